// PsRemoteValues: a worker task's RemoteValues (cluster/remote_values.hpp)
// over the ps shard actors (ps_shard.hpp), and the watcher that tells it
// which ps proxies went down. Used by foreman::Server (cluster_server.cpp),
// which makes one per worker task and shares it among the sessions of its
// target.
//
// PsRemoteValues (RemoteValues over the ps shards): Bind places the names
// with PlaceVariablesOnPs; each ps task is connected on first use with
// ConnectActor (bounded by set_connect_timeout), its proxy monitored by a
// watcher actor (a lost peer: IsPeerLost) and dropped after a loss or a
// transport error other than a timeout (a slow peer keeps its link; a
// frozen one is dropped by heartbeats), so the next call reconnects. Requests go to every shard
// concerned at once and are then awaited, each with request_timeout_ms.
// Transport failures are UNAVAILABLE "ps task K (host:port): <cause>"; a
// shard's own answer (OUT_OF_RANGE after the end of training,
// INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION) is returned unchanged.
//   Read            ps_read of each shard's names; a shard answering "not
//                   initialized" has its names erased from the mirror.
//   ReadConsistent  ps_freeze every shard (the freeze bounded by
//                   2 x request_timeout_ms + 1 s, and by the life of the
//                   one scoped actor that asks), ps_read each, ps_thaw
//                   every shard that froze (always, also after an error).
//   Write           ps_init of every shard (also one that holds no
//                   variable: it must be initialized to take applies) with
//                   its share; VariablesMessage.global_step is the mirror's
//                   global_step (0 without one).
//   Apply           one ps_apply per shard (every shard: ps 0 steps
//                   global_step, a shard with the beta powers steps them,
//                   even with no gradient of its own); ps 0's answer is the
//                   new global_step. gradients.worker is the worker's
//                   task_index.
//   ApplyAndRead    one ps_apply_read per shard (the same apply, answered
//                   with the shard's step variables after it): one round
//                   trip per step; the values are stored in the mirror and
//                   the next ReadForStep of that mirror returns at once
//                   when it comes within kMaxFusedReadAge of the answer
//                   (a step's next run follows its apply within
//                   microseconds; a later one reads, so the read stays as
//                   close to the step's start as TF1's).
// Tensor bytes (tensor_bytes.hpp): gradients are sent as views of the
// caller's tensors (an apply returns only once CAF dropped every view);
// received values become the mirror's tensors without a copy (a ps in the
// same process shares its variables' bytes: those are copied).
// After the Server stops, every call is UNAVAILABLE naming the target.
#pragma once

#include <atomic>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "cluster/remote_values.hpp"
#include "foreman/mutex.hpp"
#include "foreman/status.hpp"
#include "foreman/variable_store.hpp"
#include "messages.hpp"

namespace foreman::internal {

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

// Monitors every proxy it is sent (a caf::actor message); records each
// down_msg's cause in `lost` and fails the requests pending on that proxy.
caf::behavior ProxyWatcher(caf::event_based_actor* self, std::shared_ptr<LostProxies> lost);

// When a worker's PsRemoteValues last had an answer from each ps task
// (steady clock ns; 0: never): a value, or the shard's own error (not a
// timeout or a lost link). `foreman cluster status` prints it.
struct PsAnswerTimes {
  explicit PsAnswerTimes(std::size_t num_ps) : last_ns(num_ps) {}
  std::vector<std::atomic<int64_t>> last_ns;

  // Per ps task: ms since its last answer, -1 if none.
  std::vector<int64_t> MsAgo() const;
};

// One ps task as a worker reaches it.
struct PsTask {
  std::string host;
  uint16_t port = 0;
  std::string where;  // "ps task K (host:port)"
};

// -- PsRemoteValues -------------------------------------------------------------------

// How long an ApplyAndRead's answer serves as the next step's read.
inline constexpr std::chrono::milliseconds kMaxFusedReadAge{100};

class PsRemoteValues final : public RemoteValues {
 public:
  // `system` and `watcher` (a ProxyWatcher fed `lost`) outlive every call
  // until Shutdown. `ps`: the spec's ps tasks in index order; `target` the
  // worker's "tcp://" / "tls://" address (named in errors).
  PsRemoteValues(caf::actor_system* system, caf::actor watcher, std::shared_ptr<LostProxies> lost,
                 std::vector<PsTask> ps, bool tls, int worker_index, int num_workers, int replicas_to_aggregate,
                 int64_t request_timeout_ms, std::string target);

  Status Bind(const std::vector<std::string>& names) override;

  // ClusterOptions::ps_wait_secs, retried every heartbeat_ms. Set once,
  // before the values are handed to any session.
  void set_ps_wait(PsWait w) { ps_wait_ = w; }
  PsWait ps_wait() const override { return ps_wait_; }
  // The cluster job id (ClusterOptions::job_id) every init, apply and end
  // of training carries: a ps task of another job refuses them. Set once,
  // before the values are handed to any session.
  void set_job_id(std::string id) { job_id_ = std::move(id); }
  // The bound on one connect to a ps task (its TCP connect and BASP
  // handshake: ClusterOptions::connection_timeout_ms; never more than
  // request_timeout_ms), so that a ps that accepts and never answers, or a
  // listener that never reads, costs a --ps-wait-secs wait at most this
  // much more (issue 31 point 2). Set once, before the values are handed to
  // any session; default: request_timeout_ms.
  void set_connect_timeout(std::chrono::milliseconds t) { connect_timeout_ = std::min(t, timeout_); }

  Status Read(VariableStore& mirror) override { return ReadNames(mirror, /*step_only=*/false); }
  Status ReadForStep(VariableStore& mirror) override { return ReadNames(mirror, /*step_only=*/true); }
  Status ReadConsistent(VariableStore& mirror) override;
  Status Write(const VariableStore& mirror, WriteKind kind) override;
  StatusOr<std::vector<TaskState>> TaskStates() override;
  StatusOr<int64_t> Apply(const Gradients& grads, int64_t computed_at_step) override;
  StatusOr<int64_t> ApplyAndRead(const Gradients& grads, int64_t computed_at_step, VariableStore& mirror) override;

  // Counts each accepted Apply in `counter` (`foreman cluster status`).
  void CountAcceptedUpdates(std::shared_ptr<std::atomic<int64_t>> counter) { accepted_ = std::move(counter); }
  // Records each ps task's answers in `answers` (`foreman cluster status`).
  void RecordAnswers(std::shared_ptr<PsAnswerTimes> answers) { answers_ = std::move(answers); }

  // ps 0's applies accepted per worker task (PsShardStatsMessage::
  // worker_applies): the chief's steps_per_sec/worker_K summaries.
  StatusOr<std::vector<int64_t>> WorkerApplies();

  // Server::EndTraining: ps 0 first (its global_step), then the others.
  StatusOr<int64_t> EndTraining();

  // ps 0's counters over the link a session already opened, within
  // min(request_timeout_ms, 1 s); UNAVAILABLE when there is none (never
  // connected, or lost: the session's next call reconnects and reports the
  // loss, which this does not consume). For the Server's watch of silent
  // peers (PeerSilenceLog); thread-safe.
  StatusOr<PsShardStatsMessage> PeekPs0Stats();

  // Every later call is UNAVAILABLE `why`; waits for the calls in flight
  // (each bounded by its timeouts) and drops every CAF handle.
  void Shutdown(const std::string& why);

 private:
  // Where the bound variables live (ps_remote_values.cpp).
  struct Placement;

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

  Status ReadNames(VariableStore& mirror, bool step_only);
  StatusOr<int64_t> ApplyImpl(const Gradients& grads, int64_t computed_at_step, VariableStore* mirror);
  // ApplyAndRead's answer in `mirror` is what the next ReadForStep of it
  // returns, unless another call came in between (RemoteValues::ApplyAndRead).
  bool TakeFresh(const VariableStore* mirror);  // true once after MarkFresh(mirror)
  void ForgetFresh();
  void MarkFresh(const VariableStore* mirror);
  Status WithMissingWorkers(int k, const Status& status);
  StatusOr<Use> Enter();
  StatusOr<std::shared_ptr<const Placement>> Bound(const char* method);
  std::vector<int> AllShards() const;
  static std::vector<int> ShardsWithNames(const Placement& p);
  StatusOr<caf::actor> Proxy(int k);
  std::optional<std::string> LostCause(const caf::actor& proxy);
  void Forget(int k, const caf::actor& proxy, const std::string& cause);
  Status ShardError(int k, const caf::actor& proxy, const caf::error& e, caf::actor_system& system);
  caf::actor_system& System();
  template <class T, class Send>
  std::vector<StatusOr<T>> AskAll(const std::vector<int>& shards, Send send);
  template <class T, class Send>
  std::vector<StatusOr<T>> AskAllFrom(caf::scoped_actor& self, const std::vector<int>& shards, Send send);
  void LogStats() const;

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
  std::string job_id_;
  std::chrono::milliseconds connect_timeout_ = timeout_;
  std::shared_ptr<std::atomic<int64_t>> accepted_;  // set in Start, before any call
  std::shared_ptr<PsAnswerTimes> answers_;          // set in Start, before any call

  Mutex connect_mu_;  // one connect at a time; taken before mu_
  Mutex mu_;
  std::condition_variable_any cv_;  // in_flight_ fell
  std::shared_ptr<const Placement> placement_ ABSL_GUARDED_BY(mu_);
  std::vector<caf::actor> proxies_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> causes_ ABSL_GUARDED_BY(mu_);  // why the last proxy was dropped
  // Per ps task: when its connects began to fail (since the last one that
  // succeeded): the rest of a --ps-wait-secs wait
  // bounds the next connect (Proxy).
  std::vector<std::optional<std::chrono::steady_clock::time_point>> unreachable_since_ ABSL_GUARDED_BY(connect_mu_);
  // Each ps task's last failed connect, for a call whose ps-wait is spent.
  std::vector<std::string> last_connect_error_ ABSL_GUARDED_BY(connect_mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string why_ ABSL_GUARDED_BY(mu_);
  const VariableStore* fresh_mirror_ ABSL_GUARDED_BY(mu_) = nullptr;  // holds the last ApplyAndRead's answer
  std::chrono::steady_clock::time_point fresh_since_ ABSL_GUARDED_BY(mu_);  // when it was stored


  // The network's share of a step (tools/bench/cluster_bench.sh): the wall
  // time of Read/ReadForStep and Apply's requests and the tensor bytes they
  // carried; logged at Shutdown when FOREMAN_CLUSTER_STATS is set.
  struct Stats {
    std::atomic<uint64_t> reads{0}, read_us{0}, bytes_in{0};
    std::atomic<uint64_t> applies{0}, apply_us{0}, bytes_out{0};
    std::atomic<uint64_t> fused_reads{0};  // ReadForSteps answered by ApplyAndRead's answer
  };
  Stats stats_;
};

}  // namespace foreman::internal
