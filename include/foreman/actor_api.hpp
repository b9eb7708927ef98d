// Training inside a CAF application: spawn a training job into *your*
// caf::actor_system. Foreman never starts a hidden second actor system for
// it: the job's actors, the training loop and the service actors of its
// MonitoredTrainingSession all live in `system`. Call
// ConfigureActorSystem(cfg) on the system's config before building it, so
// that system.render(err) prints a Foreman Status' code and message.
//
// This header is for actor applications and includes CAF's; the rest of
// Foreman's public headers do not.
//
// Protocol of the job actor (all messages local; the typed messages below
// are registered by ConfigureActorSystem, so they may also cross a node):
//
//   start_atom                 begin training (no-op when already started);
//                              a job spawned with start_immediately needs none
//   stop_atom                  request a clean stop at the next step boundary
//                              (MonitoredSession::request_stop()); the final
//                              checkpoint is still written. See "Stopping"
//                              below: safe at any moment, from any thread.
//   stop_and_wait_atom -> CheckpointSaved
//                              stop_atom, answered once the loop ended: the
//                              last durable checkpoint (the final one: its
//                              path and global_step), or the error: the
//                              job's final Status as ExitReasonFromStatus
//                              renders it, FAILED_PRECONDITION when it ended
//                              OK without a checkpoint (no checkpoint_dir).
//                              Any number may wait; the job exits after
//                              answering them. (Killed jobs answer nothing:
//                              the requester sees the job down.)
//   job_status_atom -> JobStatus
//                              state, global_step, local_steps and the first
//                              error as a code and a message
//   (subscribe_atom, caf::actor subscriber)
//   subscribe_atom             (no handle: the sender) subscribe to progress:
//                              the subscriber then receives ProgressStep,
//                              CheckpointSaved, Recovered and, last,
//                              JobFinished (typed messages from the job actor;
//                              handle them in a behavior, or receive() them in
//                              a scoped_actor). Subscribing twice is one
//                              subscription; a subscriber that exits is
//                              dropped (the job monitors it).
//   (unsubscribe_atom, caf::actor subscriber)
//   unsubscribe_atom           (no handle: the sender) no more messages
//
// An unobserved job pays nothing per step: without a subscriber no progress
// message is built or sent (one relaxed atomic load per step decides).
//
// When training ends the job actor sends JobFinished to its subscribers and
// exits with the final Status as its exit reason: a caf::error in category
// "foreman" whose code is the absl status code and whose context is the
// message; a clean end exits normally. A monitor's down_msg therefore
// carries the outcome too:
//
//   ```cpp
//   auto job = foreman::SpawnTrainingJob(system, std::move(job_spec));
//   self->monitor(job);
//   self->send(job, foreman::subscribe_atom::value);
//   self->send(job, foreman::start_atom::value);
//   bool running = true;
//   self->receive_while(running)(
//       [&](const foreman::ProgressStep& p) {
//         auto loss = p.values.find("loss");   // the job's numeric scalar fetches
//         if (loss != p.values.end()) std::printf("step %lld: loss %g\n", static_cast<long long>(p.global_step), loss->second);
//       },
//       [&](const foreman::CheckpointSaved& c) { std::printf("saved %s\n", c.path.c_str()); },
//       [&](const foreman::Recovered& r) { std::printf("recovered, %lld steps lost\n", static_cast<long long>(r.steps_lost)); },
//       [&](const foreman::JobFinished& f) { std::printf("finished at step %lld\n", static_cast<long long>(f.global_step)); },
//       [&](caf::down_msg& dm) {
//         status = foreman::StatusFromExitReason(dm.reason);
//         running = false;
//       },
//       caf::after(std::chrono::minutes(10)) >> [&] {
//         status = absl::DeadlineExceededError("the job did not end within 10 minutes");
//         running = false;
//       });
//   ```
//
// Lifetime: a started job runs until training ends or it is stopped, even
// when every handle to it is dropped (as a Python thread keeps training when
// its last reference goes); its final checkpoint is written as usual. The
// actor system's shutdown (await_all_actors_done, ~actor_system) therefore
// waits for it: stop it first (stop_atom, or send_exit) to end sooner. A job
// that was never started and has no handle left can never start: it ends
// without training.
//
// Stopping from another thread: stop_atom may be sent from any thread or
// actor at any moment. Before start_atom: no step runs, the final checkpoint
// is written, the job ends OK. During a step: it ends at the step's boundary.
// During a recovery (between the failed session and its replacement): the
// back-off ends at once, the new session is still created and restored, then
// training ends cleanly with its final checkpoint (Recovered is sent with
// next_good_step_ms -1). After training ended: ignored. A plain thread that
// holds no actor uses caf::anon_send(job, foreman::stop_atom::value). Outside
// the actor API, MonitoredSession::request_stop() (or its stop_request()) is
// the same request with the same guarantees.
//
// Killing the job (exit_reason::kill or user_shutdown via send_exit) stops the
// loop at the next step boundary, closes the session (no end(): not a clean
// stop) and exits with that reason. The job's down_msg can come before that
// close released the checkpoint directory's lock: a job of the same process
// started on that directory meanwhile (OTP's restart at the down_msg) waits
// for the release, at most 30 s, instead of failing with FAILED_PRECONDITION
// "in use by process <this pid>". Another process is refused at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "foreman/monitored_session.hpp"
#include "foreman/session.hpp"
#include "foreman/status.hpp"

namespace foreman {

using start_atom = caf::atom_constant<caf::atom("fm_start")>;
using stop_atom = caf::atom_constant<caf::atom("fm_stop")>;
using stop_and_wait_atom = caf::atom_constant<caf::atom("fm_stopw")>;
using job_status_atom = caf::atom_constant<caf::atom("fm_jstatus")>;
using subscribe_atom = caf::atom_constant<caf::atom("fm_sub")>;
using unsubscribe_atom = caf::atom_constant<caf::atom("fm_unsub")>;

// -- typed messages -----------------------------------------------------------
// Plain structs with a CAF inspect(); `code` fields hold an absl::StatusCode's
// value (0: OK), and status() turns code and message back into a Status.

/// The answer to job_status_atom.
struct JobStatus {
  /// The job's identity (TrainingJob::job_id, as every message below).
  std::string job_id;
  /// "idle" (not started), "running", "stopping" (a stop was asked).
  std::string state;
  /// After the last finished step; -1 before the first.
  int64_t global_step = -1;
  /// Steps this job ran (after a restore, fewer than global_step).
  int64_t local_steps = 0;
  /// The first error (0 and "" when none).
  int32_t code = 0;
  std::string message;
  Status status() const;
};

/// Every `TrainingJob::progress_every_steps` global steps (the first one at
/// the first step a subscriber sees), sent after the step.
struct ProgressStep {
  std::string job_id;
  int64_t global_step = 0;
  /// The job's fetches that are numeric scalars (one element: "loss",
  /// "accuracy", ...), as doubles, by fetch name ("train_op", answered with
  /// an empty Tensor, is not one).
  std::map<std::string, double> values;
};

/// A checkpoint the job's CheckpointSaverHook wrote is durable (its save
/// committed): the first save, the periodic ones and the final one.
struct CheckpointSaved {
  std::string job_id;
  int64_t global_step = 0;
  /// The bundle's prefix, "<checkpoint_dir>/model.ckpt-<global_step>".
  std::string path;
};

/// A recovery from a preemption error (ABORTED / UNAVAILABLE) completed:
/// sent after the first successful step on the restored session, or when
/// training ended before one (next_good_step_ms -1). Consecutive recoveries
/// without a good step between them are one message. Times are in
/// milliseconds on the session config's clock.
struct Recovered {
  std::string job_id;
  /// The error recovered from.
  int32_t code = 0;
  std::string message;
  /// Recoveries this message covers (>= 1).
  int64_t recoveries = 0;
  /// From the failure to the decision to recover.
  int64_t detect_ms = 0;
  /// From the decision to the restored session (back-off included).
  int64_t restore_ms = 0;
  /// From the restored session to the end of the first good step; -1: none.
  int64_t next_good_step_ms = -1;
  /// global_step restored, and global steps lost (the step at the failure
  /// minus the restored one).
  int64_t global_step = -1;
  int64_t steps_lost = 0;
  Status status() const;
};

/// The job ended (the last message a subscriber gets): the final Status (as
/// the exit reason carries it) and global step.
struct JobFinished {
  std::string job_id;
  int32_t code = 0;
  std::string message;
  int64_t global_step = -1;
  Status status() const;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobStatus& x) {
  return f(caf::meta::type_name("foreman.JobStatus"), x.job_id, x.state, x.global_step, x.local_steps, x.code, x.message);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ProgressStep& x) {
  return f(caf::meta::type_name("foreman.ProgressStep"), x.job_id, x.global_step, x.values);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, CheckpointSaved& x) {
  return f(caf::meta::type_name("foreman.CheckpointSaved"), x.job_id, x.global_step, x.path);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Recovered& x) {
  return f(caf::meta::type_name("foreman.Recovered"), x.job_id, x.code, x.message, x.recoveries, x.detect_ms, x.restore_ms,
           x.next_good_step_ms, x.global_step, x.steps_lost);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobFinished& x) {
  return f(caf::meta::type_name("foreman.JobFinished"), x.job_id, x.code, x.message, x.global_step);
}

struct TrainingJob {
  /// The session to run; options.runtime.actor_system is set to the job's
  /// system by SpawnTrainingJob.
  MonitoredTrainingSessionOptions options;
  /// What each run() fetches (TF: the train_op and friends).
  std::vector<std::string> fetches = {"train_op"};
  TensorMap feeds;
  /// Called on the training thread after each successful run with its
  /// results (in an internal hook's after_run); an error (or exception) ends
  /// training with it as a hook error does: no end(), no final checkpoint.
  /// The job's Status is that error, its message prefixed
  /// "TrainingJob.on_results: " (not the internal hook's name).
  std::function<Status(const TensorMap& results)> on_results;
  /// The job's identity, in every message it sends and in JobStatus, so
  /// one subscriber can tell several jobs apart; "" (default): the
  /// checkpoint directory as given (options.checkpoint_dir, "" when none).
  std::string job_id;
  /// Start without waiting for start_atom.
  bool start_immediately = false;
  /// ProgressStep every this many global steps, while a subscriber exists
  /// (TF's log_step_count_steps default); 0: none. Negative: the job exits
  /// with INVALID_ARGUMENT when started.
  int64_t progress_every_steps = 100;
};

/// Spawns the job actor into `system` (it spawns the training loop as a
/// detached actor on start). Never fails: a job whose session cannot be
/// created exits with that error. Thread-safe (any thread, any actor).
caf::actor SpawnTrainingJob(caf::actor_system& system, TrainingJob job);

/// The job's protocol (the list at the top of this file) as a typed handle,
/// CAF's typed_actor: sending it a message it does not take, or handling a
/// reply as the wrong type, is a compile error at the sender.
using training_job_actor =
    caf::typed_actor<caf::reacts_to<start_atom>, caf::reacts_to<stop_atom>,
                     caf::replies_to<stop_and_wait_atom>::with<CheckpointSaved>,
                     caf::replies_to<job_status_atom>::with<JobStatus>, caf::reacts_to<subscribe_atom>,
                     caf::reacts_to<subscribe_atom, caf::actor>, caf::reacts_to<unsubscribe_atom>,
                     caf::reacts_to<unsubscribe_atom, caf::actor>>;

/// SpawnTrainingJob, returning the typed handle of the same actor: monitor
/// it, send_exit it and receive its messages as with the plain one;
/// caf::actor_cast<caf::actor>(handle) gives the plain handle back.
/// Thread-safe.
///
///   ```cpp
///   foreman::training_job_actor job = foreman::SpawnTypedTrainingJob(system, std::move(job_spec));
///   self->send(job, foreman::start_atom::value);
///   self->request(job, std::chrono::seconds(10), foreman::job_status_atom::value)
///       .receive([](const foreman::JobStatus& s) { std::printf("%s: %s\n", s.job_id.c_str(), s.state.c_str()); },
///                [](caf::error&) {});
///   // Stop, and hear back once the final checkpoint is durable.
///   self->request(job, std::chrono::minutes(10), foreman::stop_and_wait_atom::value)
///       .receive([](const foreman::CheckpointSaved& c) { std::printf("final checkpoint %s\n", c.path.c_str()); },
///                [&](caf::error& e) { std::printf("%s\n", system.render(e).c_str()); });
///   ```
training_job_actor SpawnTypedTrainingJob(caf::actor_system& system, TrainingJob job);

/// Registers Foreman's error category (code and message of a Status) in
/// `config`, so that system.render(err) prints it, and the typed messages
/// above (JobStatus, ProgressStep, CheckpointSaved, Recovered, JobFinished,
/// as "foreman.<Name>"), so that they can be serialised to another node.
/// Call before the caf::actor_system is built from `config`; safe to call
/// twice. Local use of the messages needs no registration.
void ConfigureActorSystem(caf::actor_system_config& config);

/// The caf::error a job exits with for `status` (none for OK).
caf::error ExitReasonFromStatus(const Status& status);

/// The Status in a job's exit reason: OK for none / exit_reason::normal, the
/// original Status for a "foreman" error, CANCELLED for user_shutdown and
/// kill, UNKNOWN (with CAF's rendering) for anything else.
Status StatusFromExitReason(const caf::error& reason);

}  // namespace foreman
