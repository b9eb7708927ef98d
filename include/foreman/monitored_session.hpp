// MonitoredSession, SingularMonitoredSession and MonitoredTrainingSession:
// a training loop wrapped in hooks, a coordinator and recovery.
// (TF: tf.compat.v1.train.MonitoredSession & co., with TF's call order,
// defaults and messages; where Foreman departs from TF, the comment says so.)
//
//   ```cpp
//   foreman::MonitoredTrainingSessionOptions opts;
//   opts.graph = graph;                        // variables + step function
//   opts.checkpoint_dir = "train_dir";
//   opts.hooks = {stop_at_step_hook};          // hooks.hpp: StopAtStepHook
//   FOREMAN_ASSIGN_OR_RETURN(auto sess, foreman::MonitoredTrainingSession(std::move(opts)));
//   while (!sess->should_stop()) {
//     auto out = sess->run({"train_op", "loss"});
//     if (!out.ok()) break;                    // the error is close()'s too
//   }
//   FOREMAN_RETURN_IF_ERROR(sess->close());    // TF's `with` exit: OK after a
//                                              // clean stop (OUT_OF_RANGE, a
//                                              // hook's request_stop), else
//                                              // the first error
//   ```
//
// TF's wrapper stack (_RecoverableSession, _CoordinatedSession,
// _HookedSession) is one object here, with the same behaviour:
//   recovery     (MonitoredSession only) ABORTED / UNAVAILABLE from run(),
//                after_create_session or the step: close, re-create via the
//                creator (after_create_session again), restore the latest
//                checkpoint, re-run the same call; bounded (unlike TF, see
//                RecoveryOptions).
//   coordination a fresh Coordinator per created session, with no
//                clean-stop codes; services report to it.
//   hooks        before_run / after_run with merged fetches and feeds.
//
// Every hook callback and the step run on the thread that calls run() (the
// training thread). Services (checkpoint saver, summary writers, step
// counter) are actors in a supervision tree owned by the session; an
// ordinary run() never waits for them. Not thread-safe: one thread uses a
// session; should_stop() may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "foreman/coordinator.hpp"
#include "foreman/hooks.hpp"
#include "foreman/input_pipeline.hpp"
#include "foreman/restart_policy.hpp"
#include "foreman/session.hpp"
#include "foreman/session_manager.hpp"
#include "foreman/status.hpp"
#include "foreman/stop.hpp"

namespace caf {
class actor_system;
}

namespace foreman {

/// What one recovery cost (MonitoredSession only; TF reports none of this).
/// Consecutive recoveries with no successful step between them (a new
/// session that failed again) are one report; `recoveries` counts them.
/// Durations are on the session config's Clock.
struct RecoveryReport {
  /// The preemption error recovered from (ABORTED / UNAVAILABLE).
  Status cause;
  /// Recoveries this report covers (>= 1).
  int64_t recoveries = 0;
  /// From the failure's return (the step's, a hook's, the creator's, or the
  /// run that found a thread's preemption error on the coordinator) to the
  /// decision to recover.
  absl::Duration detect;
  /// From that decision to the restored session (after_create_session of
  /// every hook done): pending saves, closing the old session, the back-off
  /// and the restore.
  absl::Duration restore;
  /// From the restored session to the end of the first successful step on
  /// it; std::nullopt when training ended before one (a stop during the
  /// recovery, another error).
  std::optional<absl::Duration> next_good_step;
  /// global_step before the error and after the restore (-1 when unknown),
  /// and the global steps lost (before - restored, >= 0).
  int64_t global_step_before = -1;
  int64_t restored_global_step = -1;
  int64_t steps_lost = 0;
};

/// Bounded recovery with exponential back-off and jitter (TF retries
/// forever, at once). A session on a cluster's target (tcp://, tls://)
/// waits for an unreachable ps task instead, as ClusterOptions::ps_wait_secs
/// says (one recovery, retried every heartbeat, no back-off).
struct RecoveryOptions {
  /// At most this many recoveries within `window`; the next preemption error
  /// is returned (ABORTED / UNAVAILABLE) and training stops.
  int max_recoveries = 10;
  absl::Duration window = absl::Seconds(600);
  /// Back-off before re-creating: initial * 2^(k-1) for the k-th recovery in
  /// the window, capped at `max_backoff`, times a jitter in [0.5, 1.5)
  /// drawn from `seed`. Waits on the config's Clock.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(30);
  uint64_t seed = 0;
  /// TF's behaviour, for parity tests: recover forever, no back-off.
  bool unbounded = false;
  /// Called once per RecoveryReport, on the training thread: after the
  /// first successful step following the recovery, or by close() when
  /// training ended before one. Must be quick and must not call back into
  /// the session; an exception it throws is logged and dropped. Empty: no
  /// report is built. (The actor API sends it to subscribers as Recovered.)
  std::function<void(const RecoveryReport&)> on_recovered;
  /// When not empty, each RecoveryReport is also written as one Summary into
  /// this logdir's event file (its summary_writer actor), with the float
  /// scalars
  ///   recovery/detect_secs, recovery/restore_secs,
  ///   recovery/next_good_step_secs (only when measured),
  ///   recovery/steps_lost, recovery/recoveries,
  /// at the global_step after the first good step on the restored session
  /// (when training ended before one: restored_global_step, 0 when
  /// unknown). It is written when the report is complete (the same moment
  /// as on_recovered), after the SessionLog START a SummarySaverHook writes
  /// at that step, so TensorBoard's purge at that START keeps it, and a
  /// later recovery to the same checkpoint purges it with the rest of the
  /// abandoned steps (each step's value appears once). MonitoredTrainingSession
  /// sets it to the chief's summary_dir when the chief writes summaries or
  /// step counts there and this is empty. A writer that cannot be created is
  /// logged (WARNING) and the summary dropped; training goes on.
  std::string summary_dir;
};

/// Where a MonitoredSession's service actors live, and what outlives one
/// session: the stop request and a checkpoint-directory lock the caller holds.
struct RuntimeOptions {
  /// The caller's actor system, or nullptr: the actors then live in the
  /// process's one actor system, which Foreman creates on first use
  /// (config.actor_threads scheduler threads when it creates it) and shares
  /// with every other session and input pipeline of the process. Never a
  /// hidden second system when one is given. Not owned; must outlive the
  /// session.
  caf::actor_system* actor_system = nullptr;
  /// Bound (real time) on shutting the service actors down at close() and
  /// on waiting for pending saves before a recovery restores.
  absl::Duration shutdown_timeout = absl::Seconds(60);
  /// The run's stop request (see foreman/stop.hpp): a caller that must be
  /// able to stop the run before the session exists (a signal handler that
  /// starts with the process) creates it and passes it here. Its
  /// StopRequestOptions::grace_period is then the run's one stop grace
  /// period: leave the session options' stop_grace_period_secs unset (or set
  /// it to the same value; a different one is INVALID_ARGUMENT at creation).
  /// nullptr: the session makes its own, with stop_grace_period_secs (unset:
  /// 120 s) as its grace period.
  std::shared_ptr<StopRequest> stop;
  /// A lock the caller already holds on `held_lock_directory`
  /// (LockCheckpointDirectory). The checkpoint saver of that directory uses
  /// it instead of locking the directory again, so that the directory is
  /// never unlocked between the caller's own checks and the end of the run.
  /// The session keeps a reference until close(); the caller's reference
  /// keeps the lock after that.
  std::shared_ptr<FileLock> held_lock;
  std::string held_lock_directory;
  /// How the service actors are restarted (restart_policy.hpp; OTP's
  /// supervisor flags). The default is TF's: a failing service ends the
  /// run. Checked by Create (INVALID_ARGUMENT, ValidateRestartPolicy).
  RestartPolicy restart;
};

struct MonitoredSessionOptions {
  /// As TF, the default is a ChiefSessionCreator over a default Scaffold of `graph`
  /// (no checkpoint_dir: never restores). One of the two is required.
  std::shared_ptr<SessionCreator> session_creator;
  std::shared_ptr<Graph> graph;
  HookList hooks;
  /// The stop grace period, in seconds (TF's stop_grace_period_secs, whose
  /// default this keeps), for the StopRequest the session makes when
  /// runtime.stop is nullptr; unset: 120. With a runtime.stop passed in, that
  /// StopRequest's grace_period is the one setting: unset here takes it, and
  /// a value that differs from it is INVALID_ARGUMENT at creation
  /// ("stop_grace_period_secs=5 but RuntimeOptions::stop's grace period is
  /// 120 s; set one"). The grace period bounds the stop (see request_stop()).
  std::optional<double> stop_grace_period_secs;
  RecoveryOptions recovery;
  RuntimeOptions runtime;
};

/// What run_step_fn's function gets (TF: MonitoredSession.StepContext).
class MonitoredStepContext {
 public:
  /// The raw session: runs without hooks.
  Session* session() const { return session_; }
  /// Runs with hooks, like MonitoredSession::run.
  StatusOr<TensorMap> run_with_hooks(const std::vector<std::string>& fetches, const TensorMap& feeds = {},
                                     const RunOptions& options = {});
  /// Ends training cleanly after this step (TF raises StopIteration).
  void request_stop() { stop_requested_ = true; }
  bool stop_requested() const { return stop_requested_; }

  MonitoredStepContext(class MonitoredSession* owner, Session* session) : owner_(owner), session_(session) {}

 private:
  class MonitoredSession* owner_;
  Session* session_;
  bool stop_requested_ = false;
};

using StepCallable = std::function<Status(MonitoredStepContext& ctx)>;

class MonitoredSession {
 public:
  /// As TF: hooks' begin() in order, session creation (creator), a fresh
  /// Coordinator, hooks' after_create_session() in order. On error every
  /// actor and thread started is shut down and the error is returned
  /// (a preemption error during creation is retried as RecoveryOptions say).
  static StatusOr<std::unique_ptr<MonitoredSession>> Create(MonitoredSessionOptions options);
  /// Closes if not closed (errors logged).
  virtual ~MonitoredSession();
  MonitoredSession(const MonitoredSession&) = delete;
  MonitoredSession& operator=(const MonitoredSession&) = delete;

  /// One hooked run (TF's order); returns the caller's fetches.
  ///   FAILED_PRECONDITION "Run called even after should_stop requested." (TF's message)
  ///   FAILED_PRECONDITION after close()
  ///   OUT_OF_RANGE        the step's end of input: training ends cleanly
  ///                       (should_stop() is then true; close() returns OK)
  ///   INVALID_ARGUMENT    "Same tensor is fed by two hooks. Conflict(s): ..."
  ///                       / "Same tensor is fed by a SessionRunHook and user. ..."
  ///                       (TF's messages)
  ///   any other error of the step or a hook: training ends with it (later
  ///   run() calls are FAILED_PRECONDITION, should_stop() is true); close()
  ///   returns it too (or an earlier error a service reported).
  /// ABORTED / UNAVAILABLE are recovered from (see RecoveryOptions; MonitoredSession
  /// only): each recovery is logged as a WARNING with the steps it lost;
  /// once max_recoveries within the window are spent the error is returned.
  StatusOr<TensorMap> run(const std::vector<std::string>& fetches, const TensorMap& feeds = {},
                          const RunOptions& options = {}, RunMetadata* run_metadata = nullptr);

  /// TF's run_step_fn: runs `step_fn` with a MonitoredStepContext; a preemption error
  /// inside re-runs the whole function on a new session (MonitoredSession).
  /// ctx.request_stop() is a clean stop.
  Status run_step_fn(const StepCallable& step_fn);

  /// True when the hooks asked to stop, the coordinator was asked (a service
  /// failed, or a clean stop), a run() / run_step_fn() ended training (a
  /// clean stop or an error), or the session is closed. Never blocks. In a
  /// MonitoredSession a preemption error reported to the coordinator does not
  /// count: the next run() recovers from it (as TF).
  bool should_stop() const;

  /// After a clean stop (or none) calls every
  /// hook's end() (final checkpoint, summary flush; as in TF, a failing end()
  /// skips the later hooks' end() but not the rest of close); then stops the
  /// coordinator and joins it with what is left of the stop grace period
  /// (all of it when no stop was requested), shuts the service
  /// actors down (bounded) and closes the raw session. Returns OK after a
  /// clean stop, else the first error (a step's, a hook's, a service's). As
  /// TF, no end() after an error. Unlike TF (which raises), a second close()
  /// returns the first one's status and calls no hook.
  Status close();

  /// Asks the run to stop, from any thread, at any moment: before the first
  /// run() (then no step runs), during a step (it ends at the step's
  /// boundary), during a recovery (the new session is still created and
  /// restored, then the run() in progress returns CANCELLED "stop requested
  /// ...: no step ran" without running a step — a clean end, not an error),
  /// or after close() (ignored). It holds for every session this object
  /// creates afterwards, and the current coordinator is stopped with it.
  ///   OK (a clean stop): should_stop() becomes true; close() calls every
  ///     hook's end(), so the CheckpointSaverHook writes the final checkpoint,
  ///     and returns OK.
  ///   an error: an abort: training ends with it as with a failed step —
  ///     close() calls no end() (no final checkpoint) and returns it.
  /// The first request wins. It starts the stop grace period (the
  /// StopRequest's grace_period: the one passed in RuntimeOptions::stop, or
  /// the session's own, made with stop_grace_period_secs): close() completes
  /// the stop once every end() has run; until then the same deadline bounds
  /// the coordinator's join. Non-blocking
  /// and thread-safe (TF: Coordinator.request_stop, but surviving the
  /// re-creation of the coordinator that a recovery does). The session object
  /// must outlive the call; a thread that may outlive the session keeps
  /// stop_request() (shared) and calls its request_stop() instead.
  void request_stop(const Status& status = absl::OkStatus());

  /// The stop request this session obeys (RuntimeOptions::stop, or its own).
  /// Never null; shared, so it may outlive the session.
  const std::shared_ptr<StopRequest>& stop_request() const;

  /// Recoveries so far and the global steps they lost.
  int64_t recoveries() const;
  int64_t steps_lost() const;

  /// Every restart or removal of a service actor so far, in order
  /// (RuntimeOptions::restart; empty under TF's default policy, where a
  /// failing service ends the run). Also after close(). Thread-safe.
  std::vector<ServiceRestart> service_restarts() const;

  /// An input pipeline (TF: a tf.data prefetching iterator) whose producer
  /// actor is one of this session's services: a child of its
  /// session_supervisor, service kind "input_pipeline", named
  /// "input_pipeline(<k>)" (k: 1 for the session's first pipeline). It is a
  /// member of the session, not a free function next to
  /// data::InputPipeline::Create, because the session owns what it joins:
  /// the supervision tree, the RestartPolicy, the Clock, the actor faults.
  /// Next() is as data::InputPipeline documents it (exactly
  /// dataset->GetBatch(position)), and its timeout is measured on the
  /// session's Clock (SessionConfig::clock). Under the session's policy
  /// (RuntimeOptions::restart, restart_policy.hpp):
  ///   TF's default: a producer that dies (an injected kill, or user code --
  ///     GetBatch, before_batch -- that throws) ends the run with its error,
  ///     reported as "input_pipeline(<k>)" like the other services; Next()
  ///     then returns FAILED_PRECONDITION "input pipeline: the producer
  ///     input_pipeline(<k>) stopped and is not restarted: <reason>" at
  ///     once, batches already decoded or not (a normal exit is not a
  ///     failure, but nothing restarts it: Next() fails the same way).
  ///   permanent / transient (restarted): the supervisor spawns a new
  ///     producer behind the same address; the next Next() re-seeks it to
  ///     the position asked for (waiting for the restart within its
  ///     timeout), so it still returns exactly dataset->GetBatch(position):
  ///     a restart never changes what training sees. It is recorded in
  ///     service_restarts() like the other services'.
  ///   temporary (or transient after a normal exit): the producer is removed;
  ///     Next() returns FAILED_PRECONDITION "input pipeline: the producer
  ///     input_pipeline(<k>) was removed by the restart policy (<type>) after
  ///     <reason>".
  /// ActorFault (fault.hpp) with service "input_pipeline": kKill as above;
  /// kDelay: each of the producer's next `count` batch decodes first waits
  /// `delay` on the session's Clock; kDrop: each of its next `count` batches
  /// is lost (a WARNING names its position) and the producer decodes nothing
  /// more until asked again: the Next() waiting for it returns
  /// DEADLINE_EXCEEDED after its timeout, "... (dropped by injected actor
  /// fault <id>)" with the fault's kInjectedFaultPayload, and the next call
  /// re-requests that position (a re-seek), so a retry returns exactly
  /// GetBatch(position).
  /// A producer gone for good is FAILED_PRECONDITION, not UNAVAILABLE (a
  /// preemption code, from which a MonitoredSession would recover again and
  /// again, asking the dead pipeline each time).
  /// Lifetime: the pipeline may outlive close() and the session: from
  /// close() on (the producer is stopped with the other services) Next()
  /// returns FAILED_PRECONDITION "input pipeline: the session is closed ...", and
  /// the destructor returns at once. Destroyed while the session runs, it
  /// stops its producer (waiting, real time, for the batch being decoded);
  /// the supervisor forgets it (no failure, no restart).
  /// Errors: INVALID_ARGUMENT for a null dataset, prefetch_batches < 1, or
  /// options.actor_system / options.clock not left at their defaults (the
  /// session's are used); FAILED_PRECONDITION after close(); INTERNAL or
  /// DEADLINE_EXCEEDED when the actor cannot be started. Thread-safe; the
  /// pipeline's Next() is called by one thread at a time.
  StatusOr<std::unique_ptr<data::InputPipeline>> NewInputPipeline(std::shared_ptr<const data::Dataset> dataset,
                                                                  data::InputPipelineOptions options = {});

  /// The coordinator of the latest created session (a new one per created
  /// session, as TF). Never null after Create(): between two sessions of a
  /// recovery it is the old session's (already stopped and joined), after
  /// close() the last one (stopped) — TF sets it to None there. Owned by the
  /// session; valid until the session is destroyed; safe to use from any
  /// thread. A request_stop() on it reaches that session only: to stop the
  /// run from another thread whatever the moment, call request_stop() here
  /// (or stop_request()->request_stop()).
  Coordinator* coordinator() const;

 protected:
  struct Impl;
  MonitoredSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class MonitoredStepContext;
  friend class SingularMonitoredSession;
};

struct SingularMonitoredSessionOptions {
  std::shared_ptr<Graph> graph;
  HookList hooks;
  std::shared_ptr<Scaffold> scaffold;
  std::string master;
  SessionConfig config;
  std::string checkpoint_dir;
  std::string checkpoint_filename_with_path;
  /// As MonitoredSessionOptions::stop_grace_period_secs (unset: 120 s, or
  /// runtime.stop's grace period).
  std::optional<double> stop_grace_period_secs;
  RuntimeOptions runtime;
};

/// As TF: always chief, no recovery (ABORTED / UNAVAILABLE are returned), and
/// should_stop() reports the coordinator's error through stop_error().
class SingularMonitoredSession : public MonitoredSession {
 public:
  static StatusOr<std::unique_ptr<SingularMonitoredSession>> Create(SingularMonitoredSessionOptions options);
  /// The raw session (nullptr after close).
  Session* raw_session() const;
  /// TF's SingularMonitoredSession.should_stop() re-raises the error
  /// the coordinator recorded; here should_stop() returns true and this
  /// returns that error.
  Status stop_error() const;

 private:
  using MonitoredSession::MonitoredSession;
};

// -- MonitoredTrainingSession ------------------------------------------------------

/// TF's USE_DEFAULT (distinct from "explicitly off"): left alone, the option
/// takes TF's default; None() (or std::nullopt, TF's None) turns it off; a
/// value sets it.
template <class T>
struct Defaultable {
  enum class Kind { kUseDefault, kNone, kValue };
  Kind kind = Kind::kUseDefault;
  T value{};
  Defaultable() = default;
  Defaultable(T v) : kind(Kind::kValue), value(v) {}  // NOLINT: implicit, as TF's keyword argument
  Defaultable(std::nullopt_t) : kind(Kind::kNone) {}  // NOLINT: implicit, TF's None
  static Defaultable None() {
    Defaultable d;
    d.kind = Kind::kNone;
    return d;
  }
  bool use_default() const { return kind == Kind::kUseDefault; }
};

struct MonitoredTrainingSessionOptions {
  /// Variables and step function; required unless `scaffold` is given.
  std::shared_ptr<Graph> graph;
  std::string master;
  bool is_chief = true;
  std::string checkpoint_dir;
  std::shared_ptr<Scaffold> scaffold;
  HookList hooks;
  HookList chief_only_hooks;
  Defaultable<double> save_checkpoint_secs;
  Defaultable<int64_t> save_summaries_steps;
  Defaultable<double> save_summaries_secs;
  SessionConfig config;
  /// As MonitoredSessionOptions::stop_grace_period_secs (unset: 120 s, or
  /// runtime.stop's grace period).
  std::optional<double> stop_grace_period_secs;
  /// Default 100 (TF's); 0 or None() (std::nullopt) disables the
  /// StepCounterHook (as TF).
  Defaultable<int64_t> log_step_count_steps;
  double max_wait_secs = 7200;
  Defaultable<int64_t> save_checkpoint_steps;
  std::string summary_dir;
  // Foreman extensions.
  /// Worker readiness poll interval (TF fixed it at 30 s).
  double recovery_wait_secs = 30;
  /// Checkpoint listeners for the default CheckpointSaverHook.
  std::vector<std::shared_ptr<CheckpointSaverListener>> checkpoint_listeners;
  RecoveryOptions recovery;
  RuntimeOptions runtime;
};

/// The effective schedules after TF's USE_DEFAULT rules, and which default
/// hooks MonitoredTrainingSession adds (TF's). Exposed for tests and tools.
/// INVALID_ARGUMENT when both frequencies of a pair are set (TF's code raises
/// too; its docstring says otherwise), naming both options.
struct MonitoredTrainingSessionPlan {
  std::optional<int64_t> save_summaries_steps;
  std::optional<double> save_summaries_secs;
  std::optional<int64_t> save_checkpoint_steps;
  std::optional<double> save_checkpoint_secs;
  std::string summary_dir;
  /// The StepCounterHook's every_n_steps (100 by default; nullopt: None).
  std::optional<int64_t> log_step_count_steps;
  bool step_counter_hook = false;
  bool summary_saver_hook = false;
  bool checkpoint_saver_hook = false;
};
StatusOr<MonitoredTrainingSessionPlan> PlanMonitoredTrainingSession(const MonitoredTrainingSessionOptions& options);

/// As TF: builds the hook list (chief: chief_only_hooks, StepCounterHook,
/// SummarySaverHook, CheckpointSaverHook, hooks; worker: hooks only) and a
/// MonitoredSession with a ChiefSessionCreator (restoring from
/// checkpoint_dir) or a WorkerSessionCreator (max_wait_secs,
/// recovery_wait_secs). The default hooks use the config's clock and env and
/// the scaffold's saver and summary_op; so that they can be built, the
/// scaffold is finalized first (when a summary or checkpoint hook is added)
/// and the graph, if it was not finalized, is handed back unfinalized for the
/// hooks' begin() (which may still add to it, as TF's hooks add ops).
/// When it adds a CheckpointSaverHook, it first takes checkpoint_dir's lock
/// (LockCheckpointDirectory; unless options.runtime.held_lock is the
/// caller's lock on that directory), before any hook's begin(): a directory
/// in use is FAILED_PRECONDITION "checkpoint directory <dir> is in use by
/// process <pid>" before anything (an events file) is written there. The
/// session holds that lock until close() (a Foreman addition: TF has no
/// directory lock).
StatusOr<std::unique_ptr<MonitoredSession>> MonitoredTrainingSession(MonitoredTrainingSessionOptions options);

}  // namespace foreman
