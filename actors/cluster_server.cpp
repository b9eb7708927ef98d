// foreman::Server and the tcp:// / tls:// session targets (cluster_server.hpp);
// its worker's PsRemoteValues is in ps_remote_values.cpp.
#include "cluster_server.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <caf/defaults.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "actor_system.hpp"
#include "atoms.hpp"
#include "status_error.hpp"
#include "cluster_net.hpp"
#include "cluster/peer_silence.hpp"
#include "cluster/task_address.hpp"
#include "cluster/worker_step_rates.hpp"
#include "foreman/cluster_status.hpp"
#include "foreman/mutex.hpp"
#include "foreman/nn.hpp"
#include "messages.hpp"
#include "nn/optimizer.hpp"
#include "platform/log.hpp"
#include "ps_remote_values.hpp"
#include "ps_shard.hpp"
#include "runtime/session_target.hpp"

namespace foreman {
namespace internal {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr char kTcpScheme[] = "tcp://";
constexpr char kTlsScheme[] = "tls://";

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

// The small actor a worker task publishes on its address. (caf::get_atom)
// is `foreman cluster status`'s question (foreman/cluster_status.hpp): the spec's
// hosts, the updates this worker's Server had accepted (`steps`) and the ms
// since its last answer from each ps task.
caf::behavior ClusterTaskActor(caf::event_based_actor* self, std::string job_name, int32_t task_index,
                               std::string address, std::string ps_hosts, std::string worker_hosts,
                               std::shared_ptr<std::atomic<int64_t>> steps,
                               std::shared_ptr<const PsAnswerTimes> answers, std::string job_id) {
  MakeQuiet(self, "cluster_task");
  return {[job_name, task_index, address](caf::ping_atom) {
            return caf::make_message(caf::pong_atom::value, job_name, task_index, address);
          },
          [=](caf::get_atom) {
            return caf::make_message(job_name, task_index, address, ps_hosts, worker_hosts, steps->load(),
                                     answers->MsAgo(), job_id);
          }};
}

// -- the Server's parts ---------------------------------------------------------------

// What a ps task's Join waits for (the shard's on_end_activity).
struct JoinState {
  Mutex mu;
  std::condition_variable_any cv;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  bool ended ABSL_GUARDED_BY(mu) = false;
  SteadyClock::time_point end_time ABSL_GUARDED_BY(mu);
  SteadyClock::time_point last_activity ABSL_GUARDED_BY(mu);
  // An eviction (Server::Evict): Join returns once the chief's checkpoint
  // read the shard (evicted_read) or at evict_deadline.
  bool evicting ABSL_GUARDED_BY(mu) = false;
  bool evicted_read ABSL_GUARDED_BY(mu) = false;  // the shard said: done (the chief read it, or no chief)
  bool evicted_by_chief ABSL_GUARDED_BY(mu) = false;
  SteadyClock::time_point evict_deadline ABSL_GUARDED_BY(mu);
  SteadyClock::time_point evicted_read_at ABSL_GUARDED_BY(mu);  // when Join may return (after a linger)
};

// After the chief's checkpoint read, Join waits this much more so that the
// answer to the chief's thaw leaves before the node is torn down.
constexpr std::chrono::milliseconds kEvictLinger{200};

}  // namespace

struct ServerCore {
  explicit ServerCore(ClusterSpec spec) : cluster(std::move(spec)) {}
  ClusterSpec cluster;
  ClusterTask task;
  ServerOptions options;
  std::string address;  // "host:port" as the spec writes it
  std::string target;   // "tcp://" or "tls://" + address
  std::string job_id;   // options.cluster.job_id, or DefaultClusterJobId(cluster)
  TaskAddress bind;
  bool tls = false;
  bool is_ps = false;
  bool ready = false;  // guarded by the registry's mutex

  std::unique_ptr<OwnedActorSystem> owned;
  caf::actor_system* system = nullptr;  // owned's, or the caller's (borrowed)
  // Server::Create(system, ...): the caller's system, not destroyed here;
  // Teardown closes the published port instead.
  bool borrowed = false;
  uint16_t published_port = 0;  // 0: nothing published yet
  caf::actor served;   // the shard or the cluster task actor (published)
  caf::actor watcher;  // a worker's ProxyWatcher
  std::shared_ptr<PsRemoteValues> remote;
  std::shared_ptr<SessionValues> values;
  std::shared_ptr<JoinState> join = std::make_shared<JoinState>();

  Mutex stop_mu;
  bool stopped ABSL_GUARDED_BY(stop_mu) = false;

  // A worker task's watch of silent peers (WatchPeers): the chief watches
  // the other workers, a worker the chief, as ps 0's counters show them.
  std::thread watch;
  Mutex watch_mu;
  std::condition_variable_any watch_cv;
  bool watch_stop ABSL_GUARDED_BY(watch_mu) = false;
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

// Stops the watch of silent peers (before the remote values go).
void StopWatch(ServerCore& core) {
  if (!core.watch.joinable()) return;
  {
    MutexLock l(core.watch_mu);
    core.watch_stop = true;
  }
  core.watch_cv.notify_all();
  core.watch.join();
}

// Stops the actors and destroys the system (on a short-lived thread:
// actor_system.hpp).
void Teardown(ServerCore& core, const std::string& why) {
  StopWatch(core);
  if (core.remote) core.remote->Shutdown(why);
  if (core.is_ps && std::getenv("FOREMAN_CLUSTER_STATS") != nullptr) {
    // The ps task's share of the bytes copied (tools/bench/cluster_bench.sh):
    // process-wide counters of tensor_bytes.hpp.
    const TransportCopyCounters c = TransportCopyCounters::Snapshot();
    FOREMAN_LOG_INFO("{}: transport stats: serialized={} deserialized={} copied={}", core.target, c.serialized,
                     c.deserialized, c.copied);
  }
  if (!core.system) return;
  Status s = RunOnShortLivedThread([&core]() -> Status {
    if (core.borrowed && core.published_port != 0) {
      // First, so that no new connection reaches an actor that is going.
      Status closed = ClosePort(*core.system, core.published_port, core.tls);
      if (!closed.ok()) FOREMAN_LOG_WARN("Stopping the foreman::Server {}: {}", core.target, closed.ToString());
      core.published_port = 0;
    }
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
    return absl::InvalidArgumentError(absl::StrCat("ServerOptions.replicas_to_aggregate (--replicas-to-aggregate) must be >= 0, got ",
                                                   options.replicas_to_aggregate));
  }
  return nn::ValidateOptimizerOptions(options.optimizer);
}

// Server::Create(system, ...)'s check that the caller's system was built
// as ConfigureClusterNetwork(config, options) builds one: INVALID_ARGUMENT
// naming the setting that differs.
Status CheckBorrowedSystem(caf::actor_system& system, const ClusterOptions& options, bool tls) {
  const std::string fix = "build the actor system from a config given to foreman::ConfigureClusterNetwork(config, "
                          "options.cluster) with the ServerOptions given here";
  if (!system.has_middleman()) {
    return absl::InvalidArgumentError(absl::StrCat("the actor system has no middleman (CAF's network layer): ", fix));
  }
  if (tls && !system.has_openssl_manager()) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.cluster asks for TLS but the actor system has no openssl manager: ", fix));
  }
  const caf::actor_system_config& config = system.config();
  const NetConfig net = NetConfigOf(options, tls);
  auto ms_of = [&config](const char* name, caf::timespan fallback) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(caf::get_or(config, name, fallback)).count();
  };
  const int64_t heartbeat_ms = ms_of("middleman.heartbeat-interval", caf::defaults::middleman::heartbeat_interval);
  if (heartbeat_ms != net.heartbeat_ms) {
    return absl::InvalidArgumentError(absl::StrCat("the actor system's middleman.heartbeat-interval is ",
                                                   heartbeat_ms, " ms, options.cluster.heartbeat_ms ",
                                                   net.heartbeat_ms, ": ", fix));
  }
  const int64_t timeout_ms = ms_of("middleman.connection-timeout", caf::defaults::middleman::connection_timeout);
  if (timeout_ms != net.connection_timeout_ms) {
    return absl::InvalidArgumentError(absl::StrCat("the actor system's middleman.connection-timeout is ", timeout_ms,
                                                   " ms, options.cluster.connection_timeout_ms ",
                                                   net.connection_timeout_ms, ": ", fix));
  }
  const auto ids = caf::get_or(config, "middleman.app-identifiers", caf::defaults::middleman::app_identifiers);
  if (std::find(ids.begin(), ids.end(), net.app_id) == ids.end()) {
    return absl::InvalidArgumentError(absl::StrCat("the actor system's middleman.app-identifiers [",
                                                   absl::StrJoin(ids, ", "), "] lack \"", net.app_id,
                                                   "\" (every task's handshake shows it): ", fix));
  }
  if (tls) {
    const std::pair<const std::string*, const std::string*> files[] = {
        {&config.openssl_certificate, &net.tls_cert}, {&config.openssl_key, &net.tls_key},
        {&config.openssl_cafile, &net.tls_ca}};
    const char* names[] = {"certificate (tls_cert)", "key (tls_key)", "cafile (tls_ca)"};
    for (int i = 0; i < 3; ++i) {
      if (*files[i].first != *files[i].second) {
        return absl::InvalidArgumentError(absl::StrCat("the actor system's openssl ", names[i], " is '",
                                                       absl::CHexEscape(*files[i].first), "', options.cluster's '",
                                                       absl::CHexEscape(*files[i].second), "': ", fix));
      }
    }
  }
  return absl::OkStatus();
}

// Issue 31 point 4 (deaths are logged): every connection_timeout_ms / 2
// (at least 100 ms) a worker task asks ps 0's counters (over the link its
// sessions opened; none: nothing seen this round) and logs, once each, a
// watched worker that applied and then fell silent for more than
// --connection-timeout-ms, and its return (PeerSilenceLog). The chief
// watches the other workers, a worker the chief. Stops at the end of
// training (ps 0 ended) or when the Server stops.
void WatchPeers(ServerCore* core) {
  ServerCore& c = *core;
  const int64_t silence_ms = c.options.cluster.connection_timeout_ms;
  const auto period = std::chrono::milliseconds(std::max<int64_t>(100, silence_ms / 2));
  PeerSilenceLog log(absl::StrCat("/job:worker/task:", c.task.task_index), silence_ms);
  std::vector<int> watched;
  if (c.task.is_chief()) {
    for (int w = 1; w < c.cluster.num_tasks("worker"); ++w) watched.push_back(w);
  } else {
    watched.push_back(0);
  }
  const auto start = SteadyClock::now();
  for (;;) {
    {
      MutexLock l(c.watch_mu);
      const auto until = SteadyClock::now() + period;
      while (!c.watch_stop && SteadyClock::now() < until) c.watch_cv.wait_until(l, until);
      if (c.watch_stop) return;
    }
    StatusOr<PsShardStatsMessage> stats = c.remote->PeekPs0Stats();
    if (!stats.ok()) continue;
    const int64_t now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - start).count();
    for (int w : watched) {
      const auto k = static_cast<std::size_t>(w);
      log.Observe(w, k < stats->worker_last_apply_ms.size() ? stats->worker_last_apply_ms[k] : -1, now_ms);
    }
    // Training over: this last look logged a return since the previous one.
    if (stats->ended) return;
  }
}

// Builds the system, spawns and publishes the task's actor.
Status Start(const std::shared_ptr<ServerCore>& core) {
  ServerCore& c = *core;
  const NetConfig net = NetConfigOf(c.options.cluster, c.tls);
  auto lost = std::make_shared<LostProxies>();
  auto accepted = std::make_shared<std::atomic<int64_t>>(0);
  auto answers = std::make_shared<PsAnswerTimes>(static_cast<std::size_t>(c.cluster.num_tasks("ps")));
  if (!c.borrowed) {
    FOREMAN_ASSIGN_OR_RETURN(c.owned, BuildActorSystem(2, [&net](caf::actor_system_config& config) {
                               ConfigureClusterNetwork(config, net);
                             }));
    c.system = c.owned->system.get();
  }
  // Spawned from a thread that ends at once (actor_system.hpp).
  FOREMAN_RETURN_IF_ERROR(RunOnShortLivedThread([&]() -> Status {
    if (c.is_ps) {
      PsShardOptions shard;
      shard.task_index = c.task.task_index;
      shard.optimizer = c.options.optimizer;
      shard.replicas_to_aggregate = c.options.replicas_to_aggregate;
      shard.job_id = c.job_id;
      shard.silence_ms = c.options.cluster.connection_timeout_ms;
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
      shard.on_evicted_read = [join = c.join](bool chief_read) {
        {
          MutexLock l(join->mu);
          if (!join->evicted_read) {
            join->evicted_read = true;
            join->evicted_by_chief = chief_read;
            join->evicted_read_at = SteadyClock::now() + (chief_read ? kEvictLinger : SteadyClock::duration(0));
          }
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
                                 std::shared_ptr<const PsAnswerTimes>(answers), c.job_id);
      c.watcher = c.system->spawn(ProxyWatcher, lost);
    }
    return absl::OkStatus();
  }));
  {
    ForgetSystemOnExit forget;
    FOREMAN_ASSIGN_OR_RETURN(c.published_port,
                             PublishActor(*c.system, c.served, c.bind.host, static_cast<uint16_t>(c.bind.port), c.tls));
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
    c.remote->set_job_id(c.job_id);
    c.remote->set_connect_timeout(std::chrono::milliseconds(c.options.cluster.connection_timeout_ms));
    c.remote->CountAcceptedUpdates(accepted);
    c.remote->RecordAnswers(answers);
    c.values = std::make_shared<SessionValues>();
    c.values->remote = c.remote;
    c.watch = std::thread(WatchPeers, &c);
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

// -- foreman cluster status (foreman/cluster_status.hpp) ----------------------------

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
              int64_t steps, std::vector<int64_t>& ps_last_answer_ms, std::string& job_id) {
            answered = true;
            r.cluster_job_id = std::move(job_id);
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
              r.cluster_job_id = m.job_id;
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

// The task a `cluster status` or `cluster stop` asks, checked.
struct AskedTarget {
  std::string address;  // host:port
  TaskAddress task;
  bool tls = false;
  NetConfig net;
  std::chrono::milliseconds timeout{0};
};

// `target` and the options for QueryClusterStatus / EndClusterTraining
// (`fn`, named in the timeout's error): INVALID_ARGUMENT as they document.
StatusOr<AskedTarget> CheckAskedTarget(const std::string& target, const ClusterOptions& options, int64_t timeout_ms,
                                       const char* fn) {
  AskedTarget t;
  t.tls = absl::StartsWith(target, kTlsScheme);
  if (!t.tls && !absl::StartsWith(target, kTcpScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", target, "' is not a task's address: expected tcp://HOST:PORT or tls://HOST:PORT"));
  }
  if (timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": timeout_ms (--timeout-ms) must be > 0, got ", timeout_ms));
  }
  t.address = target.substr(std::strlen(kTcpScheme));
  auto spec = ClusterSpec::Create({{"asked", {t.address}}});
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("'", target, "': ", spec.status().message()));
  }
  FOREMAN_ASSIGN_OR_RETURN(t.task, spec->task_address("asked", 0));
  const bool any_tls = !options.tls_cert.empty() || !options.tls_key.empty() || !options.tls_ca.empty();
  if (t.tls && !options.tls_enabled()) {
    return absl::InvalidArgumentError(
        absl::StrCat(target, " is a TLS address: give ClusterOptions' tls_cert, tls_key and tls_ca (--tls-cert, "
                             "--tls-key, --tls-ca: a certificate of the cluster's CA)"));
  }
  if (!t.tls && any_tls) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClusterOptions' tls_* files (--tls-*) given with the plain address ", target, ": use tls://",
                     t.address));
  }
  if (t.tls) FOREMAN_RETURN_IF_ERROR(CheckTlsFiles(options.tls_cert, options.tls_key, options.tls_ca));
  t.net = NetConfigOf(options, t.tls);
  t.timeout = std::chrono::milliseconds(std::min(timeout_ms, int64_t{86'400'000}));
  return t;
}

// QueryClusterStatus (foreman/cluster_status.hpp).
StatusOr<std::vector<ClusterTaskReport>> QueryTasks(const std::string& target, const ClusterOptions& options,
                                                    int64_t timeout_ms) {
  FOREMAN_ASSIGN_OR_RETURN(const AskedTarget t, CheckAskedTarget(target, options, timeout_ms, "QueryClusterStatus"));
  const std::string& address = t.address;
  const TaskAddress& asked = t.task;
  const bool tls = t.tls;
  const NetConfig& net = t.net;
  const std::chrono::milliseconds timeout = t.timeout;
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

// EndClusterTraining (foreman/cluster_status.hpp): the asked worker's spec
// gives the ps tasks; each is sent the end of training of the asked task's
// job, ps 0 first (its answer is the global_step the others are given, as
// Server::EndTraining does).
StatusOr<ClusterStopReport> EndTrainingOf(const std::string& target, const ClusterOptions& options,
                                          int64_t timeout_ms) {
  FOREMAN_ASSIGN_OR_RETURN(const AskedTarget t, CheckAskedTarget(target, options, timeout_ms, "EndClusterTraining"));
  std::unique_ptr<OwnedActorSystem> owned;
  FOREMAN_ASSIGN_OR_RETURN(owned, BuildActorSystem(1, [&t](caf::actor_system_config& config) {
                             ConfigureClusterNetwork(config, t.net);
                           }));
  StatusOr<ClusterStopReport> out = absl::UnknownError("EndClusterTraining: nothing asked");
  FOREMAN_RETURN_IF_ERROR(RunOnShortLivedThread([&]() -> Status {
    {
      ForgetSystemOnExit forget;
      caf::scoped_actor self{*owned->system};
      ClusterTaskReport asked;
      asked.address = t.address;
      std::string ps_hosts, worker_hosts;
      AskTask(*owned->system, self, t.task, t.tls, t.timeout, asked, &ps_hosts, &worker_hosts);
      if (!asked.reachable) {
        out = absl::UnavailableError(absl::StrCat(target, ": ", asked.error, "; nothing was ended"));
      } else if (asked.job_name == "ps") {
        out = absl::FailedPreconditionError(absl::StrCat(
            target, " is ps task ", asked.task_index, " of cluster job '", asked.cluster_job_id,
            "': give a worker's address (the chief's), which knows every ps task; nothing was ended"));
      } else if (auto cluster = ClusterSpec::FromFlags(ps_hosts, worker_hosts); !cluster.ok()) {
        out = absl::InternalError(absl::StrCat(target, " answered a spec that does not parse (",
                                               cluster.status().message(), "); nothing was ended"));
      } else {
        ClusterStopReport report;
        report.cluster_job_id = asked.cluster_job_id;
        report.ps_tasks = cluster->num_tasks("ps");
        Status failed;
        // Every ps task connected before any is ended: one that cannot be
        // reached leaves the job untouched ("nothing was ended"), and the
        // ends follow each other with no connect between them (the chief,
        // refused by ps 0, ends the others itself a moment later).
        std::vector<caf::actor> proxies;
        std::vector<std::string> where;
        for (int k = 0; k < report.ps_tasks && failed.ok(); ++k) {
          where.push_back(absl::StrCat("ps task ", k, " (", cluster->jobs().at("ps")[k], ")"));
          StatusOr<TaskAddress> a = cluster->task_address("ps", k);
          StatusOr<caf::actor> proxy = a.ok() ? ConnectActor(*owned->system, a->host, static_cast<uint16_t>(a->port),
                                                             t.tls, t.timeout)
                                              : StatusOr<caf::actor>(a.status());
          if (!proxy.ok()) {
            failed = absl::UnavailableError(absl::StrCat(where[k], ": ", proxy.status().message(),
                                                         "; nothing was ended"));
          } else {
            proxies.push_back(*proxy);
          }
        }
        for (int k = 0; k < report.ps_tasks && failed.ok(); ++k) {
          const std::string done = k == 0 ? "nothing was ended" : absl::StrCat("ps tasks 0 to ", k - 1, " ended");
          self->request(proxies[k], t.timeout, ps_end_atom::value, report.global_step, report.cluster_job_id,
                        std::string("`foreman cluster stop`"))
              .receive([&](int64_t step) { if (k == 0) report.global_step = step; },
                       [&](caf::error& e) {
                         const Status s = ErrorToStatus(e, where[k]);
                         failed = Status(s.code(), absl::StrCat(where[k], ": ", s.message(), "; ", done));
                       });
        }
        if (failed.ok()) {
          out = report;
        } else {
          out = failed;
        }
      }
    }
    owned.reset();
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace
}  // namespace internal

StatusOr<ClusterStopReport> EndClusterTraining(const std::string& target, const ClusterOptions& options,
                                               int64_t timeout_ms) {
  return internal::EndTrainingOf(target, options, timeout_ms);
}

StatusOr<std::vector<ClusterTaskReport>> QueryClusterStatus(const std::string& target, const ClusterOptions& options,
                                                            int64_t timeout_ms) {
  return internal::QueryTasks(target, options, timeout_ms);
}

std::function<std::vector<std::string>()> WorkerStepRateSummaries(const Server* server, int num_workers) {
  auto rates = std::make_shared<internal::WorkerStepRates>(
      [server] { return internal::WorkerAppliesOnPs0(*server); }, num_workers);
  return [rates] { return rates->Summaries(); };
}

// -- foreman::Server --------------------------------------------------------------------

struct Server::Impl {
  std::shared_ptr<internal::ServerCore> core;
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Stop(); }

namespace internal {
namespace {

// Both Server::Create: validates, registers and starts the task, in the
// caller's `system` or (null) a system of its own.
StatusOr<std::shared_ptr<ServerCore>> CreateServer(caf::actor_system* system, const ClusterSpec& cluster,
                                                   const ClusterTask& task, const ServerOptions& options) {
  RegisterClusterSessionTargets();
  // Everything is checked before anything listens.
  FOREMAN_RETURN_IF_ERROR(ValidateClusterOptions(cluster, task, options.cluster));
  FOREMAN_RETURN_IF_ERROR(ValidateServerOptions(options));
  if (options.cluster.tls_enabled()) {
    FOREMAN_RETURN_IF_ERROR(CheckTlsFiles(options.cluster.tls_cert, options.cluster.tls_key, options.cluster.tls_ca));
  }
  auto core = std::make_shared<ServerCore>(cluster);
  core->task = task;
  core->options = options;
  core->tls = options.cluster.tls_enabled();
  core->is_ps = task.job_name == "ps";
  core->job_id = options.cluster.job_id.empty() ? DefaultClusterJobId(cluster) : options.cluster.job_id;
  core->address = cluster.jobs().at(task.job_name)[task.task_index];
  core->target = absl::StrCat(core->tls ? kTlsScheme : kTcpScheme, core->address);
  FOREMAN_ASSIGN_OR_RETURN(core->bind, cluster.task_address(task.job_name, task.task_index));
  const std::string where = absl::StrCat("Server::Create(", system != nullptr ? "system, " : "", "/job:",
                                         task.job_name, "/task:", task.task_index, "): ");
  if (system != nullptr) {
    Status usable = CheckBorrowedSystem(*system, options.cluster, core->tls);
    if (!usable.ok()) return Status(usable.code(), absl::StrCat(where, usable.message()));
    core->system = system;
    core->borrowed = true;
  }
  {
    ServerRegistry& r = Servers();
    MutexLock l(r.mu);
    auto [it, fresh] = r.servers.emplace(core->address, core);
    if (!fresh) {
      return absl::AlreadyExistsError(absl::StrCat("a foreman::Server of this process already serves ",
                                                   it->second->target, " (/job:", it->second->task.job_name,
                                                   "/task:", it->second->task.task_index, ")"));
    }
  }
  Status started = Start(core);
  if (!started.ok()) {
    Unregister(core);
    Teardown(*core, absl::StrCat(core->target, " failed to start"));
    return Status(started.code(), absl::StrCat(where, started.message()));
  }
  {
    ServerRegistry& r = Servers();
    MutexLock l(r.mu);
    core->ready = true;
  }
  FOREMAN_LOG_INFO("Started foreman::Server /job:{}/task:{} at {} (cluster job {}{})", task.job_name,
                   task.task_index, core->target, core->job_id,
                   core->borrowed ? ", in the caller's actor system" : "");
  return core;
}

}  // namespace
}  // namespace internal

StatusOr<std::unique_ptr<Server>> Server::Create(const ClusterSpec& cluster, const ClusterTask& task,
                                                 const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  FOREMAN_ASSIGN_OR_RETURN(impl->core, internal::CreateServer(nullptr, cluster, task, options));
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

StatusOr<std::unique_ptr<Server>> Server::Create(caf::actor_system& system, const ClusterSpec& cluster,
                                                 const ClusterTask& task, const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  FOREMAN_ASSIGN_OR_RETURN(impl->core, internal::CreateServer(&system, cluster, task, options));
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Status ConfigureClusterNetwork(caf::actor_system_config& config, const ClusterOptions& options) {
  FOREMAN_RETURN_IF_ERROR(cluster_internal::ValidateNetworkOptions(options));
  const bool tls = options.tls_enabled();
  if (tls) FOREMAN_RETURN_IF_ERROR(CheckTlsFiles(options.tls_cert, options.tls_key, options.tls_ca));
  const internal::NetConfig net = internal::NetConfigOf(options, tls);
  auto ids = caf::get_or(config, "middleman.app-identifiers", caf::defaults::middleman::app_identifiers);
  internal::ConfigureClusterNetwork(config, net);
  if (std::find(ids.begin(), ids.end(), net.app_id) == ids.end()) ids.push_back(net.app_id);
  config.set("middleman.app-identifiers", std::move(ids));
  return absl::OkStatus();
}

const std::string& Server::target() const { return impl_->core->target; }
const ClusterSpec& Server::cluster() const { return impl_->core->cluster; }
const ClusterTask& Server::task() const { return impl_->core->task; }
const std::string& Server::job_id() const { return impl_->core->job_id; }

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
    if (j.evicting) {
      const auto now = internal::SteadyClock::now();
      if (j.evicted_read && now >= j.evicted_read_at) {
        FOREMAN_LOG_INFO("{}: stopping (evicted): {}; exiting", c.target,
                         j.evicted_by_chief ? "the chief read its state for a checkpoint"
                                            : "no chief is applying to it, nothing to wait for");
        return absl::OkStatus();
      }
      if (now >= j.evict_deadline) {
        FOREMAN_LOG_WARN("{}: stopping (evicted): the grace period ended {}; exiting", c.target,
                         j.evicted_read ? "just after the chief's checkpoint read"
                                        : "without a checkpoint read by the chief (it restores the latest one)");
        return absl::OkStatus();
      }
      until = std::min(until, j.evicted_read ? std::min(j.evict_deadline, j.evicted_read_at) : j.evict_deadline);
    }
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

void Server::Evict(absl::Duration grace) {
  const std::shared_ptr<internal::ServerCore> core = impl_->core;
  internal::ServerCore& c = *core;
  if (!c.is_ps) {
    Stop();
    return;
  }
  // Under stop_mu: a Stop() cannot tear the node down during the send.
  MutexLock stop_lock(c.stop_mu);
  if (c.stopped) return;
  {
    MutexLock l(c.join->mu);
    if (c.join->evicting) return;
    c.join->evicting = true;
    c.join->evict_deadline =
        internal::SteadyClock::now() +
        std::chrono::duration_cast<internal::SteadyClock::duration>(
            absl::ToChronoNanoseconds(std::clamp(grace, absl::ZeroDuration(), absl::Hours(1))));
  }
  FOREMAN_LOG_INFO("{}: stopping (evicted): refusing updates; waiting at most {} for the chief's checkpoint "
                   "(not at all when no chief is applying)",
                   c.target, absl::FormatDuration(grace));
  // Not a request: Evict may run where nothing may block (a StopRequest's
  // listener). The shard answers through on_evicted_read.
  caf::anon_send(c.served, internal::ps_evict_atom::value, c.address);
  c.join->cv.notify_all();
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
