// The `checkpoint` state file (TF: checkpoint_management.py), the choice of
// the checkpoint to restore (decision 7) and the directory lock.
#include "foreman/checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <utility>

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint_lock.hpp"
#include "checkpoint_state.pb.h"
#include "foreman/bundle.hpp"
#include "foreman/mutex.hpp"
#include "platform/log.hpp"
#include "platform/path.hpp"

namespace foreman {

namespace {

constexpr char kLockFilename[] = ".foreman.lock";

/// Collects the text-format parser's complaints instead of printing them.
class ParseErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    errors.push_back(absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message));
  }
  std::vector<std::string> errors;
};

/// `path` relative to `dir` when it lies under it (decision 8), else as given.
std::string RelativeTo(const std::string& dir, const std::string& path) {
  const std::string d = internal::NormalizeDirectory(dir);
  if (d == "/") return IsAbsolutePath(path) ? path.substr(1) : path;
  if (!d.empty() && absl::StartsWith(path, d + "/")) return path.substr(d.size() + 1);
  return path;
}

/// B137 and the empty-path rule, shared by reading and writing.
Status Validate(const CheckpointState& s, const std::string& path) {
  if (s.model_checkpoint_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": model_checkpoint_path is empty"));
  }
  if (!s.all_model_checkpoint_timestamps.empty() &&
      s.all_model_checkpoint_timestamps.size() != s.all_model_checkpoint_paths.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": all_model_checkpoint_timestamps has ", s.all_model_checkpoint_timestamps.size(),
        " entries but all_model_checkpoint_paths has ", s.all_model_checkpoint_paths.size()));
  }
  return absl::OkStatus();
}

Status CheckLatestFilename(const std::string& latest_filename) {
  if (latest_filename.empty() || absl::StrContains(latest_filename, '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'latest_filename' must be a file name without a directory component, got '", latest_filename, "'"));
  }
  return absl::OkStatus();
}

/// The global step in a prefix's name ("model.ckpt-100" -> 100), or -1.
int64_t StepOf(const std::string& prefix) {
  const std::string digits = prefix.substr(prefix.rfind('-') + 1);   // no '-': npos + 1 == 0
  const auto is_digit = [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); };
  int64_t step = -1;
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), is_digit) || !absl::SimpleAtoi(digits, &step)) {
    return -1;
  }
  return step;
}

/// OK when the bundle's index and data exist and every tensor verifies.
Status VerifyBundle(Env* env, const std::string& prefix) {
  FOREMAN_ASSIGN_OR_RETURN(auto reader, BundleReader::Open(env, prefix));
  return reader->VerifyAll();
}

/// The pid in a lock error ("... held by process 42", "... (pid 42)").
std::string PidFromLockError(absl::string_view message) {
  std::size_t pos = message.rfind("process");
  if (pos == absl::string_view::npos) return "unknown";
  pos = message.find_first_of("0123456789", pos);
  if (pos == absl::string_view::npos) return "unknown";
  std::size_t end = pos;
  while (end < message.size() && absl::ascii_isdigit(static_cast<unsigned char>(message[end]))) ++end;
  return std::string(message.substr(pos, end - pos));
}

}  // namespace

// -- the state file -----------------------------------------------------------------

StatusOr<std::optional<CheckpointState>> ReadCheckpointState(Env* env, const std::string& dir,
                                                             const std::string& latest_filename) {
  FOREMAN_RETURN_IF_ERROR(CheckLatestFilename(latest_filename));
  const std::string path = JoinPath(dir, latest_filename);
  StatusOr<std::string> text = env->ReadFileToString(path);
  if (absl::IsNotFound(text.status())) return std::optional<CheckpointState>();
  FOREMAN_RETURN_IF_ERROR(text.status());

  proto::CheckpointState p;
  ParseErrors errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(*text, &p)) {
    return absl::DataLossError(
        absl::StrCat(path, ": cannot parse checkpoint state: ", absl::StrJoin(errors.errors, "; ")));
  }
  CheckpointState s;
  s.model_checkpoint_path = p.model_checkpoint_path();
  s.all_model_checkpoint_paths.assign(p.all_model_checkpoint_paths().begin(), p.all_model_checkpoint_paths().end());
  s.all_model_checkpoint_timestamps.assign(p.all_model_checkpoint_timestamps().begin(),
                                           p.all_model_checkpoint_timestamps().end());
  s.last_preserved_timestamp = p.last_preserved_timestamp();
  FOREMAN_RETURN_IF_ERROR(Validate(s, path));
  return std::optional<CheckpointState>(std::move(s));
}

Status WriteCheckpointState(Env* env, const std::string& dir, const CheckpointState& state,
                            const std::string& latest_filename) {
  FOREMAN_RETURN_IF_ERROR(CheckLatestFilename(latest_filename));
  const std::string path = JoinPath(dir, latest_filename);
  CheckpointState s = state;
  // B136, as TF's generate_checkpoint_state_proto: the list ends with the latest.
  if (s.all_model_checkpoint_paths.empty() || s.all_model_checkpoint_paths.back() != s.model_checkpoint_path) {
    s.all_model_checkpoint_paths.push_back(s.model_checkpoint_path);
  }
  FOREMAN_RETURN_IF_ERROR(Validate(s, path));

  proto::CheckpointState p;
  p.set_model_checkpoint_path(RelativeTo(dir, s.model_checkpoint_path));
  for (const std::string& c : s.all_model_checkpoint_paths) p.add_all_model_checkpoint_paths(RelativeTo(dir, c));
  for (double t : s.all_model_checkpoint_timestamps) p.add_all_model_checkpoint_timestamps(t);
  p.set_last_preserved_timestamp(s.last_preserved_timestamp);
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(p, &text)) {
    return absl::InternalError(absl::StrCat(path, ": cannot format checkpoint state"));
  }
  return WriteFileAtomic(env, path, text);
}

std::string ResolveCheckpointPath(const std::string& dir, const std::string& path) {
  return IsAbsolutePath(path) ? path : JoinPath(dir, path);
}

// -- finding checkpoints ----------------------------------------------------------

StatusOr<std::vector<std::string>> ListCheckpointPrefixes(Env* env, const std::string& dir) {
  FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(dir));
  std::vector<std::string> prefixes;
  for (const std::string& name : names) {
    if (name.size() > 6 && absl::EndsWith(name, ".index")) {
      prefixes.push_back(JoinPath(dir, name.substr(0, name.size() - 6)));
    }
  }
  // Sorted names, then stable by step: same steps keep name order.
  std::stable_sort(prefixes.begin(), prefixes.end(),
                   [](const std::string& a, const std::string& b) { return StepOf(a) < StepOf(b); });
  return prefixes;
}

StatusOr<std::optional<std::string>> LatestCheckpoint(Env* env, const std::string& dir,
                                                      const std::string& latest_filename) {
  using Result = std::optional<std::string>;
  FOREMAN_RETURN_IF_ERROR(CheckLatestFilename(latest_filename));
  StatusOr<std::optional<CheckpointState>> state = ReadCheckpointState(env, dir, latest_filename);
  std::string tried;
  std::vector<std::string> failures;
  std::vector<std::string> listed_elsewhere;   // the state file's other paths, newest first
  int corrupt_listed = 0;                      // state-file bundles that exist but do not verify
  if (state.ok() && state->has_value()) {
    tried = ResolveCheckpointPath(dir, (*state)->model_checkpoint_path);
    Status s = VerifyBundle(env, tried);
    if (s.ok()) return Result(tried);
    FOREMAN_LOG_WARN("The checkpoint state file in {} names {}, which cannot be restored: {}", dir, tried,
                     s.ToString());
    failures.push_back(s.ToString());
    if (env->FileExists(BundleIndexPath(tried)).ok()) ++corrupt_listed;
    const std::vector<std::string>& all = (*state)->all_model_checkpoint_paths;
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
      const std::string path = ResolveCheckpointPath(dir, *it);
      if (path != tried) listed_elsewhere.push_back(path);
    }
  } else if (!state.ok()) {
    if (!absl::IsDataLoss(state.status()) && !absl::IsInvalidArgument(state.status())) return state.status();
    FOREMAN_LOG_WARN("Ignoring the checkpoint state file: {}", state.status().ToString());
  }

  // Decision 7: the newest bundle on disk that verifies.
  // Then the state file's other checkpoints outside `dir` (absolute paths).
  StatusOr<std::vector<std::string>> prefixes = ListCheckpointPrefixes(env, dir);
  if (!prefixes.ok() && !absl::IsNotFound(prefixes.status())) return prefixes.status();
  std::vector<std::string> candidates;
  if (prefixes.ok()) candidates.assign(prefixes->rbegin(), prefixes->rend());
  for (const std::string& path : listed_elsewhere) {
    if (std::find(candidates.begin(), candidates.end(), path) == candidates.end()) candidates.push_back(path);
  }
  int found = corrupt_listed;
  for (const std::string& prefix : candidates) {
    if (prefix == tried) continue;
    if (!env->FileExists(BundleIndexPath(prefix)).ok()) continue;   // a listed path that is gone
    ++found;
    Status s = VerifyBundle(env, prefix);
    if (s.ok()) {
      FOREMAN_LOG_WARN("Using {}, the newest checkpoint for {} that verifies", prefix, dir);
      return Result(prefix);
    }
    FOREMAN_LOG_WARN("Skipping checkpoint {}: {}", prefix, s.ToString());
    failures.push_back(s.ToString());
  }
  if (found == 0) return Result();
  return absl::DataLossError(absl::StrCat("no checkpoint in ", dir, " can be restored (", found,
                                          " found, none verifies): ", absl::StrJoin(failures, "; ")));
}

// -- the lock ----------------------------------------------------------------------

namespace internal {
namespace {

struct ClosingDirectories {
  Mutex mu;
  std::condition_variable_any cv;
  std::map<std::string, int> marks ABSL_GUARDED_BY(mu);
};

ClosingDirectories& Closing() {
  static auto* closing = new ClosingDirectories;  // never destroyed: jobs may end during exit
  return *closing;
}

}  // namespace

void MarkCheckpointDirectoryClosing(const std::string& dir) {
  ClosingDirectories& c = Closing();
  MutexLock l(c.mu);
  ++c.marks[NormalizeDirectory(dir)];
}

void UnmarkCheckpointDirectoryClosing(const std::string& dir) {
  ClosingDirectories& c = Closing();
  {
    MutexLock l(c.mu);
    auto it = c.marks.find(NormalizeDirectory(dir));
    if (it != c.marks.end() && --it->second <= 0) c.marks.erase(it);
  }
  c.cv.notify_all();
}

bool WaitWhileCheckpointDirectoryClosing(const std::string& dir, absl::Duration timeout) {
  const std::string key = NormalizeDirectory(dir);
  ClosingDirectories& c = Closing();
  MutexLock l(c.mu);
  if (c.marks.count(key) == 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  c.cv.wait_until(l, deadline, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return c.marks.count(key) == 0; });
  return true;
}

}  // namespace internal

StatusOr<std::unique_ptr<FileLock>> LockCheckpointDirectory(Env* env, const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("the checkpoint directory must not be empty");
  // FAILED_PRECONDITION means "held by another owner" and nothing else: an
  // Env's other FAILED_PRECONDITIONs here (a path that is not a directory)
  // become INVALID_ARGUMENT; every other code stays the Env's.
  const auto not_held = [&dir](const Status& s, absl::string_view what) {
    const std::string msg = absl::StrCat("cannot ", what, " checkpoint directory ", dir, ": ", s.message());
    return absl::IsFailedPrecondition(s) ? absl::InvalidArgumentError(msg) : Status(s.code(), msg);
  };
  if (Status s = env->RecursivelyCreateDir(dir); !s.ok()) return not_held(s, "create the");
  const std::string lock_path = JoinPath(dir, kLockFilename);
  if (StatusOr<bool> is_dir = env->IsDirectory(lock_path); is_dir.ok() && *is_dir) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot lock the checkpoint directory ", dir, ": ", lock_path, " is a directory"));
  }
  StatusOr<std::unique_ptr<FileLock>> lock = env->LockFile(lock_path);
  // Held by a killed job of this process whose loop is closing its session
  // (checkpoint_lock.hpp): wait for the release, then try again.
  if (absl::IsFailedPrecondition(lock.status()) &&
      internal::WaitWhileCheckpointDirectoryClosing(dir, internal::kClosingLockWait)) {
    lock = env->LockFile(lock_path);
  }
  if (absl::IsFailedPrecondition(lock.status())) {   // both Envs: held, by another process or lock object
    return absl::FailedPreconditionError(absl::StrCat("checkpoint directory ", dir, " is in use by process ",
                                                      PidFromLockError(lock.status().message())));
  }
  if (!lock.ok()) return not_held(lock.status(), "lock the");
  return lock;
}

}  // namespace foreman
