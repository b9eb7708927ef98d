// The run directory: the one directory a training run owns (TF Estimator's
// model_dir, MonitoredTrainingSession's checkpoint_dir) and the rules that
// keep two runs, or two programs, from mixing there:
//   - one process at a time: OpenRunDirectory takes <dir>/.foreman.lock
//     (LockCheckpointDirectory) and the object holds it; AttachTo hands it to
//     MonitoredTrainingSession (RuntimeOptions::held_lock), so the directory
//     is never unlocked between the program's checks and the end of its run;
//   - a refused start leaves nothing behind: Undo() removes what opening
//     created (the lock file, missing directories) until Commit();
//   - the run's settings are stored in a text file (train_settings.txt), one
//     `key = value` line each, written atomically, so that the same command
//     resumes the same run;
//   - what a run restores is chosen by rules that never silently train again
//     from step 0 (CheckpointToRestore), and a checkpoint that does not hold
//     the program's model is refused before training (CheckCheckpointMatches).
//
//   ```cpp
//   #include "foreman/monitored_session.hpp"
//   #include "foreman/run_directory.hpp"
//   FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<foreman::RunDirectory> dir,
//                            foreman::OpenRunDirectory("run_dir"));
//   FOREMAN_ASSIGN_OR_RETURN(std::optional<foreman::RunSettings> stored, dir->ReadSettings({"lr"}));
//   FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> restore, dir->CheckpointToRestore());
//   // ... build the graph; if `restore`, dir->CheckCheckpointMatches(*restore, *graph) ...
//   // (a refusal before Commit(): call dir->Undo() first -- dropping an
//   // uncommitted RunDirectory leaves what OpenRunDirectory made)
//   if (!dir->Commit()) return absl::CancelledError("undone");  // from here on the files stay
//   FOREMAN_RETURN_IF_ERROR(dir->WriteSettings({{"lr", stored ? stored->at("lr") : "0.1"}}));
//   foreman::MonitoredTrainingSessionOptions opts;
//   opts.graph = graph;
//   dir->AttachTo(opts);  // checkpoint_dir, the held lock, the Env
//   FOREMAN_ASSIGN_OR_RETURN(auto sess, foreman::MonitoredTrainingSession(std::move(opts)));
//   FOREMAN_RETURN_IF_ERROR(sess->close());
//   ```
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "foreman/env.hpp"
#include "foreman/mutex.hpp"
#include "foreman/status.hpp"

namespace foreman {

class Graph;
struct MonitoredTrainingSessionOptions;

/// A run's stored settings: key -> value (both without surrounding
/// whitespace; keys without '=').
using RunSettings = std::map<std::string, std::string>;

/// The settings file's name in a run directory (RunDirectoryOptions'
/// default).
inline constexpr char kRunSettingsFile[] = "train_settings.txt";

struct RunDirectoryOptions {
  /// The file system (nullptr: Env::Default()); not owned, outlives the
  /// RunDirectory. The lock and Undo() always use this one (see set_env).
  Env* env = nullptr;
  /// The settings file, a name inside the directory (no '/'; OpenRunDirectory
  /// refuses another with INVALID_ARGUMENT).
  std::string settings_file = kRunSettingsFile;
  /// Who writes runs here and how its user names another directory: the
  /// refusals say "... checkpoints that <program> did not write ...: use
  /// another <directory_flag>".
  std::string program = "foreman train";
  std::string directory_flag = "--checkpoint-dir";
};

/// An open run directory, holding its lock. Create with OpenRunDirectory.
/// Undo() and Commit() are thread-safe (a signal handler's thread may undo a
/// start the main thread is still preparing); the other methods are called
/// by one thread at a time.
class RunDirectory {
 public:
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  /// The directory as given to OpenRunDirectory (named so in every message).
  const std::string& path() const { return path_; }
  /// <path>/<settings_file>.
  std::string settings_path() const;
  /// The Env the directory's files are read and written through.
  Env* env() const { return env_; }
  /// Reads and writes the directory's files through `env` from now on (for
  /// example a FaultyEnv over the one given to OpenRunDirectory, armed once
  /// the lock is held); the lock and Undo() keep the original Env. Not
  /// owned; outlives this object.
  void set_env(Env* env) { env_ = env; }

  /// The directory's lock, held until this object and every session it was
  /// handed to (AttachTo) are gone.
  const std::shared_ptr<FileLock>& lock() const { return lock_; }
  /// Points `options` at this directory: checkpoint_dir = path(), the held
  /// lock (runtime.held_lock, runtime.held_lock_directory) and config.env =
  /// env(). The session's checkpoint saver then uses this lock instead of
  /// locking the directory again.
  void AttachTo(MonitoredTrainingSessionOptions& options) const;

  /// Reads the settings file: nullopt when it does not exist (a fresh run
  /// directory; afterwards resuming() is false), else its `key = value`
  /// lines (blank lines and lines starting with '#' skipped; resuming() is
  /// then true).
  ///   INVALID_ARGUMENT  "<file>:<line>: expected 'key = value', found
  ///                     '<line>'"; "<file>:<line>: '<key>' given twice";
  ///                     "<file>: missing '<key>'" for the first key of
  ///                     `required_keys` it lacks
  ///   the Env's error for a file that exists but cannot be read (never
  ///   taken for a missing one)
  StatusOr<std::optional<RunSettings>> ReadSettings(const std::vector<std::string>& required_keys = {});
  /// Whether ReadSettings found a settings file: the directory holds a run
  /// this program wrote, which it resumes.
  bool resuming() const { return resuming_; }

  /// Replaces the settings file with `settings`, one "key = value" line
  /// each in key order after `comment` (its lines written as they are; it
  /// should start each with '#' and end with '\n'), like a checkpoint: a
  /// temporary file, synced, renamed, the directory synced. On failure the
  /// temporary file is removed and the previous settings file is intact.
  /// INVALID_ARGUMENT, before anything is written, for a setting that would
  /// not read back as written: an empty key, or one with '=', a line break,
  /// a leading '#' or surrounding blanks; a value with a line break or
  /// surrounding blanks. The Env's errors.
  Status WriteSettings(const RunSettings& settings, const std::string& comment = "") const;

  /// The checkpoint a run in this directory restores (a checkpoint prefix),
  /// or nullopt to start at step 0, by these rules:
  ///   - settings stored (resuming()): the newest checkpoint whose index and
  ///     data verify (LatestCheckpoint; each bad one is named in a WARNING);
  ///     none and no `checkpoint` state file: nullopt (stopped before its
  ///     first checkpoint). Refused (never trained again from step 0):
  ///       DATA_LOSS            checkpoints exist and none verifies:
  ///                            LatestCheckpoint's message, then "; to start
  ///                            fresh on purpose, remove <dir> or use another
  ///                            <directory_flag>"
  ///       FAILED_PRECONDITION  a state file whose checkpoints are all gone, or
  ///                            that cannot be read with none left: "<dir>
  ///                            holds a run (<settings_file>) but the
  ///                            checkpoints its state file <file> names are
  ///                            gone (missing: <index files>): resuming would
  ///                            train again from step 0; to start fresh ..."
  ///   - no settings: nullopt. Refused:
  ///       FAILED_PRECONDITION  a `checkpoint` state file or model.ckpt-*
  ///                            files: "<dir> holds checkpoints that <program>
  ///                            did not write (no <settings_file>): use
  ///                            another <directory_flag>"
  /// Otherwise the Env's error when the directory cannot be read.
  /// `refused`, when not null, is set to whether an error is one of the
  /// refusals above (the directory was read and holds what a run must not
  /// start from) rather than the directory not being readable.
  /// REQUIRES: ReadSettings() returned OK (FAILED_PRECONDITION otherwise).
  StatusOr<std::optional<std::string>> CheckpointToRestore(bool* refused = nullptr) const;

  /// The checkpoint `prefix` must hold every global variable of `graph`
  /// with its dtype and shape (a replaced or hand-edited settings file
  /// would otherwise fail in the middle of training). FAILED_PRECONDITION
  /// "<prefix> has no variable '<name>' of this model: it holds another run;
  /// use another <directory_flag>", or "<prefix> holds '<name>' as <dtype>
  /// <shape>, this model needs <dtype> <shape> (<settings_file> does not
  /// describe these checkpoints); use another <directory_flag>"; a variable's
  /// initializer's error. OK when the checkpoint cannot be opened (the
  /// restore then reports it).
  Status CheckCheckpointMatches(const std::string& prefix, const Graph& graph) const;

  /// From now on the run's files stay (training starts): Undo() does
  /// nothing. False when Undo() came first (the start was refused, for
  /// example by a signal). Thread-safe.
  bool Commit();
  /// Removes what OpenRunDirectory created, while the lock is still held:
  /// the lock file when it did not exist before, then each directory it
  /// created (deepest first), only while empty. A directory that did not
  /// exist is gone again; one that existed is left as it was. Nothing after
  /// Commit(); idempotent. Thread-safe. Destroying a RunDirectory neither
  /// commits nor undoes: it releases the lock and leaves the files as they
  /// are, so a program that refuses to start calls Undo() itself (as
  /// `foreman train` does).
  void Undo();

 private:
  friend StatusOr<std::unique_ptr<RunDirectory>> OpenRunDirectory(const std::string& dir,
                                                                   const RunDirectoryOptions& options);
  RunDirectory(std::string path, RunDirectoryOptions options);
  Status Lock();
  void UndoLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const RunDirectoryOptions options_;
  Env* const base_env_;  // the lock's and Undo()'s
  Env* env_;
  std::shared_ptr<FileLock> lock_;
  bool read_settings_ = false;
  bool resuming_ = false;

  mutable Mutex mu_;
  bool committed_ ABSL_GUARDED_BY(mu_) = false;
  bool undone_ ABSL_GUARDED_BY(mu_) = false;
  std::string created_lock_file_ ABSL_GUARDED_BY(mu_);          // empty: it existed before
  std::vector<std::string> created_dirs_ ABSL_GUARDED_BY(mu_);  // deepest first
};

/// Opens `dir` for one run: takes its lock (LockCheckpointDirectory: creates
/// `dir` and missing ancestors, then <dir>/.foreman.lock) before anything
/// in it is read or written, remembering what did not exist so that Undo()
/// can remove it. Nothing else is read: call ReadSettings() next.
///   FAILED_PRECONDITION  the lock is held, by another process or another
///                        lock object in this one: "checkpoint directory
///                        <dir> is in use by process <pid>"
///   and LockCheckpointDirectory's other errors (INVALID_ARGUMENT for an
///   empty `dir` or a path through a file, the Env's codes for a directory
///   that cannot be created). A refused open removes the directories it
///   created. Thread-safe.
StatusOr<std::unique_ptr<RunDirectory>> OpenRunDirectory(const std::string& dir,
                                                         const RunDirectoryOptions& options = {});

}  // namespace foreman
