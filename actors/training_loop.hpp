// training_job and training_loop: the actor API of design.md §4 (b).
//
//   training_job (event-based; the handle SpawnTrainingJob returns)
//   └── training_loop (blocking actor, own thread: runs the
//       MonitoredTrainingSession loop; its Runtime's service actors
//       live in the same actor system)
//
// Message protocol of training_job (public: include/foreman/actor_api.hpp):
//   start_atom                        -> spawns training_loop (once)
//   stop_atom                         -> clean stop at the next step boundary
//   status_atom                       -> (std::string state, int64_t global_step,
//                                         int64_t local_steps, std::string error)
//   down_msg from training_loop       -> training_job quits with the same reason
//   exit_msg (user_shutdown, ...)     -> abort flag; quits with that reason
//                                        once the loop is down
//
// training_loop takes no messages: it runs until the session should stop,
// polling the shared abort/stop flags at every step boundary (design.md §2:
// no message on an ordinary step), and exits with ExitReasonFromStatus(the
// session's final Status).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "foreman/actor_api.hpp"

namespace foreman::internal {

/// State shared between training_job, training_loop and the loop's hook.
struct TrainingJobShared {
  TrainingJob job;
  std::atomic<bool> stop_requested{false};  // stop_atom: clean stop
  std::atomic<bool> abort_requested{false};  // the job is exiting: CANCELLED
  std::atomic<int64_t> global_step{-1};
  std::atomic<int64_t> local_steps{0};
  std::mutex mu;
  std::string error;  // guarded by mu: the first error, rendered
};

}  // namespace foreman::internal
