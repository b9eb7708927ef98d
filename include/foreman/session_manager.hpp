// Scaffold, SessionManager and the session creators: how a session gets its
// variables (restore, or initialise) and when it is ready.
// (TF: tf.compat.v1.train.Scaffold, SessionManager, ChiefSessionCreator,
// WorkerSessionCreator, with TF's order of steps, defaults and messages.)
//
// Ops are functions on a Session. Defaults follow TF's Scaffold:
//   init_op                   initialize every global variable of the graph
//   ready_op                  report every uninitialized variable
//   ready_for_local_init_op   report every uninitialized global variable
//   local_init_op             initialize every local variable
//   summary_op                the graph's summary fetches (none: no op)
//   saver                     Saver(max_to_keep 5) on the config's env/clock
//
//   ```cpp
//   auto scaffold = std::make_shared<foreman::Scaffold>(graph);
//   foreman::ChiefSessionCreator creator(scaffold, "", config, "ckpt");
//   FOREMAN_ASSIGN_OR_RETURN(auto session, creator.create_session());
//   ```
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "foreman/checkpoint.hpp"
#include "foreman/graph.hpp"
#include "foreman/session.hpp"
#include "foreman/status.hpp"

namespace foreman {

/// Runs on a session (TF: an op run for its effect).
using SessionOp = std::function<Status(Session& session)>;
/// TF's init_op with init_feed_dict.
using InitOp = std::function<Status(Session& session, const TensorMap& feeds)>;
/// TF's ready ops: the names of what is not ready; empty means ready.
using ReadyOp = std::function<StatusOr<std::vector<std::string>>(Session& session)>;

class Scaffold;
/// Called as init_fn(scaffold, session), as TF wraps a Scaffold's init_fn.
using InitFn = std::function<Status(const Scaffold& scaffold, Session& session)>;

/// The default ops (TF's Scaffold defaults), for building your own around them.
InitOp DefaultInitOp();                  // global variables' initializers
SessionOp DefaultLocalInitOp();          // local variables' initializers (in a cluster, also
                                         // the task's own "/job:worker" variables that hold
                                         // no value: VariableDef::device)
ReadyOp DefaultReadyOp();                // every uninitialized variable
ReadyOp DefaultReadyForLocalInitOp();    // every uninitialized global variable (in a cluster,
                                         // those on the ps tasks)

struct ScaffoldOptions {
  InitOp init_op;
  TensorMap init_feed_dict;
  InitFn init_fn;
  ReadyOp ready_op;
  ReadyOp ready_for_local_init_op;
  SessionOp local_init_op;
  std::optional<std::vector<std::string>> summary_op;
  std::shared_ptr<Saver> saver;
};

/// TF's Scaffold. Pieces not given are filled by finalize(); a copy of a
/// Scaffold is TF's copy_from_scaffold.
class Scaffold {
 public:
  explicit Scaffold(std::shared_ptr<Graph> graph, ScaffoldOptions options = {});

  /// Fills missing pieces with the defaults (the saver on `config`'s
  /// env and clock), finalizes the graph. Idempotent. The default saver is
  /// shared by every Scaffold of the same graph while the graph lives (TF's
  /// SAVERS collection); given pieces are never shared (as TF: they are not
  /// added to the collections).
  Status finalize(const SessionConfig& config = {});
  bool finalized() const { return finalized_; }

  const std::shared_ptr<Graph>& graph() const { return graph_; }
  /// Empty until finalize() unless given (TF: None).
  const InitOp& init_op() const { return options_.init_op; }
  const TensorMap& init_feed_dict() const { return options_.init_feed_dict; }
  const InitFn& init_fn() const { return options_.init_fn; }
  const ReadyOp& ready_op() const { return options_.ready_op; }
  const ReadyOp& ready_for_local_init_op() const { return options_.ready_for_local_init_op; }
  const SessionOp& local_init_op() const { return options_.local_init_op; }
  /// Empty when the graph has no summary fetches (TF: summary_op None).
  const std::vector<std::string>& summary_op() const;
  const std::shared_ptr<Saver>& saver() const { return options_.saver; }

 private:
  std::shared_ptr<Graph> graph_;
  ScaffoldOptions options_;
  std::vector<std::string> summary_op_;
  bool finalized_ = false;
};

struct SessionManagerOptions {
  SessionOp local_init_op;
  /// Empty: always ready (TF: ready_op None).
  ReadyOp ready_op;
  ReadyOp ready_for_local_init_op;
  std::shared_ptr<Graph> graph;
  /// TF: recovery_wait_secs (30 s): between a worker's readiness polls and
  /// between checks for a checkpoint to appear. Unlike TF, configurable
  /// through MonitoredTrainingSession too.
  absl::Duration recovery_wait = absl::Seconds(30);
};

struct PrepareSessionOptions {
  InitOp init_op;
  std::shared_ptr<Saver> saver;
  /// At most one of the two (INVALID_ARGUMENT otherwise, TF's ValueError).
  std::string checkpoint_dir;
  std::string checkpoint_filename_with_path;
  bool wait_for_checkpoint = false;
  /// Measured on config.clock.
  absl::Duration max_wait = absl::Seconds(7200);
  /// config.env is where checkpoints are found and read (the saver's env
  /// too); config.clock times the waits.
  SessionConfig config;
  TensorMap init_feed_dict;
  /// Called as init_fn(session); the Scaffold wraps its own.
  std::function<Status(Session&)> init_fn;
};

class SessionManager {
 public:
  /// INVALID_ARGUMENT when ready_for_local_init_op is given without
  /// local_init_op. INVALID_ARGUMENT for a null graph.
  static StatusOr<std::unique_ptr<SessionManager>> Create(SessionManagerOptions options);

  /// TF's prepare_session: creates a session on `master`; restores (the
  /// exact prefix, or the newest checkpoint of checkpoint_dir that verifies,
  /// see LatestCheckpoint, waiting for one when asked) and then rebuilds the
  /// saver's retention list; otherwise runs init_op then init_fn (neither
  /// runs after a restore); then local init and the ready check. Errors:
  ///   INVALID_ARGUMENT     both checkpoint locations
  ///   FAILED_PRECONDITION  "Model is not initialized and no init_op or
  ///                        init_fn or local_init_op was given";
  ///                        "Init operations did not make model ready for
  ///                        local_init.  ..." / "Init operations did not
  ///                        make model ready.  ..." (TF's text)
  ///   DATA_LOSS            checkpoint files exist and none verifies
  ///   INVALID_ARGUMENT     "The passed save_path is not a valid checkpoint:
  ///                        <prefix>" (checkpoint_filename_with_path)
  ///   NOT_FOUND            a global variable of the graph is missing from
  ///                        the checkpoint (Saver::Restore's message)
  ///   the restore's, init op's and Session::Create's errors
  /// Restoring creates the graph's global variables in the session with the
  /// checkpoint's dtypes and shapes (a value the session already holds must
  /// match) and restores them all at once; local variables are left to
  /// local_init_op. Logs "Restoring parameters from <prefix>" as TF does.
  /// After a restore from checkpoint_dir the retention list comes from the
  /// state file (TF: recover_last_checkpoints); an unreadable state file is
  /// logged, not an error.
  /// Unlike TF, on a cluster session (a `master` whose variables live on ps
  /// tasks: the chief) the latest checkpoint of checkpoint_dir is not
  /// restored onto ps tasks that are all initialized at a global_step >= the
  /// checkpoint's (a chief restart does not rewind the ps; TF1 would lose
  /// the updates since the checkpoint): only the
  /// task's own "/job:worker" variables (Graph::SetVariableDevice) are
  /// restored, into the session, nothing is written to the ps tasks, and it
  /// logs "re-attached to the ps at global_step N (latest checkpoint M): not
  /// restoring <prefix>"; it counts as restored (no init op). A ps task that
  /// is uninitialized or behind, a graph or checkpoint without global_step,
  /// or checkpoint_filename_with_path: everything is restored as TF does.
  /// The check costs one read of the ps tasks (its UNAVAILABLE is returned).
  /// recover_session does the same. Nor, unlike TF, does a chief with no
  /// checkpoint to restore (none in checkpoint_dir) run init_op or init_fn
  /// on ps tasks that all hold its cluster job's variables and training
  /// (restored, or updated since their init op): it logs a WARNING "No
  /// checkpoint to restore in <dir>, but the ps tasks hold the variables of
  /// cluster job 'J' (global_step N): re-attaching ..." and leaves its own
  /// "/job:worker" variables to local_init_op; when some ps tasks of its
  /// job hold training and others nothing, FAILED_PRECONDITION naming one
  /// of each (nothing to restore the empty ones from; an init op would wipe
  /// the others). A ps task refuses an init op while it holds training
  /// (FAILED_PRECONDITION): only a restore replaces a running job's
  /// training; an init op's values no update followed are initialised
  /// again (a half-done init retried). The check costs one stats request per ps task. A ps task of
  /// another job: the init op runs and that task refuses it (naming both
  /// job ids). Single-process sessions are unchanged.
  StatusOr<std::unique_ptr<Session>> prepare_session(const std::string& master, PrepareSessionOptions options);

  /// TF's recover_session: like prepare_session without initialising: `initialized` is false
  /// when nothing was restored or local init / ready failed (logged).
  struct Recovered {
    std::unique_ptr<Session> session;
    bool initialized = false;
  };
  StatusOr<Recovered> recover_session(const std::string& master, std::shared_ptr<Saver> saver,
                                      const std::string& checkpoint_dir,
                                      const std::string& checkpoint_filename_with_path = "",
                                      bool wait_for_checkpoint = false,
                                      absl::Duration max_wait = absl::Seconds(7200),
                                      const SessionConfig& config = {});

  /// TF's wait_for_session: polls until the model is ready (local init where possible),
  /// every recovery_wait on config.clock, the first poll at once; a worker
  /// never initialises global variables. std::nullopt max_wait waits forever.
  /// DEADLINE_EXCEEDED "Session was not ready after waiting N secs." when the
  /// remaining time minus recovery_wait is negative after a failed poll.
  /// Logs "Waiting for model to be ready. Ready_for_local_init_op: ..., ready:
  /// ..." per failed poll.
  StatusOr<std::unique_ptr<Session>> wait_for_session(const std::string& master, const SessionConfig& config = {},
                                                      std::optional<absl::Duration> max_wait = std::nullopt);

  /// Readiness polls made by wait_for_session so far (for tests). May be
  /// read while wait_for_session runs on another thread.
  int64_t ready_polls() const { return ready_polls_.load(std::memory_order_relaxed); }

 private:
  explicit SessionManager(SessionManagerOptions options);

  struct Restored {
    std::unique_ptr<Session> session;
    bool restored = false;
  };
  /// TF's _restore_checkpoint: a new session, restored when possible.
  StatusOr<Restored> RestoreCheckpoint(const std::string& master, const std::shared_ptr<Saver>& saver,
                                       const std::string& checkpoint_dir,
                                       const std::string& checkpoint_filename_with_path, bool wait_for_checkpoint,
                                       absl::Duration max_wait, const SessionConfig& config);
  /// TF's _try_run_local_init_op: std::nullopt on success (or no
  /// local_init_op), else why the model is not ready for it.
  StatusOr<std::optional<std::string>> TryRunLocalInitOp(Session& session);
  /// TF's _model_ready: std::nullopt when ready.
  StatusOr<std::optional<std::string>> ModelReady(Session& session);

  SessionManagerOptions options_;
  std::atomic<int64_t> ready_polls_{0};
  // The lines a recovery loop would repeat at its poll rate ("Waiting for
  // model to be ready", "Restoring parameters from"): each logged once,
  // then again on a change or 10 s later.
  struct RepeatedLogs;
  std::shared_ptr<RepeatedLogs> repeated_logs_;
};

/// Makes raw sessions for a MonitoredSession (TF: SessionCreator). Called
/// again on every recovery.
class SessionCreator {
 public:
  virtual ~SessionCreator() = default;
  virtual StatusOr<std::unique_ptr<Session>> create_session() = 0;
  /// The scaffold whose ops and saver the sessions use.
  virtual const std::shared_ptr<Scaffold>& scaffold() const = 0;
  virtual const SessionConfig& config() const = 0;
  /// The target its sessions are created on ("" when unknown, the default).
  /// Not in TF: a MonitoredSession learns a cluster target's ps wait
  /// (ClusterOptions::ps_wait_secs) from it before the first session, so a
  /// worker started before its ps tasks waits for them as a recovery would.
  virtual const std::string& master() const;
};

/// TF's ChiefSessionCreator: prepare_session with the scaffold's ops; restores from
/// checkpoint_dir (or the exact checkpoint_filename_with_path).
class ChiefSessionCreator : public SessionCreator {
 public:
  explicit ChiefSessionCreator(std::shared_ptr<Scaffold> scaffold, std::string master = "",
                               SessionConfig config = {}, std::string checkpoint_dir = "",
                               std::string checkpoint_filename_with_path = "");
  StatusOr<std::unique_ptr<Session>> create_session() override;
  const std::shared_ptr<Scaffold>& scaffold() const override { return scaffold_; }
  const SessionConfig& config() const override { return config_; }
  const std::string& master() const override { return master_; }

 private:
  std::shared_ptr<Scaffold> scaffold_;
  std::string master_;
  SessionConfig config_;
  std::string checkpoint_dir_;
  std::string checkpoint_filename_with_path_;
  std::unique_ptr<SessionManager> session_manager_;
};

/// TF's WorkerSessionCreator: wait_for_session with max_wait (TF default 30 min).
class WorkerSessionCreator : public SessionCreator {
 public:
  explicit WorkerSessionCreator(std::shared_ptr<Scaffold> scaffold, std::string master = "",
                                SessionConfig config = {}, absl::Duration max_wait = absl::Minutes(30),
                                absl::Duration recovery_wait = absl::Seconds(30));
  StatusOr<std::unique_ptr<Session>> create_session() override;
  const std::shared_ptr<Scaffold>& scaffold() const override { return scaffold_; }
  const SessionConfig& config() const override { return config_; }
  const std::string& master() const override { return master_; }
  /// The SessionManager once built (after the first create_session).
  const SessionManager* session_manager() const { return session_manager_.get(); }

 private:
  std::shared_ptr<Scaffold> scaffold_;
  std::string master_;
  SessionConfig config_;
  absl::Duration max_wait_;
  absl::Duration recovery_wait_;
  std::unique_ptr<SessionManager> session_manager_;
};

}  // namespace foreman
