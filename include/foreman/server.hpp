// One task of a cluster, running in this process (TF: tf.train.Server).
// A ps task holds its share of the variables and applies the workers'
// updates; a worker task gives its sessions a target (`target()`,
// "tcp://host:port" or "tls://host:port") whose variables live on the ps
// tasks: Session::Create / MonitoredTrainingSession(master = target()) read
// them there before each run and send each step's gradients there
// (StepContext::ApplyGradients). Worker 0 is the chief: it initialises or
// restores the ps tasks, writes the checkpoints and ends training
// (EndTraining); the other workers wait for it. Each process is started on
// its own, as with TF1 (cluster.md).
//
// Here both tasks run in one process (each is normally its own process,
// started with the same flags); ps_hosts and worker_hosts are TF1's
// --ps_hosts / --worker_hosts, such as "127.0.0.1:2222":
//
//   ```cpp
//   #include "foreman/server.hpp"
//   FOREMAN_ASSIGN_OR_RETURN(foreman::ClusterSpec cluster, foreman::ClusterSpec::FromFlags(ps_hosts, worker_hosts));
//   foreman::ServerOptions options;  // loopback, no TLS; options.optimizer as the workers'
//   FOREMAN_ASSIGN_OR_RETURN(auto ps, foreman::Server::Create(cluster, {"ps", 0}, options));
//   FOREMAN_ASSIGN_OR_RETURN(auto chief, foreman::Server::Create(cluster, {"worker", 0}, options));
//   // chief: MonitoredTrainingSessionOptions.master = chief->target(), is_chief = true, ...
//   FOREMAN_ASSIGN_OR_RETURN(int64_t final_step, chief->EndTraining());  // before the final checkpoint
//   FOREMAN_RETURN_IF_ERROR(ps->Join(absl::Seconds(10)));  // returns once training ended
//   if (chief->target() != "tcp://" + worker_hosts) return absl::InternalError("unexpected target");
//   ```
//
// Network: CAF's middleman (BASP over TCP) or, with TLS files, its openssl
// module (mutual TLS); heartbeats and the connection timeout from
// ServerOptions.cluster on every task. A task binds exactly the address the
// spec gives it. Thread-safety: every method may be called from any thread.
//
// Process-wide (README, "What libforeman changes in the whole process"):
// libforeman interposes OpenSSL's SSL_read, SSL_write, SSL_accept and
// SSL_connect (each clears the thread's error queue first, as OpenSSL asks
// of every caller) and CAF's basp::valid and basp::instance::handle (before
// a connection's handshake only a handshake of at most 64 KiB, after it no
// payload over the configured bound: refused before CAF allocates for it,
// for every CAF node in the process).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "foreman/cluster.hpp"
#include "foreman/hooks.hpp"
#include "foreman/nn.hpp"
#include "foreman/status.hpp"
#include "foreman/stop.hpp"

namespace caf {
class actor_system;
class actor_system_config;
}  // namespace caf

namespace foreman {

struct ServerOptions {
  /// Heartbeats, connection timeout, ps wait, TLS: the same on every task.
  ClusterOptions cluster;
  /// A ps task's: the optimizer its updates run (kind, momentum,
  /// use_nesterov, beta1, beta2, epsilon; the learning rate comes with each
  /// update). Give every task the same (the workers' flags). TF: the apply
  /// ops the workers' graph placed on the ps.
  nn::OptimizerOptions optimizer;
  /// 0: asynchronous training (TF1's default); N > 0: synchronous, as TF's
  /// SyncReplicasOptimizer(replicas_to_aggregate = N): a ps task applies
  /// the mean of N workers' gradients of one global_step (one per worker;
  /// older steps' are dropped) and answers them together. The ps tasks'
  /// value decides; give every task the same (`foreman train
  /// --replicas-to-aggregate`). A worker's apply waits for the other
  /// workers at most request_timeout_ms (then UNAVAILABLE).
  int replicas_to_aggregate = 0;
  /// A worker's: how long one read or update of a ps task may take before
  /// it is UNAVAILABLE (ms, > 0).
  int64_t request_timeout_ms = 10'000;
};

class Server {
 public:
  /// Starts task `task` of `cluster`: validates (ValidateClusterOptions,
  /// and CheckTlsFiles when TLS is on) before anything listens, builds this
  /// task's actor system with the network configured, and listens on the
  /// task's address (a ps task serves its shard there). Errors:
  ///   INVALID_ARGUMENT    a bad task, options, optimizer or TLS file
  ///                       (naming the flag and path)
  ///   UNAVAILABLE         the address cannot be bound (naming host:port)
  ///   ALREADY_EXISTS      a Server of this process already has this target
  /// A worker's target is registered for Session::Create until the Server
  /// is destroyed. Connections to the ps tasks are made on first use.
  static StatusOr<std::unique_ptr<Server>> Create(const ClusterSpec& cluster, const ClusterTask& task,
                                                  const ServerOptions& options);
  /// As above, in the caller's actor system instead of one of the
  /// Server's own: the task's actors live in `system` and it listens and
  /// connects through `system`'s middleman, as a training job of the actor
  /// API (actor_api.hpp) lives in the system it is spawned into. Build
  /// `system` from a config given to ConfigureClusterNetwork(config,
  /// options.cluster); more Servers (of any task) may share it. `system`
  /// is not owned and must outlive the Server (a system destroyed first
  /// waits in its destructor for the task's actors, which only the Server's
  /// Stop() ends: it never returns). Stop() and the destructor
  /// stop the task's actors and close its listening port (the port is free
  /// again for a new Server); `system` keeps running, and the connections
  /// this task made stay open until `system` ends (CAF 0.17 cannot close
  /// one: the peers see heartbeats, no messages). Errors: those above, and
  ///   INVALID_ARGUMENT    `system` was not configured for
  ///                       options.cluster: no middleman, no openssl
  ///                       manager for TLS, another heartbeat interval,
  ///                       connection timeout or TLS file, no "foreman"
  ///                       application id (naming the setting)
  /// Thread-safe; call from outside an actor of `system` (it waits for
  /// the middleman). Call Stop() and the destructor of such a Server from
  /// outside an actor of `system` too: they wait for the task's actors,
  /// which need a scheduler thread of `system` (called from an actor of a
  /// one-thread scheduler, they never return).
  static StatusOr<std::unique_ptr<Server>> Create(caf::actor_system& system, const ClusterSpec& cluster,
                                                  const ClusterTask& task, const ServerOptions& options);
  /// Stops serving (as Stop()) and unregisters the target. Sessions still
  /// open on the target fail their next run with UNAVAILABLE.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// "tcp://host:port" (or "tls://host:port" with TLS): this task's
  /// address, the master of its sessions (TF: server.target).
  const std::string& target() const;
  const ClusterSpec& cluster() const;
  const ClusterTask& task() const;
  /// The cluster job id this task serves: ClusterOptions::job_id, or
  /// DefaultClusterJobId(cluster()) when that is empty. Fixed for the
  /// Server's life; thread-safe. TF: none.
  const std::string& job_id() const;

  /// The chief (worker 0) only, at the end of training, before its final
  /// checkpoint (cluster.md rule 7): every ps task stops accepting updates
  /// (later applies are answered OUT_OF_RANGE, so each worker's run ends
  /// cleanly) but still serves reads, so the final checkpoint holds every
  /// update that was accepted. Returns ps 0's final global_step (-1 when
  /// ps 0 was never initialized). Applies held by a checkpoint's freeze or
  /// waiting for a synchronous update are answered OUT_OF_RANGE too. Final:
  /// a ps task never takes updates again (a new training job starts new ps
  /// tasks, as with TF1).
  /// FAILED_PRECONDITION on a task other than the chief; UNAVAILABLE naming
  /// a ps task that cannot be reached (the others are ended).
  StatusOr<int64_t> EndTraining();

  /// A ps task: blocks until training has ended (the chief's EndTraining)
  /// and the cluster is done with it (no request — a refused update, the
  /// chief's reads for its final checkpoint and evaluation — for
  /// connection_timeout_ms, at most 10 x that after the end), or until
  /// Stop(); OK then.
  /// DEADLINE_EXCEEDED when `timeout` passes first. On a worker task:
  /// until Stop() or `timeout`. TF: server.join(), bounded. Stop() from
  /// another thread ends a Join in progress; destroying the Server during
  /// a Join is not allowed.
  Status Join(absl::Duration timeout);

  /// A ps task evicted (a SIGTERM, as Kubernetes evicts a pod): from now
  /// on the task refuses every update with UNAVAILABLE "ps task K
  /// (host:port) is stopping (evicted): ..." and still serves
  /// reads, so that the chief takes a checkpoint of every ps task; a
  /// Join() in progress (or a later one) returns OK once the chief's
  /// consistent read of this task ended (plus 200 ms for its answer to
  /// leave), at once when the chief (worker 0) applied nothing within
  /// connection_timeout_ms, or when `grace` (clamped to [0, 1 h]) has
  /// passed, whichever comes first. It does not stop the Server (Stop()
  /// or the destructor does). Never blocks (one local message: fine in a
  /// StopRequest listener). Idempotent; a no-op once stopped. On a worker
  /// task it is Stop(). TF: none (a TF1 ps killed by a signal loses its
  /// variables).
  void Evict(absl::Duration grace);

  /// Stops listening and serving; Join() returns. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Prepares `config` for an actor system that runs foreman::Servers
/// (Server::Create(system, ...)) with `options` (the ServerOptions.cluster
/// they will be given): loads CAF's middleman (and, with TLS files, its
/// openssl manager, with those files), sets middleman.heartbeat-interval
/// and middleman.connection-timeout, scheduler.policy "sharing" (idle
/// scheduler threads wait instead of polling), adds the application id
/// "foreman", which every task's handshake must show, to
/// middleman.app-identifiers (keeping the application's own), and
/// registers what ConfigureActorSystem (actor_api.hpp) registers. Call
/// before the caf::actor_system is built from `config`.
/// INVALID_ARGUMENT, with `config` untouched, for options the Server would
/// refuse (heartbeat_ms, connection_timeout_ms, ps_wait_secs, the TLS files
/// all or none, a TLS file that cannot be read or a key that does not
/// match its certificate: CAF would abort the process on one). Not
/// thread-safe on one config. For example, a ps task and the chief sharing
/// the application's system:
///
///   ```cpp
///   #include <caf/all.hpp>
///   #include "foreman/server.hpp"
///   FOREMAN_ASSIGN_OR_RETURN(foreman::ClusterSpec cluster, foreman::ClusterSpec::FromFlags(ps_hosts, worker_hosts));
///   foreman::ServerOptions options;
///   caf::actor_system_config config;
///   FOREMAN_RETURN_IF_ERROR(foreman::ConfigureClusterNetwork(config, options.cluster));
///   caf::actor_system system{config};
///   {
///     FOREMAN_ASSIGN_OR_RETURN(auto ps, foreman::Server::Create(system, cluster, {"ps", 0}, options));
///     FOREMAN_ASSIGN_OR_RETURN(auto chief, foreman::Server::Create(system, cluster, {"worker", 0}, options));
///     // chief->target() is a session's master, as with Server::Create(cluster, ...)
///     FOREMAN_ASSIGN_OR_RETURN(int64_t final_step, chief->EndTraining());
///     if (final_step != -1) return absl::InternalError("nothing initialized the ps task");
///   }  // both Servers stop; `system` runs on
///   ```
Status ConfigureClusterNetwork(caf::actor_system_config& config, const ClusterOptions& options);

/// What EndTrainingHook does at the end of a session.
struct EndTrainingHookOptions {
  /// The run's StopRequest (the one given to the session as
  /// RuntimeOptions::stop). A session that ends while it holds a request
  /// (a signal, an eviction, MonitoredSession::request_stop) was stopped
  /// from outside; one that ends without (a hook's ctx.request_stop(), as
  /// StopAtStepHook's at its last_step; OUT_OF_RANGE at the end of the
  /// input) reached the end of training. Null: every end is the end of
  /// training.
  std::shared_ptr<const StopRequest> stop;
  /// false (the default): a stop request is a preemption of the chief, not
  /// the end of the job: end() leaves training running on the ps tasks (the
  /// CheckpointSaverHook still takes the final checkpoint, consistent across
  /// the ps tasks), the other workers train on, and a chief started again
  /// re-attaches to the ps tasks (cluster.md rule 5), as after a crash.
  /// true: a stop request ends training as the end of training does (the
  /// owner asked for the whole job to end, e.g. `foreman cluster local`'s
  /// Ctrl-C). TF1 had no such choice: its chief ended by a signal simply
  /// exited, and its workers trained on until their own last step.
  bool end_training_on_stop_request = false;
};

/// The chief's hook that ends training on the ps tasks (cluster.md rule 7).
/// Place it first among the chief's chief_only_hooks:
/// MonitoredTrainingSession runs the chief-only hooks' end() before the
/// CheckpointSaverHook's, so when end() calls server->EndTraining() the
/// final checkpoint holds every update the ps tasks accepted, and the
/// other workers' next updates end their runs with OUT_OF_RANGE. At a stop
/// request, EndTrainingHookOptions::end_training_on_stop_request decides
/// (default: training goes on). end() returns EndTraining's error
/// (UNAVAILABLE naming a ps task). `server` (the chief's) is not owned and
/// outlives the session. Training thread only; read the accessors after
/// the session's close().
class EndTrainingHook : public SessionRunHook {
 public:
  explicit EndTrainingHook(Server* server, EndTrainingHookOptions options = {})
      : server_(server), options_(std::move(options)) {}
  std::string name() const override { return "EndTrainingHook"; }
  Status end(Session* session) override;

  /// ps 0's global_step when end() ended training; nullopt before end(),
  /// or when end() left training running.
  const std::optional<int64_t>& final_step() const { return final_step_; }
  /// Whether end() ran and left training running (a stop request, with
  /// end_training_on_stop_request false): the chief was preempted.
  bool left_training_running() const { return left_running_; }

 private:
  Server* const server_;
  const EndTrainingHookOptions options_;
  std::optional<int64_t> final_step_;
  bool left_running_ = false;
};

/// The chief's per-worker steps/s summaries (TF1 has none: each TF1
/// worker's StepCounterHook writes only the cluster's "global_step/sec"). Returns a function to call at the
/// summary cadence (e.g. from the step that answers the "summaries" fetch);
/// each call reads ps 0's per-worker apply counts through `server` (one
/// request, bounded by ServerOptions::request_timeout_ms) and returns one
/// serialized Summary proto per worker task K in [0, num_workers) (smaller
/// than 1: taken as 1), a scalar with tag "steps_per_sec/worker_K": the
/// applies ps 0 accepted from worker K per second (monotonic clock) since
/// the previous call. In asynchronous training they sum to about
/// global_step/sec; in synchronous training to replicas_to_aggregate times
/// it. The first call, and the first after a failed read, only primes and
/// returns none; a failed read (UNAVAILABLE naming ps 0, or `server` not a
/// running worker task's) returns none and logs a WARNING (the first 5
/// times, then DEBUG). `server` (not null, not owned: a worker task's,
/// normally the chief's) must outlive the function. The function is not
/// thread-safe (call it from one thread, the chief's training thread).
std::function<std::vector<std::string>()> WorkerStepRateSummaries(const Server* server, int num_workers);

}  // namespace foreman
