// training_job / training_loop actors and the Status <-> caf::error mapping
// (see training_loop.hpp for the protocol).
#include "actors/training_loop.hpp"

#include <caf/all.hpp>

#include <memory>
#include <utility>

#include "actors/actor_system.hpp"
#include "actors/atoms.hpp"
#include "platform/log.hpp"

namespace foreman {
namespace {

// Publishes progress and hands the job's fetches to on_results in after_run,
// so an on_results error ends training exactly as a hook error does (no
// end()). Stops do not pass through here: stop_atom and the job's exit call
// MonitoredSession::request_stop() directly (TrainingJobShared::RequestStop).
class JobProgressHook : public SessionRunHook {
 public:
  explicit JobProgressHook(std::shared_ptr<internal::TrainingJobShared> shared) : shared_(std::move(shared)) {}
  std::string name() const override { return "TrainingJobProgressHook"; }
  Status after_create_session(Session* session, Coordinator* /*coord*/) override {
    StatusOr<int64_t> step = session->GlobalStep();
    if (step.ok()) shared_->global_step.store(*step);
    return absl::OkStatus();
  }
  StatusOr<SessionRunArgs> before_run(SessionRunContext& /*ctx*/) override {
    SessionRunArgs args;
    args.fetches = shared_->job.fetches;
    return args;
  }
  Status after_run(SessionRunContext& ctx, const SessionRunValues& values) override {
    StatusOr<int64_t> step = ctx.session()->GlobalStep();
    if (step.ok()) shared_->global_step.store(*step);
    shared_->local_steps.fetch_add(1);
    if (shared_->job.on_results) {
      static const TensorMap kNoResults;
      const TensorMap& results = values.results != nullptr ? *values.results : kNoResults;
      FOREMAN_RETURN_IF_ERROR(
          InvokeUserCode("TrainingJob::on_results", [&] { return shared_->job.on_results(results); }));
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<internal::TrainingJobShared> shared_;
};

Status RunTrainingLoop(caf::actor_system& system, const std::shared_ptr<internal::TrainingJobShared>& shared) {
  MonitoredTrainingSessionOptions options = shared->job.options;
  options.runtime.actor_system = &system;
  // The job's stop request, made before the session so that a stop_atom
  // sent at any moment (before start_atom too) reaches it: then no step runs.
  if (options.runtime.stop == nullptr) {
    StopRequestOptions stop_options;
    stop_options.grace_period = absl::Seconds(options.stop_grace_period_secs);
    if (options.config.clock != nullptr) stop_options.clock = options.config.clock;
    options.runtime.stop = std::make_shared<StopRequest>(std::move(stop_options));
  }
  shared->AttachStop(options.runtime.stop);
  options.hooks.push_back(std::make_shared<JobProgressHook>(shared));
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<MonitoredSession> session, MonitoredTrainingSession(std::move(options)));
  // The job's fetches travel through JobProgressHook (see there).
  while (!session->should_stop()) {
    if (!session->run({}, shared->job.feeds).ok()) break;  // close() returns the error (or OK after a clean end)
  }
  return session->close();
}

void training_loop(caf::blocking_actor* self, std::shared_ptr<internal::TrainingJobShared> shared) {
  Status status = RunTrainingLoop(self->system(), shared);
  if (!status.ok()) {
    MutexLock lock(shared->mu);
    if (shared->error.empty()) shared->error = status.ToString();
  }
  FOREMAN_LOG_DEBUG("training_loop finished: {}", status.ToString());
  self->fail_state(ExitReasonFromStatus(status));
}

struct JobState {
  std::shared_ptr<internal::TrainingJobShared> shared;
  caf::actor loop;
  bool started = false;
  caf::error exit_reason;  // set when the job was asked to exit before the loop ended
  static const char* name;
};
const char* JobState::name = "foreman.training_job";

caf::behavior training_job(caf::stateful_actor<JobState>* self, std::shared_ptr<internal::TrainingJobShared> shared) {
  self->state.shared = shared;
  // However the job ends (even exit_reason::kill, which cannot be trapped),
  // the loop stops at its next step boundary with CANCELLED (no end()).
  self->attach_functor([shared](const caf::error&) { shared->Abort(); });
  self->set_default_handler(caf::drop);
  auto start = [self] {
    if (self->state.started) return;
    self->state.started = true;
    self->state.loop = self->spawn<caf::monitored>(training_loop, self->state.shared);
  };
  self->set_down_handler([self](caf::down_msg& dm) {
    if (dm.source != self->state.loop) return;
    self->state.loop = nullptr;
    self->quit(self->state.exit_reason ? self->state.exit_reason : dm.reason);
  });
  self->set_exit_handler([self](caf::exit_msg& em) {
    self->state.shared->Abort();
    if (!self->state.loop) {
      self->quit(em.reason);
      return;
    }
    self->state.exit_reason = em.reason;  // quit once the loop is down
  });
  if (shared->job.start_immediately) start();
  return {
      [start](start_atom) { start(); },
      [self](stop_atom) { self->state.shared->RequestStop(absl::OkStatus()); },
      [self](status_atom) {
        const auto& s = self->state.shared;
        std::string state = !self->state.started ? "idle"
                             : (s->stop_requested.load() || s->abort_requested.load()) ? "stopping"
                                                                                        : "running";
        std::string error;
        {
          MutexLock lock(s->mu);
          error = s->error;
        }
        return caf::make_message(std::move(state), s->global_step.load(), s->local_steps.load(), std::move(error));
      },
  };
}

}  // namespace

caf::actor SpawnTrainingJob(caf::actor_system& system, TrainingJob job) {
  auto shared = std::make_shared<internal::TrainingJobShared>();
  shared->job = std::move(job);
  return system.spawn(training_job, std::move(shared));
}

caf::error ExitReasonFromStatus(const Status& status) { return internal::StatusToError(status); }

Status StatusFromExitReason(const caf::error& reason) {
  if (std::optional<Status> s = internal::StatusFromForemanError(reason)) return *std::move(s);
  if (reason == caf::exit_reason::normal) return absl::OkStatus();
  if (reason == caf::exit_reason::user_shutdown || reason == caf::exit_reason::kill) {
    return absl::CancelledError("training job stopped by " + caf::to_string(reason));
  }
  return absl::UnknownError("training job exited with " + caf::to_string(reason));
}

void ConfigureActorSystem(caf::actor_system_config& config) { internal::ConfigureActorSystemConfig(config); }

}  // namespace foreman
