// foreman::Server, PsRemoteValues and the tcp:// / tls:// session targets
// (cluster_server.hpp).
#include "cluster_server.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "actor_system.hpp"
#include "atoms.hpp"
#include "status_error.hpp"
#include "cluster_net.hpp"
#include "cluster_status.hpp"
#include "foreman/mutex.hpp"
#include "foreman/nn.hpp"
#include "messages.hpp"
#include "nn/optimizer.hpp"
#include "platform/log.hpp"
#include "ps_shard.hpp"
#include "runtime/session_target.hpp"

namespace foreman {
namespace internal {
namespace {

using SteadyClock = std::chrono::steady_clock;
using Handle = caf::response_handle<caf::blocking_actor, caf::message, true>;

constexpr char kTcpScheme[] = "tcp://";
constexpr char kTlsScheme[] = "tls://";
constexpr char kGlobalStep[] = "global_step";

// The network settings of a node (cluster_net.hpp) from the cluster flags:
// NetConfig's int milliseconds are clamped (24 days), the TLS files kept
// only for a TLS node.
NetConfig NetConfigOf(const ClusterOptions& options, bool tls) {
  constexpr int64_t kMaxMs = std::numeric_limits<int>::max();
  NetConfig net;
  net.heartbeat_ms = static_cast<int>(std::min(options.heartbeat_ms, kMaxMs));
  net.connection_timeout_ms = static_cast<int>(std::min(options.connection_timeout_ms, kMaxMs));
  if (tls) {
    net.tls_cert = options.tls_cert;
    net.tls_key = options.tls_key;
    net.tls_ca = options.tls_ca;
  }
  return net;
}

// A caller's thread that made a scoped_actor (here or in cluster_net.cpp)
// keeps a reference to that system's logger in thread-local storage, and
// ~actor_system waits for it (actor_system.hpp): a Server destroyed on
// another thread would hang. Dropped when this guard goes (declare it
// before the scoped_actor, or around the call that makes one).
struct ForgetSystemOnExit {
  ForgetSystemOnExit() = default;
  ForgetSystemOnExit(const ForgetSystemOnExit&) = delete;
  ForgetSystemOnExit& operator=(const ForgetSystemOnExit&) = delete;
  ~ForgetSystemOnExit() { caf::logger::set_current_actor_system(nullptr); }
};

// -- the watcher: which ps proxies went down ---------------------------------------

struct LostProxies {
  Mutex mu;
  std::vector<std::pair<caf::actor_addr, std::string>> lost ABSL_GUARDED_BY(mu);
  // Requests in flight to a proxy: CAF 0.17 never answers a request whose
  // peer's connection was lost (caf-0.17.md §6), so the watcher answers
  // them itself with sec::request_receiver_down (a killed ps fails the
  // run within the heartbeat timeout, not the request timeout).
  struct Pending {
    caf::actor_addr proxy;
    caf::strong_actor_ptr waiter;
    caf::message_id response_id;
  };
  std::vector<Pending> pending ABSL_GUARDED_BY(mu);
};

// Answers `p` (its waiter is blocked on the response) with an error.
void FailPending(const LostProxies::Pending& p) {
  if (auto* a = caf::actor_cast<caf::abstract_actor*>(p.waiter)) {
    a->eq_impl(p.response_id, nullptr, nullptr, caf::make_error(caf::sec::request_receiver_down));
  }
}

// Monitors every proxy it is sent; records each down_msg's cause.
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

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// When a worker's PsRemoteValues last had an answer from each ps task
// (steady clock ns; 0: never): a value, or the shard's own error (not a
// timeout or a lost link). `foreman cluster status` prints it.
struct PsAnswerTimes {
  explicit PsAnswerTimes(std::size_t num_ps) : last_ns(num_ps) {}
  std::vector<std::atomic<int64_t>> last_ns;

  // Per ps task: ms since its last answer, -1 if none.
  std::vector<int64_t> MsAgo() const {
    const int64_t now = SteadyNowNs();
    std::vector<int64_t> out;
    for (const std::atomic<int64_t>& t : last_ns) {
      const int64_t v = t.load(std::memory_order_relaxed);
      out.push_back(v == 0 ? -1 : (now - v) / 1'000'000);
    }
    return out;
  }
};

// The small actor a worker task publishes on its address. (caf::get_atom)
// is `foreman cluster status`'s question (cluster_status.hpp): the spec's
// hosts, the updates this worker's Server had accepted (`steps`) and the ms
// since its last answer from each ps task.
caf::behavior ClusterTaskActor(caf::event_based_actor* self, std::string job_name, int32_t task_index,
                               std::string address, std::string ps_hosts, std::string worker_hosts,
                               std::shared_ptr<std::atomic<int64_t>> steps,
                               std::shared_ptr<const PsAnswerTimes> answers) {
  MakeQuiet(self, "cluster_task");
  return {[job_name, task_index, address](caf::ping_atom) {
            return caf::make_message(caf::pong_atom::value, job_name, task_index, address);
          },
          [=](caf::get_atom) {
            return caf::make_message(job_name, task_index, address, ps_hosts, worker_hosts, steps->load(),
                                     answers->MsAgo());
          }};
}

bool IsNonTrainableName(const std::string& name) {
  return name == kGlobalStep || nn::internal::IsBetaPowerName(name) || nn::internal::IsSlotName(name);
}

// Sets `m` into `mirror`, reusing the variable's storage when dtype and
// shape match.
Status Store(VariableStore& mirror, const TensorMessage& m) {
  StatusOr<Tensor*> existing = mirror.Get(m.name);
  if (existing.ok()) {
    Tensor& t = **existing;
    if (static_cast<int32_t>(t.dtype()) == m.dtype && t.shape().dims() == m.shape && t.TotalBytes() == m.bytes.size() &&
        DataTypeSize(t.dtype()) != 0) {
      if (!m.bytes.empty()) std::memcpy(t.raw_data(), m.bytes.data(), m.bytes.size());
      return absl::OkStatus();
    }
  }
  FOREMAN_ASSIGN_OR_RETURN(Tensor value, FromMessage(m));
  bool trainable = !IsNonTrainableName(m.name);
  if (existing.ok()) {
    trainable = mirror.IsTrainable(m.name).value_or(trainable);
    FOREMAN_RETURN_IF_ERROR(mirror.Delete(m.name));
  }
  return mirror.Create(m.name, std::move(value), trainable);
}

struct PsTask {
  std::string host;
  uint16_t port = 0;
  std::string where;  // "ps task K (host:port)"
};

// Where the bound variables live.
struct Placement {
  std::vector<std::string> names;
  std::map<std::string, int> shard_of;
  std::vector<std::vector<std::string>> shard_names;  // per ps task, in creation order
  std::vector<std::vector<std::string>> step_names;   // shard_names less the optimizer slots (ReadForStep)
};

}  // namespace

// -- PsRemoteValues -------------------------------------------------------------------

class PsRemoteValues final : public RemoteValues {
 public:
  PsRemoteValues(caf::actor_system* system, caf::actor watcher, std::shared_ptr<LostProxies> lost,
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
        causes_(ps_.size()) {}

  Status Bind(const std::vector<std::string>& names) override {
    MutexLock l(mu_);
    if (placement_ != nullptr) {
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

  // ClusterOptions::ps_wait_secs, retried every heartbeat_ms. Set once,
  // before the values are handed to any session.
  void set_ps_wait(PsWait w) { ps_wait_ = w; }
  PsWait ps_wait() const override { return ps_wait_; }

  Status Read(VariableStore& mirror) override { return ReadNames(mirror, /*step_only=*/false); }

  Status ReadForStep(VariableStore& mirror) override { return ReadNames(mirror, /*step_only=*/true); }

  // Read (all bound names) or ReadForStep (less the slots); a shard that
  // is not initialized loses all its names from `mirror` either way.
  Status ReadNames(VariableStore& mirror, bool step_only) {
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
      for (const TensorMessage& m : r[i]->tensors) {
        stats_.bytes_in += m.bytes.size();
        FOREMAN_RETURN_IF_ERROR(Store(mirror, m));
      }
    }
    return absl::OkStatus();
  }

  Status ReadConsistent(VariableStore& mirror) override {
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
    for (const TensorMessage& m : values) FOREMAN_RETURN_IF_ERROR(Store(mirror, m));
    return absl::OkStatus();
  }

  Status Write(const VariableStore& mirror) override {
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

  StatusOr<int64_t> Apply(const nn::Gradients& grads, int64_t computed_at_step) override {
    FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
    FOREMAN_ASSIGN_OR_RETURN(auto placement, Bound("Apply"));
    std::vector<ApplyGradientsMessage> updates(ps_.size());
    for (ApplyGradientsMessage& u : updates) {
      u.gradients.step = computed_at_step;
      u.gradients.worker = worker_index_;
      u.learning_rate = grads.learning_rate;
      u.adam_step_size = grads.adam_step_size;
    }
    for (const nn::Gradients::GradAndVar& g : grads.grads_and_vars) {
      auto it = placement->shard_of.find(g.variable);
      if (it == placement->shard_of.end()) {
        return absl::NotFoundError(absl::StrCat(target_, ": a gradient of variable '", g.variable,
                                                "', which is not one of the ps tasks' variables"));
      }
      FOREMAN_ASSIGN_OR_RETURN(TensorMessage m, ToMessage(g.variable, g.grad));
      stats_.bytes_out += m.bytes.size();
      updates[it->second].gradients.tensors.push_back(std::move(m));
    }
    StatsTimer timer(stats_.apply_us);
    ++stats_.applies;
    std::vector<StatusOr<int64_t>> r =
        AskAll<int64_t>(AllShards(), [&](caf::scoped_actor& self, const caf::actor& proxy, int k) {
          return self->request(proxy, timeout_, ps_apply_atom::value, updates[k]);
        });
    for (std::size_t k = 0; k < r.size(); ++k) {
      if (r[k].ok()) continue;
      if (replicas_to_aggregate_ > 0 && absl::IsUnavailable(r[k].status())) {
        return WithMissingWorkers(static_cast<int>(k), r[k].status());
      }
      return r[k].status();
    }
    if (accepted_) accepted_->fetch_add(1);
    return *r[0];
  }

  // cluster.md rule 4: a synchronous apply that was not answered names the
  // worker tasks whose applies of the step ps task k does not hold (asked
  // with a short bound; `status` unchanged when the shard cannot say).
  Status WithMissingWorkers(int k, const Status& status) {
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

  // Counts each accepted Apply in `counter` (`foreman cluster status`).
  void CountAcceptedUpdates(std::shared_ptr<std::atomic<int64_t>> counter) { accepted_ = std::move(counter); }
  // Records each ps task's answers in `answers` (`foreman cluster status`).
  void RecordAnswers(std::shared_ptr<PsAnswerTimes> answers) { answers_ = std::move(answers); }

  // ps 0's applies accepted per worker task (PsShardStatsMessage::
  // worker_applies): the chief's steps_per_sec/worker_K summaries.
  StatusOr<std::vector<int64_t>> WorkerApplies() {
    FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
    std::vector<StatusOr<PsShardStatsMessage>> r =
        AskAll<PsShardStatsMessage>({0}, [&](caf::scoped_actor& self, const caf::actor& proxy, int) {
          return self->request(proxy, timeout_, ps_stats_atom::value);
        });
    FOREMAN_RETURN_IF_ERROR(r[0].status());
    return std::move(r[0]->worker_applies);
  }

  // Server::EndTraining: ps 0 first (its global_step), then the others.
  StatusOr<int64_t> EndTraining() {
    FOREMAN_ASSIGN_OR_RETURN(auto use, Enter());
    std::vector<StatusOr<int64_t>> first =
        AskAll<int64_t>({0}, [&](caf::scoped_actor& self, const caf::actor& proxy, int) {
          return self->request(proxy, timeout_, ps_end_atom::value, int64_t{-1});
        });
    Status status = first[0].status();
    const int64_t step = first[0].ok() ? *first[0] : -1;
    std::vector<int> others;
    for (int k = 1; k < static_cast<int>(ps_.size()); ++k) others.push_back(k);
    std::vector<StatusOr<int64_t>> r =
        AskAll<int64_t>(others, [&](caf::scoped_actor& self, const caf::actor& proxy, int) {
          return self->request(proxy, timeout_, ps_end_atom::value, step);
        });
    for (auto& one : r) {
      if (status.ok()) status = one.status();
    }
    FOREMAN_RETURN_IF_ERROR(status);
    return step;
  }

  // Every later call is UNAVAILABLE `why`; waits for the calls in flight
  // (each bounded by its timeouts) and drops every CAF handle.
  void Shutdown(const std::string& why) {
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

 private:
  // A call in flight: Shutdown waits for it.
  class Use {
   public:
    explicit Use(PsRemoteValues* rv) : rv_(rv) {}
    Use(Use&& other) noexcept : rv_(std::exchange(other.rv_, nullptr)) {}
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    Use& operator=(Use&&) = delete;
    ~Use() {
      if (rv_ == nullptr) return;
      {
        MutexLock l(rv_->mu_);
        --rv_->in_flight_;
      }
      rv_->cv_.notify_all();
    }

   private:
    PsRemoteValues* rv_;
  };

  StatusOr<Use> Enter() {
    MutexLock l(mu_);
    if (closed_) return absl::UnavailableError(why_);
    ++in_flight_;
    return Use(this);
  }

  StatusOr<std::shared_ptr<const Placement>> Bound(const char* method) {
    MutexLock l(mu_);
    if (placement_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(target_, ": RemoteValues::", method, " before Bind"));
    }
    return placement_;
  }

  std::vector<int> AllShards() const {
    std::vector<int> all;
    for (int k = 0; k < static_cast<int>(ps_.size()); ++k) all.push_back(k);
    return all;
  }
  static std::vector<int> ShardsWithNames(const Placement& p) {
    std::vector<int> out;
    for (int k = 0; k < static_cast<int>(p.shard_names.size()); ++k) {
      if (!p.shard_names[k].empty()) out.push_back(k);
    }
    return out;
  }

  // The proxy of ps task `k`: the cached one unless the watcher saw it go
  // down, else a new connection (bounded by the request timeout).
  StatusOr<caf::actor> Proxy(int k) {
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
    StatusOr<caf::actor> p = [&] {
      ForgetSystemOnExit forget;
      return ConnectActor(*system, ps_[k].host, ps_[k].port, tls_, timeout_);
    }();
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

  std::optional<std::string> LostCause(const caf::actor& proxy) {
    MutexLock l(lost_->mu);
    for (const auto& [addr, cause] : lost_->lost) {
      if (addr == proxy.address()) return cause;
    }
    return std::nullopt;
  }

  // Drops `proxy` (ps task k's) so the next call reconnects.
  void Forget(int k, const caf::actor& proxy, const std::string& cause) {
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
  Status ShardError(int k, const caf::actor& proxy, const caf::error& e, caf::actor_system& system) {
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
  caf::actor_system& System() {
    MutexLock l(mu_);
    return *system_;
  }

  // Sends one request to each shard of `shards` (send(self, proxy, k)), then
  // awaits every answer: the shards work in parallel.
  template <class T, class Send>
  std::vector<StatusOr<T>> AskAll(const std::vector<int>& shards, Send send) {
    if (shards.empty()) return {};
    ForgetSystemOnExit forget;
    caf::scoped_actor self{System()};
    return AskAllFrom<T>(self, shards, send);
  }

  // AskAll from the caller's scoped actor `self` (the sender the shards see).
  template <class T, class Send>
  std::vector<StatusOr<T>> AskAllFrom(caf::scoped_actor& self, const std::vector<int>& shards, Send send) {
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

  caf::actor_system* system_ ABSL_GUARDED_BY(mu_);  // null after Shutdown
  caf::actor watcher_ ABSL_GUARDED_BY(mu_);
  const std::shared_ptr<LostProxies> lost_;
  const std::vector<PsTask> ps_;
  const bool tls_;
  const int worker_index_;
  const int num_workers_;  // the spec's worker tasks (naming the missing ones of a synchronous step)
  const int replicas_to_aggregate_;
  const std::chrono::milliseconds timeout_;
  const std::string target_;
  PsWait ps_wait_;
  std::shared_ptr<std::atomic<int64_t>> accepted_;  // set in Start, before any call
  std::shared_ptr<PsAnswerTimes> answers_;          // set in Start, before any call

  Mutex connect_mu_;  // one connect at a time; taken before mu_
  Mutex mu_;
  std::condition_variable_any cv_;  // in_flight_ fell
  std::shared_ptr<const Placement> placement_ ABSL_GUARDED_BY(mu_);
  std::vector<caf::actor> proxies_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> causes_ ABSL_GUARDED_BY(mu_);  // why the last proxy was dropped
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string why_ ABSL_GUARDED_BY(mu_);

  // The network's share of a step (tools/bench/cluster_bench.sh): the wall
  // time of Read/ReadForStep and Apply's requests and the tensor bytes they
  // carried; logged at Shutdown when FOREMAN_CLUSTER_STATS is set.
  struct Stats {
    std::atomic<uint64_t> reads{0}, read_us{0}, bytes_in{0};
    std::atomic<uint64_t> applies{0}, apply_us{0}, bytes_out{0};
  };
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
  void LogStats() const {
    if (std::getenv("FOREMAN_CLUSTER_STATS") == nullptr) return;
    const auto per = [](const std::atomic<uint64_t>& sum, const std::atomic<uint64_t>& n) {
      const uint64_t count = n.load();
      return count == 0 ? 0.0 : static_cast<double>(sum.load()) / static_cast<double>(count);
    };
    FOREMAN_LOG_INFO(
        "{}: cluster stats: reads={} read_us={:.0f} read_bytes={:.0f} applies={} apply_us={:.0f} apply_bytes={:.0f}",
        target_, stats_.reads.load(), per(stats_.read_us, stats_.reads), per(stats_.bytes_in, stats_.reads),
        stats_.applies.load(), per(stats_.apply_us, stats_.applies), per(stats_.bytes_out, stats_.applies));
  }
  Stats stats_;
};

namespace {

// -- the Server's parts ---------------------------------------------------------------

// What a ps task's Join waits for (the shard's on_end_activity).
struct JoinState {
  Mutex mu;
  std::condition_variable_any cv;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  bool ended ABSL_GUARDED_BY(mu) = false;
  SteadyClock::time_point end_time ABSL_GUARDED_BY(mu);
  SteadyClock::time_point last_activity ABSL_GUARDED_BY(mu);
};

}  // namespace

struct ServerCore {
  explicit ServerCore(ClusterSpec spec) : cluster(std::move(spec)) {}
  ClusterSpec cluster;
  ClusterTask task;
  ServerOptions options;
  std::string address;  // "host:port" as the spec writes it
  std::string target;   // "tcp://" or "tls://" + address
  TaskAddress bind;
  bool tls = false;
  bool is_ps = false;
  bool ready = false;  // guarded by the registry's mutex

  std::unique_ptr<OwnedActorSystem> owned;
  caf::actor_system* system = nullptr;  // owned's
  caf::actor served;   // the shard or the cluster task actor (published)
  caf::actor watcher;  // a worker's ProxyWatcher
  std::shared_ptr<PsRemoteValues> remote;
  std::shared_ptr<SessionValues> values;
  std::shared_ptr<JoinState> join = std::make_shared<JoinState>();

  Mutex stop_mu;
  bool stopped ABSL_GUARDED_BY(stop_mu) = false;
};

namespace {

// The Servers of this process, by address ("host:port").
struct ServerRegistry {
  Mutex mu;
  std::map<std::string, std::shared_ptr<ServerCore>> servers ABSL_GUARDED_BY(mu);
};
ServerRegistry& Servers() {
  static auto* registry = new ServerRegistry;
  return *registry;
}

void Unregister(const std::shared_ptr<ServerCore>& core) {
  ServerRegistry& r = Servers();
  MutexLock l(r.mu);
  auto it = r.servers.find(core->address);
  if (it != r.servers.end() && it->second == core) r.servers.erase(it);
}

// Stops the actors and destroys the system (on a short-lived thread:
// actor_system.hpp).
void Teardown(ServerCore& core, const std::string& why) {
  if (core.remote) core.remote->Shutdown(why);
  if (!core.system) return;
  Status s = RunOnShortLivedThread([&core]() -> Status {
    {
      caf::scoped_actor self{*core.system};
      for (caf::actor* a : {&core.served, &core.watcher}) {
        if (!*a) continue;
        self->send_exit(*a, caf::exit_reason::user_shutdown);
        self->wait_for(*a);
        *a = nullptr;
      }
    }
    core.system = nullptr;
    core.owned.reset();
    return absl::OkStatus();
  });
  if (!s.ok()) FOREMAN_LOG_ERROR("Stopping the foreman::Server {}: {}", core.target, s.ToString());
}

StatusOr<std::shared_ptr<SessionValues>> ClusterTargetValues(const std::string& target) {
  const bool tls = absl::StartsWith(target, kTlsScheme);
  const std::string address = target.substr(std::strlen(kTcpScheme));
  ServerRegistry& r = Servers();
  MutexLock l(r.mu);
  auto it = r.servers.find(address);
  if (it == r.servers.end() || !it->second->ready) {
    return absl::FailedPreconditionError(absl::StrCat("no foreman::Server in this process serves ", target,
                                                      ": create one (Server::Create) first"));
  }
  const ServerCore& core = *it->second;
  if (core.tls != tls) {
    return absl::FailedPreconditionError(
        absl::StrCat("session target ", target, ": the foreman::Server at ", address, " serves ", core.target));
  }
  if (core.is_ps) {
    return absl::FailedPreconditionError(absl::StrCat("session target ", target, " is ps task ",
                                                      core.task.task_index,
                                                      "'s: a session's master is a worker's target"));
  }
  return core.values;
}

Status ValidateServerOptions(const ServerOptions& options) {
  if (options.request_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ServerOptions.request_timeout_ms must be > 0, got ", options.request_timeout_ms));
  }
  if (options.replicas_to_aggregate < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--replicas-to-aggregate must be >= 0, got ",
                                                   options.replicas_to_aggregate));
  }
  return nn::ValidateOptimizerOptions(options.optimizer);
}

// Builds the system, spawns and publishes the task's actor.
Status Start(const std::shared_ptr<ServerCore>& core) {
  ServerCore& c = *core;
  const NetConfig net = NetConfigOf(c.options.cluster, c.tls);
  auto lost = std::make_shared<LostProxies>();
  auto accepted = std::make_shared<std::atomic<int64_t>>(0);
  auto answers = std::make_shared<PsAnswerTimes>(static_cast<std::size_t>(c.cluster.num_tasks("ps")));
  FOREMAN_ASSIGN_OR_RETURN(c.owned, BuildActorSystem(2, [&net](caf::actor_system_config& config) {
                             ConfigureClusterNetwork(config, net);
                           }));
  c.system = c.owned->system.get();
  // Spawned from a thread that ends at once (actor_system.hpp).
  FOREMAN_RETURN_IF_ERROR(RunOnShortLivedThread([&]() -> Status {
    if (c.is_ps) {
      PsShardOptions shard;
      shard.task_index = c.task.task_index;
      shard.optimizer = c.options.optimizer;
      shard.replicas_to_aggregate = c.options.replicas_to_aggregate;
      shard.on_end_activity = [join = c.join] {
        {
          MutexLock l(join->mu);
          const auto now = SteadyClock::now();
          if (!join->ended) {
            join->ended = true;
            join->end_time = now;
          }
          join->last_activity = now;
        }
        join->cv.notify_all();
      };
      FOREMAN_ASSIGN_OR_RETURN(c.served, SpawnPsShard(*c.system, std::move(shard)));
    } else {
      const auto& jobs = c.cluster.jobs();
      auto hosts = [&jobs](const char* job) {
        auto it = jobs.find(job);
        return it == jobs.end() ? std::string() : absl::StrJoin(it->second, ",");
      };
      c.served = c.system->spawn(ClusterTaskActor, c.task.job_name, static_cast<int32_t>(c.task.task_index),
                                 c.address, hosts("ps"), hosts("worker"), accepted,
                                 std::shared_ptr<const PsAnswerTimes>(answers));
      c.watcher = c.system->spawn(ProxyWatcher, lost);
    }
    return absl::OkStatus();
  }));
  {
    ForgetSystemOnExit forget;
    FOREMAN_RETURN_IF_ERROR(
        PublishActor(*c.system, c.served, c.bind.host, static_cast<uint16_t>(c.bind.port), c.tls).status());
  }
  if (!c.is_ps) {
    std::vector<PsTask> ps;
    const int n = c.cluster.num_tasks("ps");
    for (int k = 0; k < n; ++k) {
      FOREMAN_ASSIGN_OR_RETURN(TaskAddress a, c.cluster.task_address("ps", k));
      ps.push_back(PsTask{a.host, static_cast<uint16_t>(a.port),
                          absl::StrCat("ps task ", k, " (", c.cluster.jobs().at("ps")[k], ")")});
    }
    c.remote = std::make_shared<PsRemoteValues>(c.system, c.watcher, lost, std::move(ps), c.tls,
                                                c.task.task_index, c.cluster.num_tasks("worker"),
                                                c.options.replicas_to_aggregate,
                                                c.options.request_timeout_ms, c.target);
    c.remote->set_ps_wait({absl::Seconds(c.options.cluster.ps_wait_secs),
                           absl::Milliseconds(c.options.cluster.heartbeat_ms)});
    c.remote->CountAcceptedUpdates(accepted);
    c.remote->RecordAnswers(answers);
    c.values = std::make_shared<SessionValues>();
    c.values->remote = c.remote;
  }
  return absl::OkStatus();
}

std::shared_ptr<ServerCore> CoreOf(const std::string& address) {
  ServerRegistry& r = Servers();
  MutexLock l(r.mu);
  auto it = r.servers.find(address);
  return it == r.servers.end() ? nullptr : it->second;
}

}  // namespace

void RegisterClusterSessionTargets() {
  static Mutex* mu = new Mutex;
  static bool done = false;
  MutexLock l(*mu);
  if (done) return;
  done = true;
  for (const auto& [scheme, usage] : {std::pair<const char*, const char*>{kTcpScheme, "\"tcp://HOST:PORT\""},
                                      std::pair<const char*, const char*>{kTlsScheme, "\"tls://HOST:PORT\""}}) {
    Status s = RegisterSessionTarget(scheme, usage, ClusterTargetValues);
    if (!s.ok()) FOREMAN_LOG_WARN("Registering the {} session target: {}", scheme, s.ToString());
  }
}

StatusOr<std::vector<int64_t>> WorkerAppliesOnPs0(const Server& server) {
  const std::string& target = server.target();
  std::shared_ptr<ServerCore> core = CoreOf(target.substr(std::strlen(kTcpScheme)));
  if (core == nullptr || core->remote == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(target, ": not a running worker task's Server (per-worker applies are read from ps 0)"));
  }
  return core->remote->WorkerApplies();
}

std::shared_ptr<RemoteValues> ServerRemoteValues(const Server& server) {
  const std::string& target = server.target();
  std::shared_ptr<ServerCore> core = CoreOf(target.substr(std::strlen(kTcpScheme)));
  if (core == nullptr) return nullptr;
  return core->remote;
}

// -- foreman cluster status (cluster_status.hpp) ------------------------------------

namespace {

// Asks the task at `a` into `r`: a worker's cluster task actor answers
// (caf::get_atom) (then *ps_hosts / *worker_hosts are its spec's); a ps
// shard drops that question with an error and is asked for its stats.
void AskTask(caf::actor_system& system, caf::scoped_actor& self, const TaskAddress& a, bool tls,
             std::chrono::milliseconds timeout, ClusterTaskReport& r, std::string* ps_hosts,
             std::string* worker_hosts) {
  StatusOr<caf::actor> proxy = ConnectActor(system, a.host, static_cast<uint16_t>(a.port), tls, timeout);
  if (!proxy.ok()) {
    r.error = std::string(proxy.status().message());
    return;
  }
  bool answered = false;
  std::string first_error;
  bool timed_out = false;
  self->request(*proxy, timeout, caf::get_atom::value)
      .receive(
          [&](std::string& job, int32_t index, std::string& address, std::string& ps, std::string& workers,
              int64_t steps, std::vector<int64_t>& ps_last_answer_ms) {
            answered = true;
            r.job_name = job;
            r.task_index = index;
            r.address = address;
            r.worker_steps = steps;
            r.ps_last_answer_ms = std::move(ps_last_answer_ms);
            if (ps_hosts != nullptr) *ps_hosts = ps;
            if (worker_hosts != nullptr) *worker_hosts = workers;
          },
          [&](caf::error& e) {
            timed_out = e == caf::sec::request_timeout;
            first_error = system.render(e);
          });
  if (!answered && !timed_out) {
    self->request(*proxy, timeout, ps_stats_atom::value)
        .receive(
            [&](PsShardStatsMessage& m) {
              answered = true;
              r.job_name = "ps";
              r.task_index = m.task_index;
              r.global_step = m.global_step;
              r.initialized = m.initialized;
              r.frozen = m.frozen;
              r.applied_updates = m.applied_updates;
              r.refused_updates = m.refused_updates;
              r.worker_applies = std::move(m.worker_applies);
              r.worker_last_apply_ms = std::move(m.worker_last_apply_ms);
            },
            [&](caf::error& e) {
              first_error = absl::StrCat("neither a worker's nor a ps task's answer (", first_error, "; ",
                                         system.render(e), ")");
            });
  }
  r.reachable = answered;
  if (!answered) {
    r.error = timed_out ? absl::StrCat("connected, but no answer within ", timeout.count(), " ms") : first_error;
  }
}

}  // namespace

StatusOr<std::vector<ClusterTaskReport>> QueryClusterStatus(const std::string& target, const ClusterOptions& options,
                                                            int64_t timeout_ms) {
  const bool tls = absl::StartsWith(target, kTlsScheme);
  if (!tls && !absl::StartsWith(target, kTcpScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", target, "' is not a task's address: expected tcp://HOST:PORT or tls://HOST:PORT"));
  }
  if (timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--timeout-ms must be > 0, got ", timeout_ms));
  }
  const std::string address = target.substr(std::strlen(kTcpScheme));
  auto spec = ClusterSpec::Create({{"asked", {address}}});
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("'", target, "': ", spec.status().message()));
  }
  FOREMAN_ASSIGN_OR_RETURN(TaskAddress asked, spec->task_address("asked", 0));
  const bool any_tls = !options.tls_cert.empty() || !options.tls_key.empty() || !options.tls_ca.empty();
  if (tls && !options.tls_enabled()) {
    return absl::InvalidArgumentError(
        absl::StrCat(target, " is a TLS address: give --tls-cert, --tls-key and --tls-ca (a certificate of the "
                             "cluster's CA)"));
  }
  if (!tls && any_tls) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-* given with the plain address ", target, ": use tls://", address));
  }
  if (tls) FOREMAN_RETURN_IF_ERROR(CheckTlsFiles(options.tls_cert, options.tls_key, options.tls_ca));
  const NetConfig net = NetConfigOf(options, tls);
  const auto timeout = std::chrono::milliseconds(std::min(timeout_ms, int64_t{86'400'000}));
  std::vector<ClusterTaskReport> reports;
  std::unique_ptr<OwnedActorSystem> owned;
  FOREMAN_ASSIGN_OR_RETURN(owned, BuildActorSystem(1, [&net](caf::actor_system_config& config) {
                             ConfigureClusterNetwork(config, net);
                           }));
  FOREMAN_RETURN_IF_ERROR(RunOnShortLivedThread([&]() -> Status {
    {
      ForgetSystemOnExit forget;
      caf::scoped_actor self{*owned->system};
      ClusterTaskReport first;
      first.address = address;
      std::string ps_hosts, worker_hosts;
      AskTask(*owned->system, self, asked, tls, timeout, first, &ps_hosts, &worker_hosts);
      const bool worker = first.reachable && first.job_name != "ps";
      const std::string asked_job = first.job_name;
      const int asked_index = first.task_index;
      reports.push_back(std::move(first));
      if (worker) {
        auto cluster = ClusterSpec::FromFlags(ps_hosts, worker_hosts);
        if (cluster.ok()) {
          for (const char* job : {"ps", "worker"}) {
            const int n = cluster->num_tasks(job);
            for (int k = 0; k < n; ++k) {
              if (job == asked_job && k == asked_index) continue;
              ClusterTaskReport r;
              r.job_name = job;
              r.task_index = k;
              r.address = cluster->jobs().at(job)[k];
              auto a = cluster->task_address(job, k);
              if (a.ok()) {
                AskTask(*owned->system, self, *a, tls, timeout, r, nullptr, nullptr);
              } else {
                r.error = std::string(a.status().message());
              }
              if (r.reachable && (r.job_name != job || r.task_index != k)) {
                r.error = absl::StrCat("answered as /job:", r.job_name, "/task:", r.task_index, ", not /job:", job,
                                       "/task:", k);
                r.reachable = false;
                r.job_name = job;
                r.task_index = k;
              }
              reports.push_back(std::move(r));
            }
          }
        }
      }
    }
    owned.reset();
    return absl::OkStatus();
  }));
  return reports;
}

}  // namespace internal

// -- foreman::Server --------------------------------------------------------------------

struct Server::Impl {
  std::shared_ptr<internal::ServerCore> core;
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Stop(); }

StatusOr<std::unique_ptr<Server>> Server::Create(const ClusterSpec& cluster, const ClusterTask& task,
                                                 const ServerOptions& options) {
  using internal::ServerCore;
  internal::RegisterClusterSessionTargets();
  // Everything is checked before anything listens.
  FOREMAN_RETURN_IF_ERROR(ValidateClusterOptions(cluster, task, options.cluster));
  FOREMAN_RETURN_IF_ERROR(internal::ValidateServerOptions(options));
  if (options.cluster.tls_enabled()) {
    FOREMAN_RETURN_IF_ERROR(CheckTlsFiles(options.cluster.tls_cert, options.cluster.tls_key, options.cluster.tls_ca));
  }
  auto core = std::make_shared<ServerCore>(cluster);
  core->task = task;
  core->options = options;
  core->tls = options.cluster.tls_enabled();
  core->is_ps = task.job_name == "ps";
  core->address = cluster.jobs().at(task.job_name)[task.task_index];
  core->target = absl::StrCat(core->tls ? internal::kTlsScheme : internal::kTcpScheme, core->address);
  FOREMAN_ASSIGN_OR_RETURN(core->bind, cluster.task_address(task.job_name, task.task_index));
  {
    internal::ServerRegistry& r = internal::Servers();
    MutexLock l(r.mu);
    auto [it, fresh] = r.servers.emplace(core->address, core);
    if (!fresh) {
      return absl::AlreadyExistsError(absl::StrCat("a foreman::Server of this process already serves ",
                                                   it->second->target, " (/job:", it->second->task.job_name,
                                                   "/task:", it->second->task.task_index, ")"));
    }
  }
  Status started = internal::Start(core);
  if (!started.ok()) {
    internal::Unregister(core);
    internal::Teardown(*core, absl::StrCat(core->target, " failed to start"));
    return Status(started.code(), absl::StrCat("Server::Create(/job:", task.job_name, "/task:", task.task_index,
                                               "): ", started.message()));
  }
  {
    internal::ServerRegistry& r = internal::Servers();
    MutexLock l(r.mu);
    core->ready = true;
  }
  FOREMAN_LOG_INFO("Started foreman::Server /job:{}/task:{} at {}", task.job_name, task.task_index, core->target);
  auto impl = std::make_unique<Impl>();
  impl->core = std::move(core);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

const std::string& Server::target() const { return impl_->core->target; }
const ClusterSpec& Server::cluster() const { return impl_->core->cluster; }
const ClusterTask& Server::task() const { return impl_->core->task; }

StatusOr<int64_t> Server::EndTraining() {
  internal::ServerCore& c = *impl_->core;
  if (!c.task.is_chief()) {
    return absl::FailedPreconditionError(absl::StrCat("Server::EndTraining: /job:", c.task.job_name, "/task:",
                                                      c.task.task_index, " is not the chief (worker 0)"));
  }
  StatusOr<int64_t> step = c.remote->EndTraining();
  if (step.ok()) FOREMAN_LOG_INFO("{}: training ended on every ps task at global_step {}", c.target, *step);
  return step;
}

Status Server::Join(absl::Duration timeout) {
  const std::shared_ptr<internal::ServerCore> core = impl_->core;  // Join may outlast a concurrent Stop
  internal::ServerCore& c = *core;
  internal::JoinState& j = *c.join;
  const auto wait = timeout > absl::Hours(24 * 365) ? std::chrono::hours(24 * 365)
                                                    : std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                          absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())));
  const auto deadline = internal::SteadyClock::now() + wait;
  const auto quiet = std::chrono::milliseconds(c.options.cluster.connection_timeout_ms);
  MutexLock l(j.mu);
  for (;;) {
    if (j.stopped) return absl::OkStatus();
    auto until = deadline;
    if (c.is_ps && j.ended) {
      const auto done = std::min(j.last_activity + quiet, j.end_time + 10 * quiet);
      if (internal::SteadyClock::now() >= done) return absl::OkStatus();
      until = std::min(until, done);
    }
    if (internal::SteadyClock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("Server::Join(", absl::FormatDuration(timeout), ") on ", c.target, ": ",
                       c.is_ps ? (j.ended ? "the workers were still sending updates after the end of training"
                                          : "training did not end (the chief's EndTraining)")
                               : "the Server was not stopped"));
    }
    j.cv.wait_until(l, until);
  }
}

void Server::Stop() {
  std::shared_ptr<internal::ServerCore> core = impl_->core;
  {
    MutexLock l(core->stop_mu);
    if (core->stopped) return;
    core->stopped = true;
  }
  internal::Unregister(core);
  internal::Teardown(*core, absl::StrCat("the foreman::Server serving ", core->target, " was stopped"));
  {
    MutexLock l(core->join->mu);
    core->join->stopped = true;
  }
  core->join->cv.notify_all();
  FOREMAN_LOG_INFO("Stopped foreman::Server {}", core->target);
}

}  // namespace foreman
