// The process's one caf::actor_system: where every actor Foreman spawns
// lives, unless the caller brought a system of its own (the actor API,
// RuntimeOptions::actor_system, InputPipelineOptions::actor_system). This is
// the only place in Foreman that constructs a caf::actor_system.
//
// The system is created on first use and destroyed when its last user lets
// go (a MonitoredSession's Runtime, an InputPipeline), so a process that is
// done training has no CAF threads left. Users that live at the same time
// share it: `foreman train` runs its input pipeline and its session's
// services on one scheduler.
//
// Every thread the system starts (scheduler workers, detached actors) is
// named "fm-caf<N>", N being the system's serial number in this process
// (1, 2, ... as systems come and go), so `ps -T` / /proc/<pid>/task/*/comm
// show which system a thread belongs to. Foreman's error category is
// registered, so system.render(err) prints a Status' code and message.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "foreman/status.hpp"

namespace caf {
class actor_system;
class actor_system_config;
}  // namespace caf

namespace foreman::internal {

/// A reference on the process's actor system; the system lives while any
/// reference does. Thread-safe.
using ActorSystemRef = std::shared_ptr<caf::actor_system>;

/// Returns the process's actor system, creating it when no reference is
/// alive. `scheduler_threads` (> 0) sizes a system created by this call
/// (0: 2 threads); a system that already exists is shared as it is.
/// INTERNAL when CAF cannot start it. Thread-safe.
StatusOr<ActorSystemRef> AcquireProcessActorSystem(int scheduler_threads);

/// Called when an actor of `ref` could not be stopped: the system must not
/// be destroyed (its destructor would wait for that actor forever), so this
/// reference is kept until the process ends.
void LeakActorSystem(ActorSystemRef ref);

/// How many actor systems this process has created so far (tests).
int64_t ActorSystemsCreated();

/// A caf::actor_system and its config, destroyed together (system first:
/// the config must outlive it). Destroy it on a thread that made no
/// scoped_actor of it that is still alive (RunOnShortLivedThread).
struct OwnedActorSystem {
  std::unique_ptr<caf::actor_system_config> config;
  std::unique_ptr<caf::actor_system> system;
  OwnedActorSystem() = default;
  OwnedActorSystem(const OwnedActorSystem&) = delete;
  OwnedActorSystem& operator=(const OwnedActorSystem&) = delete;
  ~OwnedActorSystem();
};

/// Builds a system of its own (not the process's; a cluster task's
/// foreman::Server), on a short-lived thread: a config with
/// ConfigureActorSystemConfig, the thread names "fm-caf<N>" and
/// scheduler.max-threads = `scheduler_threads` (0: 2), then `configure`
/// (may be empty; e.g. ConfigureClusterNetwork) before the system is
/// constructed. INVALID_ARGUMENT for threads < 0. Thread-safe.
StatusOr<std::unique_ptr<OwnedActorSystem>> BuildActorSystem(
    int scheduler_threads, const std::function<void(caf::actor_system_config&)>& configure);

/// Registers what Foreman needs in a caf::actor_system_config before the
/// system is built: the "foreman" error category's renderer and the thread
/// naming hook. Safe to call more than once on one config.
void ConfigureActorSystemConfig(caf::actor_system_config& config);

/// Runs `fn` on a short-lived thread and waits for it. CAF 0.17 keeps a
/// reference to a system's logger in the thread-local storage of any thread
/// that builds a system or spawns an actor from outside an actor, and
/// ~actor_system waits until that reference is gone; doing either on a
/// thread that ends at once lets the system be destroyed on any thread.
Status RunOnShortLivedThread(const std::function<Status()>& fn);

}  // namespace foreman::internal
