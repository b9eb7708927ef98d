// training_job and training_loop: the actor API (include/foreman/actor_api.hpp).
//
//   training_job (event-based; the handle SpawnTrainingJob returns)
//   └── training_loop (blocking actor, own thread: runs the
//       MonitoredTrainingSession loop; its Runtime's service actors
//       live in the same actor system)
//
// Message protocol of training_job (public: include/foreman/actor_api.hpp):
//   start_atom                        -> spawns training_loop (once)
//   stop_atom                         -> clean stop at the next step boundary
//   job_status_atom                   -> JobStatus
//   (subscribe_atom[, caf::actor])    -> monitors and adds the subscriber
//   (unsubscribe_atom[, caf::actor])  -> removes it
//   ProgressStep, CheckpointSaved, Recovered (from the loop's threads)
//                                     -> forwarded to every subscriber
//   down_msg from training_loop       -> JobFinished to every subscriber, then
//                                        quits with the same reason
//   down_msg from a subscriber        -> removes it
//   exit_msg (user_shutdown, ...)     -> abort flag; quits with that reason
//                                        once the loop is down
//
// training_loop takes no messages: it runs until the session should stop
// and exits with ExitReasonFromStatus(the session's final Status). A stop
// (stop_atom: clean; the job exiting: CANCELLED) goes straight to the run's
// StopRequest, which the session obeys at the next step boundary — also
// before the session exists, so a stop_atom sent before start_atom means no
// step runs.
//
// Progress: the loop's JobProgressHook (after_run, on the training thread),
// the checkpoint saver's thread (SaveObservers) and RecoveryOptions::
// on_recovered send the typed messages to the job, which fans them out; each
// checks `subscribers` first, so an unobserved job builds and sends nothing.
//
// Lifetime: while the loop runs, TrainingJobShared::keep_alive holds a
// handle on the job, so dropping every user handle does not make the job
// unreachable (which would cancel training); the loop drops it when it ends.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include "foreman/mutex.hpp"
#include "foreman/actor_api.hpp"
#include "foreman/stop.hpp"

namespace foreman::internal {

/// State shared between training_job, training_loop and the loop's hook.
struct TrainingJobShared {
  TrainingJob job;
  std::string id;  // job.job_id, or its checkpoint_dir when that is empty; set at spawn
  // The last durable save (stop_and_wait_atom's answer); any thread.
  std::optional<CheckpointSaved> last_saved ABSL_GUARDED_BY(mu);
  std::atomic<bool> stop_requested{false};   // stop_atom: clean stop
  std::atomic<bool> abort_requested{false};  // the job is exiting: CANCELLED
  std::atomic<int64_t> global_step{-1};
  std::atomic<int64_t> local_steps{0};
  /// How many subscribers the job has (written by the job actor only).
  std::atomic<int> subscribers{0};
  /// The job (weak: no cycle); set before the loop is spawned.
  caf::actor_addr job_address;
  Mutex mu;
  Status error ABSL_GUARDED_BY(mu);  // the first error
  std::shared_ptr<StopRequest> stop ABSL_GUARDED_BY(mu);  // the run's, once the loop made it
  Status pending_stop ABSL_GUARDED_BY(mu);  // a stop asked before that
  caf::actor keep_alive ABSL_GUARDED_BY(mu);  // the job, while the loop runs
  // JobFinished, last to every subscriber, exactly once, however the job
  // ends: by the job actor at its loop's down message; or, when the job was
  // killed (exit_reason::kill runs no handler), by the loop when it ends, or
  // by the job's cleanup when the loop already ended or never started.
  std::vector<caf::actor> subscriber_list ABSL_GUARDED_BY(mu);  // the job's subscribers (a copy)
  bool loop_started ABSL_GUARDED_BY(mu) = false;
  bool loop_done ABSL_GUARDED_BY(mu) = false;
  bool job_gone ABSL_GUARDED_BY(mu) = false;  // the job actor exited
  caf::error job_exit_reason ABSL_GUARDED_BY(mu);
  bool finished_sent ABSL_GUARDED_BY(mu) = false;
  // The job was killed while its loop held the checkpoint directory: marked
  // closing (formats/checkpoint_lock.hpp) until the loop has closed it.
  bool marked_closing ABSL_GUARDED_BY(mu) = false;

  /// A stop (OK: clean) from the job actor, at any moment. Thread-safe.
  void RequestStop(const Status& status) {
    std::shared_ptr<StopRequest> target;
    {
      MutexLock lock(mu);
      if (!stop_requested.exchange(true)) pending_stop = status;
      target = stop;
    }
    if (target != nullptr) target->request_stop(status);
  }
  /// The job is exiting: training stops with CANCELLED (no end(), so no
  /// final checkpoint: not a clean stop).
  void Abort() {
    abort_requested.store(true);
    RequestStop(absl::CancelledError("training job was shut down"));
  }
  /// The loop's StopRequest: a stop asked before it existed is passed on.
  void AttachStop(std::shared_ptr<StopRequest> request) {
    bool pending = false;
    Status status;
    {
      MutexLock lock(mu);
      stop = request;
      pending = stop_requested.load();
      status = pending_stop;
    }
    if (pending) request->request_stop(status);
  }
  /// Whether anyone listens (one relaxed load: the per-step check).
  bool observed() const { return subscribers.load(std::memory_order_relaxed) > 0; }
  /// Sends `msg` to the job (which forwards it to its subscribers); nothing
  /// when the job is gone. Any thread.
  template <class T>
  void Publish(T msg) {
    msg.job_id = id;
    if (auto job_actor = caf::actor_cast<caf::actor>(job_address)) caf::anon_send(job_actor, std::move(msg));
  }
  /// The first error wins.
  void RecordError(const Status& s) {
    MutexLock lock(mu);
    if (error.ok()) error = s;
  }
  Status FirstError() {
    MutexLock lock(mu);
    return error;
  }
};

}  // namespace foreman::internal
