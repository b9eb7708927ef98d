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
//    status` (QueryClusterStatus, cluster_status.hpp);
//  - a worker task: a PsRemoteValues (below), and the SessionValues that
//    every session of its target shares (`remote` set to it), registered
//    under its target until the Server stops.
//
// PsRemoteValues (RemoteValues over the ps shards): Bind places the names
// with PlaceVariablesOnPs; each ps task is connected on first use with
// ConnectActor (bounded by request_timeout_ms), its proxy monitored by a
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
// After the Server stops, every call is UNAVAILABLE naming the target.
#pragma once

#include <memory>

#include "foreman/server.hpp"
#include "runtime/remote_values.hpp"

namespace foreman::internal {

/// The RemoteValues of `server`'s target (what Session::Create(target())
/// gets in SessionValues::remote); null for a ps task or a stopped Server.
/// Tests drive it directly. Thread-safe.
std::shared_ptr<RemoteValues> ServerRemoteValues(const Server& server);

/// Registers the "tcp://" and "tls://" session targets (idempotent; done
/// by the first Server::Create, so that before it they are unknown schemes,
/// UNIMPLEMENTED). Thread-safe.
void RegisterClusterSessionTargets();

}  // namespace foreman::internal
