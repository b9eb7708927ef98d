// SessionRunHook: code that runs around every step of a MonitoredSession,
// and the stock hooks. (TF: tf.compat.v1.train.SessionRunHook,
// basic_session_run_hooks.py, with TF's call order, schedules and messages.)
//
// Call order per MonitoredSession (TF's):
//   begin()                                    once, before the first session
//   after_create_session(session, coord)       after every session creation
//   before_run(ctx) -> SessionRunArgs          every run(), in list order
//   after_run(ctx, values)                     every successful run(), in order
//   end(session)                               at close() after a clean stop
//
// All callbacks run on the training thread. A hook returns a Status (or
// throws; the exception becomes a Status): a non-OK status ends training with
// that error, exactly as TF's exceptions do (later hooks' after_run are
// skipped for that step). The session prefixes its message, returned or
// thrown, with the hook and the callback ("hook StopAtStepHook::after_run: ...",
// once), keeping its code and payloads.
//
// Every stock hook is built the same way: fill its `Options` and call
// `XxxHook::Create(options)`, which checks them (INVALID_ARGUMENT naming the
// bad field) and returns a shared_ptr. A hook that wants
// training to end cleanly calls ctx.request_stop(), which takes effect after
// the current run.
//
// A hook asks for extra fetches and feeds in before_run; Foreman merges them
// with the caller's (two hooks feeding one tensor, or a hook and the caller,
// is an error, as in TF) and hands each hook exactly its own results.
// Stock hooks whose work is I/O (checkpoints, summaries, step counting) only
// decide *when* on the training thread and send the work to a service actor,
// fire-and-forget; they need a MonitoredSession (or a Supervisor), which
// attaches those services before begin().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "foreman/checkpoint.hpp"
#include "foreman/clock.hpp"
#include "foreman/coordinator.hpp"
#include "foreman/session.hpp"
#include "foreman/status.hpp"

namespace foreman {

namespace internal {
class Services;  // the runtime's service actors, as hooks see them

/// Not part of the hook interface: implemented by Foreman's own hooks whose
/// work goes to the session's service actors (CheckpointSaverHook,
/// StepCounterHook, SummarySaverHook, FaultInjectionHook). Foreman's sessions
/// find it on a hook (dynamic_cast) and call AttachServices once, before
/// begin(); a user hook does not implement it.
class ServiceUser {
 public:
  virtual ~ServiceUser() = default;
  /// The service actors of the session the hook runs in. Not owned; valid
  /// until the session closes. Training thread.
  virtual void AttachServices(Services* services) = 0;
};
}  // namespace internal

/// What a hook adds to a run (TF: SessionRunArgs). Empty fetches means "no
/// fetches" (TF's None: the hook then gets results == nullptr).
struct SessionRunArgs {
  std::vector<std::string> fetches;
  TensorMap feeds;
  RunOptions options;
};

/// One run() as hooks see it (TF: SessionRunContext): the same object is
/// passed to every hook's before_run and after_run of that run.
class SessionRunContext {
 public:
  SessionRunContext(const SessionRunArgs* original_args, Session* session)
      : original_args_(original_args), session_(session) {}
  /// The caller's fetches and feeds.
  const SessionRunArgs& original_args() const { return *original_args_; }
  /// The raw session (no hooks); a hook may Run() it (e.g. to read the real
  /// global step after the run, as TF's hooks do).
  Session* session() const { return session_; }
  /// Asks the session to stop after this run; never interrupts it (TF:
  /// SessionRunContext.request_stop).
  void request_stop() { stop_requested_ = true; }
  bool stop_requested() const { return stop_requested_; }

 private:
  const SessionRunArgs* original_args_;
  Session* session_;
  bool stop_requested_ = false;
};

/// What a hook gets after a run (TF: SessionRunValues).
struct SessionRunValues {
  /// This hook's fetches, or nullptr when it asked for none.
  const TensorMap* results = nullptr;
  /// The merged options the run used (the caller's and every hook's).
  const RunOptions* options = nullptr;
  /// Shared by all hooks of the run; filled when tracing was on.
  const RunMetadata* run_metadata = nullptr;
};

class SessionRunHook {
 public:
  virtual ~SessionRunHook() = default;
  /// A name for logs and error messages ("StopAtStepHook").
  virtual std::string name() const = 0;
  virtual Status begin() { return absl::OkStatus(); }
  virtual Status after_create_session(Session* /*session*/, Coordinator* /*coord*/) { return absl::OkStatus(); }
  virtual StatusOr<SessionRunArgs> before_run(SessionRunContext& /*ctx*/) { return SessionRunArgs{}; }
  /// before_run() written into `args` instead of returned: what Foreman's
  /// sessions call every run. A hook that asks for the same fetches most
  /// steps overrides it to leave `args` as it is (the stock hooks do): then
  /// no SessionRunArgs is built and the session re-plans the run's fetches
  /// only when a hook's fetches change. `args` belongs to this hook in this
  /// session and is kept between runs: it holds what the previous call left
  /// (empty before the first), except `feeds`, which the session moves out
  /// (so they start empty). An override must leave in it exactly what
  /// before_run() would return, and should implement before_run() through
  /// it. The default assigns before_run()'s result. Training thread only.
  virtual Status before_run_into(SessionRunContext& ctx, SessionRunArgs& args) {
    FOREMAN_ASSIGN_OR_RETURN(args, before_run(ctx));
    return absl::OkStatus();
  }
  virtual Status after_run(SessionRunContext& /*ctx*/, const SessionRunValues& /*values*/) {
    return absl::OkStatus();
  }
  virtual Status end(Session* /*session*/) { return absl::OkStatus(); }
};

using HookList = std::vector<std::shared_ptr<SessionRunHook>>;

// -- SecondOrStepTimer ------------------------------------------------------------

class SecondOrStepTimer {
 public:
  /// Exactly one of every_secs / every_steps; INVALID_ARGUMENT "Can not
  /// provide both every_secs and every_steps." / "Either every_secs or
  /// every_steps should be provided.". Seconds are measured on `clock`'s
  /// monotonic time line (TF: time.time()); a null clock means Clock::Real().
  static StatusOr<SecondOrStepTimer> Create(std::optional<double> every_secs, std::optional<int64_t> every_steps,
                                            Clock* clock = Clock::Real());
  /// True when never triggered; false for the last triggered step; true
  /// when every_secs have passed since the last trigger, or `step` is
  /// every_steps past the last triggered step.
  bool should_trigger_for_step(int64_t step) const;
  /// Records a trigger at `step` now and returns (elapsed seconds,
  /// elapsed steps) since the previous one; nullopt on the first.
  std::optional<std::pair<double, int64_t>> update_last_triggered_step(int64_t step);
  std::optional<int64_t> last_triggered_step() const { return last_step_; }
  /// Forgets the last trigger (the next step triggers).
  void reset();

 private:
  SecondOrStepTimer(std::optional<double> every_secs, std::optional<int64_t> every_steps, Clock* clock);
  std::optional<double> every_secs_;
  std::optional<int64_t> every_steps_;
  Clock* clock_;
  std::optional<int64_t> last_step_;
  absl::Duration last_time_;
};

// -- Step multiples ----------------------------------------------------------------

/// The cadence "at every multiple of N" on a global_step that may advance by
/// more than one between two runs of this worker (a cluster: the other
/// workers' updates). StepMultiplesCrossed: how many multiples of
/// `every_steps` lie in (from_step, to_step] (0 when to_step <= from_step);
/// a schedule fires at a run whose global_step went from `from_step` to
/// `to_step` when it is > 0, once for all of them (the first run at or past
/// each multiple; no multiple skipped, none fired twice). NextStepMultiple:
/// the smallest multiple of `every_steps` greater than `step`. Steps may be
/// negative (floor division); `every_steps` must be > 0 (0 is returned for
/// every_steps <= 0: no cadence). Pure functions, thread-safe. TF's
/// SecondOrStepTimer instead fires at `every_steps` past its last trigger,
/// which drifts off the multiples once a trigger is late; Foreman's test-set
/// evaluation and `foreman train`'s progress lines use the multiples.
int64_t StepMultiplesCrossed(int64_t from_step, int64_t to_step, int64_t every_steps);
int64_t NextStepMultiple(int64_t step, int64_t every_steps);

// -- StopAtStepHook -----------------------------------------------------------------

class StopAtStepHook : public SessionRunHook {
 public:
  struct Options {
    /// Steps to run: last_step = the first session's global_step + num_steps.
    std::optional<int64_t> num_steps;
    /// The global step to stop at.
    std::optional<int64_t> last_step;
  };
  /// Exactly one of options.num_steps / options.last_step (TF raises
  /// ValueError): INVALID_ARGUMENT "One of num_steps or last_step must be
  /// specified." / "Only one of num_steps or last_step can be specified.".
  static StatusOr<std::shared_ptr<StopAtStepHook>> Create(const Options& options);
  std::string name() const override { return "StopAtStepHook"; }
  /// FAILED_PRECONDITION "Global step should be created to use
  /// StopAtStepHook." when the session's graph has no global_step. (TF checks
  /// in begin(); a Foreman hook first sees the graph here, still before any
  /// step runs.)
  /// last_step = first session's global_step + num_steps (once; a
  /// recovered session does not recompute it).
  /// Unlike TF: when the session's global_step is already >= last_step
  /// (a finished run resumed), calls coord->request_stop(), so training
  /// stops before the first step (TF runs one more step).
  Status after_create_session(Session* session, Coordinator* coord) override;
  /// Fetches the built-in "global_step" (the value before the step, as
  /// TF's global step read).
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;
  /// When stale + 1 >= last_step, re-reads the real step
  /// (Session::GlobalStep()) and requests stop when it is >= last_step.
  Status after_run(SessionRunContext& ctx, const SessionRunValues& values) override;
  /// Known from construction (last_step) or the first after_create_session.
  std::optional<int64_t> last_step() const { return last_step_; }

 private:
  StopAtStepHook(std::optional<int64_t> num_steps, std::optional<int64_t> last_step);
  std::optional<int64_t> num_steps_;
  std::optional<int64_t> last_step_;
};

// -- CheckpointSaverHook -------------------------------------------------------------

/// TF: CheckpointSaverListener. Callbacks run on the training thread, only
/// for saves the hook makes (including its first and its final save).
class CheckpointSaverListener {
 public:
  virtual ~CheckpointSaverListener() = default;
  virtual Status begin() { return absl::OkStatus(); }
  /// Before the variables are copied for the save of `global_step`.
  virtual Status before_save(Session* /*session*/, int64_t /*global_step*/) { return absl::OkStatus(); }
  /// Once the save of `global_step` is durable, at the step boundary that
  /// started it (see CheckpointSaverHook); true requests a stop, which
  /// takes effect before the next step.
  virtual StatusOr<bool> after_save(Session* /*session*/, int64_t /*global_step*/) { return false; }
  virtual Status end(Session* /*session*/, int64_t /*global_step*/) { return absl::OkStatus(); }
};


/// Saves as TF's CheckpointSaverHook: at after_create_session (after every
/// session creation, recoveries included), on the schedule, and at end()
/// when the last step was not saved; the session's checkpoint_saver actor
/// writes a SessionLog CHECKPOINT (path "<dir>/<basename>", no step suffix)
/// at each saved step into checkpoint_dir's event file.
///
/// Asynchronous (unlike TF): at a due step the training thread only runs
/// the listeners' before_save and copies the variables (Session::Snapshot);
/// the checkpoint_saver actor writes them. At most one save is in flight: a
/// save that falls due while the previous one is still being written waits
/// for it (waited_saves() counts those), so the checkpoint steps are exactly
/// TF's. A save's outcome is taken up at the first step boundary (before_run
/// or after_run) after it completed: a failed save then ends training with
/// its Status (it also reaches the coordinator at once). The final save in
/// end() completes before end() returns.
///
/// Listeners: after_save must run before the next step for a stop it
/// requests to stop training at the saved step (TF's schedule, and no
/// second save in end()). So with listeners the training
/// thread waits at the boundary that started the save until it is durable,
/// then calls after_save there; without listeners it never waits for a save
/// except as above.
///
/// From begin(), the session's checkpoint_saver actor holds the checkpoint
/// directory's lock (LockCheckpointDirectory) until the session's services
/// shut down (the MonitoredSession's close()).
class CheckpointSaverHook : public SessionRunHook, public internal::ServiceUser {
 public:
  struct Options {
    std::string checkpoint_dir;
    /// Exactly one of save_secs / save_steps.
    std::optional<double> save_secs;
    std::optional<int64_t> save_steps;
    /// As TF: explicit saver > scaffold's saver (set by MonitoredTrainingSession)
    /// > a default Saver (max_to_keep 5) built on this `env` and `clock`.
    std::shared_ptr<Saver> saver;
    std::string checkpoint_basename = "model.ckpt";
    std::vector<std::shared_ptr<CheckpointSaverListener>> listeners;
    /// TF's steps_per_run: the schedule checks stale step + steps_per_run.
    int64_t steps_per_run = 1;
    Clock* clock = Clock::Real();
    Env* env = Env::Default();
    /// How long the training thread waits for a save still being written
    /// (a save due while one is in flight, the final save in end(), a save
    /// with listeners) before it fails with DEADLINE_EXCEEDED. Real time: the
    /// save is real work, not Clock time. Must be > 0.
    absl::Duration save_timeout = absl::Hours(1);
  };
  /// INVALID_ARGUMENT for a bad schedule, empty checkpoint_dir,
  /// steps_per_run < 1, save_timeout <= 0, a null listener; a default
  /// Saver's errors.
  static StatusOr<std::shared_ptr<CheckpointSaverHook>> Create(const Options& options);
  ~CheckpointSaverHook() override;
  std::string name() const override { return "CheckpointSaverHook"; }
  void AttachServices(internal::Services* services) override;
  /// FAILED_PRECONDITION without services; starts (or finds) the
  /// checkpoint_saver of checkpoint_dir (its lock errors); listeners' begin().
  Status begin() override;
  /// FAILED_PRECONDITION "Global step should be created to use
  /// CheckpointSaverHook." when the session's graph has none (TF checks in
  /// begin(), before a graph is at hand here); then the save at the
  /// session's current step.
  Status after_create_session(Session* session, Coordinator* coord) override;
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;
  /// Takes up a finished save, then leaves {global_step} in `args`
  /// (allocates nothing once it is there).
  Status before_run_into(SessionRunContext& ctx, SessionRunArgs& args) override;
  Status after_run(SessionRunContext& ctx, const SessionRunValues& values) override;
  Status end(Session* session) override;
  /// A save at the session's current global_step now, outside the
  /// schedule (unless that step is the last one saved), waited for (at
  /// most save_timeout; then DEADLINE_EXCEEDED); the listeners'
  /// before_save / after_save run as for any save. MonitoredSession calls
  /// it when a cluster run fails because a ps task is stopping (an
  /// eviction, Server::Evict), so that the restore of that ps loses no
  /// step. Errors: the global_step read's or the save's. Training thread
  /// only (as the other callbacks). TF: none (TF1's saver saves on its
  /// schedule only).
  Status SaveNow(Session* session);

  /// Steps whose saves completed, in order (tests and benchmarks).
  std::vector<int64_t> saved_steps() const;
  /// Saves that had to wait for the one in flight.
  int64_t waited_saves() const;

  struct Impl;

 private:
  explicit CheckpointSaverHook(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// -- StepCounterHook -------------------------------------------------------------

/// Measures global_step/sec on the training thread; when its timer fires it
/// sends the value to the step_counter actor, which logs
/// "global_step/sec: <v>" and writes the `global_step/sec` summary (TF's tag).
/// The first trigger only primes the timer (values at 101, 201, ... with the
/// defaults). Warns (first 5 times) when the stale global step did not
/// change (TF's warning). A trigger with no Clock time elapsed records nothing (TF
/// would divide by zero).
class StepCounterHook : public SessionRunHook, public internal::ServiceUser {
 public:
  struct Options {
    /// Exactly one of every_n_steps / every_n_secs (INVALID_ARGUMENT
    /// "exactly one of every_n_steps and every_n_secs should be provided.").
    std::optional<int64_t> every_n_steps = 100;
    std::optional<double> every_n_secs;
    /// Event files go to this directory's summary writer; empty = log only.
    std::string output_dir;
    Clock* clock = Clock::Real();
  };
  /// INVALID_ARGUMENT unless exactly one of every_n_steps / every_n_secs.
  static StatusOr<std::shared_ptr<StepCounterHook>> Create(const Options& options);
  ~StepCounterHook() override;
  std::string name() const override { return "StepCounterHook"; }
  void AttachServices(internal::Services* services) override;
  /// FAILED_PRECONDITION without services (AttachServices).
  Status begin() override;
  /// FAILED_PRECONDITION "Global step should be created to use
  /// StepCounterHook." when the session's graph has none (TF checks
  /// in begin(), before a graph is at hand here).
  Status after_create_session(Session* session, Coordinator* coord) override;
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;
  /// Leaves {global_step} in `args` (allocates nothing once it is there).
  Status before_run_into(SessionRunContext& ctx, SessionRunArgs& args) override;
  Status after_run(SessionRunContext& ctx, const SessionRunValues& values) override;
  struct Impl;

 private:
  explicit StepCounterHook(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// -- SummarySaverHook ------------------------------------------------------------

/// Requests the summary on the first run and whenever the timer fires for
/// the predicted next step; writes SessionLog START at the post-run global
/// step after the first run and the summaries at the post-run global step
/// (TF's schedule: 1, 101, 201, ... with save_steps=100); end() flushes.
/// Beyond TF: after a MonitoredSession's recovery (a second
/// after_create_session since begin()) the hook starts over as after
/// begin(): the first run on the restored session requests the summary and
/// writes a START at its post-run step, so TensorBoard's purge hides
/// what the failed session wrote after the restored checkpoint, as it does
/// after a process restart. TF writes no START there, and the replayed steps
/// appear twice.
/// The writes go to output_dir's summary_writer actor.
class SummarySaverHook : public SessionRunHook, public internal::ServiceUser {
 public:
  struct Options {
    /// Exactly one of save_steps / save_secs (see SecondOrStepTimer).
    std::optional<int64_t> save_steps;
    std::optional<double> save_secs;
    /// Where events go; empty means the hook does nothing (as TF; it does not
    /// even fetch the summaries, which TF would on every run).
    std::string output_dir;
    /// The fetch that returns a serialized Summary (a kString scalar), or
    /// several whose Summaries are merged into one event (TF: summary_op, a
    /// tensor or list). The MonitoredTrainingSession passes the scaffold's,
    /// which is empty when the graph has no summaries: then nothing is fetched
    /// and only the START session log is written (TF: a scaffold whose
    /// summary_op is None).
    std::vector<std::string> summary_op;
    Clock* clock = Clock::Real();
    /// How long end() waits for the writer to flush (real time). Must be > 0.
    absl::Duration flush_timeout = absl::Minutes(5);
  };
  /// INVALID_ARGUMENT for a bad schedule, an empty summary_op name,
  /// flush_timeout <= 0.
  static StatusOr<std::shared_ptr<SummarySaverHook>> Create(const Options& options);
  ~SummarySaverHook() override;
  std::string name() const override { return "SummarySaverHook"; }
  void AttachServices(internal::Services* services) override;
  /// FAILED_PRECONDITION without services when output_dir is set.
  Status begin() override;
  /// FAILED_PRECONDITION "Global step should be created to use
  /// SummarySaverHook." when the session's graph has none.
  Status after_create_session(Session* session, Coordinator* coord) override;
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;
  /// Leaves {global_step} (plus summary_op when the summary is due) in
  /// `args`, allocating nothing on steps that are not due.
  Status before_run_into(SessionRunContext& ctx, SessionRunArgs& args) override;
  Status after_run(SessionRunContext& ctx, const SessionRunValues& values) override;
  /// Flushes the writer (waits for the summary_writer actor). Like TF, not
  /// called after an error, so nothing is flushed then.
  Status end(Session* session) override;
  struct Impl;

 private:
  explicit SummarySaverHook(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// -- LoggingTensorHook --------------------------------------------------------

/// A tensor as numpy's str() prints it, which is how TF's LoggingTensorHook
/// shows values (with np.set_printoptions(suppress=True)):
///   scalars   Python repr of the number: "0.5", "1.0", "1e-05", "1e+16",
///             "nan", "-inf", "42"; strings as Python bytes: "b'abc'"
///   arrays    "[1.  2.5 3. ]", "[ 1 10]", "[[1 2]\n [3 4]]", "[b'a' b'bc']":
///             floats with at most 8 fractional digits, padded to a common
///             width (scientific, "[1.0e+08 2.5e+09]", when the largest
///             magnitude is >= 1e8); over 1000 elements, 3 edge items per
///             dimension and "..."; lines wrapped at numpy's 75 columns.
/// (Checked against numpy 1.24 for float32/float64 vectors and scalars.)
std::string FormatTensorForLog(const Tensor& tensor);

class LoggingTensorHook : public SessionRunHook {
 public:
  struct Options {
    /// Fetch names to log. With `sorted_tags` the line lists them sorted (TF's
    /// dict); otherwise in the given order (TF's list).
    std::vector<std::string> tensors;
    bool sorted_tags = false;
    /// at_end alone, or exactly one of every_n_iter (> 0) / every_n_secs (TF's
    /// rule; INVALID_ARGUMENT otherwise).
    std::optional<int64_t> every_n_iter;
    std::optional<double> every_n_secs;
    bool at_end = false;
    /// Replaces the default "tag = value, ..." line (called with the logged
    /// tensors; its exceptions become the callback's Status).
    std::function<std::string(const TensorMap&)> formatter;
    Clock* clock = Clock::Real();
  };
  /// INVALID_ARGUMENT for a bad schedule (TF's messages, see Options).
  static StatusOr<std::shared_ptr<LoggingTensorHook>> Create(const Options& options);
  std::string name() const override { return "LoggingTensorHook"; }
  Status begin() override;
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;
  Status after_run(SessionRunContext& ctx, const SessionRunValues& values) override;
  /// With at_end, runs the tensors once more and logs them (as TF: side
  /// effects of that run, such as consuming input, happen).
  Status end(Session* session) override;
  /// Local iterations seen (as TF: not the global step).
  int64_t iteration() const { return iter_count_; }

 private:
  /// `timer` is nullopt for at_end alone (TF's NeverTriggerTimer).
  LoggingTensorHook(Options options, std::optional<SecondOrStepTimer> timer);
  Status LogTensors(const TensorMap& values);
  Options options_;
  std::optional<SecondOrStepTimer> timer_;
  int64_t iter_count_ = 0;
  bool should_trigger_ = false;
};

// -- NanTensorHook ---------------------------------------------------------------

class NanTensorHook : public SessionRunHook {
 public:
  struct Options {
    /// The fetch name of the loss, a float32 or float64 tensor of one
    /// element (INVALID_ARGUMENT from after_run otherwise).
    std::string loss_tensor;
    bool fail_on_nan_loss = true;
  };
  /// INVALID_ARGUMENT for an empty loss_tensor.
  static StatusOr<std::shared_ptr<NanTensorHook>> Create(const Options& options);
  std::string name() const override { return "NanTensorHook"; }
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;
  /// NaN (not Inf): with fail_on_nan_loss logs "Model diverged with loss =
  /// NaN." and returns NanLossDuringTrainingError("NaN loss during
  /// training."); otherwise warns and requests stop.
  Status after_run(SessionRunContext& ctx, const SessionRunValues& values) override;

 private:
  explicit NanTensorHook(Options options)
      : loss_tensor_(std::move(options.loss_tensor)), fail_on_nan_loss_(options.fail_on_nan_loss) {}
  std::string loss_tensor_;
  bool fail_on_nan_loss_;
};

// -- GlobalStepWaiterHook ----------------------------------------------------------

class GlobalStepWaiterHook : public SessionRunHook {
 public:
  struct Options {
    /// Training starts once the global step is >= this (<= 0: at once).
    int64_t wait_until_step = 0;
    /// Polls on this clock; null means Clock::Real().
    Clock* clock = Clock::Real();
    /// TF's 0.5 s. Must be > 0.
    absl::Duration poll_interval = absl::Milliseconds(500);
    /// Foreman's bound (TF waits forever); past it the first before_run
    /// returns DEADLINE_EXCEEDED. Must be > 0 when set.
    std::optional<absl::Duration> max_wait;
  };
  /// INVALID_ARGUMENT for poll_interval <= 0 or max_wait <= 0.
  static StatusOr<std::shared_ptr<GlobalStepWaiterHook>> Create(const Options& options);
  std::string name() const override { return "GlobalStepWaiterHook"; }
  Status begin() override;
  /// FAILED_PRECONDITION "Global step should be created to use
  /// GlobalStepWaiterHook." when the graph has none (TF: in begin()).
  Status after_create_session(Session* session, Coordinator* coord) override;
  /// On the first call only, polls Session::GlobalStep() every
  /// poll_interval of the clock until it is >= wait_until_step; logs
  /// "Waiting for global step N before starting training." and, every 1000
  /// steps of progress, the current step. DEADLINE_EXCEEDED past max_wait.
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;

 private:
  explicit GlobalStepWaiterHook(const Options& options)
      : wait_until_step_(options.wait_until_step),
        clock_(options.clock == nullptr ? Clock::Real() : options.clock),
        poll_interval_(options.poll_interval),
        max_wait_(options.max_wait) {}
  int64_t wait_until_step_;
  Clock* clock_;
  absl::Duration poll_interval_;
  std::optional<absl::Duration> max_wait_;
  bool worker_is_started_ = false;
};

// -- FinalOpsHook ------------------------------------------------------------------

class FinalOpsHook : public SessionRunHook {
 public:
  struct Options {
    /// Fetch names run once in end(); none: end() runs nothing.
    std::vector<std::string> final_ops;
    TensorMap final_ops_feed_dict;
  };
  /// INVALID_ARGUMENT for an empty name in final_ops.
  static StatusOr<std::shared_ptr<FinalOpsHook>> Create(const Options& options);
  std::string name() const override { return "FinalOpsHook"; }
  /// Runs final_ops (none: nothing) on the raw session with the feeds and
  /// keeps the values; OUT_OF_RANGE there is logged with TF's warning and
  /// returned.
  Status end(Session* session) override;
  const TensorMap& final_ops_values() const { return values_; }

 private:
  explicit FinalOpsHook(Options options)
      : final_ops_(std::move(options.final_ops)), feeds_(std::move(options.final_ops_feed_dict)) {}
  std::vector<std::string> final_ops_;
  TensorMap feeds_;
  TensorMap values_;
};

// -- FeedFnHook --------------------------------------------------------------------

class FeedFnHook : public SessionRunHook {
 public:
  struct Options {
    /// Called on the training thread before every run; returns the feeds.
    std::function<TensorMap()> feed_fn;
  };
  /// INVALID_ARGUMENT for an empty feed_fn.
  static StatusOr<std::shared_ptr<FeedFnHook>> Create(const Options& options);
  std::string name() const override { return "FeedFnHook"; }
  /// No fetches, feeds = feed_fn() (its exceptions become the Status).
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;

 private:
  explicit FeedFnHook(Options options) : feed_fn_(std::move(options.feed_fn)) {}
  std::function<TensorMap()> feed_fn_;
};

// -- ProfilerHook ------------------------------------------------------------------

/// Fetches the stale global step every run; the first run only primes
/// the timer. When the timer fires for the predicted step it asks for
/// kFullTrace, re-reads the real step and writes
/// <output_dir>/timeline-<step>.json through options.env, a Chrome
/// trace-event file (chrome://tracing and Perfetto load it) of that run's
/// RunMetadata. Differences from TF: no run-metadata event (tag step_<step>)
/// goes to a summary writer (hooks here call no service), and show_dataflow /
/// show_memory are accepted and ignored (Foreman has no op graph or
/// allocator stats to show).
class ProfilerHook : public SessionRunHook {
 public:
  struct Options {
    std::optional<int64_t> save_steps;
    std::optional<double> save_secs;
    std::string output_dir;
    bool show_dataflow = true;
    bool show_memory = false;
    Clock* clock = Clock::Real();
    Env* env = Env::Default();
  };
  /// INVALID_ARGUMENT for a bad schedule (see SecondOrStepTimer).
  static StatusOr<std::shared_ptr<ProfilerHook>> Create(const Options& options);
  std::string name() const override { return "ProfilerHook"; }
  /// Resets the schedule and creates output_dir.
  Status begin() override;
  /// FAILED_PRECONDITION "Global step should be created to use
  /// ProfilerHook." when the graph has none (TF: in begin()).
  Status after_create_session(Session* session, Coordinator* coord) override;
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;
  Status after_run(SessionRunContext& ctx, const SessionRunValues& values) override;

 private:
  ProfilerHook(Options options, SecondOrStepTimer timer);
  Options options_;
  SecondOrStepTimer timer_;
  bool request_summary_ = false;
  std::optional<int64_t> next_step_;
};

/// Renders `metadata` as Chrome trace-event JSON:
///   {"traceEvents":[
///     {"name":"process_name","ph":"M","pid":0,"args":{"name":"Foreman step <step>"}},
///     {"name":"thread_name","ph":"M","pid":0,"tid":<t>,"args":{"name":"thread <t>"}}, ...
///     {"name":..,"cat":..,"ph":"X","ts":..,"dur":..,"pid":0,"tid":<t>}, ...]}
/// one "X" event per span in step_stats order; thread ids are renumbered
/// 0, 1, ... in order of first appearance (a hashed std::thread::id does not
/// survive a JavaScript number). Names are JSON-escaped; ts and dur are
/// microseconds.
std::string ChromeTraceJson(const RunMetadata& metadata, int64_t step);

}  // namespace foreman
