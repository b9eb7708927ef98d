// PsRemoteValues and the ps proxy watcher (ps_remote_values.hpp).
#include "ps_remote_values.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "atoms.hpp"
#include "status_error.hpp"
#include "cluster_net.hpp"
#include "foreman/cluster.hpp"
#include "foreman/nn.hpp"
#include "messages.hpp"
#include "nn/optimizer.hpp"
#include "platform/log.hpp"
#include "ps_shard.hpp"

namespace foreman::internal {
namespace {

using Handle = caf::response_handle<caf::blocking_actor, caf::message, true>;

// The least time a connect is started with (Proxy).
constexpr std::chrono::milliseconds kMinConnectWindow{50};
constexpr char kGlobalStep[] = "global_step";

// Answers `p` (its waiter is blocked on the response) with an error.
void FailPending(const LostProxies::Pending& p) {
  if (auto* a = caf::actor_cast<caf::abstract_actor*>(p.waiter)) {
    a->eq_impl(p.response_id, nullptr, nullptr, caf::make_error(caf::sec::request_receiver_down));
  }
}

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool IsNonTrainableName(const std::string& name) {
  return name == kGlobalStep || nn::internal::IsBetaPowerName(name) || nn::internal::IsSlotName(name);
}

// Sets `m` into `mirror`: the received bytes become the variable's without
// a copy when `m` holds the only reference to them (a remote ps's answer,
// deserialized); otherwise (a ps in this process, whose answer shares its
// variable's bytes) they are copied into the variable's storage when dtype
// and shape match. `m.bytes` may be taken.
Status Store(VariableStore& mirror, TensorMessage& m) {
  StatusOr<Tensor*> existing = mirror.Get(m.name);
  if (existing.ok()) {
    Tensor& t = **existing;
    if (static_cast<int32_t>(t.dtype()) == m.dtype && t.shape().dims() == m.shape && t.TotalBytes() == m.bytes.size() &&
        DataTypeSize(t.dtype()) != 0) {
      if (m.bytes.unique() && !m.bytes.borrowed()) {
        t = m.bytes.TakeAsTensor(t.dtype(), t.shape());
      } else if (!m.bytes.empty()) {
        std::memcpy(t.raw_data(), m.bytes.data(), m.bytes.size());
        TransportCopyCounters::CountCopy(m.bytes.size());
      }
      return absl::OkStatus();
    }
  }
  FOREMAN_ASSIGN_OR_RETURN(Tensor value, FromMessage(std::move(m)));
  bool trainable = !IsNonTrainableName(m.name);
  if (existing.ok()) {
    trainable = mirror.IsTrainable(m.name).value_or(trainable);
    FOREMAN_RETURN_IF_ERROR(mirror.Delete(m.name));
  }
  return mirror.Create(m.name, std::move(value), trainable);
}

// Adds the wall time of its life to `sum_us` (PsRemoteValues::Stats).
class StatsTimer {
 public:
  explicit StatsTimer(std::atomic<uint64_t>& sum_us) : sum_us_(sum_us), start_(std::chrono::steady_clock::now()) {}
  StatsTimer(const StatsTimer&) = delete;
  StatsTimer& operator=(const StatsTimer&) = delete;
  ~StatsTimer() {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start_);
    sum_us_.fetch_add(static_cast<uint64_t>(us.count()), std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t>& sum_us_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace

caf::behavior ProxyWatcher(caf::event_based_actor* self, std::shared_ptr<LostProxies> lost) {
  MakeQuiet(self, "ps_proxy_watcher");
  self->set_down_handler([self, lost](caf::down_msg& down) {
    std::string cause = IsPeerLost(down) ? "the connection was lost (peer closed or heartbeats timed out)"
                                         : absl::StrCat("its actor is gone (", self->system().render(down.reason), ")");
    MutexLock l(lost->mu);
    // A proxy already dropped by an error is never looked up again: keep
    // the most recent few only.
    if (lost->lost.size() >= 64) lost->lost.erase(lost->lost.begin());
    lost->lost.emplace_back(down.source, std::move(cause));
    for (const LostProxies::Pending& p : lost->pending) {
      if (p.proxy == down.source) FailPending(p);
    }
  });
  return {[self](caf::actor& proxy) { self->monitor(proxy); }};
}

std::vector<int64_t> PsAnswerTimes::MsAgo() const {
  const int64_t now = SteadyNowNs();
  std::vector<int64_t> out;
  for (const std::atomic<int64_t>& t : last_ns) {
    const int64_t v = t.load(std::memory_order_relaxed);
    out.push_back(v == 0 ? -1 : (now - v) / 1'000'000);
  }
  return out;
}

// Where the bound variables live.
struct PsRemoteValues::Placement {
  std::vector<std::string> names;
  std::map<std::string, int> shard_of;
  std::vector<std::vector<std::string>> shard_names;  // per ps task, in creation order
  std::vector<std::vector<std::string>> step_names;   // shard_names less the optimizer slots (ReadForStep)
};

PsRemoteValues::PsRemoteValues(caf::actor_system* system, caf::actor watcher, std::shared_ptr<LostProxies> lost,
                               std::vector<PsTask> ps, bool tls, int worker_index, int num_workers, int replicas_to_aggregate,
                               int64_t request_timeout_ms, std::string target)
    : system_(system),
      watcher_(std::move(watcher)),
      lost_(std::move(lost)),
      ps_(std::move(ps)),
      tls_(tls),
      worker_index_(worker_index),
      num_workers_(num_workers),
      replicas_to_aggregate_(replicas_to_aggregate),
      timeout_(request_timeout_ms),
      target_(std::move(target)),
      proxies_(ps_.size()),
      causes_(ps_.size()),
      unreachable_since_(ps_.size()),
      last_connect_error_(ps_.size()) {}

// Sends one request to each shard of `shards` (send(self, proxy, k)), then
// awaits every answer: the shards work in parallel.
template <class T, class Send>
std::vector<StatusOr<T>> PsRemoteValues::AskAll(const std::vector<int>& shards, Send send) {
  if (shards.empty()) return {};
  ForgetSystemOnExit forget;
  caf::scoped_actor self{System()};
  return AskAllFrom<T>(self, shards, send);
}

// AskAll from the caller's scoped actor `self` (the sender the shards see).
template <class T, class Send>
std::vector<StatusOr<T>> PsRemoteValues::AskAllFrom(caf::scoped_actor& self, const std::vector<int>& shards,
                                                    Send send) {
  std::vector<StatusOr<T>> out(shards.size(), StatusOr<T>(absl::UnknownError("no answer")));
  if (shards.empty()) return out;
  std::vector<caf::actor> proxies(shards.size());
  for (std::size_t i = 0; i < shards.size(); ++i) {
    StatusOr<caf::actor> p = Proxy(shards[i]);
    if (p.ok()) {
      proxies[i] = *p;
    } else {
      out[i] = p.status();
    }
  }
  caf::actor_system* system = &self->system();
  std::vector<std::optional<Handle>> handles(shards.size());
  std::vector<LostProxies::Pending> pending;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (!proxies[i]) continue;
    handles[i].emplace(send(self, proxies[i], shards[i]));
    pending.push_back({proxies[i].address(), caf::actor_cast<caf::strong_actor_ptr>(self),
                       handles[i]->id()});
  }
  if (!pending.empty()) {
    MutexLock l(lost_->mu);
    for (const LostProxies::Pending& p : pending) {
      lost_->pending.push_back(p);
      // Lost before it was registered: the watcher has already looked.
      for (const auto& e : lost_->lost) {
        if (e.first == p.proxy) FailPending(p);
      }
    }
  }
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (!handles[i]) continue;
    const int k = shards[i];
    auto heard = [&] {
      if (answers_ && k >= 0 && static_cast<std::size_t>(k) < answers_->last_ns.size()) {
        answers_->last_ns[k].store(SteadyNowNs(), std::memory_order_relaxed);
      }
    };
    handles[i]->receive(
        [&](T& value) {
          heard();
          out[i] = std::move(value);
        },
        [&](caf::error& e) {
          if (StatusFromForemanError(e).has_value()) heard();  // the shard's own answer
          out[i] = ShardError(k, proxies[i], e, *system);
        });
  }
  if (!pending.empty()) {
    MutexLock l(lost_->mu);
    auto& v = lost_->pending;
    v.erase(std::remove_if(v.begin(), v.end(),
                           [&](const LostProxies::Pending& p) { return p.waiter == caf::actor_cast<caf::strong_actor_ptr>(self); }),
            v.end());
  }
  return out;
}

Status PsRemoteValues::Bind(const std::vector<std::string>& names) {
  MutexLock l(mu_);
  if (placement_ != nullptr) {
    fresh_mirror_ = nullptr;  // a new session's first step reads
    const std::vector<std::string>& bound = placement_->names;
    if (names == bound) return absl::OkStatus();
    const std::size_t n = std::min(names.size(), bound.size());
    std::size_t i = 0;
    while (i < n && names[i] == bound[i]) ++i;
    return absl::InvalidArgumentError(absl::StrCat(
        target_, ": this session's remote variables differ from those its target was bound to, at position ", i,
        ": '", i < names.size() ? names[i] : "<end>", "' vs '", i < bound.size() ? bound[i] : "<end>",
        "' (every session of a target must build the same graph)"));
  }
  fresh_mirror_ = nullptr;  // a new session's first step reads
  FOREMAN_ASSIGN_OR_RETURN(std::vector<int> place, PlaceVariablesOnPs(names, static_cast<int>(ps_.size())));
  auto p = std::make_shared<Placement>();
  p->names = names;
  p->shard_names.resize(ps_.size());
  p->step_names.resize(ps_.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    p->shard_of[names[i]] = place[i];
    p->shard_names[place[i]].push_back(names[i]);
    if (!nn::internal::IsSlotName(names[i])) p->step_names[place[i]].push_back(names[i]);
  }
  placement_ = std::move(p);
  return absl::OkStatus();
}

// Read (all bound names) or ReadForStep (less the slots); a shard that
// is not initialized loses all its names from `mirror` either way.
Status PsRemoteValues::ReadNames(VariableStore& mirror, bool step_only) {
  if (step_only && TakeFresh(&mirror)) return absl::OkStatus();  // the last ApplyAndRead's answer
  ForgetFresh();
  FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
  FOREMAN_ASSIGN_OR_RETURN(auto placement, Bound(step_only ? "ReadForStep" : "Read"));
  const auto& names = step_only ? placement->step_names : placement->shard_names;
  const std::vector<int> shards = ShardsWithNames(*placement);
  StatsTimer timer(stats_.read_us);
  std::vector<StatusOr<VariablesMessage>> r = AskAll<VariablesMessage>(
      shards, [&](caf::scoped_actor& self, const caf::actor& proxy, int k) {
        return self->request(proxy, timeout_, ps_read_atom::value, names[k]);
      });
  ++stats_.reads;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    if (!r[i].ok()) {
      if (r[i].status().code() != absl::StatusCode::kFailedPrecondition) return r[i].status();
      // Not initialized yet: the chief has not run its init (a worker waits).
      for (const std::string& name : placement->shard_names[shards[i]]) {
        if (mirror.Contains(name)) FOREMAN_RETURN_IF_ERROR(mirror.Delete(name));
      }
      continue;
    }
    for (TensorMessage& m : r[i]->tensors) {
      stats_.bytes_in += m.bytes.size();
      FOREMAN_RETURN_IF_ERROR(Store(mirror, m));
    }
  }
  return absl::OkStatus();
}

Status PsRemoteValues::ReadConsistent(VariableStore& mirror) {
  ForgetFresh();
  FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
  FOREMAN_ASSIGN_OR_RETURN(auto placement, Bound("ReadConsistent"));
  const std::vector<int> all = AllShards();
  const int64_t freeze_ms = std::min<int64_t>(kMaxFreezeMs, 2 * timeout_.count() + 1000);
  // One actor freezes, reads and thaws: the shards monitor it, so a chief
  // killed mid-checkpoint thaws them at once (its connection drops), not
  // after freeze_ms.
  ForgetSystemOnExit forget;
  caf::scoped_actor freezer{System()};
  std::vector<StatusOr<int64_t>> frozen =
      AskAllFrom<int64_t>(freezer, all, [&](caf::scoped_actor& self, const caf::actor& proxy, int) {
        return self->request(proxy, timeout_, ps_freeze_atom::value, freeze_ms);
      });
  Status status;
  std::vector<int> thaw;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (frozen[i].ok()) {
      thaw.push_back(all[i]);
    } else if (status.ok()) {
      status = frozen[i].status();
    }
  }
  std::vector<TensorMessage> values;
  if (status.ok()) {
    const std::vector<int> shards = ShardsWithNames(*placement);
    std::vector<StatusOr<VariablesMessage>> r =
        AskAllFrom<VariablesMessage>(freezer, shards, [&](caf::scoped_actor& self, const caf::actor& proxy, int k) {
          return self->request(proxy, timeout_, ps_read_atom::value, placement->shard_names[k]);
        });
    for (auto& one : r) {
      if (!one.ok()) {
        if (status.ok()) status = one.status();
        continue;
      }
      for (TensorMessage& m : one->tensors) values.push_back(std::move(m));
    }
  }
  // Always thaw what froze (a shard also thaws itself after freeze_ms).
  std::vector<StatusOr<int64_t>> thawed =
      AskAllFrom<int64_t>(freezer, thaw, [&](caf::scoped_actor& self, const caf::actor& proxy, int) {
        return self->request(proxy, timeout_, ps_thaw_atom::value);
      });
  for (std::size_t i = 0; i < thaw.size(); ++i) {
    if (!thawed[i].ok()) {
      FOREMAN_LOG_WARN("{}: thawing after a consistent read: {} (the shard thaws itself after {} ms)", target_,
                       thawed[i].status().ToString(), freeze_ms);
    }
  }
  FOREMAN_RETURN_IF_ERROR(status);
  for (TensorMessage& m : values) FOREMAN_RETURN_IF_ERROR(Store(mirror, m));
  return absl::OkStatus();
}

Status PsRemoteValues::Write(const VariableStore& mirror, WriteKind kind) {
  ForgetFresh();
  FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
  FOREMAN_ASSIGN_OR_RETURN(auto placement, Bound("Write"));
  int64_t global_step = 0;
  if (StatusOr<const Tensor*> gs = mirror.Get(kGlobalStep);
      gs.ok() && (*gs)->dtype() == DataType::kInt64 && (*gs)->num_elements() == 1) {
    global_step = *(*gs)->data<int64_t>();
  }
  for (const std::string& name : placement->names) {
    if (!mirror.Contains(name)) {
      return absl::FailedPreconditionError(
          absl::StrCat(target_, ": cannot initialize the ps tasks: variable '", name, "' (of ",
                       ps_[placement->shard_of.at(name)].where, ") has no value"));
    }
  }
  std::vector<VariablesMessage> shares(ps_.size());
  for (std::size_t k = 0; k < ps_.size(); ++k) {
    shares[k].global_step = global_step;
    shares[k].job_id = job_id_;
    shares[k].restore = kind == WriteKind::kRestore;
    for (const std::string& name : placement->shard_names[k]) {
      FOREMAN_ASSIGN_OR_RETURN(const Tensor* t, mirror.Get(name));
      FOREMAN_ASSIGN_OR_RETURN(TensorMessage m, ToMessage(name, *t));
      shares[k].tensors.push_back(std::move(m));
    }
  }
  std::vector<StatusOr<caf::ok_atom>> r =
      AskAll<caf::ok_atom>(AllShards(), [&](caf::scoped_actor& self, const caf::actor& proxy, int k) {
        return self->request(proxy, timeout_, ps_init_atom::value, shares[k]);
      });
  for (auto& one : r) FOREMAN_RETURN_IF_ERROR(one.status());
  return absl::OkStatus();
}

StatusOr<int64_t> PsRemoteValues::Apply(const nn::Gradients& grads, int64_t computed_at_step) {
  return ApplyImpl(grads, computed_at_step, nullptr);
}

StatusOr<int64_t> PsRemoteValues::ApplyAndRead(const nn::Gradients& grads, int64_t computed_at_step,
                                               VariableStore& mirror) {
  return ApplyImpl(grads, computed_at_step, &mirror);
}

// The gradients travel as views of the caller's tensors (no copy: CAF's
// serialization writes them into the socket's buffer); before returning,
// every view handed to CAF must be gone (serialized and dropped, or dropped
// with a lost connection), since the caller reuses its tensors.
StatusOr<int64_t> PsRemoteValues::ApplyImpl(const nn::Gradients& grads, int64_t computed_at_step,
                                            VariableStore* mirror) {
  ForgetFresh();
  FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
  FOREMAN_ASSIGN_OR_RETURN(auto placement, Bound(mirror != nullptr ? "ApplyAndRead" : "Apply"));
  std::vector<ApplyGradientsMessage> updates(ps_.size());
  for (ApplyGradientsMessage& u : updates) {
    u.gradients.step = computed_at_step;
    u.gradients.worker = worker_index_;
    u.learning_rate = grads.learning_rate;
    u.adam_step_size = grads.adam_step_size;
    u.job_id = job_id_;
  }
  for (const nn::Gradients::GradAndVar& g : grads.grads_and_vars) {
    auto it = placement->shard_of.find(g.variable);
    if (it == placement->shard_of.end()) {
      return absl::NotFoundError(absl::StrCat(target_, ": a gradient of variable '", g.variable,
                                              "', which is not one of the ps tasks' variables"));
    }
    FOREMAN_ASSIGN_OR_RETURN(TensorMessage m, BorrowingMessage(g.variable, g.grad));
    stats_.bytes_out += m.bytes.size();
    updates[it->second].gradients.tensors.push_back(std::move(m));
  }
  // Runs last (declared after `updates`'s use below): waits for CAF to drop
  // every copy of the views.
  struct ReturnViews {
    const std::vector<ApplyGradientsMessage>& updates;
    std::chrono::milliseconds bound;
    const std::string& target;
    ~ReturnViews() {
      for (const ApplyGradientsMessage& u : updates) {
        for (const TensorMessage& m : u.gradients.tensors) {
          if (m.bytes.WaitUntilReturned(bound)) continue;
          // Nothing else is safe: the caller's gradient buffers would be
          // read after they were reused or freed.
          FOREMAN_LOG_ERROR("{}: the network layer still holds the gradient of '{}' {} ms after its apply ended; "
                            "aborting (its buffer cannot be reused safely)",
                            target, m.name, bound.count());
          std::abort();
        }
      }
    }
  } return_views{updates, 2 * timeout_ + std::chrono::seconds(60), target_};
  StatsTimer timer(stats_.apply_us);
  ++stats_.applies;
  const std::vector<int> all = AllShards();
  std::vector<StatusOr<int64_t>> steps;
  std::vector<StatusOr<VariablesMessage>> values;
  if (mirror == nullptr) {
    steps = AskAll<int64_t>(all, [&](caf::scoped_actor& self, const caf::actor& proxy, int k) {
      return self->request(proxy, timeout_, ps_apply_atom::value, updates[k]);
    });
  } else {
    values = AskAll<VariablesMessage>(all, [&](caf::scoped_actor& self, const caf::actor& proxy, int k) {
      return self->request(proxy, timeout_, ps_apply_read_atom::value, updates[k]);
    });
  }
  for (std::size_t k = 0; k < all.size(); ++k) {
    const Status status = mirror == nullptr ? steps[k].status() : values[k].status();
    if (status.ok()) continue;
    if (replicas_to_aggregate_ > 0 && absl::IsUnavailable(status)) {
      return WithMissingWorkers(static_cast<int>(k), status);
    }
    return status;
  }
  if (accepted_) accepted_->fetch_add(1);
  if (mirror == nullptr) return *steps[0];
  for (std::size_t k = 0; k < all.size(); ++k) {
    std::size_t stored = 0;
    for (TensorMessage& m : values[k]->tensors) {
      // Only the variables bound to ps task k (a ps answers all its own).
      auto it = placement->shard_of.find(m.name);
      if (it == placement->shard_of.end() || it->second != all[k]) continue;
      stats_.bytes_in += m.bytes.size();
      FOREMAN_RETURN_IF_ERROR(Store(*mirror, m));
      ++stored;
    }
    // As ReadForStep would: a bound variable the ps task does not hold.
    const std::vector<std::string>& wanted = placement->step_names[all[k]];
    if (stored != wanted.size()) {
      for (const std::string& name : wanted) {
        const bool answered =
            std::any_of(values[k]->tensors.begin(), values[k]->tensors.end(),
                        [&](const TensorMessage& m) { return m.name == name; });
        if (!answered) {
          return absl::NotFoundError(absl::StrCat(ps_[all[k]].where, " holds no variable '", name, "'"));
        }
      }
    }
  }
  MarkFresh(mirror);
  return values[0]->global_step;
}

bool PsRemoteValues::TakeFresh(const VariableStore* mirror) {
  MutexLock l(mu_);
  // After Shutdown every call is UNAVAILABLE (Enter), this one too; an
  // answer older than kMaxFusedReadAge is not a step's read any more.
  const bool fresh = fresh_mirror_ == mirror && !closed_ &&
                     std::chrono::steady_clock::now() - fresh_since_ <= kMaxFusedReadAge;
  fresh_mirror_ = nullptr;
  if (fresh) ++stats_.fused_reads;
  return fresh;
}

void PsRemoteValues::ForgetFresh() {
  MutexLock l(mu_);
  fresh_mirror_ = nullptr;
}

void PsRemoteValues::MarkFresh(const VariableStore* mirror) {
  MutexLock l(mu_);
  fresh_mirror_ = mirror;
  fresh_since_ = std::chrono::steady_clock::now();
}

// cluster.md rule 4: a synchronous apply that was not answered names the
// worker tasks whose applies of the step ps task k does not hold (asked
// with a short bound; `status` unchanged when the shard cannot say).
Status PsRemoteValues::WithMissingWorkers(int k, const Status& status) {
  constexpr std::chrono::milliseconds kStatsTimeout{1000};
  {
    // Only over the link that timed out (kept after a timeout): a lost
    // link's reconnect to a silent ps could take the whole connect bound.
    MutexLock l(mu_);
    if (proxies_[k] == nullptr) return status;
  }
  std::vector<StatusOr<PsShardStatsMessage>> r =
      AskAll<PsShardStatsMessage>({k}, [&](caf::scoped_actor& self, const caf::actor& proxy, int) {
        return self->request(proxy, std::min(timeout_, kStatsTimeout), ps_stats_atom::value);
      });
  if (!r[0].ok() || r[0]->sync_step < 0) return status;
  const std::vector<int64_t>& held = r[0]->waiting_workers;
  std::vector<std::string> missing;
  for (int w = 0; w < num_workers_; ++w) {
    if (std::find(held.begin(), held.end(), w) == held.end()) missing.push_back(absl::StrCat("/job:worker/task:", w));
  }
  return absl::UnavailableError(absl::StrCat(
      status.message(), "; ", ps_[k].where, " holds ", held.size(), " of the ", replicas_to_aggregate_,
      " applies of step ", r[0]->sync_step, " (from workers ", absl::StrJoin(held, ", "), "); missing: ",
      missing.empty() ? std::string("none") : absl::StrJoin(missing, ", ")));
}

// ps 0's applies accepted per worker task (PsShardStatsMessage::
// worker_applies): the chief's steps_per_sec/worker_K summaries.
StatusOr<std::vector<int64_t>> PsRemoteValues::WorkerApplies() {
  FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
  std::vector<StatusOr<PsShardStatsMessage>> r =
      AskAll<PsShardStatsMessage>({0}, [&](caf::scoped_actor& self, const caf::actor& proxy, int) {
        return self->request(proxy, timeout_, ps_stats_atom::value);
      });
  FOREMAN_RETURN_IF_ERROR(r[0].status());
  return std::move(r[0]->worker_applies);
}

StatusOr<std::vector<RemoteValues::TaskState>> PsRemoteValues::TaskStates() {
  FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
  std::vector<StatusOr<PsShardStatsMessage>> r =
      AskAll<PsShardStatsMessage>(AllShards(), [&](caf::scoped_actor& self, const caf::actor& proxy, int) {
        return self->request(proxy, timeout_, ps_stats_atom::value);
      });
  std::vector<TaskState> out;
  for (std::size_t k = 0; k < r.size(); ++k) {
    FOREMAN_RETURN_IF_ERROR(r[k].status());
    TaskState& task = out.emplace_back();
    task.where = ps_[k].where;
    task.job_id = r[k]->job_id;
    task.same_job = r[k]->job_id == job_id_;
    task.initialized = r[k]->initialized;
    task.trained = r[k]->trained;
    task.global_step = r[k]->global_step;
  }
  return out;
}

// Server::EndTraining: ps 0 first (its global_step), then the others.
StatusOr<int64_t> PsRemoteValues::EndTraining() {
  FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
  std::vector<StatusOr<int64_t>> first =
      AskAll<int64_t>({0}, [&](caf::scoped_actor& self, const caf::actor& proxy, int) {
        return self->request(proxy, timeout_, ps_end_atom::value, int64_t{-1}, job_id_);
      });
  Status status = first[0].status();
  const int64_t step = first[0].ok() ? *first[0] : -1;
  std::vector<int> others;
  for (int k = 1; k < static_cast<int>(ps_.size()); ++k) others.push_back(k);
  std::vector<StatusOr<int64_t>> r =
      AskAll<int64_t>(others, [&](caf::scoped_actor& self, const caf::actor& proxy, int) {
        return self->request(proxy, timeout_, ps_end_atom::value, step, job_id_);
      });
  for (auto& one : r) {
    if (status.ok()) status = one.status();
  }
  FOREMAN_RETURN_IF_ERROR(status);
  return step;
}

StatusOr<PsShardStatsMessage> PsRemoteValues::PeekPs0Stats() {
  FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
  caf::actor proxy;
  {
    MutexLock l(mu_);
    if (!proxies_.empty()) proxy = proxies_[0];
  }
  if (!proxy || LostCause(proxy)) return absl::UnavailableError(absl::StrCat(target_, ": no link to ps task 0 now"));
  StatusOr<PsShardStatsMessage> out = absl::UnavailableError(absl::StrCat(target_, ": no answer from ps task 0"));
  ForgetSystemOnExit forget;
  caf::scoped_actor self{System()};
  self->request(proxy, std::min(timeout_, std::chrono::milliseconds(1000)), ps_stats_atom::value)
      .receive([&](PsShardStatsMessage& m) { out = std::move(m); },
               [&](caf::error& e) {
                 out = absl::UnavailableError(absl::StrCat(ps_[0].where, ": ", self->system().render(e)));
               });
  return out;
}

// Every later call is UNAVAILABLE `why`; waits for the calls in flight
// (each bounded by its timeouts) and drops every CAF handle.
void PsRemoteValues::Shutdown(const std::string& why) {
  MutexLock l(mu_);
  if (closed_) return;
  closed_ = true;
  why_ = why;
  LogStats();
  while (in_flight_ > 0) cv_.wait(l);
  for (caf::actor& p : proxies_) p = nullptr;
  watcher_ = nullptr;
  system_ = nullptr;
}

StatusOr<PsRemoteValues::Use> PsRemoteValues::Enter() {
  MutexLock l(mu_);
  if (closed_) return absl::UnavailableError(why_);
  ++in_flight_;
  return Use(this);
}

StatusOr<std::shared_ptr<const PsRemoteValues::Placement>> PsRemoteValues::Bound(const char* method) {
  MutexLock l(mu_);
  if (placement_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(target_, ": RemoteValues::", method, " before Bind"));
  }
  return placement_;
}

std::vector<int> PsRemoteValues::AllShards() const {
  std::vector<int> all;
  for (int k = 0; k < static_cast<int>(ps_.size()); ++k) all.push_back(k);
  return all;
}

std::vector<int> PsRemoteValues::ShardsWithNames(const Placement& p) {
  std::vector<int> out;
  for (int k = 0; k < static_cast<int>(p.shard_names.size()); ++k) {
    if (!p.shard_names[k].empty()) out.push_back(k);
  }
  return out;
}

// The proxy of ps task `k`: the cached one unless the watcher saw it go
// down, else a new connection (bounded by the request timeout).
StatusOr<caf::actor> PsRemoteValues::Proxy(int k) {
  MutexLock l(connect_mu_);
  caf::actor cached;
  caf::actor watcher;
  caf::actor_system* system = nullptr;
  {
    MutexLock m(mu_);
    cached = proxies_[k];
    watcher = watcher_;
    system = system_;
  }
  if (system == nullptr) return absl::UnavailableError(absl::StrCat(ps_[k].where, ": ", target_, " is stopped"));
  if (cached) {
    std::optional<std::string> cause = LostCause(cached);
    if (!cause) return cached;
    Forget(k, cached, *cause);
    // The loss is reported once before the next call reconnects: a
    // restarted ps task is uninitialized, and the session must recover
    // (the chief restores, a worker waits) rather than use it unawares.
    return absl::UnavailableError(absl::StrCat(ps_[k].where, ": ", *cause, " (the next call reconnects)"));
  }
  // A connect is bounded by the connection timeout and, once the ps task
  // has been unreachable for a while, by what is left of the ps-wait (the
  // session's wait began at about the first failed connect): a ps that
  // accepts and never answers makes the wait end at --ps-wait-secs, not
  // one connection timeout later (issue 31 point 2).
  std::chrono::milliseconds bound = connect_timeout_;
  const auto now = std::chrono::steady_clock::now();
  if (unreachable_since_[k] && ps_wait_.wait > absl::ZeroDuration()) {
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(absl::ToChronoMilliseconds(ps_wait_.wait));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*unreachable_since_[k] + wait - now);
    // No connect in the wait's last moments: it could not finish a
    // handshake, and a connect that CAF's middleman actor is still making
    // when the caller gives up and stops the system can leave that system's
    // destructor waiting for the middleman actor forever (seen 2 in 300
    // runs of a plain worker against a TLS ps: each last connect had 1 ms).
    if (left < kMinConnectWindow && !last_connect_error_[k].empty()) {
      return absl::UnavailableError(absl::StrCat(ps_[k].where, ": ", last_connect_error_[k]));
    }
    bound = std::clamp(left, kMinConnectWindow, bound);
  }
  StatusOr<caf::actor> p = [&] {
    ForgetSystemOnExit forget;
    return ConnectActor(*system, ps_[k].host, ps_[k].port, tls_, bound);
  }();
  if (!p.ok() && !unreachable_since_[k]) unreachable_since_[k] = std::chrono::steady_clock::now();
  if (!p.ok()) last_connect_error_[k] = std::string(p.status().message());
  if (p.ok()) {
    unreachable_since_[k].reset();
    last_connect_error_[k].clear();
  }
  if (!p.ok()) {
    std::string before;
    {
      MutexLock m(mu_);
      before = causes_[k];
    }
    return absl::UnavailableError(absl::StrCat(ps_[k].where, ": ", before.empty() ? "" : before + "; then ",
                                               p.status().message()));
  }
  caf::anon_send(watcher, *p);
  MutexLock m(mu_);
  proxies_[k] = *p;
  causes_[k].clear();
  return *p;
}

std::optional<std::string> PsRemoteValues::LostCause(const caf::actor& proxy) {
  MutexLock l(lost_->mu);
  for (const auto& [addr, cause] : lost_->lost) {
    if (addr == proxy.address()) return cause;
  }
  return std::nullopt;
}

// Drops `proxy` (ps task k's) so the next call reconnects.
void PsRemoteValues::Forget(int k, const caf::actor& proxy, const std::string& cause) {
  {
    MutexLock l(lost_->mu);
    auto& v = lost_->lost;
    v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return e.first == proxy.address(); }), v.end());
  }
  MutexLock m(mu_);
  if (proxies_[k] == proxy) proxies_[k] = nullptr;
  causes_[k] = cause;
}

// A shard's error: its own answer unchanged, else UNAVAILABLE naming it.
Status PsRemoteValues::ShardError(int k, const caf::actor& proxy, const caf::error& e, caf::actor_system& system) {
  if (std::optional<Status> s = StatusFromForemanError(e)) return *std::move(s);
  std::string cause;
  if (e == caf::sec::request_timeout) {
    // A slow or frozen peer, not a lost link (heartbeats find those, and
    // the watcher then drops the proxy): the proxy is kept.
    cause = absl::StrCat("no answer within ", timeout_.count(), " ms (request_timeout_ms)");
    if (replicas_to_aggregate_ > 0) {
      cause += absl::StrCat("; in synchronous mode an apply waits for ", replicas_to_aggregate_,
                            " workers' applies of its step");
    }
    return absl::UnavailableError(absl::StrCat(ps_[k].where, ": ", cause));
  } else {
    cause = system.render(e);
  }
  if (std::optional<std::string> lost = LostCause(proxy)) cause = absl::StrCat(*lost, ": ", cause);
  Forget(k, proxy, cause);
  return absl::UnavailableError(absl::StrCat(ps_[k].where, ": ", cause));
}

// The actor system, for a scoped actor of the caller's (Enter() keeps it
// alive: Shutdown waits for in_flight_ to fall).
caf::actor_system& PsRemoteValues::System() {
  MutexLock l(mu_);
  return *system_;
}

void PsRemoteValues::LogStats() const {
  if (std::getenv("FOREMAN_CLUSTER_STATS") == nullptr) return;
  const auto per = [](const std::atomic<uint64_t>& sum, const std::atomic<uint64_t>& n) {
    const uint64_t count = n.load();
    return count == 0 ? 0.0 : static_cast<double>(sum.load()) / static_cast<double>(count);
  };
  // bytes_in counts both reads' and fused applies' answers.
  const TransportCopyCounters copies = TransportCopyCounters::Snapshot();
  FOREMAN_LOG_INFO(
      "{}: cluster stats: reads={} read_us={:.0f} fused_reads={} applies={} apply_us={:.0f} apply_bytes={:.0f} "
      "bytes_in={} serialized={} deserialized={} copied={}",
      target_, stats_.reads.load(), per(stats_.read_us, stats_.reads), stats_.fused_reads.load(),
      stats_.applies.load(), per(stats_.apply_us, stats_.applies), per(stats_.bytes_out, stats_.applies),
      stats_.bytes_in.load(), copies.serialized, copies.deserialized, copies.copied);
}

}  // namespace foreman::internal
