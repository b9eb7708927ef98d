// Saving and restoring a VariableStore as TensorFlow V2 checkpoints, with
// TF's naming, its `checkpoint` state file and its retention rules.
// (TF: tf.compat.v1.train.Saver, checkpoint_management. Two departures: state
// file paths are written relative to the directory, and a missing, corrupt or
// dangling state file falls back to the newest checkpoint that verifies.)
//
// A checkpoint directory:
//   checkpoint                          CheckpointState, protobuf text format;
//                                       paths relative to the directory
//   model.ckpt-<step>.index / .data-00000-of-00001   one bundle per save
//   .foreman.lock                       taken by whoever owns the directory
//                                       for writing, via LockCheckpointDirectory
//
// One writer per directory: the runtime's checkpoint saver takes the lock
// with LockCheckpointDirectory(); a program using Saver directly should do
// the same. Saver itself takes no lock.
//
// Commit protocol of Saver::Save (a crash at any instant leaves the previous
// checkpoint listed and intact, and the new one complete or absent):
//   1. bundle data and index to temporary names, fsync, rename, fsync dir;
//   2. the state file replaced atomically (WriteFileAtomic);
//   3. only then the oldest checkpoint beyond max_to_keep is deleted.
// Re-saving a prefix that already exists (the same step again, e.g. TF's
// saver after a restart re-saves the restored step):
//   - when the existing bundle verifies and holds exactly the same tensors
//     (names, dtypes, shapes, bytes), step 1 is skipped: the bundle is not
//     rewritten, so a crash cannot damage it;
//   - otherwise the bundle is rewritten as above, and a crash between the two
//     renames of step 1 (data, then index) can leave the new data file next to
//     the old index: the previous contents of *that same prefix* may be lost.
//     Other checkpoints are untouched; LatestCheckpoint then falls
//     back to the newest other checkpoint that verifies, or reports DATA_LOSS
//     when none does — never a silent fresh start.
//
//   ```cpp
//   FOREMAN_RETURN_IF_ERROR(env->RecursivelyCreateDir("ckpt"));
//   FOREMAN_ASSIGN_OR_RETURN(auto saver, foreman::Saver::Create({}));
//   FOREMAN_ASSIGN_OR_RETURN(std::string prefix, saver->Save(vars, "ckpt/model.ckpt", step));
//   FOREMAN_ASSIGN_OR_RETURN(auto latest, foreman::LatestCheckpoint(env, "ckpt"));
//   if (latest) FOREMAN_RETURN_IF_ERROR(saver->Restore(*latest, &vars));
//   ```
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "foreman/clock.hpp"
#include "foreman/env.hpp"
#include "foreman/status.hpp"
#include "foreman/tensor.hpp"
#include "foreman/variable_store.hpp"

namespace foreman {

// -- the `checkpoint` state file -----------------------------------------------------

inline constexpr char kCheckpointStateFilename[] = "checkpoint";

struct CheckpointState {
  std::string model_checkpoint_path;                  // the latest
  std::vector<std::string> all_model_checkpoint_paths;   // oldest to newest
  std::vector<double> all_model_checkpoint_timestamps;   // optional; one per path, seconds since the epoch
  double last_preserved_timestamp = 0;                   // seconds since the epoch; 0: not set
};

/// Reads <dir>/<latest_filename>. Paths come back as written (relative or
/// absolute; as in TF, relative ones are relative to `dir` — use
/// ResolveCheckpointPath).
///   std::nullopt       no state file (as TF's None)
///   DATA_LOSS          the file does not parse (unlike TF, which warns
///                      and treats it as absent; we report it so callers fall
///                      back to scanning, see LatestCheckpoint)
///   INVALID_ARGUMENT   empty model_checkpoint_path, or timestamps whose count
///                      differs from the paths' (TF: ValueError)
StatusOr<std::optional<CheckpointState>> ReadCheckpointState(Env* env, const std::string& dir,
                                                             const std::string& latest_filename = "checkpoint");

/// Writes the state atomically (WriteFileAtomic). Paths under `dir` are
/// written relative to it, so a moved directory still restores; others as
/// given. The latest path is appended to all_model_checkpoint_paths if
/// missing (as TF).
Status WriteCheckpointState(Env* env, const std::string& dir, const CheckpointState& state,
                            const std::string& latest_filename = "checkpoint");

/// A state-file path made usable: relative paths are joined with `dir`,
/// absolute ones (TF writes those) are kept.
std::string ResolveCheckpointPath(const std::string& dir, const std::string& path);

/// TF's latest_checkpoint, made safe: the prefix to restore from `dir`, or
/// std::nullopt when the directory holds no checkpoint at all.
///   - The state file's latest path when its index and data exist and verify.
///   - Otherwise (state file missing, unparsable, dangling or corrupt) the
///     newest bundle in the directory (by global step in its name, then by
///     name) that verifies, with a warning naming what was bad.
///   - DATA_LOSS naming the directory and the bad files when bundles exist
///     (in the directory, or named by the state file anywhere) and none
///     verifies: never a silent fresh start.
StatusOr<std::optional<std::string>> LatestCheckpoint(Env* env, const std::string& dir,
                                                      const std::string& latest_filename = "checkpoint");

/// Every bundle prefix in `dir` (names ending in ".index"), oldest step first.
StatusOr<std::vector<std::string>> ListCheckpointPrefixes(Env* env, const std::string& dir);

// -- Saver -------------------------------------------------------------------------

struct SaverOptions {
  /// Checkpoints kept by the retention list; 0 keeps all (as TF, the state
  /// file then lists only the latest).
  int max_to_keep = 5;
  /// As TF: a checkpoint leaving the retention window is kept forever when it
  /// was saved after the next keep time (Saver creation + N h, advancing by
  /// N h per kept checkpoint). 10000 h = effectively off.
  double keep_checkpoint_every_n_hours = 10000.0;
  /// "-%08d" step suffix instead of "-%d".
  bool pad_step_number = false;
  Env* env = Env::Default();
  Clock* clock = Clock::Real();
};

class Saver {
 public:
  /// INVALID_ARGUMENT for max_to_keep < 0 or keep_checkpoint_every_n_hours <= 0.
  static StatusOr<std::unique_ptr<Saver>> Create(SaverOptions options);

  /// Saves `tensors` (name -> value) as the bundle "<save_path>-<global_step>"
  /// (or "<save_path>" without a step), updates the state file named
  /// `latest_filename` in save_path's directory, and applies retention (as
  /// TF: at most one deletion per save, failures logged and ignored). The
  /// state file also carries each listed checkpoint's save time
  /// (all_model_checkpoint_timestamps, seconds since the epoch from the
  /// clock) and last_preserved_timestamp (when the current
  /// keep_checkpoint_every_n_hours interval began), as TF's
  /// CheckpointManager writes them (TF's Saver does not).
  /// Returns the prefix. An existing bundle at the prefix holding exactly
  /// `tensors` is kept, not rewritten (see the commit protocol above).
  /// Takes no lock: see LockCheckpointDirectory.
  ///   INVALID_ARGUMENT  latest_filename with a '/', or a save path equal to the
  ///                     state file (TF: ValueError / RuntimeError)
  ///   NOT_FOUND         "Parent directory of <save_path> doesn't exist, can't save." (TF's message)
  ///   Env errors naming the file.
  StatusOr<std::string> Save(const std::map<std::string, Tensor>& tensors, const std::string& save_path,
                             std::optional<int64_t> global_step,
                             const std::string& latest_filename = "checkpoint");
  /// Save(vars.Snapshot(), ...).
  StatusOr<std::string> Save(const VariableStore& vars, const std::string& save_path,
                             std::optional<int64_t> global_step,
                             const std::string& latest_filename = "checkpoint");

  /// Restores every variable of `vars` from bundle `prefix` (TF: Saver.restore).
  ///   INVALID_ARGUMENT  "The passed save_path is not a valid checkpoint: <prefix>"
  ///   NOT_FOUND         a variable missing from the checkpoint (names both)
  ///   INVALID_ARGUMENT  dtype or shape mismatch (names the variable, expected, actual)
  ///   DATA_LOSS         a CRC mismatch (names file and variable)
  /// On error `vars` is unchanged (all tensors are read and checked first).
  Status Restore(const std::string& prefix, VariableStore* vars) const;

  /// Restores only the variables in `name_map` (variable name in `vars` ->
  /// name in the checkpoint), for checkpoints whose names differ (TF's
  /// var_list dict, e.g. TF2 "layer/kernel/.ATTRIBUTES/VARIABLE_VALUE").
  Status Restore(const std::string& prefix, VariableStore* vars,
                 const std::map<std::string, std::string>& name_map) const;

  /// TF's recover_last_checkpoints: seeds the retention list with `paths`
  /// (from a state file), dropping those whose files are gone, so
  /// max_to_keep continues across restarts. Paths are resolved against
  /// `dir`. Without their save times (TF reads mtimes; the Env has none)
  /// they count as saved before this Saver, and keep_checkpoint_every_n_hours
  /// counts from the Saver's creation. Not thread-safe with Save().
  void RecoverLastCheckpoints(const std::string& dir, const std::vector<std::string>& paths);
  /// The same from a whole state file (ReadCheckpointState of `dir`), as TF's
  /// set_last_checkpoints_with_time and CheckpointManager's restart:
  /// each path keeps its all_model_checkpoint_timestamps entry (seconds since
  /// the epoch), and a non-zero last_preserved_timestamp (clamped to the
  /// clock's now) restarts the keep_checkpoint_every_n_hours schedule, so a
  /// checkpoint that interval would keep is kept across a restart too.
  /// Timestamps missing or not one per path (older files, TF's Saver's):
  /// as the paths-only form. Not thread-safe with Save().
  void RecoverLastCheckpoints(const std::string& dir, const CheckpointState& state);

  /// The retention list, oldest first (prefixes, as returned by Save).
  std::vector<std::string> last_checkpoints() const;

 private:
  struct Impl;
  explicit Saver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;

 public:
  ~Saver();
};

// -- one writer per directory --------------------------------------------------------

/// Takes <dir>/.foreman.lock (creating `dir` if missing), for whoever owns the
/// directory for writing: the runtime's checkpoint saver does; a program that
/// uses Saver directly should hold it while saving (Saver does not lock).
/// The lock is released when the returned object is destroyed, or when the
/// process dies. Thread-safe.
///   FAILED_PRECONDITION  only when the lock is held (by another process, or by
///                        another lock object in this one): "checkpoint
///                        directory <dir> is in use by process <pid>"
///   INVALID_ARGUMENT     `dir` is empty, `dir` or one of its ancestors is not a
///                        directory, or <dir>/.foreman.lock is a directory
///   NOT_FOUND, PERMISSION_DENIED, RESOURCE_EXHAUSTED, INTERNAL, UNAVAILABLE
///                        `dir` cannot be created or the lock file cannot be
///                        opened or written: the Env's code, message
///                        "cannot create|lock the checkpoint directory <dir>: <why>"
StatusOr<std::unique_ptr<FileLock>> LockCheckpointDirectory(Env* env, const std::string& dir);

}  // namespace foreman
