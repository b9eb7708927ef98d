// Where a cluster session's variables live (issue 13): the seam between a
// Session and the parameter servers. TF1 places a worker's variables on the
// ps tasks (replica_device_setter) and every session.run reads them there
// and runs the apply ops there; Foreman's Session keeps a local mirror of
// the values (SessionValues::vars) and, when its target is a cluster's,
// refreshes the mirror from a RemoteValues before anything reads it and
// sends a step's gradients through it. CAF-free: actors/ implements it over
// ps shard actors (the tcp:// and tls:// targets); tests implement it in
// memory.
//
// Which variables are remote: those Bind() was given (the graph's global
// variables whose VariableDef::device is empty). The others (a worker's
// input position, device "/job:worker") stay in the mirror only: each
// worker has its own, and the chief's are the ones its checkpoints carry.
//
// Thread-safety: a Session calls every method with its SessionValues::mu
// held, one call at a time per SessionValues; an implementation shared by
// several SessionValues must be thread-safe. Every method is bounded in time
// (the implementation's own timeouts); none may block forever.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "foreman/status.hpp"
#include "foreman/variable_store.hpp"

namespace foreman {
struct Gradients;  // optimizer.hpp
}

namespace foreman::internal {

class RemoteValues {
 public:
  virtual ~RemoteValues() = default;

  /// The remote variables' names, in the graph's creation order (placement
  /// depends on it: PlaceVariablesOnPs). Called by Session::Create; every
  /// session of one target passes the same names (a different list:
  /// INVALID_ARGUMENT naming the first difference). Makes no remote call.
  virtual Status Bind(const std::vector<std::string>& names) = 0;

  /// Sets every bound variable in `mirror` to its current remote value
  /// (reusing the mirror's storage where dtype and shape match). Variables
  /// of a ps task that is not initialized yet are erased from `mirror`
  /// (TF's report_uninitialized_variables sees them: a worker waits for the
  /// chief). Values of different ps tasks may come from different updates
  /// (TF1's async reads, cluster.md rule 3). Errors: UNAVAILABLE naming the
  /// ps task and address when it cannot be reached; `mirror` is then
  /// unspecified for the bound variables.
  virtual Status Read(VariableStore& mirror) = 0;

  /// Read(), less what a training step does not read: the optimizer's slots
  /// (nn's slot names, e.g. "w/Adam" and "w/Adam_1": with Adam 2/3 of the
  /// bytes) keep the values they have in `mirror` (from the last Read or
  /// ReadConsistent; absent if there was none), every other bound variable
  /// (global_step and the beta powers included) is set as by Read. A ps
  /// task that is not initialized yet: all its bound variables, slots
  /// included, are erased from `mirror`, as by Read. Session::Run uses it
  /// (the step's update runs on the ps tasks, which hold the current slots);
  /// a Run that fetches a slot, WithVariables, Snapshot, GlobalStep and the
  /// ready check (UninitializedVariables) use Read. TF1: a worker's
  /// session.run reads only the ps variables its fetches need. Errors as
  /// Read. The default implementation is Read.
  virtual Status ReadForStep(VariableStore& mirror) { return Read(mirror); }

  /// Read(), as one state of the whole cluster: no update lands on any ps
  /// task between the first task's read and the last's (the chief's
  /// checkpoint, cluster.md rule "a consistent snapshot of all ps shards at
  /// one global_step"). FAILED_PRECONDITION when a ps task is not
  /// initialized; UNAVAILABLE as Read.
  virtual Status ReadConsistent(VariableStore& mirror) = 0;

  /// What a Write is: the chief's init op (or init_fn), or its restore of
  /// a checkpoint.
  enum class WriteKind { kInit, kRestore };

  /// Replaces the remote variables with `mirror`'s values of the bound
  /// names (the chief's init op or restore: TF's init_op / Saver.restore
  /// running on the ps devices). Every bound name must be in `mirror`
  /// (FAILED_PRECONDITION naming the first missing one). A ps task that
  /// holds training (TaskState::trained) refuses a kInit write
  /// (FAILED_PRECONDITION naming it, and its global_step when it holds it:
  /// issue 31 point 3, only a restore replaces a running job's training)
  /// and takes a kRestore one; an init op's values no update followed may
  /// be written again (a half-done init retried). UNAVAILABLE as
  /// Read; a failure may leave some ps tasks written and others not (the
  /// chief retries the whole init/restore in recovery).
  virtual Status Write(const VariableStore& mirror, WriteKind kind) = 0;

  /// One ps task as the chief's session manager sees it before an init op.
  struct TaskState {
    std::string where;       // "ps task K (host:port)"
    std::string job_id;      // the task's cluster job id
    bool same_job = true;    // job_id is this process's
    bool initialized = false;
    /// Restored from a checkpoint, or updated since its init op: an init
    /// op would lose training (refused: Write's kInit).
    bool trained = false;
    int64_t global_step = -1;  // -1: not held (or not initialized)
  };

  /// Every ps task's state, in task order (one stats request each, bounded
  /// by the implementation's timeouts). Errors: UNAVAILABLE as Read.
  virtual StatusOr<std::vector<TaskState>> TaskStates() = 0;

  /// A training step's update (TF1: apply_gradients run on the ps tasks):
  /// each ps task applies the gradients of its variables with its slots
  /// (the ps task's optimizer, grads.learning_rate / grads.adam_step_size),
  /// and ps 0 increments global_step once. `computed_at_step` is the
  /// global_step the gradients were computed from (synchronous mode drops
  /// older ones). Returns the new global_step. Errors: UNAVAILABLE as Read;
  /// OUT_OF_RANGE once the chief ended training (EndTraining: the worker's
  /// run ends cleanly, as at the end of its input); a ps task's refusal
  /// (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION) unchanged.
  virtual StatusOr<int64_t> Apply(const Gradients& grads, int64_t computed_at_step) = 0;

  /// Apply(), and `mirror` then set as by ReadForStep from each ps task's
  /// state right after it applied this update (issue 27 point 2: PsRemote-
  /// Values asks for both in one round trip, the ps answering the apply
  /// with the values). Session::Run's step uses it, so a worker's next step
  /// needs no read of its own: an implementation may then answer the next
  /// ReadForStep of the same `mirror` from what this call stored, provided
  /// no other method was called in between (Bind, every Read*, Write and
  /// Apply* end that; a new session's first step always reads, as after a
  /// recovery). TF1's semantics: the next step reads after its own update
  /// landed; other workers' updates are seen as far as they had arrived (an
  /// asynchronous read). Returns the new global_step; errors as Apply's,
  /// and `mirror` is then unspecified for the bound variables (the next
  /// ReadForStep reads). The mirror's tensors may get new buffers (the
  /// received bytes become them): a data pointer or Eigen map taken before
  /// the call is invalid after it (the Tensor objects stay). The default:
  /// Apply, then ReadForStep(mirror).
  virtual StatusOr<int64_t> ApplyAndRead(const Gradients& grads, int64_t computed_at_step, VariableStore& mirror) {
    StatusOr<int64_t> next = Apply(grads, computed_at_step);
    if (!next.ok()) return next;
    if (Status s = ReadForStep(mirror); !s.ok()) return s;
    return next;
  }

  /// How a session of this target waits for an unreachable ps task (issue
  /// 13 point 4; ClusterOptions::ps_wait_secs and heartbeat_ms): on an
  /// UNAVAILABLE error MonitoredSession's recovery keeps re-creating the
  /// session every `retry_interval` for at most `wait`, as ONE recovery,
  /// instead of spending RecoveryOptions' bounded attempts and back-off;
  /// past `wait` the run fails with UNAVAILABLE naming the ps task and the
  /// wait. `wait` zero (the default): no such wait. Makes no remote call;
  /// constant for the target's lifetime; thread-safe.
  struct PsWait {
    absl::Duration wait = absl::ZeroDuration();
    absl::Duration retry_interval = absl::ZeroDuration();
  };
  virtual PsWait ps_wait() const { return {}; }
};

}  // namespace foreman::internal
