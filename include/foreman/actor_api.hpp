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
// Protocol of the job actor (all messages local; no type registration needed):
//
//   start_atom                 begin training (no-op when already started);
//                              a job spawned with start_immediately needs none
//   stop_atom                  request a clean stop at the next step boundary
//                              (MonitoredSession::request_stop()); the final
//                              checkpoint is still written. Safe at any
//                              moment: sent before start_atom, no step runs;
//                              during a recovery, the run ends once the new
//                              session is restored
//   status_atom  -> (std::string state, int64_t global_step,
//                    int64_t local_steps, std::string error)
//                              state: "idle", "running", "stopping";
//                              global_step: after the last finished step (-1
//                              before the first); error: "" or the first error
//
// When training ends the job actor exits with the final Status as its exit
// reason: a caf::error in category "foreman" whose code is the absl status
// code and whose context is the message; a clean end exits normally. A
// monitor's down_msg therefore carries the outcome:
//
//   ```cpp
//   auto job = foreman::SpawnTrainingJob(system, std::move(job_spec));
//   self->monitor(job);
//   self->send(job, foreman::start_atom::value);
//   self->receive([&](caf::down_msg& dm) { status = foreman::StatusFromExitReason(dm.reason); },
//                 caf::after(std::chrono::minutes(10)) >> [&] { status = absl::DeadlineExceededError("no end"); });
//   ```
//
// Killing the job (exit_reason::kill or user_shutdown via send_exit) stops the
// loop at the next step boundary, closes the session (no end(): not a clean
// stop) and exits with that reason.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>

#include "foreman/monitored_session.hpp"
#include "foreman/session.hpp"
#include "foreman/status.hpp"

namespace foreman {

using start_atom = caf::atom_constant<caf::atom("fm_start")>;
using stop_atom = caf::atom_constant<caf::atom("fm_stop")>;
using status_atom = caf::atom_constant<caf::atom("fm_status")>;

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
  std::function<Status(const TensorMap& results)> on_results;
  /// Start without waiting for start_atom.
  bool start_immediately = false;
};

/// Spawns the job actor into `system` (it spawns the training loop as a
/// detached actor on start). Never fails: a job whose session cannot be
/// created exits with that error.
caf::actor SpawnTrainingJob(caf::actor_system& system, TrainingJob job);

/// Registers Foreman's error category (code and message of a Status) in
/// `config`, so that system.render(err) prints it. Call before the
/// caf::actor_system is built from `config`; safe to call twice.
void ConfigureActorSystem(caf::actor_system_config& config);

/// The caf::error a job exits with for `status` (none for OK).
caf::error ExitReasonFromStatus(const Status& status);

/// The Status in a job's exit reason: OK for none / exit_reason::normal, the
/// original Status for a "foreman" error, CANCELLED for user_shutdown and
/// kill, UNKNOWN (with CAF's rendering) for anything else.
Status StatusFromExitReason(const caf::error& reason);

}  // namespace foreman
