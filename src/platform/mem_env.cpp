// MemEnv: an in-memory file system that forgets, in Crash(), exactly what a
// power cut forgets.
//
// Model: a tree of nodes (inodes). A file node holds `data` (what reads see)
// and `synced_data` (what survives a crash); a directory node holds
// `children` (the names reads see) and `durable_children` (the names that
// survive a crash). Sync() copies data to synced_data, SyncDir() copies
// children to durable_children, and Crash() copies everything back the other
// way, walking the tree from the roots along durable_children. A rename moves
// the node, so a renamed file keeps its synced data under either name. "/"
// roots absolute paths and "." relative ones; both always exist.

#include "foreman/mem_env.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "foreman/mutex.hpp"

namespace foreman {

namespace {

struct Node;
using NodePtr = std::shared_ptr<Node>;
using Children = std::map<std::string, NodePtr>;

/// A file or a directory.
struct Node {
  explicit Node(bool dir) : is_dir(dir) {}

  const bool is_dir;
  std::string data;         // Files: current contents.
  std::string synced_data;  // Files: contents after a crash.
  Children children;        // Directories: current names.
  Children durable_children;  // Directories: names after a crash.
};

/// A path split into components below its root; "." and ".." resolved.
struct ParsedPath {
  bool absolute = false;
  std::vector<std::string> parts;
};

StatusOr<ParsedPath> Parse(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty path");
  ParsedPath p;
  p.absolute = path.front() == '/';
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") {
      if (!p.parts.empty()) {
        p.parts.pop_back();
      } else if (!p.absolute) {
        return absl::InvalidArgumentError(absl::StrCat(path, " leaves the current directory"));
      }
      continue;
    }
    p.parts.emplace_back(part);
  }
  return p;
}

/// The canonical spelling of a parsed path, e.g. for lock names.
std::string Canonical(const ParsedPath& p) {
  std::string joined = absl::StrJoin(p.parts, "/");
  if (p.absolute) return absl::StrCat("/", joined);
  return joined.empty() ? "." : joined;
}

/// `node`, and every node reachable from it along durable_children, as it
/// was last synced. A node reached twice keeps only its first name: a
/// directory cannot have two parents (but sequences of renames synced in
/// only some directories can make it look so).
void Restore(Node* node, std::set<const Node*>* seen) {
  if (!node->is_dir) {
    node->data = node->synced_data;
    return;
  }
  for (auto it = node->durable_children.begin(); it != node->durable_children.end();) {
    Node* child = it->second.get();
    if (child->is_dir && !seen->insert(child).second) {
      it = node->durable_children.erase(it);
      continue;
    }
    Restore(child, seen);
    ++it;
  }
  node->children = node->durable_children;
}

/// A deep copy of what Restore() would leave of `node`: synced data and
/// durable names only (a directory reached twice keeps its first name).
NodePtr DurableCopy(const Node& node, std::set<const Node*>* seen) {
  auto copy = std::make_shared<Node>(node.is_dir);
  if (!node.is_dir) {
    copy->data = node.synced_data;
    copy->synced_data = node.synced_data;
    return copy;
  }
  for (const auto& [name, child] : node.durable_children) {
    if (child->is_dir && !seen->insert(child.get()).second) continue;
    copy->children[name] = DurableCopy(*child, seen);
  }
  copy->durable_children = copy->children;
  return copy;
}

Status Inactive(const std::string& path) {
  return absl::UnavailableError(absl::StrCat("file system inactive (simulated crash): ", path));
}

Status StaleHandle(const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat("file handle from before a crash: ", path));
}

Status NoSuchFile(const std::string& path) {
  return absl::NotFoundError(absl::StrCat(path, ": no such file or directory"));
}

Status IsADirectory(const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(path, " is a directory"));
}

}  // namespace

// -- shared state ------------------------------------------------------------------

/// The file system, shared by the MemEnv and every file object it opened.
/// `mu` guards every other member and every Node reachable from them; each
/// method below requires `mu` held.
struct MemEnv::State {
  mutable Mutex mu;
  NodePtr root ABSL_GUARDED_BY(mu) = std::make_shared<Node>(true);  // "/"
  NodePtr cwd ABSL_GUARDED_BY(mu) = std::make_shared<Node>(true);   // "."
  std::set<std::string> locks ABSL_GUARDED_BY(mu);  // Canonical paths.
  bool active ABSL_GUARDED_BY(mu) = true;
  int64_t ops ABSL_GUARDED_BY(mu) = 0;
  int64_t ops_until_crash ABSL_GUARDED_BY(mu) = kNoCrash;
  uint64_t epoch ABSL_GUARDED_BY(mu) = 0;  // Bumped by every Crash().

  Status CheckActive(const std::string& path) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return active ? absl::OkStatus() : Inactive(path);
  }

  /// Counts a successful mutating operation; may stop the file system.
  void CountMutation() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ++ops;
    if (ops_until_crash != kNoCrash && --ops_until_crash <= 0) {
      active = false;
      ops_until_crash = kNoCrash;
    }
  }

  /// The node at `p`, or null.
  NodePtr Lookup(const ParsedPath& p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    NodePtr node = p.absolute ? root : cwd;
    for (const std::string& part : p.parts) {
      if (!node->is_dir) return nullptr;
      auto it = node->children.find(part);
      if (it == node->children.end()) return nullptr;
      node = it->second;
    }
    return node;
  }

  /// The directory that holds the name `p`; NOT_FOUND when missing.
  /// REQUIRES: `p` is not a root.
  StatusOr<NodePtr> Parent(const ParsedPath& p, const std::string& path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ParsedPath parent = p;
    parent.parts.pop_back();
    NodePtr node = Lookup(parent);
    if (node == nullptr || !node->is_dir) {
      return absl::NotFoundError(absl::StrCat("directory of ", path, " does not exist"));
    }
    return node;
  }

  /// The existing directory `dir`.
  StatusOr<NodePtr> Directory(const std::string& dir) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    FOREMAN_ASSIGN_OR_RETURN(ParsedPath p, Parse(dir));
    NodePtr node = Lookup(p);
    if (node == nullptr) return NoSuchFile(dir);
    if (!node->is_dir) return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
    return node;
  }

  /// The existing file `path`.
  StatusOr<NodePtr> File(const std::string& path) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    FOREMAN_ASSIGN_OR_RETURN(ParsedPath p, Parse(path));
    NodePtr node = Lookup(p);
    if (node == nullptr) return NoSuchFile(path);
    if (node->is_dir) return IsADirectory(path);
    return node;
  }

  /// The file `path`, created when missing, truncated when `truncate`.
  StatusOr<NodePtr> OpenForWrite(const std::string& path, bool truncate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    FOREMAN_RETURN_IF_ERROR(CheckActive(path));
    FOREMAN_ASSIGN_OR_RETURN(ParsedPath p, Parse(path));
    if (p.parts.empty()) return IsADirectory(path);
    FOREMAN_ASSIGN_OR_RETURN(NodePtr dir, Parent(p, path));
    NodePtr& node = dir->children[p.parts.back()];
    if (node == nullptr) {
      node = std::make_shared<Node>(false);
    } else if (node->is_dir) {
      return IsADirectory(path);
    } else if (truncate) {
      node->data.clear();  // Not durable before the next Sync().
    }
    return node;
  }

  Status CreateDir(const std::string& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    FOREMAN_RETURN_IF_ERROR(CheckActive(dir));
    FOREMAN_ASSIGN_OR_RETURN(ParsedPath p, Parse(dir));
    if (p.parts.empty()) return absl::AlreadyExistsError(absl::StrCat(dir, " already exists"));
    FOREMAN_ASSIGN_OR_RETURN(NodePtr parent, Parent(p, dir));
    NodePtr& node = parent->children[p.parts.back()];
    if (node != nullptr) return absl::AlreadyExistsError(absl::StrCat(dir, " already exists"));
    node = std::make_shared<Node>(true);
    CountMutation();
    return absl::OkStatus();
  }

  Status SyncDir(const std::string& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    FOREMAN_RETURN_IF_ERROR(CheckActive(dir));
    FOREMAN_ASSIGN_OR_RETURN(NodePtr node, Directory(dir));
    node->durable_children = node->children;
    CountMutation();
    return absl::OkStatus();
  }
};

// -- file objects --------------------------------------------------------------------

namespace {

class MemWritableFile : public WritableFile {
 public:
  MemWritableFile(std::shared_ptr<MemEnv::State> state, NodePtr node, std::string path,
                  uint64_t epoch)
      : state_(std::move(state)),
        node_(std::move(node)),
        path_(std::move(path)),
        epoch_(epoch),
        size_(node_->data.size()) {}

  ~MemWritableFile() override { Close().IgnoreError(); }

  Status Append(absl::string_view data) override {
    MutexLock l(state_->mu);
    FOREMAN_RETURN_IF_ERROR(Check());
    node_->data.append(data.data(), data.size());
    size_ += data.size();
    state_->CountMutation();
    return absl::OkStatus();
  }

  Status Flush() override {
    MutexLock l(state_->mu);
    FOREMAN_RETURN_IF_ERROR(Check());  // Appends go straight to the "OS".
    state_->CountMutation();
    return absl::OkStatus();
  }

  Status Sync() override {
    MutexLock l(state_->mu);
    FOREMAN_RETURN_IF_ERROR(Check());
    node_->synced_data = node_->data;
    state_->CountMutation();
    return absl::OkStatus();
  }

  Status Close() override {
    if (closed_) return absl::OkStatus();
    MutexLock l(state_->mu);
    FOREMAN_RETURN_IF_ERROR(Check());
    closed_ = true;
    state_->CountMutation();
    return absl::OkStatus();
  }

  uint64_t Size() const override { return size_; }

 private:
  Status Check() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    FOREMAN_RETURN_IF_ERROR(state_->CheckActive(path_));
    if (epoch_ != state_->epoch) return StaleHandle(path_);
    if (closed_) return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
    return absl::OkStatus();
  }

  const std::shared_ptr<MemEnv::State> state_;
  const NodePtr node_;
  const std::string path_;
  const uint64_t epoch_;
  uint64_t size_;
  bool closed_ = false;
};

class MemRandomAccessFile : public RandomAccessFile {
 public:
  MemRandomAccessFile(std::shared_ptr<MemEnv::State> state, NodePtr node, std::string path,
                      uint64_t epoch)
      : state_(std::move(state)), node_(std::move(node)), path_(std::move(path)), epoch_(epoch) {}

  StatusOr<absl::string_view> Read(uint64_t offset, std::size_t n, char* scratch) const override {
    MutexLock l(state_->mu);
    FOREMAN_RETURN_IF_ERROR(state_->CheckActive(path_));
    if (epoch_ != state_->epoch) return StaleHandle(path_);
    const std::string& data = node_->data;
    if (offset > data.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("read ", path_, " at offset ", offset, " past its size ", data.size()));
    }
    const std::size_t len = std::min<uint64_t>(n, data.size() - offset);
    std::memcpy(scratch, data.data() + offset, len);
    return absl::string_view(scratch, len);
  }

  uint64_t Size() const override {
    MutexLock l(state_->mu);
    return node_->data.size();
  }

 private:
  const std::shared_ptr<MemEnv::State> state_;
  const NodePtr node_;
  const std::string path_;
  const uint64_t epoch_;
};

class MemFileLock : public FileLock {
 public:
  MemFileLock(std::shared_ptr<MemEnv::State> state, std::string name, uint64_t epoch)
      : state_(std::move(state)), name_(std::move(name)), epoch_(epoch) {}

  ~MemFileLock() override {
    MutexLock l(state_->mu);
    // A crash already released it; someone may hold it again by now.
    if (epoch_ == state_->epoch) state_->locks.erase(name_);
  }

 private:
  const std::shared_ptr<MemEnv::State> state_;
  const std::string name_;
  const uint64_t epoch_;
};

}  // namespace

// -- MemEnv --------------------------------------------------------------------------

MemEnv::MemEnv() : state_(std::make_shared<State>()) {}

MemEnv::~MemEnv() = default;

void MemEnv::Crash() {
  MutexLock l(state_->mu);
  std::set<const Node*> seen;
  Restore(state_->root.get(), &seen);
  Restore(state_->cwd.get(), &seen);
  state_->locks.clear();
  ++state_->epoch;
  state_->active = true;
  // A restart forgets a pending SetCrashAfterOperations(), so that checking
  // what survived cannot trip it.
  state_->ops_until_crash = kNoCrash;
}

std::unique_ptr<MemEnv> MemEnv::DurableImage() const {
  auto image = std::make_unique<MemEnv>();
  MutexLock l(state_->mu);
  MutexLock m(image->state_->mu);
  std::set<const Node*> seen;
  image->state_->root = DurableCopy(*state_->root, &seen);
  image->state_->cwd = DurableCopy(*state_->cwd, &seen);
  return image;
}

int64_t MemEnv::crashes() const {
  MutexLock l(state_->mu);
  return static_cast<int64_t>(state_->epoch);
}

bool MemEnv::IsLocked(const std::string& path) const {
  auto parsed = Parse(path);
  if (!parsed.ok()) return false;
  MutexLock l(state_->mu);
  return state_->locks.count(Canonical(*parsed)) > 0;
}

void MemEnv::SetFilesystemActive(bool active) {
  MutexLock l(state_->mu);
  state_->active = active;
}

void MemEnv::SetCrashAfterOperations(int64_t n) {
  MutexLock l(state_->mu);
  state_->ops_until_crash = n;
  if (n <= 0) {
    state_->active = false;
    state_->ops_until_crash = kNoCrash;
  }
}

int64_t MemEnv::mutating_operations() const {
  MutexLock l(state_->mu);
  return state_->ops;
}

StatusOr<std::string> MemEnv::ReadFileToString(const std::string& path) {
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(path));
  FOREMAN_ASSIGN_OR_RETURN(NodePtr node, state_->File(path));
  return node->data;
}

StatusOr<std::unique_ptr<RandomAccessFile>> MemEnv::NewRandomAccessFile(const std::string& path) {
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(path));
  FOREMAN_ASSIGN_OR_RETURN(NodePtr node, state_->File(path));
  return std::unique_ptr<RandomAccessFile>(
      new MemRandomAccessFile(state_, std::move(node), path, state_->epoch));
}

StatusOr<std::unique_ptr<WritableFile>> MemEnv::NewWritableFile(const std::string& path) {
  MutexLock l(state_->mu);
  FOREMAN_ASSIGN_OR_RETURN(NodePtr node, state_->OpenForWrite(path, /*truncate=*/true));
  state_->CountMutation();
  return std::unique_ptr<WritableFile>(
      new MemWritableFile(state_, std::move(node), path, state_->epoch));
}

StatusOr<std::unique_ptr<WritableFile>> MemEnv::NewAppendableFile(const std::string& path) {
  MutexLock l(state_->mu);
  FOREMAN_ASSIGN_OR_RETURN(NodePtr node, state_->OpenForWrite(path, /*truncate=*/false));
  state_->CountMutation();
  return std::unique_ptr<WritableFile>(
      new MemWritableFile(state_, std::move(node), path, state_->epoch));
}

Status MemEnv::RenameFile(const std::string& from, const std::string& to) {
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(from));
  FOREMAN_ASSIGN_OR_RETURN(ParsedPath src, Parse(from));
  FOREMAN_ASSIGN_OR_RETURN(ParsedPath dst, Parse(to));
  const std::string what = absl::StrCat("rename ", from, " to ", to);
  if (src.parts.empty() || dst.parts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot rename a root"));
  }
  NodePtr node = state_->Lookup(src);
  if (node == nullptr) return NoSuchFile(from);
  FOREMAN_ASSIGN_OR_RETURN(NodePtr src_dir, state_->Parent(src, from));
  FOREMAN_ASSIGN_OR_RETURN(NodePtr dst_dir, state_->Parent(dst, to));
  NodePtr target = state_->Lookup(dst);
  if (target != node) {
    if (node->is_dir && src.absolute == dst.absolute && dst.parts.size() > src.parts.size() &&
        std::equal(src.parts.begin(), src.parts.end(), dst.parts.begin())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": target inside the source"));
    }
    if (target != nullptr) {
      if (target->is_dir != node->is_dir) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, ": ", target->is_dir ? "target is a directory" : "target is a file"));
      }
      if (target->is_dir && !target->children.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(what, ": target directory not empty"));
      }
    }
    src_dir->children.erase(src.parts.back());
    dst_dir->children[dst.parts.back()] = node;
  }
  state_->CountMutation();
  return absl::OkStatus();
}

Status MemEnv::DeleteFile(const std::string& path) {
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(path));
  FOREMAN_ASSIGN_OR_RETURN(ParsedPath p, Parse(path));
  FOREMAN_RETURN_IF_ERROR(state_->File(path).status());
  FOREMAN_ASSIGN_OR_RETURN(NodePtr dir, state_->Parent(p, path));
  dir->children.erase(p.parts.back());
  state_->CountMutation();
  return absl::OkStatus();
}

Status MemEnv::FileExists(const std::string& path) {
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(path));
  FOREMAN_ASSIGN_OR_RETURN(ParsedPath p, Parse(path));
  return state_->Lookup(p) != nullptr ? absl::OkStatus() : NoSuchFile(path);
}

StatusOr<uint64_t> MemEnv::GetFileSize(const std::string& path) {
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(path));
  FOREMAN_ASSIGN_OR_RETURN(NodePtr node, state_->File(path));
  return node->data.size();
}

StatusOr<std::vector<std::string>> MemEnv::GetChildren(const std::string& dir) {
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(dir));
  FOREMAN_ASSIGN_OR_RETURN(NodePtr node, state_->Directory(dir));
  std::vector<std::string> names;
  names.reserve(node->children.size());
  for (const auto& [name, child] : node->children) names.push_back(name);
  return names;  // Sorted: children is a std::map.
}

StatusOr<bool> MemEnv::IsDirectory(const std::string& path) {
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(path));
  FOREMAN_ASSIGN_OR_RETURN(ParsedPath p, Parse(path));
  NodePtr node = state_->Lookup(p);
  if (node == nullptr) return NoSuchFile(path);
  return node->is_dir;
}

Status MemEnv::CreateDir(const std::string& dir) {
  MutexLock l(state_->mu);
  return state_->CreateDir(dir);
}

Status MemEnv::RecursivelyCreateDir(const std::string& dir) {
  // Counts as the CreateDir and SyncDir of each level it creates, so that a
  // crash can strike between them.
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(dir));
  FOREMAN_ASSIGN_OR_RETURN(ParsedPath p, Parse(dir));
  ParsedPath prefix{p.absolute, {}};
  for (const std::string& part : p.parts) {
    prefix.parts.push_back(part);
    NodePtr node = state_->Lookup(prefix);
    const std::string level = Canonical(prefix);
    if (node != nullptr) {
      if (node->is_dir) continue;
      return absl::FailedPreconditionError(absl::StrCat(level, " is not a directory"));
    }
    FOREMAN_RETURN_IF_ERROR(state_->CreateDir(level));
    FOREMAN_RETURN_IF_ERROR(state_->SyncDir(Dirname(level)));
  }
  return absl::OkStatus();
}

Status MemEnv::DeleteDir(const std::string& dir) {
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(dir));
  FOREMAN_ASSIGN_OR_RETURN(ParsedPath p, Parse(dir));
  FOREMAN_ASSIGN_OR_RETURN(NodePtr node, state_->Directory(dir));
  if (p.parts.empty()) return absl::InvalidArgumentError(absl::StrCat("cannot delete root ", dir));
  if (!node->children.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("directory ", dir, " is not empty"));
  }
  FOREMAN_ASSIGN_OR_RETURN(NodePtr parent, state_->Parent(p, dir));
  parent->children.erase(p.parts.back());
  state_->CountMutation();
  return absl::OkStatus();
}

Status MemEnv::SyncDir(const std::string& dir) {
  MutexLock l(state_->mu);
  return state_->SyncDir(dir);
}

StatusOr<std::unique_ptr<FileLock>> MemEnv::LockFile(const std::string& path) {
  MutexLock l(state_->mu);
  FOREMAN_RETURN_IF_ERROR(state_->CheckActive(path));
  FOREMAN_ASSIGN_OR_RETURN(ParsedPath p, Parse(path));
  std::string name = Canonical(p);
  if (state_->locks.count(name) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lock ", path, " is held by this process (pid ", static_cast<int64_t>(getpid()), ")"));
  }
  FOREMAN_ASSIGN_OR_RETURN(NodePtr node, state_->OpenForWrite(path, /*truncate=*/true));
  node->data = absl::StrCat(static_cast<int64_t>(getpid()), "\n");
  state_->locks.insert(name);
  state_->CountMutation();
  return std::unique_ptr<FileLock>(new MemFileLock(state_, std::move(name), state_->epoch));
}

}  // namespace foreman
