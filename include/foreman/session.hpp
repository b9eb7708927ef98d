// The raw Session: values for a Graph's variables, and run(fetches, feeds).
// (TF: tf.compat.v1.Session.)
//
//   ```cpp
//   #include "foreman/session.hpp"
//   #include "foreman/session_manager.hpp"  // DefaultInitOp
//   FOREMAN_ASSIGN_OR_RETURN(auto sess, foreman::Session::Create(graph, "", config));
//   FOREMAN_RETURN_IF_ERROR(foreman::DefaultInitOp()(*sess, {}));  // TF: sess.run(init_op)
//   FOREMAN_ASSIGN_OR_RETURN(foreman::TensorMap out, sess->Run({"loss", "train_op"}, feeds));
//   FOREMAN_ASSIGN_OR_RETURN(float loss, out.at("loss").scalar<float>());
//   ```
//
// Run() calls the graph's step function with the requested fetch names; only
// those are computed. Fetches the Session answers when the step does not:
//   "global_step"  the value read *before* the step runs (TF's stale
//                  global-step read)
//   "train_op"     an empty Tensor (dtype kInvalid): TF's run() returns None
//                  for an op. The step trains when ctx.requested("train_op").
//   a variable     its value after the step
// When the graph declares its fetches (Graph::AddFetch), an unknown fetch is
// NOT_FOUND before the step runs, so nothing changes.
//
// Targets (TF's `master`):
//   ""               a local session with its own variable values
//   "inproc://NAME"  sessions of one process that name the same NAME share
//                    one set of values (a chief and its workers in tests, the
//                    in-process analogue of a TF server); steps of sessions
//                    sharing values are serialised by one mutex.
//   anything else    UNIMPLEMENTED, listing the registered forms. Targets are
//                    resolved through one registry of schemes, so tcp:// and
//                    tls:// (clusters) are added without changing Session.
//
// A cluster target (a worker Server's target(), tcp:// or tls://): the global
// variables without a device (VariableDef::device) live on the ps tasks and
// the session holds a mirror of them.
// Run(), WithVariables(), Snapshot(), GlobalStep() and
// UninitializedVariables() first read every such variable from the ps tasks
// (one network read of all of them each; a ps task not initialized yet shows
// its variables as uninitialized); an unreachable ps task is UNAVAILABLE,
// which MonitoredSession recovers from. Changes a caller makes to the mirror
// are not sent to the ps tasks: a step sends its update with
// StepContext::ApplyGradients, and only the chief's session manager (init op,
// init_fn, restore) writes the ps tasks' values.
//
// Thread-safety: Run(), WithVariables(), Snapshot() and GlobalStep() may be
// called from any thread; each holds the values' mutex while it runs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "foreman/clock.hpp"
#include "foreman/compute.hpp"
#include "foreman/env.hpp"
#include "foreman/graph.hpp"
#include "foreman/optimizer.hpp"
#include "foreman/status.hpp"
#include "foreman/tensor.hpp"
#include "foreman/variable_store.hpp"

namespace Eigen {
struct ThreadPoolDevice;
}

namespace foreman {

namespace internal {
class RemoteValues;
class SessionAccess;  // the runtime's allocation-free run (MonitoredSession)
}

/// The fetch that runs a training step (TF: the train_op). The Session
/// answers it with an empty Tensor when the step function does not set it.
inline constexpr char kTrainOpName[] = "train_op";

/// Named tensors: feeds going into a step, fetch results coming out.
using TensorMap = std::map<std::string, Tensor>;

/// TF's RunOptions (the fields hooks merge).
struct RunOptions {
  enum TraceLevel : int { kNoTrace = 0, kSoftwareTrace = 1, kHardwareTrace = 2, kFullTrace = 3 };
  TraceLevel trace_level = kNoTrace;
  /// 0 = no limit. A step still running past it is not interrupted (Foreman
  /// cannot preempt user code); Run() then returns DEADLINE_EXCEEDED.
  int64_t timeout_in_ms = 0;
  bool report_tensor_allocations_upon_oom = false;
};

/// One span of a traced run (Chrome trace-event "X" event), microseconds on
/// the session's monotonic clock.
struct TraceEvent {
  std::string name;
  std::string category;
  int64_t start_us = 0;
  int64_t duration_us = 0;
  int64_t thread_id = 0;
};

/// TF's RunMetadata: with trace_level > kNoTrace, the spans of the run: one
/// "step" span for the whole step function plus those the step recorded with
/// StepContext::Trace().
struct RunMetadata {
  std::vector<TraceEvent> step_stats;
};

/// TF's ConfigProto, the parts Foreman uses. Passed through unchanged from
/// MonitoredTrainingSession / Supervisor to every session.
struct SessionConfig {
  /// Threads of the Eigen thread pool a step may use (StepContext::
  /// eigen_device(), and the CPU compute device); 0 = one per hardware
  /// thread. (TF: intra_op_parallelism_threads.)
  int intra_op_parallelism_threads = 0;
  /// CAF scheduler threads when Foreman owns the actor system
  /// (scheduler.max-threads); 0 = 2. Ignored for a caller's actor system.
  int actor_threads = 0;
  /// The session's compute device (StepContext::compute()): "", "/cpu:0" or
  /// "/device:CPU:0" is the CPU; "/gpu:N" or "/device:GPU:N" is CUDA device
  /// N. Checked by Session::Create, never UNAVAILABLE or ABORTED (a device
  /// error is not a reason to recover):
  ///   INVALID_ARGUMENT     not a device name ("/tpu:0", "/gpu:x", "gpu:0")
  ///   FAILED_PRECONDITION  no such device, naming it: a build without CUDA,
  ///                        no driver, fewer CUDA devices, "/cpu:1"
  ///   RESOURCE_EXHAUSTED   out of device memory, naming the device and size
  /// On a GPU the variables a step uses on the device live there
  /// (VariableStore::DeviceData) and are copied back when the host reads
  /// them (hooks, checkpoints, fetches); only a local target ("") may use a
  /// GPU (FAILED_PRECONDITION otherwise).
  std::string device;
  /// At most this many bytes of device memory for a GPU session (0: the
  /// device's own limit); an allocation beyond it is RESOURCE_EXHAUSTED
  /// naming the device and the size (TF: GPUOptions.
  /// per_process_gpu_memory_fraction, in bytes). Ignored for the CPU.
  /// INVALID_ARGUMENT when negative.
  int64_t device_memory_limit_bytes = 0;
  /// Seams: every file operation and timing decision of the
  /// session and of everything built from this config. Not owned; must
  /// outlive it.
  Env* env = Env::Default();
  Clock* clock = Clock::Real();
};

/// What one step sees. Lives for one Session::Run call; not thread-safe.
class StepContext {
 public:
  /// The session's variable values (the step updates them in place).
  VariableStore& variables() { return *variables_; }
  /// Fetch names asked for in this run (caller's and hooks', deduplicated,
  /// sorted).
  const std::vector<std::string>& requested() const { return *requested_; }
  /// Whether `fetch` was asked for in this run.
  bool requested(const std::string& fetch) const;
  /// The fed tensor, or nullptr when `name` was not fed.
  const Tensor* feed(const std::string& name) const;
  const TensorMap& feeds() const { return *feeds_; }
  /// Answers `fetch` (replacing an earlier answer). Answers to names nobody
  /// requested are dropped.
  void Set(const std::string& fetch, Tensor value);

  /// The session's compute device (SessionConfig.device), owned by the
  /// session: what nn::Mlp runs on. Not thread-safe (one step at a time).
  compute::Device& compute() const;
  /// The CPU Eigen device of the session's intra-op pool, for a step's own
  /// Eigen code, whatever SessionConfig.device is (never null).
  const Eigen::ThreadPoolDevice& eigen_device() const { return *device_; }
  int intra_op_threads() const;

  /// Applies a step's gradients (TF1: optimizer.apply_gradients(grads,
  /// global_step=global_step); optimizer.hpp). On a local or inproc://
  /// session: optimizer.ApplyGradients(grads, variables(), compute()), then
  /// global_step += 1 when variables() holds it. On a cluster session
  /// (tcp://, tls://: remote_variables()), the ps tasks apply them with
  /// their own optimizer (started from the same flags; `optimizer` is not
  /// used), and variables() then holds what each ps task answered right
  /// after applying them (every variable but the optimizer slots, other
  /// workers' updates as far as they had arrived; global_step ps 0's new
  /// value): the next run's read, taken in the same round trip. On a
  /// cluster a data pointer or Eigen map into variables() taken before the
  /// call is invalid after it (the received bytes become the tensors'
  /// buffers; the Tensor objects stay). Gradients' buffers are read until
  /// the call returns. Errors: the optimizer's; on a cluster,
  /// UNAVAILABLE naming the ps task that cannot be reached, OUT_OF_RANGE
  /// once the chief ended training (end the run as at the end of input).
  Status ApplyGradients(const Gradients& grads, const Optimizer& optimizer);
  /// Whether the variables live on parameter servers (a cluster target):
  /// the step should then compute gradients (nn::Mlp::ComputeGradients) and
  /// call ApplyGradients rather than update variables() itself. There,
  /// variables() is this worker's copy, read again before every run, so an
  /// update made to it in place would be lost: a run whose step returns OK
  /// without calling ApplyGradients fails with FAILED_PRECONDITION (naming
  /// the variable) when it changed global_step (checked every run) or any
  /// other ps-held variable (checked at the session's first such run).
  bool remote_variables() const { return remote_ != nullptr; }

  /// Records a span for RunMetadata while tracing is on (no-op otherwise):
  ///   { auto span = ctx.Trace("forward"); ...work...; }
  class Span {
   public:
    Span(Span&& other) noexcept;
    ~Span();

   private:
    friend class StepContext;
    Span(StepContext* ctx, std::string name);
    StepContext* ctx_;
    std::string name_;
    int64_t start_us_ = 0;
  };
  Span Trace(std::string name);
  bool tracing() const { return metadata_ != nullptr; }

  /// For Session's implementation and tests that call a StepFn directly.
  /// `compute` (not owned) is what compute() returns; null means a CPU
  /// device on `device`, made by the first compute() call.
  StepContext(VariableStore* variables, const std::vector<std::string>* requested, const TensorMap* feeds,
              TensorMap* results, const Eigen::ThreadPoolDevice* device, compute::Device* compute,
              RunMetadata* metadata, Clock* clock);
  /// Same, with compute = null.
  StepContext(VariableStore* variables, const std::vector<std::string>* requested, const TensorMap* feeds,
              TensorMap* results, const Eigen::ThreadPoolDevice* device, RunMetadata* metadata, Clock* clock);
  ~StepContext();

 private:
  friend class Session;
  // Session's own: answers go to slots[i] for requested()[i] (answered[i]
  // set) instead of a map, so that a run allocates no map nodes.
  StepContext(VariableStore* variables, const std::vector<std::string>* requested, const TensorMap* feeds,
              Tensor* slots, unsigned char* answered, const Eigen::ThreadPoolDevice* device,
              compute::Device* compute, RunMetadata* metadata, Clock* clock);

  VariableStore* variables_;
  const std::vector<std::string>* requested_;
  const TensorMap* feeds_;
  TensorMap* results_;  // null in slot mode
  Tensor* slots_ = nullptr;
  unsigned char* answered_ = nullptr;
  const Eigen::ThreadPoolDevice* device_;
  mutable std::unique_ptr<compute::Device> owned_compute_;  // the second constructor's
  mutable compute::Device* compute_;
  RunMetadata* metadata_;  // null unless tracing
  Clock* clock_;
  internal::RemoteValues* remote_ = nullptr;  // a cluster session's (Session sets it)
  bool applied_ = false;                      // ApplyGradients was called (a cluster's in-place check)
};

class Session {
 public:
  /// Finalizes `graph` (as TF) and creates a session on `target` (see above).
  ///   INVALID_ARGUMENT    null graph, graph without a step function, bad config
  ///   UNIMPLEMENTED       a target of no registered scheme ("" / "inproc://NAME")
  ///   INVALID_ARGUMENT / FAILED_PRECONDITION / UNIMPLEMENTED /
  ///   RESOURCE_EXHAUSTED  the device (SessionConfig::device, above)
  static StatusOr<std::unique_ptr<Session>> Create(std::shared_ptr<Graph> graph, const std::string& target = "",
                                                   const SessionConfig& config = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Runs the step function for `fetches` with `feeds` and returns exactly the
  /// requested fetches.
  /// "global_step", "train_op" and variables the step does not answer are
  /// answered by the Session (top of this file).
  ///   FAILED_PRECONDITION  "Attempted to use a closed Session."; with declared
  ///                        fetches, a fetched variable that holds no value
  ///                        ("Attempting to use uninitialized value v"),
  ///                        before the step runs
  ///   NOT_FOUND            a fetch the graph does not know (when it declares
  ///                        its fetches: Graph::AddFetch), before the step
  ///                        runs; otherwise a fetch the step did not answer,
  ///                        after it ran. The message names the fetch.
  ///   UNAVAILABLE          a cluster session whose ps task cannot be read
  ///                        (naming it), before the step runs
  ///   the step's own error (exceptions converted, status.hpp), including
  ///   StepContext::ApplyGradients's UNAVAILABLE / OUT_OF_RANGE, unchanged
  StatusOr<TensorMap> Run(const std::vector<std::string>& fetches, const TensorMap& feeds = {},
                          const RunOptions& options = {}, RunMetadata* metadata = nullptr);

  /// Runs `fn` on the variable values under the values' mutex (init ops,
  /// restore, reads by hooks). `fn`'s exceptions become a Status. On a
  /// cluster session it reads every remote variable first (UNAVAILABLE then,
  /// and `fn` does not run); what `fn` changes stays in this target's mirror
  /// (the next read replaces remote variables) unless the chief's session
  /// manager runs it as the init op, init_fn or restore.
  Status WithVariables(const std::function<Status(VariableStore&)>& fn);
  /// A deep copy of the global (checkpointed) variables that are initialized,
  /// keyed by name: what a checkpoint saves. Local variables are excluded.
  /// On a cluster session, after a read of every remote variable; empty
  /// (and logged) when a ps task cannot be read.
  std::map<std::string, Tensor> Snapshot();
  /// The current global_step (GetGlobalStep on the values). On a cluster
  /// session, after a read of every remote variable (its UNAVAILABLE).
  StatusOr<int64_t> GlobalStep();
  /// Names of the graph's global variables that hold no value yet, sorted
  /// (what TF's default ready_op reports). On a cluster session, after a
  /// read of every remote variable; when a ps task cannot be read its
  /// variables are reported (and the error logged).
  std::vector<std::string> UninitializedVariables();
  /// Same for every variable, local ones included.
  std::vector<std::string> UninitializedVariables(bool include_local);

  /// Closes the session; later Run() calls fail. Idempotent. Values shared
  /// through inproc:// stay with the other sessions.
  Status Close();
  bool closed() const;

  const std::shared_ptr<Graph>& graph() const;
  const std::string& target() const;
  const SessionConfig& config() const;

 private:
  friend class internal::SessionAccess;
  struct Impl;
  explicit Session(std::unique_ptr<Impl> impl);
  // Run()'s work for `requested` sorted and unique: values[i] answers
  // requested[i] (answered[i] = 1), both of requested.size(); their tensors'
  // storage is reused. Does not check closed().
  Status RunCore(const std::vector<std::string>& requested, const TensorMap& feeds, const RunOptions& options,
                 RunMetadata* metadata, Tensor* values, unsigned char* answered);
  std::unique_ptr<Impl> impl_;
};

/// An inproc:// target's values live like a TF server's, until this drops
/// them (sessions still using them keep their reference); the next session
/// on that target starts uninitialized. Returns whether the target existed.
bool ResetInprocTarget(const std::string& target);

}  // namespace foreman
