// foreman::Server (include/foreman/server.hpp) over CAF, and the tcp:// and
// tls:// session targets (issue 13): one translation unit,
// actors/cluster_server.cpp. What a Server is made of:
//
//  - its own caf::actor_system, configured by ConfigureClusterNetwork from
//    ServerOptions.cluster (heartbeats, connection timeout, TLS), built and
//    destroyed on short-lived threads (actor_system.hpp);
//  - a ps task: its shard (ps_shard.hpp) published on exactly its address;
//    a worker task (any job other than "ps"): a small "cluster task" actor
//    published on its address, answering (caf::ping_atom) with
//    (caf::pong_atom, job_name, task_index, "host:port") (the port is held),
//    and (caf::get_atom) with (job_name, task_index, "host:port", ps_hosts,
//    worker_hosts, int64 updates accepted, std::vector<int64_t> ms since
//    the last answer from each ps task, -1: never) for `foreman cluster
//    status` (QueryClusterStatus, foreman/cluster_status.hpp);
//  - a worker task: a PsRemoteValues (ps_remote_values.hpp), and the SessionValues that
//    every session of its target shares (`remote` set to it), registered
//    under its target until the Server stops.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "foreman/server.hpp"
#include "cluster/remote_values.hpp"

namespace foreman::internal {

/// The RemoteValues of `server`'s target (what Session::Create(target())
/// gets in SessionValues::remote); null for a ps task or a stopped Server.
/// Tests drive it directly. Thread-safe.
std::shared_ptr<RemoteValues> ServerRemoteValues(const Server& server);

/// The chief's per-worker step counts (foreman::WorkerStepRateSummaries):
/// per worker task K (index K), the applies ps 0 accepted from it since
/// ps 0 started (PsShardStatsMessage::worker_applies; every worker's every
/// step reaches ps 0, which holds global_step). Sized to the highest worker
/// index ps 0 has seen + 1; empty before any apply. One request to ps 0,
/// bounded by the Server's request_timeout_ms. FAILED_PRECONDITION when
/// `server` is not a running worker task's; else PsRemoteValues' errors
/// (UNAVAILABLE naming ps 0 when it cannot be reached). Thread-safe.
StatusOr<std::vector<int64_t>> WorkerAppliesOnPs0(const Server& server);

/// Registers the "tcp://" and "tls://" session targets (idempotent; done
/// by the first Server::Create, so that before it they are unknown schemes,
/// UNIMPLEMENTED). Thread-safe.
void RegisterClusterSessionTargets();

}  // namespace foreman::internal
