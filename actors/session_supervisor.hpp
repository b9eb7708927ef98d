// session_supervisor actor: the root of one session's supervision tree
// (design.md §1). It spawns the coordinator at start and every service
// child on request, links and monitors them, and turns a child's abnormal
// exit into a Status for the coordinator. Runtime::Create (the Runtime
// facade, runtime.hpp) is implemented next to it, in session_supervisor.cpp.
//
// Protocol:
//   (spawn_atom, ChildSpec spec, std::shared_ptr<SpawnReply> reply)
//       Calls spec.spawn(self, coordinator), links and monitors the child,
//       stores its handle in reply->actor and completes reply->done (an
//       error when the factory threw).
//   down_msg from a child
//       A normal exit is forgotten. Any other exit reason (an error the
//       child quit with, an exception it threw, a kill) becomes a Status
//       (ErrorToStatus, e.g. INTERNAL "summary_writer(/logs) stopped: ...")
//       that goes to the coordinator as (report_atom, child name, status) --
//       or straight into the FailureCell when the coordinator itself died.
//       No restarts (TF has none; a later issue adds restart policies).
//   exit_msg not from a child (the Runtime's anon_send_exit, user_shutdown)
//       Ordered shutdown, last stage: sends user_shutdown to every child,
//       then quits normally once every child is down. (The Runtime has
//       already waited for pending saves and closed the summary writers.)
//       Exits the children cause by shutting down are not reported.
// When the supervisor itself dies abnormally, its links take the children
// down with it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "atoms.hpp"
#include "coordinator.hpp"

namespace foreman::internal {

/// How to start one child: `spawn` runs on the supervisor and returns the
/// new actor (spawned from `parent`); `coordinator` is where it reports.
struct ChildSpec {
  std::string name;
  std::function<caf::actor(caf::local_actor* parent, const caf::actor& coordinator)> spawn;
};

/// The supervisor's answer to a spawn request.
struct SpawnReply {
  std::shared_ptr<Completion> done = std::make_shared<Completion>();
  caf::actor actor;  // written before done completes
};

/// Spawns the root (on the shared scheduler: it never blocks).
caf::actor SpawnSessionSupervisor(caf::actor_system& system, std::shared_ptr<FailureCell> cell);

}  // namespace foreman::internal

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(foreman::internal::ChildSpec)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<foreman::internal::SpawnReply>)
