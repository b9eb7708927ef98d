// The run directory (include/foreman/run_directory.hpp): the lock, the undo
// of a refused start, the settings file, and the rules that choose what a
// run restores.
#include "foreman/run_directory.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/graph.hpp"
#include "foreman/monitored_session.hpp"

namespace foreman {
namespace {

// LockCheckpointDirectory's lock file.
constexpr char kLockFile[] = ".foreman.lock";

// A `checkpoint` state file or a model.ckpt-* file: checkpoints (of another
// program when there is no settings file: a settings file deleted, another
// program's run). The Env's error other than NOT_FOUND.
StatusOr<bool> HoldsCheckpoints(Env* env, const std::string& dir) {
  if (Status exists = env->FileExists(JoinPath(dir, kCheckpointStateFilename)); exists.ok()) {
    return true;
  } else if (!absl::IsNotFound(exists)) {
    return exists;
  }
  auto children = env->GetChildren(dir);
  if (!children.ok()) return absl::IsNotFound(children.status()) ? StatusOr<bool>(false) : children.status();
  for (const std::string& name : *children) {
    if (absl::StartsWith(name, "model.ckpt-")) return true;
  }
  return false;
}

}  // namespace

RunDirectory::RunDirectory(std::string path, RunDirectoryOptions options)
    : path_(std::move(path)),
      options_(std::move(options)),
      base_env_(options_.env != nullptr ? options_.env : Env::Default()),
      env_(base_env_) {}

RunDirectory::~RunDirectory() = default;

std::string RunDirectory::settings_path() const { return path_ + "/" + options_.settings_file; }

void RunDirectory::AttachTo(MonitoredTrainingSessionOptions& options) const {
  options.checkpoint_dir = path_;
  options.runtime.held_lock = lock_;
  options.runtime.held_lock_directory = path_;
  options.config.env = env_;
}

Status RunDirectory::Lock() {
  MutexLock l(mu_);
  // What does not exist yet, for Undo(); before anything is created.
  const std::string lock_file = path_ + "/" + kLockFile;
  if (!base_env_->FileExists(lock_file).ok()) created_lock_file_ = lock_file;
  for (std::string p = path_; !p.empty() && !base_env_->FileExists(p).ok();) {
    created_dirs_.push_back(p);  // deepest first
    std::string parent = Dirname(p);
    if (parent == p) break;
    p = std::move(parent);
  }
  auto lock = LockCheckpointDirectory(base_env_, path_);
  if (!lock.ok()) {
    // The lock file (if any) is not this object's: only the directories go.
    created_lock_file_.clear();
    UndoLocked();
    return lock.status();
  }
  lock_ = std::move(*lock);
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<RunDirectory>> OpenRunDirectory(const std::string& dir, const RunDirectoryOptions& options) {
  const std::string& f = options.settings_file;
  if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("RunDirectoryOptions::settings_file '", f,
                                                   "' is not a file name inside the run directory"));
  }
  std::unique_ptr<RunDirectory> run(new RunDirectory(dir, options));
  FOREMAN_RETURN_IF_ERROR(run->Lock());
  return run;
}

StatusOr<std::optional<RunSettings>> RunDirectory::ReadSettings(const std::vector<std::string>& required_keys) {
  const std::string path = settings_path();
  // Only a missing file means a fresh run: any other error (EACCES, EIO) is
  // returned, never taken for "no settings" (which would refuse the
  // directory as another program's, or train again from step 0).
  if (Status exists = env_->FileExists(path); absl::IsNotFound(exists)) {
    read_settings_ = true;
    resuming_ = false;
    return std::optional<RunSettings>();
  } else if (!exists.ok()) {
    return exists;
  }
  FOREMAN_ASSIGN_OR_RETURN(std::string text, env_->ReadFileToString(path));
  RunSettings settings;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_number, ": expected 'key = value', found '",
                                                     absl::CHexEscape(line.substr(0, 80)), "'"));
    }
    const std::string key(absl::StripAsciiWhitespace(kv[0]));
    if (settings.count(key) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_number, ": '", key, "' given twice"));
    }
    settings[key] = std::string(absl::StripAsciiWhitespace(kv[1]));
  }
  for (const std::string& key : required_keys) {
    if (settings.count(key) == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": missing '", key, "'"));
  }
  read_settings_ = true;
  resuming_ = true;
  return std::optional<RunSettings>(std::move(settings));
}

namespace {

// What ReadSettings reads back as written: a key without '=', a line break,
// a leading '#' or surrounding blanks; a value without a line break or
// surrounding blanks (ReadSettings strips them).
Status CheckSetting(const std::string& path, const std::string& key, const std::string& value) {
  auto padded = [](const std::string& x) {
    return !x.empty() && (absl::ascii_isspace(x.front()) || absl::ascii_isspace(x.back()));
  };
  if (key.empty() || key.find_first_of("=\n\r") != std::string::npos || key[0] == '#' || padded(key)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write the setting key '", absl::CEscape(key),
                                                   "' (it must be non-empty, without '=', a line break, a "
                                                   "leading '#' or surrounding blanks)"));
  }
  if (value.find_first_of("\n\r") != std::string::npos || padded(value)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write the value of '", key, "', '",
                                                   absl::CEscape(value),
                                                   "' (it must have no line break and no surrounding blanks)"));
  }
  return absl::OkStatus();
}

}  // namespace

Status RunDirectory::WriteSettings(const RunSettings& settings, const std::string& comment) const {
  for (const auto& [key, value] : settings) FOREMAN_RETURN_IF_ERROR(CheckSetting(settings_path(), key, value));
  std::string text = comment;
  for (const auto& [key, value] : settings) absl::StrAppend(&text, key, " = ", value, "\n");
  const std::string path = settings_path();
  const std::string tmp = path + ".tmp";
  Status s = [&]() -> Status {
    FOREMAN_ASSIGN_OR_RETURN(auto file, env_->NewWritableFile(tmp));
    FOREMAN_RETURN_IF_ERROR(file->Append(text));
    FOREMAN_RETURN_IF_ERROR(file->Sync());
    FOREMAN_RETURN_IF_ERROR(file->Close());
    FOREMAN_RETURN_IF_ERROR(env_->RenameFile(tmp, path));
    return env_->SyncDir(path_);
  }();
  if (!s.ok() && env_->FileExists(tmp).ok()) env_->DeleteFile(tmp).IgnoreError();
  return s;
}

StatusOr<std::optional<std::string>> RunDirectory::CheckpointToRestore(bool* refused) const {
  bool refusal = false;
  auto choice = [&]() -> StatusOr<std::optional<std::string>> {
    if (!read_settings_) {
      return absl::FailedPreconditionError("RunDirectory::CheckpointToRestore: call ReadSettings() first");
    }
    const std::string& dir = path_;
    if (!resuming_) {
      FOREMAN_ASSIGN_OR_RETURN(bool holds, HoldsCheckpoints(env_, dir));
      if (!holds) return std::optional<std::string>();
      refusal = true;
      return absl::FailedPreconditionError(absl::StrCat(dir, " holds checkpoints that ", options_.program,
                                                        " did not write (no ", options_.settings_file,
                                                        "): use another ", options_.directory_flag));
    }
    const std::string fresh =
        absl::StrCat("; to start fresh on purpose, remove ", dir, " or use another ", options_.directory_flag);
    auto latest = LatestCheckpoint(env_, dir);
    if (!latest.ok()) {
      // DATA_LOSS: checkpoints exist and none verifies (each was named in a warning).
      if (!absl::IsDataLoss(latest.status())) return latest.status();
      refusal = true;
      return Status(latest.status().code(), absl::StrCat(latest.status().message(), fresh));
    }
    if (latest->has_value()) return *latest;
    // None: a run stopped before its first checkpoint has no state file.
    const std::string state_path = JoinPath(dir, kCheckpointStateFilename);
    if (absl::IsNotFound(env_->FileExists(state_path))) return std::optional<std::string>();
    std::string missing;
    auto state = ReadCheckpointState(env_, dir);
    if (state.ok() && state->has_value()) {
      std::vector<std::string> files;
      for (const std::string& path : (*state)->all_model_checkpoint_paths) {
        files.push_back(BundleIndexPath(ResolveCheckpointPath(dir, path)));
      }
      const std::string latest_index = BundleIndexPath(ResolveCheckpointPath(dir, (*state)->model_checkpoint_path));
      if (std::find(files.begin(), files.end(), latest_index) == files.end()) files.push_back(latest_index);
      missing = absl::StrCat("the checkpoints its state file ", state_path, " names are gone (missing: ",
                             absl::StrJoin(files, ", "), ")");
    } else {
      missing = absl::StrCat("its state file ", state_path, " cannot be read (",
                             state.ok() ? std::string("empty") : std::string(state.status().message()),
                             ") and no checkpoint is left");
    }
    refusal = true;
    return absl::FailedPreconditionError(absl::StrCat(dir, " holds a run (", options_.settings_file, ") but ",
                                                      missing, ": resuming would train again from step 0", fresh));
  }();
  if (refused != nullptr) *refused = !choice.ok() && refusal;
  return choice;
}

Status RunDirectory::CheckCheckpointMatches(const std::string& prefix, const Graph& graph) const {
  auto reader = BundleReader::Open(env_, prefix);
  if (!reader.ok()) return absl::OkStatus();  // verified just before; the restore reports what changed since
  for (const VariableDef& def : graph.variables()) {
    if (def.local) continue;
    auto initial = def.initializer();
    if (!initial.ok()) return initial.status();
    auto entry = (*reader)->GetEntry(def.name);
    if (!entry.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(prefix, " has no variable '", def.name,
                                                        "' of this model: it holds another run; use another ",
                                                        options_.directory_flag));
    }
    if (entry->dtype != initial->dtype() || entry->shape != initial->shape()) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, " holds '", def.name, "' as ", DataTypeName(entry->dtype), " ", entry->shape.ToString(),
          ", this model needs ", DataTypeName(initial->dtype()), " ", initial->shape().ToString(), " (",
          options_.settings_file, " does not describe these checkpoints); use another ", options_.directory_flag));
    }
  }
  return absl::OkStatus();
}

bool RunDirectory::Commit() {
  MutexLock lock(mu_);
  if (undone_) return false;
  committed_ = true;
  return true;
}

void RunDirectory::Undo() {
  MutexLock lock(mu_);
  UndoLocked();
}

void RunDirectory::UndoLocked() {
  if (committed_ || undone_) return;
  undone_ = true;
  if (!created_lock_file_.empty()) base_env_->DeleteFile(created_lock_file_).IgnoreError();
  for (const std::string& d : created_dirs_) {
    if (!base_env_->DeleteDir(d).ok()) break;  // not empty (not only ours), or gone
  }
}

}  // namespace foreman
