// session_supervisor actor: the root of one session's supervision tree
// (design.md §1). It spawns the failure_sink at start and every service
// child on request, links and monitors them, and turns a child's abnormal
// exit into a Status for the failure_sink. Runtime::Create (the Runtime
// facade, runtime.hpp) is implemented next to it, in session_supervisor.cpp.
//
// Protocol:
//   (spawn_atom, ChildSpec spec, std::shared_ptr<SpawnReply> reply)
//       Calls spec.spawn(self, failure_sink), links and monitors the child,
//       stores its handle in reply->actor and completes reply->done (an
//       error when the factory threw).
//   down_msg from a child
//       Under TF's default RestartPolicy: a normal exit is forgotten. Any
//       other exit reason (an error the child quit with, an exception it
//       threw, a kill) becomes a Status (ErrorToStatus, e.g. INTERNAL
//       "summary_writer(/logs) stopped: ...") that goes to the failure_sink as
//       (report_atom, child name, status) -- or straight into the
//       FailureCell when the failure_sink itself died. (Escalation.)
//       Under another policy (restart_policy.hpp, OTP's supervisor): a
//       service whose restart type says so (permanent: always; transient:
//       after an abnormal exit; temporary: never) is restarted with the
//       services its strategy names (one_for_one: itself; one_for_all:
//       every service; rest_for_one: itself and those started after it; the
//       others are stopped with user_shutdown first), after its back-off
//       (a real-time CAF timer), through its ChildLink (ChildLink::Rebind:
//       the same address for its users). Each restart is recorded in the
//       RestartLog and logged as a WARNING (with the events a summary writer
//       lost, or the steps of the saves a checkpoint saver lost:
//       ChildLink::TakeLostSaves). When a restart would exceed the intensity
//       (max_restarts within period, on the session's Clock) the failure
//       escalates as above, with the child's own Status, and its link is
//       marked failed (ChildLink::MarkFailed: requests parked for a next
//       incarnation fail). A service that is not restarted is removed
//       (logged, recorded with restarted = false, ChildLink::MarkRemoved).
//       A child whose ChildLink was retired by its owner (an input pipeline
//       destroyed while the session runs) is forgotten: no report, no
//       restart.
//   (kill_atom, std::string name, caf::error reason, std::shared_ptr<Completion> done)
//       An injected actor fault (ServiceFaults::Kill): sends (kill_atom,
//       reason) to the running service `name` and completes `done` once its
//       exit is handled as above -- escalated (after the failure_sink has
//       taken the report: a flush_atom sent behind it), removed, forgotten,
//       restarted (no back-off), or a restart scheduled (with a back-off:
//       not after it) -- or the tree shuts down. When
//       `name` is not running, `done` completes at once.
//   (restart_atom, uint64_t id)                                  to itself
//       A back-off is over: restart that group once every member is down.
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
#include <vector>

#include "atoms.hpp"
#include "child_link.hpp"
#include "failure_sink.hpp"
#include "foreman/clock.hpp"
#include "foreman/restart_policy.hpp"

namespace foreman::internal {

/// How to start one child: `spawn` runs on the supervisor and returns the
/// new actor (spawned from `parent`); `failure_sink` is where it reports.
/// A restart calls `spawn` again (on the supervisor).
struct ChildSpec {
  std::string name;
  std::function<caf::actor(caf::local_actor* parent, const caf::actor& failure_sink)> spawn;
  /// The service kind the policy names ("summary_writer", ...); empty: the
  /// name up to its first '('.
  std::string kind;
  /// The service's stable address: the supervisor attaches every
  /// incarnation to it (may be null: nothing to rebind).
  std::shared_ptr<ChildLink> link;
  /// Called on the supervisor before a restart (`restart` true) or when the
  /// service is removed: fills in what the old incarnation lost (a summary
  /// writer's events). May be empty.
  std::function<void(ServiceRestart* record, bool restart)> on_exit;
  /// Called on the supervisor once a restarted incarnation is bound to
  /// `link` (a summary writer is sent a drain there: what was queued while
  /// no incarnation could be asked). May be empty.
  std::function<void(const caf::actor& actor)> on_restarted;
  /// Called on the supervisor when the service is down for good without
  /// being removed: TF's default policy (an error escalates, a normal exit
  /// is forgotten), the restart intensity exceeded, or a restart that failed
  /// to spawn. `reason`: its exit status (OK: a normal exit) or the spawn's
  /// error. May be empty.
  std::function<void(const Status& reason)> on_stopped;
};

/// The supervisor's answer to a spawn request.
struct SpawnReply {
  std::shared_ptr<Completion> done = std::make_shared<Completion>();
  caf::actor actor;  // written before done completes
};

/// Every restart and removal, in order (the Runtime's restarts()).
/// Thread-safe.
class RestartLog {
 public:
  void Add(ServiceRestart r) {
    MutexLock l(mu_);
    records_.push_back(std::move(r));
  }
  std::vector<ServiceRestart> Get() {
    MutexLock l(mu_);
    return records_;
  }

 private:
  Mutex mu_;
  std::vector<ServiceRestart> records_ ABSL_GUARDED_BY(mu_);
};

/// What the supervisor applies to its services (TF's default: none).
struct SupervisorOptions {
  RestartPolicy policy;
  Clock* clock = Clock::Real();  // measures the intensity's period
  std::shared_ptr<RestartLog> log = std::make_shared<RestartLog>();
};

/// Spawns the root (on the shared scheduler: it never blocks); without
/// options, with TF's default policy.
caf::actor SpawnSessionSupervisor(caf::actor_system& system, std::shared_ptr<FailureCell> cell,
                                  const SupervisorOptions& options);
caf::actor SpawnSessionSupervisor(caf::actor_system& system, std::shared_ptr<FailureCell> cell);

}  // namespace foreman::internal

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(foreman::internal::ChildSpec)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<foreman::internal::SpawnReply>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const foreman::internal::SupervisorOptions>)
