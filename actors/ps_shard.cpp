#include "ps_shard.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "atoms.hpp"
#include "cluster/peer_silence.hpp"
#include "status_error.hpp"
#include "compute/cpu_device.hpp"
#include "foreman/tensor.hpp"
#include "nn/optimizer.hpp"
#include "platform/log.hpp"

namespace foreman::internal {

namespace {

constexpr char kGlobalStepName[] = "global_step";

// How an apply is answered: (ps_apply_atom) with the new global_step,
// (ps_apply_read_atom) with the shard's step variables right after it
// (StepValues). Errors either way.
struct ApplyReply {
  caf::response_promise promise;
  bool with_values = false;
};

struct HeldApply {
  ApplyGradientsMessage update;
  ApplyReply reply;
};

struct ps_shard_state {
  PsShardOptions options;
  std::unique_ptr<compute::CpuDevice> device;
  bool initialized = false;
  // Restored from a checkpoint, or updated since the last init op: an init
  // op would lose training (refused).
  bool trained = false;
  // Every tensor here is a block tensor (tensor_bytes.hpp): reads share
  // its bytes with the answer (no copy), and an update that finds a block
  // still shared (an answer not yet serialized) writes a copy instead
  // (Writable).
  std::map<std::string, Tensor> vars;
  bool frozen = false;
  uint64_t freeze_epoch = 0;  // the timeout of an older freeze is ignored
  caf::actor_addr freezer;    // who froze the shard (monitored): its end thaws it
  std::deque<HeldApply> held;
  PsShardStatsMessage stats;
  // Synchronous mode (options.replicas_to_aggregate > 0): the step whose
  // gradients are accumulated, and the applies waiting for the aggregated
  // update, in arrival order, one per worker, each with its gradients (TF's
  // ConditionalAccumulator sums them as they come; they are kept apart here
  // so a worker's newer apply of the step replaces its older one, and summed
  // in arrival order, in float, at the N-th).
  int64_t sync_step = 0;
  struct Waiting {
    int32_t worker = 0;
    std::vector<std::pair<std::string, Tensor>> grads;
    ApplyReply reply;
  };
  std::vector<Waiting> waiting;
  // Gradients averaged into the applied updates, and the fewest and most in
  // one update (the end-of-training line: N each when all is well).
  int64_t aggregated_gradients = 0;
  int64_t min_per_update = 0, max_per_update = 0;
  ApplyGradientsMessage last_rates;  // the learning rate / step size of the last accumulated apply (no tensors)
  // Training ended (ps_end_atom): every apply is answered OUT_OF_RANGE.
  bool ended = false;
  int64_t end_step = -1;  // the global_step named in the answer
  std::string ended_by = "the chief";  // who ended training (ps_end_atom's `by`)
  // Its task is evicted (ps_evict_atom): every apply is refused with
  // `stopping` (UNAVAILABLE); `read_while_frozen`: a read since the
  // current freeze (the chief's consistent read for its checkpoint).
  bool evicted = false;
  Status stopping;
  bool read_while_frozen = false;
  // Per worker index: when an apply from it last arrived (steady clock ns,
  // 0: never); the accepted counts are stats.worker_applies.
  std::vector<int64_t> worker_last_apply_ns;
  // options.silence_ms > 0: logs the chief falling silent and returning.
  std::unique_ptr<PeerSilenceLog> silence;
  static const char* name;
};
const char* ps_shard_state::name = "ps_shard";

std::string Who(const ps_shard_state& st) { return absl::StrCat("ps task ", st.options.task_index); }

// Another cluster job's request (PsShardOptions::job_id): FAILED_PRECONDITION
// naming both ids; `what` is the request ("the init", "an apply").
Status CheckJob(const ps_shard_state& st, const std::string& sender_job, const char* what) {
  if (sender_job == st.options.job_id) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      Who(st), " serves cluster job '", st.options.job_id, "' and refused ", what, " of cluster job '", sender_job,
      "': two jobs share this ps address (a task started with another job's cluster spec, or another "
      "--cluster-job-id); the running job '", st.options.job_id, "' is untouched"));
}

Status NotInitialized(const ps_shard_state& st) {
  return absl::FailedPreconditionError(absl::StrCat(Who(st), " is not initialized"));
}

bool IsBetaPower(const std::string& name) { return nn::internal::IsBetaPowerName(name); }

// True when `name` is "<var>/<suffix>" for a held variable <var> and one of
// TF1's slot suffixes (any optimizer's: a slot is never trainable).
bool IsSlot(const ps_shard_state& st, const std::string& name) {
  std::string primary;
  return nn::internal::IsSlotName(name, &primary) && st.vars.count(primary) > 0;
}

int64_t GlobalStep(const ps_shard_state& st) {
  auto it = st.vars.find(kGlobalStepName);
  return it == st.vars.end() ? -1 : *it->second.data<int64_t>();
}

// FromMessage(std::move(m)): a block tensor, the received bytes taken
// without a copy when `m` holds the only reference; its error naming the ps
// task.
StatusOr<Tensor> TensorOf(const ps_shard_state& st, TensorMessage& m) {
  StatusOr<Tensor> t = FromMessage(std::move(m));
  if (!t.ok()) return Status(t.status().code(), absl::StrCat(Who(st), ": ", t.status().message()));
  return t;
}

// The answer's copy of variable `t` (a block tensor): its bytes shared.
TensorMessage Message(const std::string& name, const Tensor& t) {
  TensorMessage m;
  m.name = name;
  m.dtype = static_cast<int32_t>(t.dtype());
  m.shape = t.shape().dims();
  m.bytes = TensorBytes::ShareBlockOf(t);
  return m;
}

// `t` (a block tensor of st.vars) made safe to write: a copy when an
// answer still shares its bytes.
void Writable(Tensor& t) {
  if (!TensorBytes::IsUniqueBlockTensor(t)) t = TensorBytes::BlockCopyOf(t);
}

Status Init(ps_shard_state& st, VariablesMessage& message) {
  std::map<std::string, Tensor> vars;
  for (TensorMessage& m : message.tensors) {
    if (m.name.empty()) return absl::InvalidArgumentError(absl::StrCat(Who(st), ": a variable with an empty name"));
    FOREMAN_ASSIGN_OR_RETURN(Tensor t, TensorOf(st, m));
    if (m.name == kGlobalStepName && (t.dtype() != DataType::kInt64 || t.shape().dims().size() != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(Who(st), ": global_step must be an int64 scalar, got ",
                                                     DataTypeName(t.dtype()), " ", t.shape().ToString()));
    }
    if (IsBetaPower(m.name) && (t.dtype() != DataType::kFloat || t.shape().dims().size() != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(Who(st), ": ", m.name, " must be a float32 scalar, got ",
                                                     DataTypeName(t.dtype()), " ", t.shape().ToString()));
    }
    if (!vars.emplace(m.name, std::move(t)).second) {
      return absl::InvalidArgumentError(absl::StrCat(Who(st), ": variable '", m.name, "' given twice"));
    }
  }
  const bool b1 = vars.count(nn::internal::kBeta1PowerName) > 0;
  const bool b2 = vars.count(nn::internal::kBeta2PowerName) > 0;
  if (b1 != b2) {
    return absl::InvalidArgumentError(absl::StrCat(Who(st), ": ",
                                                   b1 ? nn::internal::kBeta1PowerName : nn::internal::kBeta2PowerName,
                                                   " without ",
                                                   b1 ? nn::internal::kBeta2PowerName : nn::internal::kBeta1PowerName));
  }
  // The chief's optimizer must be this shard's (every task gets the same
  // --optimizer): a slot or beta power of another optimizer means the
  // shard would apply updates the chief's graph does not describe.
  const std::vector<std::string> own_slots = nn::internal::SlotSuffixes(st.options.optimizer.kind);
  const std::string own_kind = nn::OptimizerKindName(st.options.optimizer.kind);
  for (const auto& [name, tensor] : vars) {
    std::string primary;
    const bool foreign_slot =
        nn::internal::IsSlotName(name, &primary) && vars.count(primary) > 0 &&
        std::find(own_slots.begin(), own_slots.end(), name.substr(primary.size() + 1)) == own_slots.end();
    const bool foreign_beta = IsBetaPower(name) && st.options.optimizer.kind != nn::OptimizerKind::kAdam;
    if (foreign_slot || foreign_beta) {
      return absl::InvalidArgumentError(absl::StrCat(
          Who(st), ": the chief's variables include '", name, "', which the ", own_kind,
          " optimizer this ps task runs does not have: give every task of the cluster the same --optimizer"));
    }
  }
  st.vars = std::move(vars);
  st.initialized = true;
  auto gs = st.vars.find(kGlobalStepName);
  st.sync_step = gs != st.vars.end() ? *gs->second.data<int64_t>() : message.global_step;
  return absl::OkStatus();
}

StatusOr<VariablesMessage> Read(const ps_shard_state& st, const std::vector<std::string>& names) {
  if (!st.initialized) return NotInitialized(st);
  VariablesMessage out;
  out.global_step = GlobalStep(st);
  out.tensors.reserve(names.size());
  for (const std::string& name : names) {
    auto it = st.vars.find(name);
    if (it == st.vars.end()) {
      return absl::NotFoundError(absl::StrCat(Who(st), " holds no variable '", name, "'"));
    }
    out.tensors.push_back(Message(name, it->second));
  }
  return out;
}

// What a training step reads from the shard (ReadForStep's names: every
// variable but the optimizer slots), sorted by name: the answer of
// ps_apply_read_atom.
VariablesMessage StepValues(const ps_shard_state& st) {
  VariablesMessage out;
  out.global_step = GlobalStep(st);
  for (const auto& [name, t] : st.vars) {
    if (!IsSlot(st, name)) out.tensors.push_back(Message(name, t));
  }
  return out;
}

StatusOr<VariablesMessage> Snapshot(const ps_shard_state& st) {
  if (!st.initialized) return NotInitialized(st);
  std::vector<std::string> names;
  names.reserve(st.vars.size());
  for (const auto& [name, t] : st.vars) names.push_back(name);
  return Read(st, names);
}

Status CheckRate(const ps_shard_state& st, const char* field, float value) {
  // 0 is a rate (a decayed rate underflows to 0 in float32; TF's apply ops
  // take it, and nn::ApplyGradients does too): the slots still update.
  if (!std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(Who(st), ": ", field, " must be finite and >= 0, got ", value));
  }
  return absl::OkStatus();
}

// One planned update: validated, nothing changed yet.
struct Planned {
  std::string name;
  Tensor grad;
  Tensor* var = nullptr;
  Tensor* slots[2] = {nullptr, nullptr};
};

// A validated update: the step size and, per gradient, its variable and
// slots. Nothing is changed until Commit().
struct Plan {
  float lr = 0;
  std::vector<Planned> gradients;
};

// Takes the gradients' bytes out of `update` (without a copy when they were
// received), so `update` is left without them.
StatusOr<Plan> PlanUpdate(ps_shard_state& st, ApplyGradientsMessage& update) {
  if (!st.initialized) return NotInitialized(st);
  const nn::OptimizerOptions& opt = st.options.optimizer;
  float lr = update.learning_rate;
  if (opt.kind == nn::OptimizerKind::kAdam) {
    FOREMAN_RETURN_IF_ERROR(CheckRate(st, "adam_step_size", update.adam_step_size));
    lr = update.adam_step_size;
  } else {
    FOREMAN_RETURN_IF_ERROR(CheckRate(st, "learning_rate", update.learning_rate));
  }
  const std::vector<std::string> suffixes = nn::internal::SlotSuffixes(opt.kind);
  std::vector<Planned> plan;
  plan.reserve(update.gradients.tensors.size());
  std::set<std::string> seen;
  for (TensorMessage& m : update.gradients.tensors) {
    if (!seen.insert(m.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(Who(st), ": two gradients for variable '", m.name, "'"));
    }
    auto it = st.vars.find(m.name);
    if (it == st.vars.end()) {
      return absl::NotFoundError(absl::StrCat(Who(st), " holds no variable '", m.name, "' (a gradient for it)"));
    }
    if (m.name == kGlobalStepName || IsBetaPower(m.name) || IsSlot(st, m.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Who(st), ": variable '", m.name, "' is not trainable (a gradient for it)"));
    }
    Planned p;
    p.name = m.name;
    p.var = &it->second;
    if (p.var->dtype() != DataType::kFloat) {
      return absl::InvalidArgumentError(absl::StrCat(Who(st), ": variable '", m.name, "' is ",
                                                     DataTypeName(p.var->dtype()), ", only float32 is trained"));
    }
    FOREMAN_ASSIGN_OR_RETURN(p.grad, TensorOf(st, m));
    if (p.grad.dtype() != DataType::kFloat) {
      return absl::InvalidArgumentError(absl::StrCat(Who(st), ": the gradient of '", m.name, "' is ",
                                                     DataTypeName(p.grad.dtype()), ", expected float32"));
    }
    if (p.grad.shape() != p.var->shape()) {
      return absl::InvalidArgumentError(absl::StrCat(Who(st), ": the gradient of '", m.name, "' has shape ",
                                                     p.grad.shape().ToString(), ", its variable ",
                                                     p.var->shape().ToString()));
    }
    for (std::size_t s = 0; s < suffixes.size() && s < 2; ++s) {
      const std::string slot = absl::StrCat(m.name, "/", suffixes[s]);
      auto sit = st.vars.find(slot);
      if (sit == st.vars.end()) {
        return absl::FailedPreconditionError(absl::StrCat(Who(st), " holds no slot '", slot, "' of variable '",
                                                          m.name, "' (not initialized with the optimizer's slots)"));
      }
      if (sit->second.dtype() != DataType::kFloat || sit->second.shape() != p.var->shape()) {
        return absl::FailedPreconditionError(absl::StrCat(Who(st), ": slot '", slot, "' is ",
                                                          DataTypeName(sit->second.dtype()), " ",
                                                          sit->second.shape().ToString(), ", its variable float32 ",
                                                          p.var->shape().ToString()));
      }
      p.slots[s] = &sit->second;
    }
    plan.push_back(std::move(p));
  }
  return Plan{lr, std::move(plan)};
}

// Applies a planned update (TF1's kernels), then AdamOptimizer._finish and
// global_step's increment where held. Fails only for bad arguments to the
// device, which PlanUpdate excluded.
StatusOr<int64_t> Commit(ps_shard_state& st, const Plan& plan) {
  const nn::OptimizerOptions& opt = st.options.optimizer;
  const float lr = plan.lr;
  for (const Planned& p : plan.gradients) {
    Writable(*p.var);
    if (p.slots[0] != nullptr) Writable(*p.slots[0]);
    if (p.slots[1] != nullptr) Writable(*p.slots[1]);
    FOREMAN_RETURN_IF_ERROR(nn::internal::ApplyDense(
        opt, lr, p.var->data<float>(), p.grad.data<float>(), p.slots[0] ? p.slots[0]->data<float>() : nullptr,
        p.slots[1] ? p.slots[1]->data<float>() : nullptr, p.var->num_elements(), *st.device));
  }
  auto b1 = st.vars.find(nn::internal::kBeta1PowerName);
  auto b2 = st.vars.find(nn::internal::kBeta2PowerName);
  if (opt.kind == nn::OptimizerKind::kAdam && b1 != st.vars.end() && b2 != st.vars.end()) {
    // AdamOptimizer._finish: beta*_power.assign(beta*_power * beta*).
    Writable(b1->second);
    Writable(b2->second);
    *b1->second.data<float>() = *b1->second.data<float>() * opt.beta1;
    *b2->second.data<float>() = *b2->second.data<float>() * opt.beta2;
  }
  auto gs = st.vars.find(kGlobalStepName);
  if (gs != st.vars.end()) {
    Writable(gs->second);
    ++*gs->second.data<int64_t>();
  }
  return GlobalStep(st);
}

StatusOr<int64_t> Apply(ps_shard_state& st, ApplyGradientsMessage& update) {
  FOREMAN_ASSIGN_OR_RETURN(Plan plan, PlanUpdate(st, update));
  return Commit(st, plan);
}

caf::error ErrorOf(const Status& s) { return StatusToError(s); }

void Refuse(ApplyReply& reply, const Status& why) { reply.promise.deliver(ErrorOf(why)); }

// An accepted apply's answer, taken now (after the update it was part of).
void Answer(const ps_shard_state& st, ApplyReply& reply, int64_t global_step) {
  if (reply.with_values) {
    reply.promise.deliver(StepValues(st));
  } else {
    reply.promise.deliver(global_step);
  }
}

// Answers every apply waiting for an aggregated update with `why`.
void FailWaiting(ps_shard_state& st, const Status& why) {
  for (auto& w : st.waiting) Refuse(w.reply, why);
  st.waiting.clear();
}

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool CountedWorker(int32_t worker) { return worker >= 0 && worker < kMaxCountedWorkers; }

// An apply from `worker` arrived (accepted or not).
void NoteArrival(ps_shard_state& st, int32_t worker) {
  if (!CountedWorker(worker)) return;
  const auto k = static_cast<std::size_t>(worker);
  if (st.worker_last_apply_ns.size() <= k) st.worker_last_apply_ns.resize(k + 1, 0);
  st.worker_last_apply_ns[k] = SteadyNowNs();
}

// An apply from `worker` was accepted (applied, or accumulated).
void CountAccepted(ps_shard_state& st, int32_t worker) {
  if (!CountedWorker(worker)) return;
  const auto k = static_cast<std::size_t>(worker);
  std::vector<int64_t>& v = st.stats.worker_applies;
  if (v.size() <= k) v.resize(k + 1, 0);
  ++v[k];
}

// Synchronous mode (TF's SyncReplicasOptimizer on this shard): adds
// `update`'s gradients to the accumulators, or drops them when stale; the
// replicas_to_aggregate-th apply of a step applies the means once.
void Accumulate(ps_shard_state& st, ApplyGradientsMessage& update, ApplyReply reply) {
  StatusOr<Plan> plan = PlanUpdate(st, update);
  if (!plan.ok()) {
    ++st.stats.refused_updates;
    Refuse(reply, plan.status());
    return;
  }
  const int64_t step = update.gradients.step;
  if (step < st.sync_step) {
    // TF's accumulators drop a gradient of a step older than theirs.
    st.stats.stale_gradients += 1;
    st.stats.dropped_gradients += 1;
    FOREMAN_LOG_DEBUG("{}: dropped the stale gradients of worker {} computed at step {} (now at step {})", Who(st),
                      update.gradients.worker, step, st.sync_step);
    Answer(st, reply, GlobalStep(st));
    return;
  }
  if (step > st.sync_step) {
    ++st.stats.refused_updates;
    Refuse(reply, absl::InvalidArgumentError(absl::StrCat(
        Who(st), ": gradients of step ", step, " from worker ", update.gradients.worker,
        ", but the shard aggregates step ", st.sync_step, " (a step it has not reached)")));
    return;
  }
  // One apply per worker and step: a worker's newer apply (its session
  // recovered after its older one timed out, and ran the step again)
  // replaces its older one, which is answered ABORTED and counted dropped,
  // so N applies are always N workers' gradients.
  for (auto it = st.waiting.begin(); it != st.waiting.end(); ++it) {
    if (it->worker != update.gradients.worker) continue;
    st.stats.dropped_gradients += 1;
    Refuse(it->reply, absl::AbortedError(absl::StrCat(Who(st), ": worker ", update.gradients.worker,
                                                      "'s apply of step ", step,
                                                      " was replaced by its newer apply of the same step")));
    st.waiting.erase(it);
    // A worker's applies count once per step: the newer one, not the replaced one.
    if (CountedWorker(update.gradients.worker)) {
      --st.stats.worker_applies[static_cast<std::size_t>(update.gradients.worker)];
    }
    break;
  }
  ps_shard_state::Waiting w;
  w.worker = update.gradients.worker;
  for (Planned& p : plan->gradients) w.grads.emplace_back(p.name, std::move(p.grad));
  w.reply = std::move(reply);
  st.waiting.push_back(std::move(w));
  CountAccepted(st, update.gradients.worker);
  st.last_rates.learning_rate = update.learning_rate;
  st.last_rates.adam_step_size = update.adam_step_size;
  if (static_cast<int64_t>(st.waiting.size()) < st.options.replicas_to_aggregate) return;

  // The mean of each variable's gradients (TF: accum / counter, in float;
  // the first gradient copied, the next ones added in arrival order),
  // applied once.
  struct Accumulator {
    Tensor sum;
    int64_t count = 0;
  };
  std::map<std::string, Accumulator> accumulators;
  for (ps_shard_state::Waiting& one : st.waiting) {
    for (auto& [name, grad] : one.grads) {
      auto [it, fresh] = accumulators.try_emplace(name);
      if (fresh) {
        it->second.sum = std::move(grad);
      } else {
        float* sum = it->second.sum.data<float>();
        const float* g = grad.data<float>();
        for (int64_t i = 0; i < grad.num_elements(); ++i) sum[i] += g[i];
      }
      ++it->second.count;
    }
    one.grads.clear();
  }
  ApplyGradientsMessage mean = st.last_rates;
  for (auto& [name, acc] : accumulators) {
    float* sum = acc.sum.data<float>();
    const float count = static_cast<float>(acc.count);
    for (int64_t i = 0; i < acc.sum.num_elements(); ++i) sum[i] = sum[i] / count;
    // Shared, not copied: once the sums are dropped, PlanUpdate takes them.
    mean.gradients.tensors.push_back(Message(name, acc.sum));
  }
  accumulators.clear();
  StatusOr<int64_t> r = Apply(st, mean);
  std::vector<ps_shard_state::Waiting> waiting = std::move(st.waiting);
  st.waiting.clear();
  if (!r.ok()) {
    ++st.stats.refused_updates;
    for (auto& one : waiting) Refuse(one.reply, r.status());
    return;
  }
  ++st.stats.applied_updates;
  st.trained = true;
  ++st.sync_step;
  const auto n = static_cast<int64_t>(waiting.size());
  st.aggregated_gradients += n;
  st.min_per_update = st.stats.applied_updates == 1 ? n : std::min(st.min_per_update, n);
  st.max_per_update = std::max(st.max_per_update, n);
  for (auto& one : waiting) Answer(st, one.reply, *r);
}

Status Ended(const ps_shard_state& st) {
  return absl::OutOfRangeError(
      absl::StrCat(Who(st), ": training ended by ", st.ended_by, " at global_step ", st.end_step));
}

// A request after the end (the chief's final checkpoint and evaluation
// read; a worker's apply is refused): the Server told, so a ps task's Join
// waits until the cluster is quiet, not only until the updates stop.
void NoteEndedActivity(const ps_shard_state& st) {
  if (st.ended && st.options.on_end_activity) st.options.on_end_activity();
}

// An apply after the end: answered OUT_OF_RANGE, and the Server told.
void RefuseEnded(ps_shard_state& st, ApplyReply& reply) {
  NoteEndedActivity(st);  // before the answer
  Refuse(reply, Ended(st));
}

// An apply: now (asynchronous), or into the accumulators (synchronous).
void Dispatch(ps_shard_state& st, ApplyGradientsMessage& update, ApplyReply reply) {
  if (st.ended) {
    RefuseEnded(st, reply);
    return;
  }
  if (st.evicted) {
    ++st.stats.refused_updates;
    Refuse(reply, st.stopping);
    return;
  }
  if (st.options.replicas_to_aggregate > 0) {
    Accumulate(st, update, std::move(reply));
    return;
  }
  StatusOr<int64_t> r = Apply(st, update);
  if (r.ok()) {
    ++st.stats.applied_updates;
    st.trained = true;
    CountAccepted(st, update.gradients.worker);
    Answer(st, reply, *r);
  } else {
    ++st.stats.refused_updates;
    Refuse(reply, r.status());
  }
}

// Ends the freeze and answers the held applies in arrival order.
int64_t Thaw(ps_shard_state& st) {
  st.frozen = false;
  ++st.freeze_epoch;
  // The freezer stays monitored: it ends soon after (one consistent read's
  // scoped actor) and its down message is then ignored; the next freezer
  // replaces it.
  int64_t n = 0;
  while (!st.held.empty()) {
    HeldApply h = std::move(st.held.front());
    st.held.pop_front();
    ++n;
    Dispatch(st, h.update, std::move(h.reply));
  }
  return n;
}

// An apply (either atom) as it arrives: dispatched now, or held by a freeze.
void OnApply(ps_shard_state& st, ApplyGradientsMessage& update, ApplyReply reply) {
  if (Status s = CheckJob(st, update.job_id, "an apply"); !s.ok()) {
    ++st.stats.refused_updates;
    FOREMAN_LOG_WARN("{}", std::string(s.message()));
    Refuse(reply, s);
    return;
  }
  NoteArrival(st, update.gradients.worker);
  if (!st.frozen || st.ended || st.evicted) {
    Dispatch(st, update, std::move(reply));
    return;
  }
  if (static_cast<int>(st.held.size()) >= kMaxHeldApplies) {
    ++st.stats.refused_updates;
    Refuse(reply, absl::UnavailableError(
                      absl::StrCat(Who(st), " is frozen for a checkpoint and already holds ", kMaxHeldApplies, " applies")));
    return;
  }
  // Kept past this message: a local sender's borrowed bytes are copied now
  // (its request may time out and its buffer be reused before the thaw).
  for (TensorMessage& m : update.gradients.tensors) m.bytes.Detach();
  st.held.push_back(HeldApply{std::move(update), std::move(reply)});
}

// One look at the chief's updates for the death log (PeerSilenceLog): at
// each ps_watch tick, and once more at the end of training, so that a chief
// that returned since the last tick is logged as back before the watch stops.
void ObserveChief(ps_shard_state& st) {
  if (st.silence == nullptr) return;
  const int64_t now = SteadyNowNs();
  const int64_t last = st.worker_last_apply_ns.empty() ? 0 : st.worker_last_apply_ns[0];
  st.silence->Observe(0, last == 0 ? -1 : (now - last) / 1'000'000, now / 1'000'000);
}

// (ps_end_atom): training ends on the shard (ps_shard.hpp), unless another
// job asked.
caf::result<int64_t> EndTraining(ps_shard_state& st, int64_t chief_step, const std::string& job_id,
                                 const std::string& by) {
  if (Status refused = CheckJob(st, job_id, "the end of training"); !refused.ok()) {
    FOREMAN_LOG_WARN("{}", std::string(refused.message()));
    return ErrorOf(refused);
  }
  if (!st.ended) {
    ObserveChief(st);
    st.ended = true;
    st.end_step = GlobalStep(st) >= 0 ? GlobalStep(st) : chief_step;
    if (!by.empty()) st.ended_by = by;
    if (st.ended_by != "the chief") FOREMAN_LOG_INFO("{}: training ended by {} at global_step {}", Who(st), by, st.end_step);
    // The applies held by a freeze and those waiting for an aggregated
    // update end too: their workers' runs end cleanly.
    std::deque<HeldApply> held = std::move(st.held);
    st.held.clear();
    for (HeldApply& h : held) Refuse(h.reply, Ended(st));
    if (!st.waiting.empty()) {
      st.stats.dropped_gradients += static_cast<int64_t>(st.waiting.size());
      FailWaiting(st, Ended(st));
    }
    FOREMAN_LOG_DEBUG("{}: training ended at global_step {} ({} held and waiting applies refused)", Who(st),
                      st.end_step, held.size());
    if (st.options.replicas_to_aggregate > 0) {
      FOREMAN_LOG_INFO(
          "{}: synchronous training (--replicas-to-aggregate {}) ended at step {}: {} aggregated updates of "
          "{} gradients ({} to {} per update), {} stale gradients dropped, {} gradients dropped in all",
          Who(st), st.options.replicas_to_aggregate, st.sync_step, st.stats.applied_updates,
          st.aggregated_gradients, st.min_per_update, st.max_per_update, st.stats.stale_gradients,
          st.stats.dropped_gradients);
    }
    if (st.options.on_end_activity) st.options.on_end_activity();
  }
  return GlobalStep(st);
}

caf::behavior ps_shard(caf::stateful_actor<ps_shard_state>* self, PsShardOptions options) {
  MakeQuiet(self, "ps_shard");
  auto& st0 = self->state;
  st0.options = std::move(options);
  st0.device = std::make_unique<compute::CpuDevice>(1);
  st0.stats.task_index = st0.options.task_index;
  st0.stats.job_id = st0.options.job_id;
  if (st0.options.silence_ms > 0) {
    st0.silence = std::make_unique<PeerSilenceLog>(Who(st0), st0.options.silence_ms);
    self->send(self, ps_watch_atom::value);
  }
  // Asked to quit while frozen: the held applies are answered UNAVAILABLE
  // first (their senders would otherwise wait for their own timeouts).
  self->set_exit_handler([self](caf::exit_msg& msg) {
    auto& st = self->state;
    for (HeldApply& h : st.held) Refuse(h.reply, absl::UnavailableError(absl::StrCat(Who(st), " stopped while frozen")));
    st.held.clear();
    FailWaiting(st, absl::UnavailableError(absl::StrCat(Who(st), " stopped before the aggregated update")));
    self->quit(msg.reason);
  });
  // The actor that froze the shard ended (a chief killed mid-checkpoint: its
  // connection is gone, so is the proxy) before it thawed: thaw now, rather
  // than stalling every worker's applies until the freeze's timeout.
  self->set_down_handler([self](caf::down_msg& down) {
    auto& st = self->state;
    if (!st.frozen || down.source != st.freezer) return;  // thawed, or an older freezer
    ++st.stats.freeze_timeouts;
    const int64_t n = Thaw(st);
    FOREMAN_LOG_WARN(
        "{}: the actor that froze it for a checkpoint ended before thawing ({}): thawed, {} held "
        "applies applied",
        Who(st), down.reason ? self->system().render(down.reason) : std::string("it exited normally"), n);
  });
  return {
      [self](ps_init_atom, VariablesMessage& vars) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (Status refused = CheckJob(st, vars.job_id, "the init (or restore)"); !refused.ok()) {
          FOREMAN_LOG_WARN("{}", std::string(refused.message()));
          return ErrorOf(refused);
        }
        if (st.initialized && st.trained && !vars.restore) {
          // Issue 31 point 3: only a restore from a checkpoint replaces a
          // running job's training (a chief without one re-attaches). An
          // init op's values no update followed may be replaced (the
          // chief's recovery retrying its half-done first init).
          const Status refused = absl::FailedPreconditionError(absl::StrCat(
              Who(st), " already holds the variables of cluster job '", st.options.job_id, "'",
              // Only the ps task of global_step knows it (-1 elsewhere).
              GlobalStep(st) >= 0 ? absl::StrCat(" (global_step ", GlobalStep(st), ")") : std::string(),
              " and refused an init op that would re-initialise them; only a restore from a checkpoint replaces "
              "them"));
          FOREMAN_LOG_WARN("{}", std::string(refused.message()));
          return ErrorOf(refused);
        }
        const int64_t old_step = st.sync_step;
        Status s = Init(st, vars);
        if (!s.ok()) return ErrorOf(s);
        st.trained = vars.restore;
        if (!st.waiting.empty()) {
          st.stats.dropped_gradients += static_cast<int64_t>(st.waiting.size());
          FailWaiting(st, absl::AbortedError(absl::StrCat(Who(st), " was initialized again (a restore): the gradients "
                                                          "of step ", old_step, " were dropped")));
        }
        FOREMAN_LOG_DEBUG("{}: initialized with {} variables, global_step {}", Who(self->state),
                          self->state.vars.size(), GlobalStep(self->state));
        return caf::ok_atom::value;
      },
      [self](ps_read_atom, const std::vector<std::string>& names) -> caf::result<VariablesMessage> {
        NoteEndedActivity(self->state);
        if (self->state.frozen) self->state.read_while_frozen = true;
        StatusOr<VariablesMessage> r = Read(self->state, names);
        if (!r.ok()) return ErrorOf(r.status());
        return *std::move(r);
      },
      [self](ps_snap_atom) -> caf::result<VariablesMessage> {
        NoteEndedActivity(self->state);
        if (self->state.frozen) self->state.read_while_frozen = true;
        StatusOr<VariablesMessage> r = Snapshot(self->state);
        if (!r.ok()) return ErrorOf(r.status());
        return *std::move(r);
      },
      [self](ps_apply_atom, ApplyGradientsMessage& update) -> caf::result<int64_t> {
        ApplyReply reply{self->make_response_promise(), /*with_values=*/false};
        caf::response_promise answer = reply.promise;
        OnApply(self->state, update, std::move(reply));
        return answer;
      },
      [self](ps_apply_read_atom, ApplyGradientsMessage& update) -> caf::result<VariablesMessage> {
        ApplyReply reply{self->make_response_promise(), /*with_values=*/true};
        caf::response_promise answer = reply.promise;
        OnApply(self->state, update, std::move(reply));
        return answer;
      },
      [self](ps_freeze_atom, int64_t timeout_ms) -> caf::result<int64_t> {
        auto& st = self->state;
        NoteEndedActivity(st);
        if (timeout_ms <= 0 || timeout_ms > kMaxFreezeMs) {
          return ErrorOf(absl::InvalidArgumentError(absl::StrCat(
              Who(st), ": freeze timeout_ms must be in [1, ", kMaxFreezeMs, "], got ", timeout_ms)));
        }
        st.frozen = true;
        st.read_while_frozen = false;
        const uint64_t epoch = ++st.freeze_epoch;
        if (const caf::strong_actor_ptr& sender = self->current_sender()) {
          const caf::actor_addr who = caf::actor_cast<caf::actor_addr>(sender);
          if (who != st.freezer) {
            if (st.freezer) self->demonitor(st.freezer);
            st.freezer = who;
            self->monitor(sender);
          }
        }
        self->delayed_send(self, std::chrono::milliseconds(timeout_ms), ps_thawed_atom::value, epoch, timeout_ms);
        return GlobalStep(st);
      },
      [self](ps_thaw_atom) -> int64_t {
        auto& st = self->state;
        NoteEndedActivity(st);
        const bool checkpoint_read = st.evicted && st.frozen && st.read_while_frozen;
        const int64_t n = Thaw(st);
        if (checkpoint_read) {
          FOREMAN_LOG_INFO("{}: the chief read its state at global_step {} for a checkpoint while it is stopping",
                           Who(st), GlobalStep(st));
          if (st.options.on_evicted_read) st.options.on_evicted_read(true);
        }
        return n;
      },
      [self](ps_evict_atom, const std::string& address) -> bool {
        auto& st = self->state;
        if (!st.evicted) {
          st.evicted = true;
          st.stopping = absl::UnavailableError(absl::StrCat(
              Who(st), " (", address, ") is stopping (evicted): it accepts no updates; the chief takes a "
              "checkpoint of it, then it exits, and started again it is restored from that checkpoint"));
          std::deque<HeldApply> held = std::move(st.held);
          st.held.clear();
          st.stats.refused_updates += static_cast<int64_t>(held.size());
          for (HeldApply& h : held) Refuse(h.reply, st.stopping);
          if (!st.waiting.empty()) {
            st.stats.dropped_gradients += static_cast<int64_t>(st.waiting.size());
            FailWaiting(st, st.stopping);
          }
        }
        // The chief is there to take a checkpoint when it applied within
        // the silence bound (the connection timeout).
        const int64_t bound_ms = st.options.silence_ms > 0 ? st.options.silence_ms : 1000;
        const bool chief_there = st.initialized && !st.ended && !st.worker_last_apply_ns.empty() &&
                                 st.worker_last_apply_ns[0] != 0 &&
                                 (SteadyNowNs() - st.worker_last_apply_ns[0]) / 1'000'000 <= bound_ms;
        if (!chief_there && st.options.on_evicted_read) st.options.on_evicted_read(false);
        return chief_there;
      },
      [self](ps_end_atom, int64_t chief_step) -> caf::result<int64_t> {
        return EndTraining(self->state, chief_step, std::string(), std::string());
      },
      [self](ps_end_atom, int64_t chief_step, const std::string& job_id) -> caf::result<int64_t> {
        return EndTraining(self->state, chief_step, job_id, std::string());
      },
      [self](ps_end_atom, int64_t chief_step, const std::string& job_id, const std::string& by)
          -> caf::result<int64_t> { return EndTraining(self->state, chief_step, job_id, by); },
      [self](ps_watch_atom) {
        auto& st = self->state;
        if (st.ended || st.silence == nullptr) return;  // training over: nothing to watch
        ObserveChief(st);
        self->delayed_send(self, std::chrono::milliseconds(std::max<int64_t>(100, st.options.silence_ms / 2)),
                           ps_watch_atom::value);
      },
      [self](ps_thawed_atom, uint64_t epoch, int64_t timeout_ms) {
        auto& st = self->state;
        if (!st.frozen || epoch != st.freeze_epoch) return;  // thawed or frozen again since
        ++st.stats.freeze_timeouts;
        const int64_t n = Thaw(st);
        FOREMAN_LOG_WARN("{}: frozen for {} ms without a thaw (the chief's checkpoint did not finish): thawed, "
                         "{} held applies applied",
                         Who(st), timeout_ms, n);
      },
      [self](ps_stats_atom) -> PsShardStatsMessage {
        auto& st = self->state;
        PsShardStatsMessage s = st.stats;
        s.global_step = GlobalStep(st);
        s.initialized = st.initialized;
        s.trained = st.trained;
        s.frozen = st.frozen;
        s.ended = st.ended;
        s.queued_updates = static_cast<int64_t>(st.held.size());
        s.sync_step = st.options.replicas_to_aggregate > 0 ? st.sync_step : -1;
        s.waiting_replicas = static_cast<int64_t>(st.waiting.size());
        for (const auto& w : st.waiting) s.waiting_workers.push_back(w.worker);
        const int64_t now = SteadyNowNs();
        s.worker_last_apply_ms.clear();
        for (int64_t t : st.worker_last_apply_ns) s.worker_last_apply_ms.push_back(t == 0 ? -1 : (now - t) / 1'000'000);
        s.worker_applies.resize(s.worker_last_apply_ms.size(), 0);
        return s;
      },
  };
}

}  // namespace

StatusOr<caf::actor> SpawnPsShard(caf::actor_system& system, PsShardOptions options) {
  if (options.task_index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ps shard: task_index must be >= 0, got ", options.task_index));
  }
  if (options.replicas_to_aggregate < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ps shard: replicas_to_aggregate must be >= 0, got ",
                                                   options.replicas_to_aggregate));
  }
  FOREMAN_RETURN_IF_ERROR(nn::ValidateOptimizerOptions(options.optimizer));
  return system.spawn(ps_shard, std::move(options));
}

}  // namespace foreman::internal
