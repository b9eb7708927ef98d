// Saver (TF: tf.compat.v1.train.Saver, V2 format): naming (B127-B129),
// the commit protocol, retention (B130-B133), restore (B134) and recovery of
// the retention list (B84).
#include "foreman/checkpoint.hpp"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "foreman/bundle.hpp"
#include "formats/saver.hpp"
#include "platform/log.hpp"

namespace foreman {

namespace {

/// A checkpoint in the retention list and when it was saved (seconds).
struct Saved {
  std::string prefix;
  double time_secs = 0;
};

/// B133: deletes the bundle's index, data shards and .meta; failures are
/// logged and ignored, files already gone are not failures.
void DeleteCheckpoint(Env* env, const std::string& prefix) {
  std::vector<std::string> paths = {BundleIndexPath(prefix)};
  const std::string dir = Dirname(prefix);
  const std::string data_stem = Basename(prefix) + ".data-";   // + "?????-of-?????"
  StatusOr<std::vector<std::string>> names = env->GetChildren(dir);
  if (names.ok()) {
    for (const std::string& name : *names) {
      if (absl::StartsWith(name, data_stem) && name.size() == data_stem.size() + 14) {
        paths.push_back(JoinPath(dir, name));
      }
    }
  } else {
    FOREMAN_LOG_WARN("Ignoring: {}", names.status().ToString());
  }
  paths.push_back(prefix + ".meta");
  for (const std::string& path : paths) {
    Status s = env->DeleteFile(path);
    if (!s.ok() && !absl::IsNotFound(s)) FOREMAN_LOG_WARN("Ignoring: {}", s.ToString());
  }
}

/// True when the bundle `prefix` exists, verifies and holds exactly
/// `tensors` (names, dtypes, shapes, bytes). Any error reads as false.
bool BundleHolds(Env* env, const std::string& prefix, const std::map<std::string, Tensor>& tensors) {
  if (!env->FileExists(BundleIndexPath(prefix)).ok()) return false;
  StatusOr<std::unique_ptr<BundleReader>> reader = BundleReader::Open(env, prefix);
  if (!reader.ok()) return false;
  const std::vector<BundleEntry>& entries = (*reader)->entries();
  if (entries.size() != tensors.size()) return false;
  auto it = tensors.begin();
  for (const BundleEntry& e : entries) {   // both sorted by name
    const auto& [name, tensor] = *it++;
    if (e.name != name || e.dtype != tensor.dtype() || e.shape != tensor.shape()) return false;
  }
  for (const auto& [name, tensor] : tensors) {   // one tensor in memory at a time
    StatusOr<Tensor> stored = (*reader)->Lookup(name);   // checks its CRC
    if (!stored.ok() || !stored->Equals(tensor)) return false;
  }
  return true;
}

}  // namespace

// -- Impl ---------------------------------------------------------------------------

struct Saver::Impl {
  SaverOptions options;
  std::vector<Saved> last_checkpoints;   // oldest first
  std::deque<Saved> to_be_deleted;       // left the window; one handled per save
  double next_keep_time_secs = 0;        // B132

  double KeepIntervalSecs() const { return options.keep_checkpoint_every_n_hours * 3600.0; }
  /// TF's last_preserved_timestamp: when the current keep interval began
  /// (the Saver's creation, or the last keep time passed).
  double LastPreservedSecs() const { return next_keep_time_secs - KeepIntervalSecs(); }

  /// B130: moves `prefix` to the end of the list; what falls out of the
  /// window waits in to_be_deleted.
  void Record(const std::string& prefix) {
    if (options.max_to_keep == 0) return;   // B131
    const auto same = [&](const Saved& s) { return s.prefix == prefix; };
    last_checkpoints.erase(std::remove_if(last_checkpoints.begin(), last_checkpoints.end(), same),
                           last_checkpoints.end());
    // Unlike TF, a re-saved checkpoint still waiting for deletion is spared.
    to_be_deleted.erase(std::remove_if(to_be_deleted.begin(), to_be_deleted.end(), same), to_be_deleted.end());
    last_checkpoints.push_back({prefix, options.clock->WallSeconds()});
    if (static_cast<int>(last_checkpoints.size()) > options.max_to_keep) {
      to_be_deleted.push_back(std::move(last_checkpoints.front()));
      last_checkpoints.erase(last_checkpoints.begin());
    }
  }

  /// B130/B132: at most one deletion; a checkpoint saved after the next keep
  /// time is kept for good instead.
  void MaybeDeleteOldest() {
    if (to_be_deleted.empty()) return;
    Saved oldest = std::move(to_be_deleted.front());
    to_be_deleted.pop_front();
    if (oldest.time_secs > next_keep_time_secs) {
      next_keep_time_secs += KeepIntervalSecs();
      return;
    }
    DeleteCheckpoint(options.env, oldest.prefix);
  }
};

// -- Saver ---------------------------------------------------------------------------

Saver::Saver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Saver::~Saver() = default;

StatusOr<std::unique_ptr<Saver>> Saver::Create(SaverOptions options) {
  if (options.max_to_keep < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_to_keep must be >= 0, got ", options.max_to_keep));
  }
  if (!(options.keep_checkpoint_every_n_hours > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_checkpoint_every_n_hours must be > 0, got ", options.keep_checkpoint_every_n_hours));
  }
  if (options.env == nullptr || options.clock == nullptr) {
    return absl::InvalidArgumentError("SaverOptions needs an env and a clock");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->next_keep_time_secs = options.clock->WallSeconds() + options.keep_checkpoint_every_n_hours * 3600.0;
  return std::unique_ptr<Saver>(new Saver(std::move(impl)));
}

StatusOr<std::unique_ptr<Saver>> internal::NewDefaultSaver(Env* env, Clock* clock) {
  SaverOptions options;
  options.env = env;
  options.clock = clock;
  return Saver::Create(options);
}

namespace {

bool AllDigits(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// True when `name` is a BundleWriter temporary of a save to `basename`
/// (bundle_writer.cpp: BundleIndexPath/BundleDataPath + ".tempstate" + a
/// decimal uint64).
bool IsSaveTemporary(absl::string_view name, absl::string_view basename) {
  if (!absl::ConsumePrefix(&name, basename)) return false;
  const std::size_t tempstate = name.rfind(".tempstate");
  if (tempstate == absl::string_view::npos) return false;
  const absl::string_view suffix = name.substr(tempstate + 10);
  if (!AllDigits(suffix) || suffix.size() > 20) return false;
  absl::string_view stem = name.substr(0, tempstate);   // "[-<step>].index" or "[-<step>].data-NNNNN-of-NNNNN"
  if (!absl::ConsumeSuffix(&stem, ".index")) {
    if (stem.size() < 20) return false;
    const absl::string_view data = stem.substr(stem.size() - 20);   // ".data-00000-of-00001"
    if (!absl::StartsWith(data, ".data-") || data.substr(11, 4) != "-of-" || !AllDigits(data.substr(6, 5)) ||
        !AllDigits(data.substr(15, 5))) {
      return false;
    }
    stem.remove_suffix(20);
  }
  return stem.empty() || (absl::ConsumePrefix(&stem, "-") && AllDigits(stem));
}

}  // namespace

StatusOr<int> internal::RemoveStaleSaveTemporaries(Env* env, const std::string& dir_in, const std::string& basename_in) {
  // "<dir>/<basename>" may put the files in a subdirectory of `dir`.
  const std::string save_path = JoinPath(dir_in, basename_in);
  const std::string dir = Dirname(save_path);
  const std::string basename = Basename(save_path);
  StatusOr<std::vector<std::string>> names = env->GetChildren(dir);
  if (absl::IsNotFound(names.status())) return 0;
  FOREMAN_RETURN_IF_ERROR(names.status());
  int removed = 0;
  for (const std::string& name : *names) {
    if (!IsSaveTemporary(name, basename)) continue;
    const std::string path = JoinPath(dir, name);
    StatusOr<uint64_t> size = env->GetFileSize(path);
    Status s = env->DeleteFile(path);
    if (!s.ok()) {
      if (!absl::IsNotFound(s)) FOREMAN_LOG_WARN("Cannot remove the stale save temporary {}: {}", path, s.ToString());
      continue;
    }
    ++removed;
    FOREMAN_LOG_WARN("Removed {} ({} bytes), left by a save that did not finish (a kill or a crash)", path,
                     size.ok() ? absl::StrCat(*size) : std::string("?"));
  }
  return removed;
}

StatusOr<std::string> Saver::Save(const std::map<std::string, Tensor>& tensors, const std::string& save_path,
                                  std::optional<int64_t> global_step, const std::string& latest_filename) {
  Env* env = impl_->options.env;
  if (latest_filename.empty() || absl::StrContains(latest_filename, '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'latest_filename' must be a file name without a directory component, got '", latest_filename, "'"));
  }
  std::string prefix = save_path;
  if (global_step) {
    absl::StrAppend(&prefix, "-", impl_->options.pad_step_number ? absl::StrFormat("%08d", *global_step)
                                                                 : absl::StrCat(*global_step));
  }
  const std::string dir = Dirname(save_path);
  if (prefix == JoinPath(dir, latest_filename) || Basename(prefix) == latest_filename) {   // B129, B135
    return absl::InvalidArgumentError(
        absl::StrCat("Save path '", prefix, "' conflicts with path used for checkpoint state"));
  }
  StatusOr<bool> is_dir = env->IsDirectory(dir);
  if (!is_dir.ok() || !*is_dir) {
    if (!is_dir.ok() && !absl::IsNotFound(is_dir.status())) return is_dir.status();
    return absl::NotFoundError(absl::StrCat("Parent directory of ", save_path, " doesn't exist, can't save."));
  }

  // The syncs of a save, five, each one needed for "a crash leaves the
  // previous checkpoint listed and intact and the new one complete or
  // absent" under the Env's contract (a file's bytes are durable only after
  // its Sync; a create/rename only after SyncDir of its directory, in no
  // promised order before that):
  //   data fdatasync, index fdatasync  the bundle's bytes durable before any
  //                                    name points at them (else a listed
  //                                    bundle could hold garbage);
  //   SyncDir after the two renames    their names durable before the state
  //                                    file's rename, which could otherwise
  //                                    reach the disk first and list a
  //                                    bundle that is not there (with
  //                                    max_to_keep 1, no longer listing the
  //                                    previous one);
  //   state file fdatasync             its bytes durable before its rename
  //                                    (else an empty or torn state file);
  //   SyncDir after that rename        the save is durable when its ticket
  //                                    says so, and before step 3 deletes
  //                                    the oldest checkpoint.
  // (On a file system that commits one directory's renames in order, ext4's
  // and XFS's journals, the middle SyncDir would be redundant; the Env does
  // not promise that order, so it stays.) The re-save path below makes
  // three: the SyncDir and the state file's two.
  //
  // 1. The bundle, renamed into place and synced. A prefix that already holds
  // exactly these tensors (TF re-saves the restored step after a restart) is
  // kept as it is: rewriting it would open the window in which the new data
  // file sits next to the old index.
  if (BundleHolds(env, prefix, tensors)) {
    FOREMAN_LOG_INFO("{} already holds these values; not rewriting it", prefix);
    FOREMAN_RETURN_IF_ERROR(env->SyncDir(dir));   // its names durable before the state file names it
  } else {
    FOREMAN_ASSIGN_OR_RETURN(auto writer, BundleWriter::Create(env, prefix));
    for (const auto& [name, tensor] : tensors) FOREMAN_RETURN_IF_ERROR(writer->Add(name, tensor));
    FOREMAN_RETURN_IF_ERROR(writer->Finish());
  }

  // 2. The state file, replaced atomically.
  impl_->Record(prefix);
  CheckpointState state;
  state.model_checkpoint_path = prefix;
  for (const Saved& s : impl_->last_checkpoints) {
    state.all_model_checkpoint_paths.push_back(s.prefix);
    state.all_model_checkpoint_timestamps.push_back(s.time_secs);
  }
  // TF's CheckpointManager fields (B136), so that B132's schedule survives a
  // restart (RecoverLastCheckpoints with the state).
  state.last_preserved_timestamp = impl_->LastPreservedSecs();
  FOREMAN_RETURN_IF_ERROR(WriteCheckpointState(env, dir, state, latest_filename));

  // 3. Only then an old checkpoint goes.
  impl_->MaybeDeleteOldest();
  return prefix;
}

StatusOr<std::string> Saver::Save(const VariableStore& vars, const std::string& save_path,
                                  std::optional<int64_t> global_step, const std::string& latest_filename) {
  return Save(vars.Snapshot(), save_path, global_step, latest_filename);
}

Status Saver::Restore(const std::string& prefix, VariableStore* vars) const {
  std::map<std::string, std::string> identity;
  for (const std::string& name : vars->Names()) identity.emplace(name, name);
  return Restore(prefix, vars, identity);
}

Status Saver::Restore(const std::string& prefix, VariableStore* vars,
                      const std::map<std::string, std::string>& name_map) const {
  if (prefix.empty()) return absl::InvalidArgumentError("Can't load save_path when it is empty.");
  StatusOr<std::unique_ptr<BundleReader>> reader = BundleReader::Open(impl_->options.env, prefix);
  if (absl::IsNotFound(reader.status())) {
    return absl::InvalidArgumentError(absl::StrCat("The passed save_path is not a valid checkpoint: ", prefix));
  }
  FOREMAN_RETURN_IF_ERROR(reader.status());

  // Everything is read and checked before anything is assigned.
  const VariableStore& store = *vars;
  std::vector<std::pair<std::string, Tensor>> values;
  for (const auto& [var_name, ckpt_name] : name_map) {
    FOREMAN_ASSIGN_OR_RETURN(const Tensor* current, store.Get(var_name));
    StatusOr<BundleEntry> entry = (*reader)->GetEntry(ckpt_name);
    if (!entry.ok()) {
      return absl::NotFoundError(absl::StrCat(
          "Restoring from checkpoint failed: key '", ckpt_name, "' (variable '", var_name, "') not found in ",
          prefix, ". This is most likely due to a variable name or other graph key that is missing from "
          "the checkpoint; the checkpoint may have been written by a different model."));
    }
    if (entry->dtype != current->dtype() || entry->shape != current->shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Restoring from checkpoint ", prefix, " failed for variable '", var_name, "': expected ",
          DataTypeName(current->dtype()), current->shape().ToString(), ", checkpoint has ",
          DataTypeName(entry->dtype), entry->shape.ToString(),
          ckpt_name == var_name ? "" : absl::StrCat(" (key '", ckpt_name, "')")));
    }
    FOREMAN_ASSIGN_OR_RETURN(Tensor value, (*reader)->Lookup(ckpt_name));
    values.emplace_back(var_name, std::move(value));
  }
  for (const auto& [name, value] : values) FOREMAN_RETURN_IF_ERROR(vars->Assign(name, value));
  return absl::OkStatus();
}

void Saver::RecoverLastCheckpoints(const std::string& dir, const std::vector<std::string>& paths) {
  // TF takes the files' mtimes; the Env has none. A recovered checkpoint is
  // older than the saver, so time 0 ranks it the same way for B132.
  impl_->last_checkpoints.clear();
  for (const std::string& path : paths) {
    const std::string prefix = ResolveCheckpointPath(dir, path);
    if (impl_->options.env->FileExists(BundleIndexPath(prefix)).ok()) {
      impl_->last_checkpoints.push_back({prefix, 0.0});
    }
  }
}

void Saver::RecoverLastCheckpoints(const std::string& dir, const CheckpointState& state) {
  const std::vector<std::string>& paths = state.all_model_checkpoint_paths;
  const std::vector<double>& times = state.all_model_checkpoint_timestamps;
  if (times.size() != paths.size()) {   // an older state file, or TF's Saver's: no timestamps
    RecoverLastCheckpoints(dir, paths);
    return;
  }
  impl_->last_checkpoints.clear();
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const std::string prefix = ResolveCheckpointPath(dir, paths[i]);
    if (impl_->options.env->FileExists(BundleIndexPath(prefix)).ok()) {
      impl_->last_checkpoints.push_back({prefix, times[i]});
    }
  }
  // As TF's CheckpointManager (B142): the keep schedule goes on from the last
  // preserved time, clamped to now when the clock went backwards; 0 (not
  // written) keeps the schedule that started at the Saver's creation.
  if (state.last_preserved_timestamp > 0) {
    const double now = impl_->options.clock->WallSeconds();
    impl_->next_keep_time_secs = std::min(state.last_preserved_timestamp, now) + impl_->KeepIntervalSecs();
  }
}

std::vector<std::string> Saver::last_checkpoints() const {
  std::vector<std::string> out;
  for (const Saved& s : impl_->last_checkpoints) out.push_back(s.prefix);
  return out;
}

}  // namespace foreman
