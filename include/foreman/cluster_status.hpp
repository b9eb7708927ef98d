// What a running cluster's tasks say about themselves, asked over the
// network (`foreman cluster status`), and the explicit end of a running
// job (`foreman cluster stop`: EndClusterTraining). TF1 has no such query;
// the nearest is reading each task's logs.
//
// What each task can tell (and nothing more is reported):
//  - a ps task: its shard's counters: global_step (ps 0 holds it),
//    initialized, frozen (a checkpoint in progress), updates applied and
//    refused, and per worker task the applies it accepted and when the last
//    one arrived. A ps task does not know the cluster's other tasks.
//  - a worker task (a foreman::Server of any job but "ps"): its job,
//    task_index and address, the spec's ps and worker hosts, how many
//    updates its Server had accepted by the ps tasks (its own training
//    steps; each counted once ps 0 answered it), and how long ago it last
//    had an answer from each ps task. Asking a worker also asks every other
//    task of its spec.
//  - "last heard": CAF 0.17's heartbeats are node-level and not exposed, so
//    what is known is the application's own traffic: a worker knows when
//    each ps task last answered it (any request: reads, applies; a value or
//    the shard's own error, not a timeout or a lost link), and a ps task
//    knows when each worker's last apply arrived. Workers do not talk to
//    each other, so a worker's "last heard" is ps 0's view.
//
// Asking a port where nothing listens is not an error of the query: the
// one report says unreachable and why, naming host:port:
//
//   ```cpp
//   #include "foreman/cluster_status.hpp"
//   foreman::ClusterOptions options;  // heartbeats as the cluster's; no TLS
//   // Port 1 on loopback: nothing listens there (the connect is refused).
//   FOREMAN_ASSIGN_OR_RETURN(std::vector<foreman::ClusterTaskReport> reports,
//                            foreman::QueryClusterStatus("tcp://127.0.0.1:1", options, /*timeout_ms=*/2000));
//   const foreman::ClusterTaskReport& asked = reports.front();
//   if (asked.reachable || asked.address != "127.0.0.1:1") return absl::InternalError("unexpected answer");
//   // asked.error: why not (the connect's error, naming 127.0.0.1:1)
//   ```
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "foreman/cluster.hpp"
#include "foreman/status.hpp"

namespace foreman {

/// One task as QueryClusterStatus saw it. A value type. Times are in
/// milliseconds on the answering task's monotonic clock, measured when it
/// answered; -1 means "never" (or, for the counters, "not this kind of
/// task").
struct ClusterTaskReport {
  /// "ps" or "worker" (as the spec names the job); "" when unknown (an
  /// unreachable task asked by address).
  std::string job_name;
  /// The task's index in its job; -1 when unknown.
  int task_index = -1;
  /// "host:port" as the spec (or the asked target) writes it.
  std::string address;
  /// Whether the task answered within the timeout.
  bool reachable = false;
  /// Why not reachable: the connect's or the request's error (names
  /// host:port for a failed connect); "" when reachable.
  std::string error;
  /// The cluster job id the task serves (ClusterOptions::job_id, or the
  /// one derived from its spec); "" when unreachable.
  std::string cluster_job_id;

  // A ps task (job "ps"), from its shard's counters:
  /// The shard's global_step; -1 when the shard does not hold it (only ps 0
  /// does).
  int64_t global_step = -1;
  /// The chief has initialized or restored the shard.
  bool initialized = false;
  /// A checkpoint's consistent read holds the shard (applies wait).
  bool frozen = false;
  /// Updates applied and refused since the shard started.
  int64_t applied_updates = 0;
  int64_t refused_updates = 0;
  /// Per worker task K (index K; sized to the highest K seen + 1): the
  /// applies the shard accepted from K, and the ms since K's last apply
  /// arrived (-1: never). Both empty before the first apply.
  std::vector<int64_t> worker_applies;
  std::vector<int64_t> worker_last_apply_ms;

  // A worker task:
  /// Updates its Server had accepted by the ps tasks (its training steps);
  /// -1 for a ps task or an unreachable one.
  int64_t worker_steps = -1;
  /// Per ps task K (index K): ms since the worker last had an answer from
  /// ps K (-1: never).
  std::vector<int64_t> ps_last_answer_ms;
};

/// Asks the task at `target` ("tcp://host:port", or "tls://host:port" with
/// options' three TLS files: a certificate of the cluster's CA) what it is
/// and, when it is a worker, every other task of its cluster. Each connect
/// and each request is bounded by `timeout_ms` (> 0; at most a day is used),
/// so a call takes at most about 2 x timeout_ms per task of the spec. Uses
/// options.heartbeat_ms and connection_timeout_ms for its own node (give the
/// cluster's); options' other fields are not used.
///
/// Returns the reports: the asked task's first (reachable or not), then,
/// for a reachable worker, the spec's other tasks in spec order (ps tasks,
/// then workers). A task that answers as another task than the spec says is
/// reported unreachable with an error saying so. An unreachable task is a
/// report, not an error.
/// Errors (nothing asked): INVALID_ARGUMENT for a target that is not
/// tcp:// or tls:// plus a valid "host:port", a non-positive `timeout_ms`,
/// TLS files given with tcp:// or missing with tls://, or bad TLS files
/// (CheckTlsFiles' message).
/// Thread-safe: builds and destroys its own actor system (one thread) per
/// call. TF: none.
StatusOr<std::vector<ClusterTaskReport>> QueryClusterStatus(const std::string& target, const ClusterOptions& options,
                                                            int64_t timeout_ms);

/// What EndClusterTraining ended. A value type.
struct ClusterStopReport {
  /// The job whose training ended (the asked worker's cluster job id).
  std::string cluster_job_id;
  /// ps 0's global_step when it ended (-1: not initialized yet).
  int64_t global_step = -1;
  /// How many ps tasks ended training (all of the spec's).
  int ps_tasks = 0;
};

/// Ends the training of the running cluster job that the worker task at
/// `target` ("tcp://host:port", or "tls://..." with options' TLS files)
/// belongs to, without a signal to any task: the explicit request to end a
/// job early (`foreman cluster stop`), where a signal to the chief is only
/// its eviction. Asks the worker for its spec, connects to every ps task
/// (one unreachable: nothing is ended), then ends training on each, ps 0
/// first, as the chief's Server::EndTraining does: from then
/// on every worker's next update is OUT_OF_RANGE, so each ends its session
/// cleanly as at the end of its input, the chief after its final
/// checkpoint (every task then exits 0: a finished job). Idempotent.
/// Each connect and request is bounded by `timeout_ms` (> 0).
/// Errors: INVALID_ARGUMENT as QueryClusterStatus (nothing asked);
/// UNAVAILABLE the asked task or a ps task unreachable; FAILED_PRECONDITION
/// for a ps task's address (a ps task does not know the others) or a ps
/// task of another cluster job (its refusal, naming both ids); each naming
/// the task and saying which ps tasks had already ended ("nothing was
/// ended" when none). Thread-safe: builds and destroys its own actor system
/// (one thread) per call. TF: none (TF1's chief ends a job).
StatusOr<ClusterStopReport> EndClusterTraining(const std::string& target, const ClusterOptions& options,
                                               int64_t timeout_ms);

}  // namespace foreman
