// Runtime: the supervision tree of one MonitoredSession / Supervisor, behind
// a CAF-free facade (design.md §1, §4). Implemented in actors/ (the only
// translation units that include CAF).
//
//   session_supervisor            root; monitors every child
//   ├── coordinator               forwards service failures to the session's Coordinator
//   ├── checkpoint_saver          one per checkpoint directory (holds its lock)
//   ├── summary_writer            one per logdir (TF's FileWriterCache)
//   ├── step_counter              one per output_dir
//   └── input_pipeline            one per NewInputPipeline (its producer)
//
// A child that fails (returns an error, throws, or dies) is handled by the
// session's RestartPolicy (RuntimeOptions::restart; OTP's supervisor, see
// actors/session_supervisor.hpp): restarted behind its stable address
// (ChildLink), or removed. Under TF's default policy, or once the restart
// intensity is exceeded, it is reported to the failure_sink actor as a Status
// (first error wins); the session sees should_stop() and ends with that
// error. Create() returns INVALID_ARGUMENT for a policy that
// ValidateRestartPolicy refuses.
#pragma once

#include <memory>

#include "absl/time/time.h"
#include "foreman/monitored_session.hpp"
#include "foreman/session.hpp"
#include "foreman/status.hpp"
#include "runtime/services.hpp"

namespace caf {
class actor_system;
}

namespace foreman::internal {

class Runtime : public Services {
 public:
  /// Spawns the tree into options.actor_system, or, when it is nullptr, into
  /// the process's actor system (actors/actor_system.hpp; created with
  /// config.actor_threads scheduler threads when no one holds it). A
  /// checkpoint saver for options.held_lock_directory uses options.held_lock
  /// instead of locking the directory again.
  static StatusOr<std::unique_ptr<Runtime>> Create(const RuntimeOptions& options, const SessionConfig& config);
  /// The same with only an actor system (nullptr: the process's).
  static StatusOr<std::unique_ptr<Runtime>> Create(caf::actor_system* system, const SessionConfig& config) {
    RuntimeOptions options;
    options.actor_system = system;
    return Create(options, config);
  }

  /// Stops the tree in order: waits for pending saves and for the step
  /// counters' last records, flushes and closes every summary writer, stops
  /// every actor (the failure_sink last) and waits until they are gone;
  /// bounded by `timeout` (real time; DEADLINE_EXCEEDED naming what did not
  /// stop). Returns the first service error (error()) if any. Idempotent:
  /// later calls return the first result. The destructor calls it when
  /// nobody did (errors logged).
  ///
  /// Afterwards every service object, including those hooks still hold, has
  /// dropped its actor handle (no handle may outlive the actor system):
  /// their sends are dropped, Flush() and StartSave() return UNAVAILABLE,
  /// and new services are FAILED_PRECONDITION. When an actor did not stop in
  /// time (a save stuck in the file system), an owned actor system is
  /// kept alive (never destroyed), since ~actor_system would wait for it
  /// forever; a caller's system then waits in its own destructor.
  virtual Status Shutdown(absl::Duration timeout) = 0;
};

}  // namespace foreman::internal
