// What `foreman cluster status` asks a cluster's tasks over the network
// (issue 13, point 6). Internal, CAF-free: tools/foreman/cluster.cpp
// includes it; actors/cluster_server.cpp implements it.
//
// What each task can tell (and nothing more is printed):
//  - a ps task: its shard's counters (ps_stats_atom -> PsShardStatsMessage):
//    global_step (ps 0 holds it), initialized, frozen (a checkpoint in
//    progress), updates applied and refused. A ps does not know the
//    cluster's other tasks.
//  - a worker task: the small "cluster task" actor published on its address
//    answers (caf::get_atom) with its job, task_index, address, the spec's
//    ps and worker hosts, and how many updates its Server had accepted by
//    the ps tasks (its own training steps; each is counted once ps 0
//    answered it), and how long ago it last had an answer from each ps
//    task. Asking a worker also asks every other task of its spec.
//  - "last heard": CAF 0.17's BASP heartbeats are node-level and not
//    exposed, so what is known is the application's own traffic: a worker
//    knows when each ps task last answered it (any request: reads, applies;
//    a value or the shard's own error, not a timeout or a lost link), and a
//    ps task knows when each worker's last apply arrived. Workers do not
//    talk to each other, so a worker's "last heard" is ps 0's view.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "foreman/cluster.hpp"
#include "foreman/server.hpp"
#include "foreman/status.hpp"

namespace foreman::internal {

/// One task as `foreman cluster status` saw it.
struct ClusterTaskReport {
  std::string job_name;  // "ps" or "worker"; as the spec names it ("" if unknown)
  int task_index = -1;   // -1 if unknown (an unreachable task asked by address)
  std::string address;   // "host:port"
  bool reachable = false;
  std::string error;     // why not reachable (the connect's or request's error)
  // A ps task (job "ps"), from its shard's stats:
  int64_t global_step = -1;  // -1: the shard does not hold global_step
  bool initialized = false;
  bool frozen = false;
  int64_t applied_updates = 0;
  int64_t refused_updates = 0;
  // A ps task, per worker task K (index K; sized to the highest K seen + 1):
  // the applies it accepted from K and the ms since K's last apply arrived
  // (-1: never). Empty before the first apply.
  std::vector<int64_t> worker_applies;
  std::vector<int64_t> worker_last_apply_ms;
  // A worker task: updates its Server had accepted by the ps tasks.
  int64_t worker_steps = -1;
  // A worker task, per ps task K: ms since it last had an answer from ps K
  // (-1: never).
  std::vector<int64_t> ps_last_answer_ms;
};

/// Asks the task at `target` ("tcp://host:port" or "tls://host:port"; the
/// latter needs options' three TLS files, the former none) what it is and,
/// for a worker, every task of its cluster. Each connect and each request
/// is bounded by `timeout_ms` (> 0). The first report is the asked task's
/// (reachable or not); the others follow in spec order (ps tasks, then
/// workers). Uses options.heartbeat_ms / connection_timeout_ms for its own
/// node. Errors (nothing asked): INVALID_ARGUMENT for a bad target, a
/// non-positive timeout, TLS files with tcp:// or none with tls://, or bad
/// TLS files (CheckTlsFiles). Thread-safe; builds and destroys its own
/// actor system.
StatusOr<std::vector<ClusterTaskReport>> QueryClusterStatus(const std::string& target, const ClusterOptions& options,
                                                            int64_t timeout_ms);

/// The chief's per-worker step counts (TF: none; Foreman's
/// steps_per_sec/worker_K summaries, tools/foreman/cluster_task.hpp): per
/// worker task K (index K), the applies ps 0 accepted from it since ps 0
/// started (PsShardStatsMessage::worker_applies; every worker's every step
/// reaches ps 0, which holds global_step). Sized to the highest worker index
/// ps 0 has seen + 1; empty before any apply. One request to ps 0, bounded
/// by the Server's request_timeout_ms. FAILED_PRECONDITION when `server` is
/// not a running worker task's; else PsRemoteValues' errors (UNAVAILABLE
/// naming ps 0 when it cannot be reached). Thread-safe.
StatusOr<std::vector<int64_t>> WorkerAppliesOnPs0(const Server& server);

}  // namespace foreman::internal
