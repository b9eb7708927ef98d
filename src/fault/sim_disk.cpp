// The simulated disk of `foreman chaos --disk sim` (sim_disk.hpp).
#include "fault/sim_disk.hpp"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fault/chaos_oracle.hpp"

namespace foreman::internal {
namespace {

constexpr char kLockName[] = ".foreman.lock";

std::string Basename(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The harness's record of fired faults is written by whoever fires, lock or
// not (a fault may fire as the job ends): not the job's file.
bool ExemptFromLockRule(const std::string& path) {
  const std::string name = Basename(path);
  return name == kLockName || absl::StartsWith(name, "fault_record.json");
}

}  // namespace

SimDisk::SimDisk(MemEnv* disk, std::string root, Env* outside)
    : EnvWrapper(disk), disk_(disk), root_(std::move(root)), outside_(outside) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  disk_->RecursivelyCreateDir(root_).IgnoreError();  // a fresh MemEnv: cannot fail
  // Every ancestor's entry made durable, as a directory made long ago is.
  for (std::string dir = root_; !dir.empty();) {
    disk_->SyncDir(dir).IgnoreError();
    const std::size_t slash = dir.rfind('/');
    if (slash == std::string::npos || dir == "/") break;
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
}

bool SimDisk::Inside(const std::string& path) const {
  return path == root_ || (absl::StartsWith(path, root_) && path.size() > root_.size() && path[root_.size()] == '/');
}

std::vector<std::string> SimDisk::TakeLockViolations() {
  MutexLock l(mu_);
  return std::exchange(violations_, {});
}

std::vector<std::string> SimDisk::TakeRecordViolations() {
  MutexLock l(mu_);
  return std::exchange(record_violations_, {});
}

void SimDisk::RecordBreach(const std::string& path, const std::string& what) {
  const std::string name = path.substr(root_.size() + 1);
  MutexLock l(mu_);
  for (const std::string& v : record_violations_) {
    if (absl::StartsWith(v, name + " ")) return;  // each file's first breach: the later ones follow from it
  }
  record_violations_.push_back(absl::StrCat(name, " ", what));
}

void SimDisk::CheckRecords(const char* op, const std::string& path, int64_t whole_bytes) {
  StatusOr<std::string> bytes = disk_->ReadFileToString(path);
  if (!bytes.ok()) {
    RecordBreach(path, absl::StrCat("after a ", op, ": cannot be read: ", bytes.status().message()));
    return;
  }
  if (whole_bytes >= 0 && static_cast<uint64_t>(whole_bytes) < bytes->size()) {
    bytes->resize(static_cast<std::size_t>(whole_bytes));  // a failed append's cut record may follow
  }
  if (Status s = OracleCheckRecords(*bytes); !s.ok()) {
    RecordBreach(path, absl::StrCat("after a ", op, ": ", s.message()));
  }
}

namespace {

// An event file opened through a SimDisk: checks the summaries rule (the
// class comment) after each Flush that succeeds, and that nothing is
// appended after a failed append.
class RecordCheckedFile final : public WritableFile {
 public:
  RecordCheckedFile(std::unique_ptr<WritableFile> file, SimDisk* disk, std::string path)
      : file_(std::move(file)), disk_(disk), path_(std::move(path)) {}
  Status Append(absl::string_view data) override {
    const uint64_t before = file_->Size();
    Status s = file_->Append(data);
    if (!s.ok() && torn_at_ < 0) torn_at_ = static_cast<int64_t>(before);
    if (s.ok() && torn_at_ >= 0 && !data.empty()) {
      disk_->RecordBreach(path_, absl::StrCat("appended to after a failed append at byte ", torn_at_,
                                              " (a cut record followed by more)"));
    }
    return s;
  }
  Status Flush() override { return Checked("flush", file_->Flush()); }
  // Not checked at Sync: FaultyEnv's torn write (above this Env) syncs
  // between the halves of one append.
  Status Sync() override { return file_->Sync(); }
  // Not checked at Close: a writer closes the file a failed append cut
  // (FaultyEnv, above this Env, cuts it) and goes on in a new one.
  Status Close() override { return file_->Close(); }
  uint64_t Size() const override { return file_->Size(); }

 private:
  Status Checked(const char* op, Status s) {
    if (s.ok()) disk_->CheckRecords(op, path_, torn_at_);
    return s;
  }
  const std::unique_ptr<WritableFile> file_;
  SimDisk* const disk_;
  const std::string path_;
  int64_t torn_at_ = -1;  // the size before the first failed append; -1: none (one writer thread)
};

bool IsEventFile(const std::string& path) { return absl::StrContains(path, "events.out.tfevents"); }

}  // namespace

Status SimDisk::Writable(const char* op, const std::string& path) const {
  if (Inside(path)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(op, " ", path, ": outside the simulated disk ", root_));
}

void SimDisk::CheckLocked(const char* op, const std::string& path) {
  if (path == root_ || ExemptFromLockRule(path)) return;
  if (disk_->IsLocked(absl::StrCat(root_, "/", kLockName))) return;
  MutexLock l(mu_);
  violations_.push_back(absl::StrCat(op, " ", path.substr(root_.size() + 1), " while the directory's lock was not held"));
}

StatusOr<std::string> SimDisk::ReadFileToString(const std::string& path) { return For(path)->ReadFileToString(path); }

StatusOr<std::unique_ptr<RandomAccessFile>> SimDisk::NewRandomAccessFile(const std::string& path) {
  return For(path)->NewRandomAccessFile(path);
}

StatusOr<std::unique_ptr<WritableFile>> SimDisk::NewWritableFile(const std::string& path) {
  FOREMAN_RETURN_IF_ERROR(Writable("create", path));
  CheckLocked("create", path);
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, disk_->NewWritableFile(path));
  if (!IsEventFile(path)) return file;
  return std::unique_ptr<WritableFile>(std::make_unique<RecordCheckedFile>(std::move(file), this, path));
}

StatusOr<std::unique_ptr<WritableFile>> SimDisk::NewAppendableFile(const std::string& path) {
  FOREMAN_RETURN_IF_ERROR(Writable("open for append", path));
  CheckLocked("open for append", path);
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, disk_->NewAppendableFile(path));
  if (!IsEventFile(path)) return file;
  return std::unique_ptr<WritableFile>(std::make_unique<RecordCheckedFile>(std::move(file), this, path));
}

Status SimDisk::RenameFile(const std::string& from, const std::string& to) {
  FOREMAN_RETURN_IF_ERROR(Writable("rename", from));
  FOREMAN_RETURN_IF_ERROR(Writable("rename", to));
  CheckLocked("rename to", to);
  return disk_->RenameFile(from, to);
}

Status SimDisk::DeleteFile(const std::string& path) {
  FOREMAN_RETURN_IF_ERROR(Writable("delete", path));
  CheckLocked("delete", path);
  return disk_->DeleteFile(path);
}

Status SimDisk::FileExists(const std::string& path) { return For(path)->FileExists(path); }

StatusOr<uint64_t> SimDisk::GetFileSize(const std::string& path) { return For(path)->GetFileSize(path); }

StatusOr<std::vector<std::string>> SimDisk::GetChildren(const std::string& dir) { return For(dir)->GetChildren(dir); }

StatusOr<bool> SimDisk::IsDirectory(const std::string& path) { return For(path)->IsDirectory(path); }

Status SimDisk::CreateDir(const std::string& dir) {
  // The root's ancestors exist already: creating them is asking for them.
  if (!Inside(dir) && absl::StartsWith(root_, dir)) return absl::AlreadyExistsError(absl::StrCat(dir, " already exists"));
  FOREMAN_RETURN_IF_ERROR(Writable("mkdir", dir));
  return disk_->CreateDir(dir);
}

Status SimDisk::RecursivelyCreateDir(const std::string& dir) {
  if (!Inside(dir) && absl::StartsWith(root_, dir)) return absl::OkStatus();
  FOREMAN_RETURN_IF_ERROR(Writable("mkdir", dir));
  return disk_->RecursivelyCreateDir(dir);
}

Status SimDisk::DeleteDir(const std::string& dir) {
  FOREMAN_RETURN_IF_ERROR(Writable("rmdir", dir));
  if (dir == root_) return disk_->DeleteDir(dir);
  CheckLocked("rmdir", dir);
  return disk_->DeleteDir(dir);
}

Status SimDisk::SyncDir(const std::string& dir) {
  // An ancestor of the root is already durable (the constructor synced it).
  if (!Inside(dir) && absl::StartsWith(root_, dir)) return disk_->SyncDir(dir);
  FOREMAN_RETURN_IF_ERROR(Writable("fsync", dir));
  return disk_->SyncDir(dir);
}

StatusOr<std::unique_ptr<FileLock>> SimDisk::LockFile(const std::string& path) {
  FOREMAN_RETURN_IF_ERROR(Writable("lock", path));
  return disk_->LockFile(path);
}

namespace {

Status CopyTree(MemEnv* disk, const std::string& dir, Env* real) {
  FOREMAN_RETURN_IF_ERROR(real->RecursivelyCreateDir(dir));
  FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> names, disk->GetChildren(dir));
  for (const std::string& name : names) {
    const std::string path = JoinPath(dir, name);
    FOREMAN_ASSIGN_OR_RETURN(bool is_dir, disk->IsDirectory(path));
    if (is_dir) {
      FOREMAN_RETURN_IF_ERROR(CopyTree(disk, path, real));
      continue;
    }
    FOREMAN_ASSIGN_OR_RETURN(std::string bytes, disk->ReadFileToString(path));
    FOREMAN_RETURN_IF_ERROR(WriteStringToFile(real, path, bytes));
  }
  return absl::OkStatus();
}

}  // namespace

Status CopyOutOfDisk(MemEnv* disk, const std::string& root, Env* real) { return CopyTree(disk, root, real); }

}  // namespace foreman::internal
