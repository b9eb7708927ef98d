// The chief's EndTrainingHook (foreman/server.hpp).
#include "foreman/server.hpp"

#include "platform/log.hpp"

namespace foreman {

Status EndTrainingHook::end(Session*) {
  if (options_.stop != nullptr && options_.stop->stop_requested() && !options_.end_training_on_stop_request) {
    // A preemption of the chief: the ps tasks keep their state and take the
    // other workers' updates; a restarted chief re-attaches.
    left_running_ = true;
    FOREMAN_LOG_INFO("{}: stopped by a stop request; training goes on on the ps tasks (not ended)",
                     server_->target());
    return absl::OkStatus();
  }
  FOREMAN_ASSIGN_OR_RETURN(int64_t step, server_->EndTraining());
  final_step_ = step;
  return absl::OkStatus();
}

}  // namespace foreman
