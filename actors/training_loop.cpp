// training_job / training_loop actors and the Status <-> caf::error mapping
// (see training_loop.hpp for the protocol).
#include "actors/training_loop.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "actors/actor_system.hpp"
#include "actors/atoms.hpp"
#include "actors/status_error.hpp"
#include "absl/strings/str_cat.h"
#include "formats/checkpoint_lock.hpp"
#include "platform/log.hpp"
#include "runtime/services.hpp"
#include "runtime/user_code.hpp"

namespace foreman {
namespace {

// A numeric one-element tensor as a double.
std::optional<double> ScalarValue(const Tensor& t) {
  if (t.num_elements() != 1) return std::nullopt;
  switch (t.dtype()) {
    case DataType::kFloat: return static_cast<double>(*t.data<float>());
    case DataType::kDouble: return *t.data<double>();
    case DataType::kInt32: return static_cast<double>(*t.data<int32_t>());
    case DataType::kUInt8: return static_cast<double>(*t.data<uint8_t>());
    case DataType::kInt64: return static_cast<double>(*t.data<int64_t>());
    default: return std::nullopt;
  }
}

// Publishes progress and hands the job's fetches to on_results in after_run,
// so an on_results error ends training exactly as a hook error does (no
// end()). Stops do not pass through here: stop_atom and the job's exit call
// MonitoredSession::request_stop() directly (TrainingJobShared::RequestStop).
// Subscribers get a ProgressStep every progress_every_steps global steps and
// a CheckpointSaved per durable save (from the saver's thread); without one,
// after_run does one relaxed load more than before and builds nothing.
class JobProgressHook : public SessionRunHook, public internal::ServiceUser {
 public:
  explicit JobProgressHook(std::shared_ptr<internal::TrainingJobShared> shared) : shared_(std::move(shared)) {}
  std::string name() const override { return "TrainingJobProgressHook"; }
  void AttachServices(internal::Services* services) override {
    if (services == nullptr) return;
    services->ObserveSaves([shared = shared_](int64_t global_step, const std::string& path) {
      const CheckpointSaved saved{shared->id, global_step, path};
      {
        MutexLock lock(shared->mu);
        shared->last_saved = saved;
      }
      if (shared->observed()) shared->Publish(saved);
    });
  }
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
    if (!shared_->observed()) {
      last_published_ = -1;  // a new subscriber gets the next step at once
    } else if (step.ok()) {
      MaybePublish(*step, values);
    }
    if (shared_->job.on_results) {
      static const TensorMap kNoResults;
      const TensorMap& results = values.results != nullptr ? *values.results : kNoResults;
      static const std::string kWhere = "TrainingJob.on_results";
      FOREMAN_RETURN_IF_ERROR(internal::AttributeToUserCode(
          InvokeUserCode(kWhere, [&] { return shared_->job.on_results(results); }), kWhere));
    }
    return absl::OkStatus();
  }

 private:
  void MaybePublish(int64_t step, const SessionRunValues& values) {
    const int64_t every = shared_->job.progress_every_steps;
    if (every <= 0) return;
    // A restore moves the step back: publish again from there.
    if (last_published_ >= 0 && step >= last_published_ && step - last_published_ < every) return;
    last_published_ = step;
    ProgressStep progress;
    progress.global_step = step;
    if (values.results != nullptr) {
      for (const auto& [name, tensor] : *values.results) {
        if (std::optional<double> v = ScalarValue(tensor)) progress.values.emplace(name, *v);
      }
    }
    shared_->Publish(std::move(progress));
  }

  std::shared_ptr<internal::TrainingJobShared> shared_;
  int64_t last_published_ = -1;  // global step of the last ProgressStep
};

// RecoveryOptions::on_recovered: a Recovered for the subscribers, then the
// caller's own callback, if any.
std::function<void(const RecoveryReport&)> RecoveredPublisher(
    std::shared_ptr<internal::TrainingJobShared> shared, std::function<void(const RecoveryReport&)> user) {
  return [shared = std::move(shared), user = std::move(user)](const RecoveryReport& r) {
    if (shared->observed()) {
      Recovered m;
      m.code = static_cast<int32_t>(r.cause.code());
      m.message = std::string(r.cause.message());
      m.recoveries = r.recoveries;
      m.detect_ms = absl::ToInt64Milliseconds(r.detect);
      m.restore_ms = absl::ToInt64Milliseconds(r.restore);
      m.next_good_step_ms = r.next_good_step.has_value() ? absl::ToInt64Milliseconds(*r.next_good_step) : -1;
      m.global_step = r.restored_global_step;
      m.steps_lost = r.steps_lost;
      shared->Publish(std::move(m));
    }
    if (user) user(r);
  };
}

Status RunTrainingLoop(caf::actor_system& system, const std::shared_ptr<internal::TrainingJobShared>& shared) {
  if (shared->job.progress_every_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("TrainingJob.progress_every_steps must be >= 0, got ",
                                                   shared->job.progress_every_steps));
  }
  MonitoredTrainingSessionOptions options = shared->job.options;
  options.runtime.actor_system = &system;
  options.recovery.on_recovered = RecoveredPublisher(shared, std::move(options.recovery.on_recovered));
  // The job's stop request, made before the session so that a stop_atom
  // sent at any moment (before start_atom too) reaches it: then no step runs.
  if (options.runtime.stop == nullptr) {
    StopRequestOptions stop_options;
    // Unset: StopRequestOptions' default, the 120 s the session would use.
    if (options.stop_grace_period_secs.has_value()) {
      stop_options.grace_period = absl::Seconds(*options.stop_grace_period_secs);
    }
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

// JobFinished for `reason` to `subscribers` from outside the job actor (a
// killed job's: shared->finished_sent was set by the caller).
void SendJobFinished(const std::string& job_id, const std::vector<caf::actor>& subscribers, const caf::error& reason,
                     int64_t global_step) {
  const Status final_status = StatusFromExitReason(reason);
  for (const caf::actor& s : subscribers) {
    caf::anon_send(s, JobFinished{job_id, static_cast<int32_t>(final_status.code()), std::string(final_status.message()),
                                  global_step});
  }
}

void training_loop(caf::blocking_actor* self, std::shared_ptr<internal::TrainingJobShared> shared) {
  Status status = RunTrainingLoop(self->system(), shared);
  if (!status.ok()) shared->RecordError(status);
  FOREMAN_LOG_DEBUG("training_loop finished: {}", status.ToString());
  // A killed job cannot forward JobFinished at this loop's end: send it here,
  // now that the session is closed (its checkpoint directory released).
  std::vector<caf::actor> subscribers;
  caf::error reason;
  {
    MutexLock lock(shared->mu);
    shared->loop_done = true;
    if (shared->marked_closing) {
      shared->marked_closing = false;
      internal::UnmarkCheckpointDirectoryClosing(shared->job.options.checkpoint_dir);
    }
    if (shared->job_gone && !shared->finished_sent) {
      shared->finished_sent = true;
      subscribers = shared->subscriber_list;
      reason = shared->job_exit_reason;
    }
  }
  if (!subscribers.empty()) SendJobFinished(shared->id, subscribers, reason, shared->global_step.load());
  self->fail_state(ExitReasonFromStatus(status));
}

struct JobState {
  std::shared_ptr<internal::TrainingJobShared> shared;
  caf::actor loop;
  bool started = false;
  caf::error exit_reason;  // set when the job was asked to exit before the loop ended
  std::vector<caf::actor> subscribers;
  std::vector<caf::response_promise> stop_waiters;  // stop_and_wait_atom's, answered at the loop's end
  static const char* name;
};
const char* JobState::name = "foreman.training_job";

using job_actor = caf::stateful_actor<JobState>;

void CopySubscribers(JobState& st) {
  MutexLock lock(st.shared->mu);
  st.shared->subscriber_list = st.subscribers;
}

void Subscribe(job_actor* self, const caf::actor& who) {
  auto& st = self->state;
  if (!who || std::find(st.subscribers.begin(), st.subscribers.end(), who) != st.subscribers.end()) return;
  self->monitor(who);
  st.subscribers.push_back(who);
  st.shared->subscribers.store(static_cast<int>(st.subscribers.size()), std::memory_order_relaxed);
  CopySubscribers(st);
}

void Unsubscribe(job_actor* self, const caf::actor_addr& who) {
  auto& st = self->state;
  auto it = std::find_if(st.subscribers.begin(), st.subscribers.end(),
                         [&](const caf::actor& a) { return a.address() == who; });
  if (it == st.subscribers.end()) return;
  self->demonitor(*it);
  st.subscribers.erase(it);
  st.shared->subscribers.store(static_cast<int>(st.subscribers.size()), std::memory_order_relaxed);
  CopySubscribers(st);
}

caf::actor Sender(job_actor* self) { return caf::actor_cast<caf::actor>(self->current_sender()); }

template <class T>
void Forward(job_actor* self, const T& msg) {
  for (const caf::actor& s : self->state.subscribers) self->send(s, msg);
}

caf::behavior training_job(job_actor* self, std::shared_ptr<internal::TrainingJobShared> shared) {
  self->state.shared = shared;
  shared->job_address = self->address();
  // However the job ends (even exit_reason::kill, which cannot be trapped),
  // the loop stops at its next step boundary with CANCELLED (no end()).
  // The keep-alive handle goes too (already gone after a normal end): a
  // killed job must not be kept by its own training loop.
  self->attach_functor([shared](const caf::error& reason) {
    shared->Abort();
    caf::actor keep_alive;
    std::vector<caf::actor> subscribers;
    {
      MutexLock lock(shared->mu);
      keep_alive.swap(shared->keep_alive);
      shared->job_gone = true;
      shared->job_exit_reason = reason;
      // Gone before its loop closed the session: a restart on the same
      // directory waits for that close instead of being refused.
      if (shared->loop_started && !shared->loop_done && !shared->job.options.checkpoint_dir.empty()) {
        shared->marked_closing = true;
        internal::MarkCheckpointDirectoryClosing(shared->job.options.checkpoint_dir);
      }
      // Killed with no loop left to tell them (never started, or ended with
      // its down message still in the mailbox): JobFinished now.
      if ((!shared->loop_started || shared->loop_done) && !shared->finished_sent) {
        shared->finished_sent = true;
        subscribers = shared->subscriber_list;
      }
    }
    if (!subscribers.empty()) SendJobFinished(shared->id, subscribers, reason, shared->global_step.load());
  });
  self->set_default_handler(caf::drop);
  // A subscriber that does not handle a message answers it with an error
  // (CAF's unexpected_message); the default error handler would end the job.
  self->set_error_handler([](caf::error& err) {
    FOREMAN_LOG_DEBUG("training_job: a subscriber answered {}", caf::to_string(err));
  });
  auto start = [self] {
    if (self->state.started) return;
    self->state.started = true;
    {
      // Until the loop is down, the job stays reachable without any user
      // handle: dropping them must not cancel training.
      MutexLock lock(self->state.shared->mu);
      self->state.shared->keep_alive = caf::actor_cast<caf::actor>(self);
    }
    {
      MutexLock lock(self->state.shared->mu);
      self->state.shared->loop_started = true;
    }
    self->state.loop = self->spawn<caf::monitored>(training_loop, self->state.shared);
  };
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    if (!st.loop || dm.source != st.loop) {
      Unsubscribe(self, dm.source);
      return;
    }
    st.loop = nullptr;
    const caf::error reason = st.exit_reason ? st.exit_reason : dm.reason;
    const Status final_status = StatusFromExitReason(reason);
    bool send = false;
    {
      MutexLock lock(st.shared->mu);
      send = !std::exchange(st.shared->finished_sent, true);
    }
    if (send) {
      Forward(self, JobFinished{st.shared->id, static_cast<int32_t>(final_status.code()),
                                std::string(final_status.message()), st.shared->global_step.load()});
    }
    if (!st.stop_waiters.empty()) {
      std::optional<CheckpointSaved> saved;
      {
        MutexLock lock(st.shared->mu);
        saved = st.shared->last_saved;
      }
      for (caf::response_promise& rp : st.stop_waiters) {
        if (!final_status.ok()) {
          rp.deliver(ExitReasonFromStatus(final_status));
        } else if (!saved.has_value()) {
          rp.deliver(ExitReasonFromStatus(absl::FailedPreconditionError(absl::StrCat(
              "training job '", st.shared->id, "' ended without a durable checkpoint (no checkpoint_dir)"))));
        } else {
          rp.deliver(*saved);
        }
      }
      st.stop_waiters.clear();
    }
    caf::actor keep_alive;  // released when this handler returns, after quit()
    {
      MutexLock lock(st.shared->mu);
      keep_alive.swap(st.shared->keep_alive);
    }
    self->quit(reason);
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
  auto state_name = [self] {
    const auto& s = self->state.shared;
    return std::string(!self->state.started                                             ? "idle"
                       : (s->stop_requested.load() || s->abort_requested.load()) ? "stopping"
                                                                                  : "running");
  };
  return {
      [start](start_atom) { start(); },
      // Before start_atom too: the loop is started to end at once, so no
      // step runs and the final checkpoint is written (the header's rule).
      [self, start](stop_atom) {
        self->state.shared->RequestStop(absl::OkStatus());
        start();
      },
      [self, start](stop_and_wait_atom) -> caf::result<CheckpointSaved> {
        self->state.shared->RequestStop(absl::OkStatus());
        self->state.stop_waiters.push_back(self->make_response_promise());
        caf::response_promise answer = self->state.stop_waiters.back();
        start();
        return answer;
      },
      [self, state_name](job_status_atom) {
        const auto& s = self->state.shared;
        const Status error = s->FirstError();
        return JobStatus{s->id, state_name(), s->global_step.load(), s->local_steps.load(),
                         static_cast<int32_t>(error.code()), std::string(error.message())};
      },
      [self](subscribe_atom) { Subscribe(self, Sender(self)); },
      [self](subscribe_atom, const caf::actor& who) { Subscribe(self, who); },
      [self](unsubscribe_atom) {
        if (auto who = Sender(self)) Unsubscribe(self, who.address());
      },
      [self](unsubscribe_atom, const caf::actor& who) {
        if (who) Unsubscribe(self, who.address());
      },
      [self](const ProgressStep& m) { Forward(self, m); },
      [self](const CheckpointSaved& m) { Forward(self, m); },
      [self](const Recovered& m) { Forward(self, m); },
  };
}

}  // namespace

caf::actor SpawnTrainingJob(caf::actor_system& system, TrainingJob job) {
  auto shared = std::make_shared<internal::TrainingJobShared>();
  shared->job = std::move(job);
  shared->id = shared->job.job_id.empty() ? shared->job.options.checkpoint_dir : shared->job.job_id;
  return system.spawn(training_job, std::move(shared));
}

training_job_actor SpawnTypedTrainingJob(caf::actor_system& system, TrainingJob job) {
  return caf::actor_cast<training_job_actor>(SpawnTrainingJob(system, std::move(job)));
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

Status JobStatus::status() const { return internal::FromMessage(internal::StatusMessage{code, message}); }
Status Recovered::status() const { return internal::FromMessage(internal::StatusMessage{code, message}); }
Status JobFinished::status() const { return internal::FromMessage(internal::StatusMessage{code, message}); }

}  // namespace foreman
