// failure_sink actor: where the tree's failures arrive (design.md §1).
//
// Protocol (fire-and-forget; no replies):
//   (report_atom, std::string source, StatusMessage status)
//       A service (`source`, e.g. "summary_writer(/logs)") failed. The first
//       non-OK status is kept (sticky across sessions: FailureCell::error())
//       and passed to the current session's foreman::Coordinator with
//       request_stop(status), which the training loop reads every step. OK
//       statuses are ignored. Every report is logged at ERROR once.
//   (flush_atom, std::shared_ptr<Completion> done)
//       Completes `done` (OK): every report sent before has been taken (the
//       session_supervisor's answer to an injected kill, ServiceFaults::Kill).
//
// The state lives in a FailureCell shared with the Runtime: the training
// thread sets the session's Coordinator (Services::SetCoordinator) and reads
// the first error there without a message round trip (design.md §2).
// Spawned on the shared scheduler (it never blocks: request_stop only takes
// the Coordinator's mutex).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "atoms.hpp"
#include "messages.hpp"
#include "foreman/mutex.hpp"
#include "foreman/coordinator.hpp"
#include "foreman/status.hpp"
#include "status_error.hpp"

namespace foreman::internal {

/// The first service error and the session's Coordinator. Thread-safe.
class FailureCell {
 public:
  /// The Coordinator of the current session (nullptr between sessions).
  /// When an error was reported before, `coord` is stopped with it at once:
  /// a failed service stays failed for every later session.
  void SetCoordinator(Coordinator* coord);
  /// Records `status` (first non-OK wins) and passes it to the current
  /// Coordinator. Returns whether it was the first.
  bool Report(const std::string& source, const Status& status);
  /// The first reported error; OK when none.
  Status error();

 private:
  // Held across request_stop(), so that SetCoordinator(nullptr) returns only
  // when no report still uses the old Coordinator (the session may then
  // destroy it).
  Mutex mu_;
  Coordinator* coord_ ABSL_GUARDED_BY(mu_) = nullptr;
  Status first_error_ ABSL_GUARDED_BY(mu_);
};

/// Spawns the failure_sink actor as a child of `parent` (the
/// session_supervisor), on the shared scheduler.
caf::actor SpawnFailureSink(caf::local_actor* parent, std::shared_ptr<FailureCell> cell);

}  // namespace foreman::internal
