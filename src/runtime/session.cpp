// The raw Session (session.hpp). The step function runs under the values'
// mutex, which also serialises the steps of sessions sharing an inproc://
// target. On a cluster target (SessionValues::remote) the values are a
// mirror: every run and every read of the values refreshes it from the
// RemoteValues first, under the same mutex (cluster/remote_values.hpp).
#include "foreman/session.hpp"

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compute/cpu_device.hpp"
#include "compute/device_factory.hpp"
#include "foreman/mutex.hpp"
#include "foreman/optimizer.hpp"
#include "platform/log.hpp"
#include "runtime/session_access.hpp"
#include "runtime/session_target.hpp"

namespace foreman {
namespace {

int64_t ThreadId() { return static_cast<int64_t>(::syscall(SYS_gettid)); }

int64_t MicrosNow(Clock* clock) { return absl::ToInt64Microseconds(clock->MonotonicNow()); }

// kGlobalStepName as a std::string, built once (compared every run).
const std::string& GlobalStepName() {
  static const std::string name(kGlobalStepName);
  return name;
}

}  // namespace

// -- StepContext ------------------------------------------------------------------

StepContext::StepContext(VariableStore* variables, const std::vector<std::string>* requested,
                         const TensorMap* feeds, TensorMap* results, const Eigen::ThreadPoolDevice* device,
                         compute::Device* compute, RunMetadata* metadata, Clock* clock)
    : variables_(variables),
      requested_(requested),
      feeds_(feeds),
      results_(results),
      device_(device),
      compute_(compute),
      metadata_(metadata),
      clock_(clock) {}

StepContext::StepContext(VariableStore* variables, const std::vector<std::string>* requested,
                         const TensorMap* feeds, TensorMap* results, const Eigen::ThreadPoolDevice* device,
                         RunMetadata* metadata, Clock* clock)
    : StepContext(variables, requested, feeds, results, device, nullptr, metadata, clock) {}

StepContext::StepContext(VariableStore* variables, const std::vector<std::string>* requested,
                         const TensorMap* feeds, Tensor* slots, unsigned char* answered,
                         const Eigen::ThreadPoolDevice* device, compute::Device* compute, RunMetadata* metadata,
                         Clock* clock)
    : StepContext(variables, requested, feeds, nullptr, device, compute, metadata, clock) {
  slots_ = slots;
  answered_ = answered;
}

StepContext::~StepContext() = default;

compute::Device& StepContext::compute() const {
  if (compute_ == nullptr) {
    owned_compute_ = std::make_unique<compute::CpuDevice>(device_);
    compute_ = owned_compute_.get();
  }
  return *compute_;
}

bool StepContext::requested(const std::string& fetch) const {
  return std::binary_search(requested_->begin(), requested_->end(), fetch);
}

const Tensor* StepContext::feed(const std::string& name) const {
  auto it = feeds_->find(name);
  return it == feeds_->end() ? nullptr : &it->second;
}

void StepContext::Set(const std::string& fetch, Tensor value) {
  if (slots_ != nullptr) {
    auto it = std::lower_bound(requested_->begin(), requested_->end(), fetch);
    if (it == requested_->end() || *it != fetch) return;
    const auto i = static_cast<std::size_t>(it - requested_->begin());
    slots_[i] = std::move(value);
    answered_[i] = 1;
    return;
  }
  if (!requested(fetch)) return;
  (*results_)[fetch] = std::move(value);
}

int StepContext::intra_op_threads() const { return device_->numThreads(); }

Status StepContext::ApplyGradients(const Gradients& grads, const Optimizer& optimizer) {
  VariableStore& vars = *variables_;
  const bool has_step = vars.Contains(GlobalStepName());
  if (remote_ == nullptr) {
    FOREMAN_RETURN_IF_ERROR(optimizer.ApplyGradients(grads, vars, compute()));
    if (has_step) FOREMAN_RETURN_IF_ERROR(IncrementGlobalStep(vars).status());
    return absl::OkStatus();
  }
  // A cluster: the ps tasks apply them; the mirror's global_step (read at the
  // start of this run) is the step the gradients were computed from. Without
  // a global_step in the mirror the update is sent as computed at step 0.
  int64_t computed_at_step = 0;
  if (has_step) {
    FOREMAN_ASSIGN_OR_RETURN(computed_at_step, GetGlobalStep(vars));
  }
  // One round trip: the ps tasks answer the update with what the next
  // step reads (RemoteValues::ApplyAndRead).
  applied_ = true;
  FOREMAN_ASSIGN_OR_RETURN(int64_t next, remote_->ApplyAndRead(grads, computed_at_step, vars));
  if (has_step) FOREMAN_RETURN_IF_ERROR(SetGlobalStep(vars, next));
  return absl::OkStatus();
}

StepContext::Span::Span(StepContext* ctx, std::string name) : ctx_(ctx), name_(std::move(name)) {
  if (ctx_ != nullptr) start_us_ = MicrosNow(ctx_->clock_);
}

StepContext::Span::Span(Span&& other) noexcept
    : ctx_(std::exchange(other.ctx_, nullptr)), name_(std::move(other.name_)), start_us_(other.start_us_) {}

StepContext::Span::~Span() {
  if (ctx_ == nullptr || ctx_->metadata_ == nullptr) return;
  const int64_t end_us = MicrosNow(ctx_->clock_);
  ctx_->metadata_->step_stats.push_back(TraceEvent{name_, "step", start_us_, end_us - start_us_, ThreadId()});
}

StepContext::Span StepContext::Trace(std::string name) {
  return Span(metadata_ != nullptr ? this : nullptr, std::move(name));
}

// -- Session ------------------------------------------------------------------------

struct Session::Impl {
  std::shared_ptr<Graph> graph;
  std::string target;
  SessionConfig config;
  // Declared before `values`, so destroyed after them: the device copies of
  // values only this session holds (VariableStore::DeviceData) are freed
  // while the device lives. Close() and, for values held elsewhere too,
  // ~Session release them explicitly (ReleaseDeviceCopies).
  std::unique_ptr<compute::Device> device;   // SessionConfig.device
  std::shared_ptr<internal::SessionValues> values;
  std::unique_ptr<compute::CpuDevice> host;  // the intra-op pool when `device` is not the CPU
  compute::CpuDevice* cpu = nullptr;         // device or host: StepContext::eigen_device()
  std::atomic<bool> closed{false};
  // Every fetch Run() accepts, sorted; empty when the graph declares no
  // fetches (then nothing is checked before the step).
  std::vector<std::string> known_fetches;
  // The graph's variables (global and local), sorted: with declared fetches,
  // fetching one that holds no value fails before the step.
  std::vector<std::string> variable_names;
  // The chief's init op or restore is running (SessionAccess::
  // SetWriteThrough): WithVariables writes the mirror to the remote after
  // `fn` succeeds, as this kind (0: off, else 1 + RemoteValues::WriteKind).
  // Only on a cluster session; set by one thread while no other uses the
  // session.
  std::atomic<int> write_through{0};
  // A cluster session's ps-held variables (RemoteValues::Bind's names), and
  // whether a run's step already returned OK without ApplyGradients and
  // was checked for in-place updates of all of them (InPlaceUpdateError).
  // Under values->mu.
  std::vector<std::string> remote_names;
  bool in_place_checked = false;
};

namespace {

// A cluster step that updated the mirror itself (graph.hpp's local way)
// would never train: its changes are overwritten by the next read.
Status InPlaceUpdateError(const std::string& target, const std::string& variable, const std::string& change) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the step function changed variable '", variable, "' in place (", change, ") on a cluster session (target '",
      target, "'): there variables() is this worker's copy of the ps tasks' values, read again before every run, "
      "so the change would be lost and training would never advance. Compute the gradients and call "
      "StepContext::ApplyGradients(grads, optimizer): the ps tasks apply them and advance global_step "
      "(TF1: optimizer.apply_gradients(grads, global_step))"));
}

// The bytes of each of `names` in `vars` (empty for a string or missing
// variable: not compared).
std::vector<std::string> SnapshotBytes(const VariableStore& vars, const std::vector<std::string>& names) {
  std::vector<std::string> bytes(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    StatusOr<const Tensor*> t = vars.Get(names[i]);
    if (!t.ok() || (*t)->dtype() == DataType::kString || (*t)->dtype() == DataType::kInvalid) continue;
    bytes[i].assign((*t)->raw_data(), (*t)->TotalBytes());
  }
  return bytes;
}

}  // namespace

namespace {

// Copies back every variable value the session's device holds newer than
// the host and frees the device's copies (VariableStore::ReleaseDevice): what
// Close() and ~Session do before the device goes. Nothing for the CPU.
Status ReleaseDeviceCopies(compute::Device* device, internal::SessionValues& values) {
  if (device == nullptr || device->host_memory()) return absl::OkStatus();
  MutexLock lock(values.mu);
  return values.vars.ReleaseDevice(*device);
}

// The fetches a graph that declares its own accepts: those, its summary ops,
// its variables and the runtime's global_step and train_op. Sorted, unique.
std::vector<std::string> KnownFetches(const Graph& graph) {
  if (graph.fetches().empty()) return {};
  std::vector<std::string> known = graph.fetches();
  known.insert(known.end(), graph.summary_ops().begin(), graph.summary_ops().end());
  for (const VariableDef& def : graph.variables()) known.push_back(def.name);
  known.push_back(kGlobalStepName);
  known.push_back(kTrainOpName);
  std::sort(known.begin(), known.end());
  known.erase(std::unique(known.begin(), known.end()), known.end());
  return known;
}

}  // namespace

StatusOr<std::unique_ptr<Session>> Session::Create(std::shared_ptr<Graph> graph, const std::string& target,
                                                   const SessionConfig& config) {
  if (graph == nullptr) return absl::InvalidArgumentError("Session::Create: null graph");
  if (!graph->step()) return absl::InvalidArgumentError("Session::Create: the graph has no step function (Graph::SetStep)");
  if (config.intra_op_parallelism_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("SessionConfig.intra_op_parallelism_threads must be >= 0, got ",
                                                   config.intra_op_parallelism_threads));
  }
  if (config.actor_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SessionConfig.actor_threads must be >= 0, got ", config.actor_threads));
  }
  if (config.env == nullptr || config.clock == nullptr) {
    return absl::InvalidArgumentError("SessionConfig: env and clock must not be null");
  }
  int threads = config.intra_op_parallelism_threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<compute::Device> device,
                           compute::CreateDevice(config.device, threads, config.device_memory_limit_bytes));
  if (!device->host_memory() && !target.empty()) {
    // Variables with device copies are one session's own: values shared
    // through a target (inproc://, a cluster's mirror) are read and written
    // on the host by other sessions and by the ps tasks.
    return absl::FailedPreconditionError(absl::StrCat(
        "session target '", target, "' cannot be used with SessionConfig.device '", config.device, "' (",
        device->name(), "): a device without host memory holds the variables only for a local session (target \"\")"));
  }
  FOREMAN_ASSIGN_OR_RETURN(std::shared_ptr<internal::SessionValues> values, internal::ResolveSessionTarget(target));
  graph->Finalize();  // B19 / B93: creating a session finalizes the graph
  // The variables replica_device_setter puts on the ps tasks: the global
  // ones without a device, in declaration (creation) order.
  std::vector<std::string> remote_names;
  if (values->remote != nullptr) {
    for (const VariableDef& def : graph->variables()) {
      if (!def.local && def.device.empty()) remote_names.push_back(def.name);
    }
    MutexLock lock(values->mu);
    FOREMAN_RETURN_IF_ERROR(values->remote->Bind(remote_names));
  }

  auto impl = std::make_unique<Impl>();
  impl->remote_names = std::move(remote_names);
  impl->known_fetches = KnownFetches(*graph);
  for (const VariableDef& def : graph->variables()) impl->variable_names.push_back(def.name);
  std::sort(impl->variable_names.begin(), impl->variable_names.end());
  impl->graph = std::move(graph);
  impl->target = target;
  impl->config = config;
  impl->values = std::move(values);
  impl->device = std::move(device);
  impl->cpu = dynamic_cast<compute::CpuDevice*>(impl->device.get());
  if (impl->cpu == nullptr) {
    impl->host = std::make_unique<compute::CpuDevice>(threads);
    impl->cpu = impl->host.get();
  }
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Session::~Session() {
  // The device's copies go before the device does (Close() did this unless
  // the session was never closed). Values only this session holds die with
  // it, before the device (Impl's member order): their device copies are
  // freed, not copied back. Values held elsewhere too get them back.
  if (impl_->values.use_count() == 1) return;
  if (Status s = ReleaseDeviceCopies(impl_->device.get(), *impl_->values); !s.ok()) {
    FOREMAN_LOG_WARN("Session: the variables on {} could not be copied back: {}", impl_->device->name(),
                     s.ToString());
  }
}

StatusOr<TensorMap> Session::Run(const std::vector<std::string>& fetches, const TensorMap& feeds,
                                 const RunOptions& options, RunMetadata* metadata) {
  if (impl_->closed.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError("Attempted to use a closed Session.");
  }
  // The step sees the fetch names sorted and unique; a caller that passes
  // them so saves the copy.
  std::vector<std::string> sorted_copy;
  const std::vector<std::string>* requested_names = &fetches;
  if (!std::is_sorted(fetches.begin(), fetches.end()) ||
      std::adjacent_find(fetches.begin(), fetches.end()) != fetches.end()) {
    sorted_copy = fetches;
    std::sort(sorted_copy.begin(), sorted_copy.end());
    sorted_copy.erase(std::unique(sorted_copy.begin(), sorted_copy.end()), sorted_copy.end());
    requested_names = &sorted_copy;
  }
  const std::vector<std::string>& requested = *requested_names;
  absl::InlinedVector<Tensor, 4> values(requested.size());
  absl::InlinedVector<unsigned char, 8> answered(requested.size());
  FOREMAN_RETURN_IF_ERROR(RunCore(requested, feeds, options, metadata, values.data(), answered.data()));
  // Exactly the requested fetches, in the caller's order for the error (a
  // name listed twice is returned once).
  TensorMap out;
  for (const std::string& fetch : fetches) {
    auto [it, inserted] = out.try_emplace(fetch);
    if (!inserted) continue;
    const auto i =
        static_cast<std::size_t>(std::lower_bound(requested.begin(), requested.end(), fetch) - requested.begin());
    if (answered[i] == 0) {
      return absl::NotFoundError("fetch '" + fetch + "' was requested but the step function did not produce it");
    }
    it->second = std::move(values[i]);
  }
  return out;
}

Status Session::RunCore(const std::vector<std::string>& requested, const TensorMap& feeds,
                        const RunOptions& options, RunMetadata* metadata, Tensor* values,
                        unsigned char* answered) {
  if (!impl_->known_fetches.empty()) {
    for (const std::string& fetch : requested) {
      if (!std::binary_search(impl_->known_fetches.begin(), impl_->known_fetches.end(), fetch)) {
        return absl::NotFoundError(absl::StrCat(
            "fetch '", fetch, "' is not known to the graph (not declared by Graph::AddFetch, not a summary op, not a ",
            "variable, not global_step or train_op); the step did not run"));
      }
    }
  }
  const std::size_t n = requested.size();
  std::fill(answered, answered + n, static_cast<unsigned char>(0));

  Clock* clock = impl_->config.clock;
  RunMetadata* trace = options.trace_level > RunOptions::kNoTrace ? metadata : nullptr;
  Status status;
  // The clock is read only for a trace or a timeout (not every step).
  const bool timed = trace != nullptr || options.timeout_in_ms > 0;
  const absl::Duration started = timed ? clock->MonotonicNow() : absl::ZeroDuration();
  {
    MutexLock lock(impl_->values->mu);
    VariableStore& vars = impl_->values->vars;
    internal::RemoteValues* remote = impl_->values->remote.get();
    // A cluster session: the step sees the variables' values on the ps
    // tasks (its error, UNAVAILABLE say, is the run's, unchanged).
    // The step needs no optimizer slot (its update runs on the ps tasks):
    // ReadForStep leaves them, unless this run fetches one.
    if (remote != nullptr) {
      const bool fetches_slot = std::any_of(requested.begin(), requested.end(),
                                            [](const std::string& f) { return IsOptimizerSlotName(f); });
      FOREMAN_RETURN_IF_ERROR(fetches_slot ? remote->Read(vars) : remote->ReadForStep(vars));
    }
    if (!impl_->known_fetches.empty()) {
      for (const std::string& fetch : requested) {
        if (std::binary_search(impl_->variable_names.begin(), impl_->variable_names.end(), fetch) &&
            !vars.Contains(fetch)) {
          // TF: "Attempting to use uninitialized value" (FailedPreconditionError).
          return absl::FailedPreconditionError(absl::StrCat("Attempting to use uninitialized value ", fetch,
                                                            " (fetched); the step did not run"));
        }
      }
    }
    // B126: the built-in "global_step" fetch is the value before the step
    // (written into the slot's int64 scalar when it has one).
    if (auto it = std::lower_bound(requested.begin(), requested.end(), GlobalStepName());
        it != requested.end() && *it == GlobalStepName()) {
      StatusOr<int64_t> step = GetGlobalStep(vars);
      if (step.ok()) {
        const auto i = static_cast<std::size_t>(it - requested.begin());
        Tensor& slot = values[i];
        if (slot.dtype() == DataType::kInt64 && slot.shape().rank() == 0) {
          *slot.data<int64_t>() = *step;
        } else {
          slot = Tensor::Scalar<int64_t>(*step);
        }
        answered[i] = 1;
      }
    }
    // A cluster step must not update the mirror in place: global_step is
    // compared every run, every ps-held variable at the first run.
    std::optional<int64_t> step_before;
    std::vector<std::string> bytes_before;
    if (remote != nullptr) {
      if (StatusOr<int64_t> s = GetGlobalStep(vars); s.ok()) step_before = *s;
      if (!impl_->in_place_checked) bytes_before = SnapshotBytes(vars, impl_->remote_names);
    }
    StepContext ctx(&vars, &requested, &feeds, values, answered, &impl_->cpu->eigen_device(), impl_->device.get(),
                    trace, clock);
    ctx.remote_ = remote;
    const int64_t start_us = absl::ToInt64Microseconds(started);
    static const std::string kWhere = "step function";
    status = InvokeUserCode(kWhere, [&] { return impl_->graph->step()(ctx); });
    if (status.ok() && remote != nullptr && !ctx.applied_) {
      if (step_before.has_value()) {
        if (StatusOr<int64_t> s = GetGlobalStep(vars); s.ok() && *s != *step_before) {
          return InPlaceUpdateError(impl_->target, GlobalStepName(),
                                    absl::StrCat("from ", *step_before, " to ", *s));
        }
      }
      if (!impl_->in_place_checked) {
        const std::vector<std::string> bytes_after = SnapshotBytes(vars, impl_->remote_names);
        for (std::size_t i = 0; i < bytes_after.size(); ++i) {
          if (bytes_before[i] != bytes_after[i]) {
            return InPlaceUpdateError(impl_->target, impl_->remote_names[i], "its bytes differ after the step");
          }
        }
        impl_->in_place_checked = true;
      }
    }
    if (status.ok()) {
      // Fetches the step left unanswered that the Session answers: train_op
      // (an empty Tensor, TF's None for an op) and variables (their value now).
      for (std::size_t i = 0; i < n; ++i) {
        if (answered[i] != 0) continue;
        const std::string& fetch = requested[i];
        if (fetch == kTrainOpName) {
          values[i] = Tensor();
          answered[i] = 1;
        } else if (StatusOr<const Tensor*> value = std::as_const(vars).Get(fetch);
                   value.ok() && (*value)->dtype() != DataType::kInvalid) {
          values[i] = **value;
          answered[i] = 1;
        } else if (!value.ok() && !absl::IsNotFound(value.status())) {
          status = value.status();  // the device's failed copy back (INTERNAL naming the variable)
          break;
        }
      }
    }
    if (trace != nullptr) {
      const int64_t end_us = MicrosNow(clock);
      trace->step_stats.push_back(TraceEvent{"step", "session", start_us, end_us - start_us, ThreadId()});
    }
  }
  if (!status.ok()) return status;
  if (options.timeout_in_ms > 0 &&
      clock->MonotonicNow() - started > absl::Milliseconds(options.timeout_in_ms)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the step ran longer than RunOptions.timeout_in_ms = ", options.timeout_in_ms));
  }
  return absl::OkStatus();
}

namespace internal {

Status SessionAccess::RunInto(Session& session, const std::vector<std::string>& fetches, const TensorMap& feeds,
                              const RunOptions& options, RunMetadata* metadata, std::vector<Tensor>* values,
                              std::vector<unsigned char>* answered) {
  if (session.closed()) return absl::FailedPreconditionError("Attempted to use a closed Session.");
  values->resize(fetches.size());
  answered->resize(fetches.size());
  FOREMAN_RETURN_IF_ERROR(session.RunCore(fetches, feeds, options, metadata, values->data(), answered->data()));
  for (std::size_t i = 0; i < fetches.size(); ++i) {
    if ((*answered)[i] == 0) {
      return absl::NotFoundError("fetch '" + fetches[i] +
                                 "' was requested but the step function did not produce it");
    }
  }
  return absl::OkStatus();
}

}  // namespace internal

Status Session::WithVariables(const std::function<Status(VariableStore&)>& fn) {
  MutexLock lock(impl_->values->mu);
  internal::RemoteValues* remote = impl_->values->remote.get();
  if (remote != nullptr) FOREMAN_RETURN_IF_ERROR(remote->Read(impl_->values->vars));
  FOREMAN_RETURN_IF_ERROR(InvokeUserCode("Session::WithVariables", [&] {
    impl_->values->mu.AssertHeld();  // runs here, under `lock`
    return fn(impl_->values->vars);
  }));
  // The chief's init op or restore: the ps tasks take the new values.
  if (const int kind = impl_->write_through.load(std::memory_order_acquire); remote != nullptr && kind != 0) {
    return remote->Write(impl_->values->vars, static_cast<internal::RemoteValues::WriteKind>(kind - 1));
  }
  return absl::OkStatus();
}

std::map<std::string, Tensor> Session::Snapshot() {
  std::map<std::string, Tensor> snapshot;
  {
    MutexLock lock(impl_->values->mu);
    if (internal::RemoteValues* remote = impl_->values->remote.get(); remote != nullptr) {
      if (Status s = remote->Read(impl_->values->vars); !s.ok()) {
        FOREMAN_LOG_WARN("Session::Snapshot: the variables could not be read: {}", s.ToString());
        return snapshot;
      }
    }
    snapshot = impl_->values->vars.Snapshot();
  }
  for (const std::string& local : impl_->graph->LocalVariableNames()) snapshot.erase(local);
  return snapshot;
}

StatusOr<int64_t> Session::GlobalStep() {
  MutexLock lock(impl_->values->mu);
  if (internal::RemoteValues* remote = impl_->values->remote.get(); remote != nullptr) {
    FOREMAN_RETURN_IF_ERROR(remote->Read(impl_->values->vars));
  }
  return GetGlobalStep(impl_->values->vars);
}

std::vector<std::string> Session::UninitializedVariables() { return UninitializedVariables(false); }

std::vector<std::string> Session::UninitializedVariables(bool include_local) {
  StatusOr<std::vector<std::string>> missing = internal::SessionAccess::UninitializedVariables(*this, include_local);
  if (missing.ok()) return *std::move(missing);
  // The ps tasks could not be read: their variables count as uninitialized.
  FOREMAN_LOG_WARN("Session::UninitializedVariables: {}", missing.status().ToString());
  std::vector<std::string> names;
  MutexLock lock(impl_->values->mu);
  for (const VariableDef& def : impl_->graph->variables()) {
    if (def.local && !include_local) continue;
    if ((!def.local && def.device.empty()) || !impl_->values->vars.Contains(def.name)) names.push_back(def.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

namespace internal {

StatusOr<std::vector<std::string>> SessionAccess::UninitializedVariables(Session& session, bool include_local) {
  Session::Impl& impl = *session.impl_;
  std::vector<std::string> missing;
  MutexLock lock(impl.values->mu);
  if (RemoteValues* remote = impl.values->remote.get(); remote != nullptr) {
    FOREMAN_RETURN_IF_ERROR(remote->Read(impl.values->vars));
  }
  for (const VariableDef& def : impl.graph->variables()) {
    if (def.local && !include_local) continue;
    if (!impl.values->vars.Contains(def.name)) missing.push_back(def.name);
  }
  std::sort(missing.begin(), missing.end());
  return missing;
}

Status SessionAccess::WithConsistentVariables(Session& session, const std::function<Status(VariableStore&)>& fn) {
  Session::Impl& impl = *session.impl_;
  MutexLock lock(impl.values->mu);
  if (RemoteValues* remote = impl.values->remote.get(); remote != nullptr) {
    FOREMAN_RETURN_IF_ERROR(remote->ReadConsistent(impl.values->vars));
  }
  return InvokeUserCode("Session::WithVariables", [&] {
    impl.values->mu.AssertHeld();  // runs here, under `lock`
    return fn(impl.values->vars);
  });
}

bool SessionAccess::remote_variables(const Session& session) { return session.impl_->values->remote != nullptr; }

StatusOr<std::vector<RemoteValues::TaskState>> SessionAccess::ps_task_states(Session& session) {
  MutexLock lock(session.impl_->values->mu);
  RemoteValues* remote = session.impl_->values->remote.get();
  if (remote == nullptr) return std::vector<RemoteValues::TaskState>();
  return remote->TaskStates();
}

compute::Device& SessionAccess::compute_device(Session& session) { return *session.impl_->device; }

std::optional<RemoteValues::PsWait> SessionAccess::ps_wait(const Session& session) {
  const RemoteValues* remote = session.impl_->values->remote.get();
  if (remote == nullptr) return std::nullopt;
  RemoteValues::PsWait w = remote->ps_wait();
  if (w.wait <= absl::ZeroDuration()) return std::nullopt;
  return w;
}

std::optional<int64_t> SessionAccess::mirrored_global_step(Session& session) {
  MutexLock lock(session.impl_->values->mu);
  StatusOr<int64_t> step = GetGlobalStep(session.impl_->values->vars);
  if (!step.ok()) return std::nullopt;
  return *step;
}

void SessionAccess::SetWriteThrough(Session& session, std::optional<RemoteValues::WriteKind> kind) {
  session.impl_->write_through.store(kind.has_value() ? 1 + static_cast<int>(*kind) : 0, std::memory_order_release);
}

}  // namespace internal

Status Session::Close() {
  impl_->closed.store(true, std::memory_order_release);
  // The variables come back to the host (hooks' end(), Snapshot() and a
  // later session on the same values read them there); the device's INTERNAL
  // when a copy fails (those values stay at their last host copy).
  return ReleaseDeviceCopies(impl_->device.get(), *impl_->values);
}

bool Session::closed() const { return impl_->closed.load(std::memory_order_acquire); }
const std::shared_ptr<Graph>& Session::graph() const { return impl_->graph; }
const std::string& Session::target() const { return impl_->target; }
const SessionConfig& Session::config() const { return impl_->config; }

}  // namespace foreman
