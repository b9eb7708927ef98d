// The runtime's services as the training thread sees them: plain C++ handles
// onto the service actors (actors/), so hooks and sessions never include CAF.
// (design.md §1-§2: hooks decide *when* on the training thread and send the
// work to an actor, fire-and-forget; only flushes, a save that must wait, and
// shutdown block, each bounded.)
//
// Implemented by actors/session_supervisor.cpp (Runtime::Create). One
// Services object per MonitoredSession / Supervisor; it outlives the hooks'
// use of it (the session closes hooks before it shuts the services down).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "foreman/checkpoint.hpp"
#include "foreman/clock.hpp"
#include "foreman/coordinator.hpp"
#include "foreman/env.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/input_pipeline.hpp"
#include "foreman/mutex.hpp"
#include "foreman/restart_policy.hpp"
#include "foreman/status.hpp"
#include "foreman/tensor.hpp"
#include "runtime/completion.hpp"

namespace foreman {
class Session;
}

namespace foreman::internal {

/// The summary_writer actor of one logdir (TF: FileWriterCache.get(logdir),
/// B151: every hook writing to one directory shares one event file).
class SummaryWriterService {
 public:
  virtual ~SummaryWriterService() = default;
  /// Fire-and-forget (the bytes are copied); errors reach the coordinator.
  /// Thread-safe, as are the other methods.
  virtual void AddSummary(absl::string_view serialized_summary, int64_t step) = 0;
  virtual void AddSessionLog(SessionLogStatus status, std::optional<int64_t> step, std::string checkpoint_path = "",
                             std::string msg = "") = 0;
  /// Blocks until everything sent before is written and flushed; the writer's
  /// first error; DEADLINE_EXCEEDED when `timeout` (real time) passes;
  /// UNAVAILABLE when the actor is gone.
  virtual Status Flush(absl::Duration timeout) = 0;
  virtual const std::string& logdir() const = 0;
};

/// One asynchronous save (decision 11), completed by the checkpoint_saver
/// actor, or with an error by the runtime when that actor dies.
struct SaveTicket {
  int64_t step = 0;
  Mutex mu;
  std::condition_variable_any cv;
  bool done ABSL_GUARDED_BY(mu) = false;
  Status status ABSL_GUARDED_BY(mu);
  std::string prefix ABSL_GUARDED_BY(mu);  // the saved bundle's prefix
  absl::Duration write_time ABSL_GUARDED_BY(mu);  // serialise + write + commit
  /// The snapshot the save wrote, handed back by the checkpoint_saver when
  /// it is done with it, so that the next save copies into the same, already
  /// touched buffers (SnapshotInto) instead of new pages. Empty when the
  /// ticket was completed without them (the runtime's error when the actor
  /// died: the request, and its buffers, went down with it).
  std::map<std::string, Tensor> buffers ABSL_GUARDED_BY(mu);

  /// Set with a failed completion when the save was lost with an
  /// incarnation of a checkpoint_saver that the session's restart policy
  /// may restart (its own save error, or it exited with the save queued):
  /// the run does not fail for it (the supervisor escalates if it does not
  /// restart the saver); the hooks log a WARNING naming the step.
  bool lost ABSL_GUARDED_BY(mu) = false;

  /// The first completion wins; a later one (and its `returned_buffers`) is
  /// dropped. `lost_to_restart`: see `lost`.
  void Complete(Status s, std::string saved_prefix, absl::Duration took,
                std::map<std::string, Tensor> returned_buffers = {}, bool lost_to_restart = false)
      ABSL_LOCKS_EXCLUDED(mu);
  bool IsDone() ABSL_LOCKS_EXCLUDED(mu);
  /// True once completed with `lost` set.
  bool IsLost() ABSL_LOCKS_EXCLUDED(mu);
  /// Moves the handed-back buffers out (empty before completion or when none
  /// came back). Only a completed ticket's buffers are free: the actor no
  /// longer reads them.
  std::map<std::string, Tensor> TakeBuffers() ABSL_LOCKS_EXCLUDED(mu);
  /// Waits (real time, since the actor's progress is real work) until done or
  /// `timeout`; DEADLINE_EXCEEDED naming the step on timeout; else the save's
  /// status.
  Status Wait(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu);
};

/// Copies the global (checkpointed) variables of `session` that are
/// initialized into `*snapshot`, as Session::Snapshot() does, but in place:
/// a tensor already in `*snapshot` under the same name, dtype and shape is
/// overwritten in its own buffer (no allocation, no page faults); others are
/// (re)allocated, and names that are no longer variables are dropped.
/// `*snapshot` must not be in use by a save (only a completed ticket's
/// buffers are). Holds the values' mutex while it copies (between steps).
/// Returns how many tensors were copied into buffers they already had.
/// On a cluster session it first reads one consistent state of all ps tasks
/// (RemoteValues::ReadConsistent) into the mirror, then copies as above.
/// On a session whose device has no host memory (a GPU), new buffers come
/// from the device's AllocateHostTensor (page-locked on CUDA; reused by the
/// next saves), and the variables whose device copy is newer than the host
/// one are copied from the device straight into their buffers with one
/// CopyToHostBatch (internal::VariableStoreAccess); the store's host copies
/// are left as they are (still stale, the device's copy stays the value).
/// Errors: RESOURCE_EXHAUSTED when an allocation fails (Session::WithVariables
/// turns the std::bad_alloc into a Status); on a cluster, ReadConsistent's
/// FAILED_PRECONDITION or UNAVAILABLE; the device's error (INTERNAL) when
/// its copy fails, naming the variables copied (then `*snapshot` holds a
/// partial copy: do not save it).
StatusOr<int64_t> SnapshotInto(Session& session, std::map<std::string, Tensor>* snapshot);

/// Who hears of each durable save (the actor API's CheckpointSaved): called
/// on the checkpoint_saver's thread, once the save of `global_step` is
/// committed under `path` ("<dir>/<basename>-<step>") and before its ticket
/// completes. Callbacks must be quick (they send a message). Thread-safe.
class SaveObservers {
 public:
  using Fn = std::function<void(int64_t global_step, const std::string& path)>;
  void Add(Fn fn) {
    MutexLock l(mu_);
    fns_.push_back(std::move(fn));
  }
  void Notify(int64_t global_step, const std::string& path) {
    MutexLock l(mu_);
    for (const Fn& fn : fns_) fn(global_step, path);
  }

 private:
  Mutex mu_;
  std::vector<Fn> fns_ ABSL_GUARDED_BY(mu_);
};

/// The checkpoint_saver actor of one directory. It owns the directory lock.
class CheckpointService {
 public:
  virtual ~CheckpointService() = default;
  /// Sends `snapshot` to be saved as "<dir>/<basename>-<step>" with `saver`
  /// and, once durable, a SessionLog CHECKPOINT at `step` into the dir's
  /// summary writer (B106). Never blocks. The caller waits for a previous
  /// ticket before starting the next one (one save in flight). A failed save
  /// completes the ticket with its error and is also reported (error()).
  /// When the actor is gone, the ticket comes back completed with an error.
  /// Under a restart policy that may restart the saver (restart_policy.hpp):
  /// a failed save ends the saver's incarnation instead, and its ticket
  /// completes with the error marked lost (SaveTicket::lost; the run goes
  /// on); a save started while the saver is down is parked and sent to the
  /// restarted one (the caller's bounded Wait on the ticket bounds it).
  virtual std::shared_ptr<SaveTicket> StartSave(std::map<std::string, Tensor> snapshot, int64_t step) = 0;
  virtual const std::string& directory() const = 0;
  virtual const std::shared_ptr<Saver>& saver() const = 0;
};

/// The step_counter actor: logs "global_step/sec: <v>" and writes the
/// summary `<tag>` (B110) into `output_dir`'s writer when it is non-empty.
class StepCounterService {
 public:
  virtual ~StepCounterService() = default;
  virtual void Record(int64_t global_step, double steps_per_sec) = 0;
};

/// The seam through which a FaultInjectionHook injects ActorFaults
/// (fault.hpp) into the runtime's service actors, without CAF: the Runtime
/// implements it and hands it out as Services::service_faults(); the
/// MonitoredSession gives every hook that is an internal::ServiceUser the
/// Services at creation (ServiceUser::AttachServices). `service` is a kind:
/// "summary_writer", "checkpoint_saver", "step_counter" or "input_pipeline";
/// each call acts on every running service of that kind. Thread-safe.
class ServiceFaults {
 public:
  virtual ~ServiceFaults() = default;
  /// Makes each such service actor quit: with INTERNAL "injected actor fault
  /// <fault_id>" as its exit reason, or normally when `normal_exit` (OTP:
  /// exit(normal)); the session_supervisor then applies the restart policy.
  /// The exit reason carries the kInjectedFaultPayload (fault.hpp) with
  /// `fault_id`. For each service sent the fault, one Completion is appended
  /// to `*applied` (when not null): the session_supervisor completes it (OK)
  /// once it has handled that service's exit -- the failure escalated (and
  /// the failure_sink has taken the report), the service removed, restarted
  /// (no back-off) or its restart scheduled (with a back-off: completed
  /// then, not after it), or the normal exit forgotten -- or the tree shut
  /// down. The service's link (ChildLink::NoteKill, actors/) notes the
  /// kill, so requests it can no longer take fail with `fault_id` as
  /// payload even after a normal exit. Returns how many were sent the
  /// fault; 0 when none runs.
  virtual int Kill(const std::string& service, const std::string& fault_id, bool normal_exit,
                   std::vector<std::shared_ptr<Completion>>* applied) = 0;
  /// The next `count` (>= 1) work messages of each such service are dropped,
  /// or delayed by `delay` (waited on the session's Clock by the actor).
  /// Returns how many services got it.
  virtual int DelayOrDrop(const std::string& service, const std::string& fault_id, bool drop, int64_t count,
                          absl::Duration delay) = 0;
};

class Services {
 public:
  virtual ~Services() = default;
  /// Creates the writer actor for `logdir` on first use (EventFileWriter::Create
  /// errors are returned here).
  virtual StatusOr<std::shared_ptr<SummaryWriterService>> SummaryWriter(const std::string& logdir) = 0;
  /// Spawns (or returns) the checkpoint_saver for `dir`; takes the directory
  /// lock (FAILED_PRECONDITION naming the holder when another process has it)
  /// and holds it until Shutdown. The same `dir` again returns the same
  /// service when `saver` and `basename` are the same, else
  /// FAILED_PRECONDITION (one writer per directory). Also creates `dir`'s
  /// summary writer (for the CHECKPOINT events, B106).
  virtual StatusOr<std::shared_ptr<CheckpointService>> CheckpointSaver(const std::string& dir,
                                                                       std::shared_ptr<Saver> saver,
                                                                       const std::string& basename) = 0;
  /// Spawns (or returns) the step_counter for (`output_dir`, `tag`); an
  /// empty output_dir logs only.
  virtual StatusOr<std::shared_ptr<StepCounterService>> StepCounter(const std::string& output_dir,
                                                                    const std::string& tag) = 0;
  /// The coordinator of the current session (B19: a new one per created
  /// session; nullptr between sessions). A service failure is recorded here
  /// (first error wins, sticky across sessions, see error()) and passed to
  /// that coordinator's request_stop(), which the loop reads; a coordinator
  /// set after a failure is stopped with it at once. Returns only when no
  /// report uses the previous coordinator any more (it may then be
  /// destroyed).
  virtual void SetCoordinator(Coordinator* coord) = 0;
  /// The first error any service reported (OK when none).
  virtual Status error() = 0;
  /// Blocks until every save started so far is durable (or failed); bounded
  /// by `timeout` (DEADLINE_EXCEEDED). A recovery calls it before restoring,
  /// so the restore sees the newest checkpoint.
  virtual Status WaitForPendingSaves(absl::Duration timeout) = 0;
  /// Calls `fn` after every durable save of this session's checkpoint
  /// savers, on the saver's thread (SaveObservers). Call before the first
  /// save (a hook's AttachServices).
  virtual void ObserveSaves(SaveObservers::Fn fn) = 0;
  virtual Clock* clock() = 0;
  virtual Env* env() = 0;
  /// An input pipeline whose producer is a service child of the session's
  /// supervisor, kind "input_pipeline" (MonitoredSession::NewInputPipeline
  /// documents it). FAILED_PRECONDITION after Shutdown; INVALID_ARGUMENT
  /// for bad options.
  virtual StatusOr<std::unique_ptr<data::InputPipeline>> NewInputPipeline(
      std::shared_ptr<const data::Dataset> /*dataset*/, data::InputPipelineOptions /*options*/) {
    return absl::UnimplementedError("these services have no input pipelines");
  }
  /// Actor fault injection (null when the services cannot be reached).
  virtual ServiceFaults* service_faults() { return nullptr; }
  /// Every restart or removal the supervisor performed (RestartPolicy).
  virtual std::vector<ServiceRestart> restarts() { return {}; }
};

}  // namespace foreman::internal
