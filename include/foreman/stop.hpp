// StopRequest: the one place a training run's stop is asked for, from any
// thread, at any moment — before the session exists, during a step, between
// two sessions while a recovery re-creates one, or while close() runs.
//
//   ```cpp
//   #include <thread>
//   #include "foreman/monitored_session.hpp"
//   #include "foreman/stop.hpp"
//   auto stop = std::make_shared<foreman::StopRequest>(foreman::StopRequestOptions{});
//   foreman::MonitoredTrainingSessionOptions mts_options;
//   mts_options.graph = graph;
//   mts_options.checkpoint_dir = "train_dir";
//   mts_options.runtime.stop = stop;             // the session obeys it
//   FOREMAN_ASSIGN_OR_RETURN(auto sess, foreman::MonitoredTrainingSession(std::move(mts_options)));
//   // On another thread (a signal watcher, an RPC, an actor):
//   std::thread watcher([stop] { stop->request_stop(); });  // clean: final checkpoint
//   while (!sess->should_stop()) {
//     if (!sess->run({"train_op"}).ok()) break;
//   }
//   watcher.join();
//   FOREMAN_RETURN_IF_ERROR(sess->close());
//   ```
//
// MonitoredSession::request_stop() forwards here (a session given no
// StopRequest makes its own). What a stop does to the session is documented
// at MonitoredSession::request_stop(); this object only records it, tells
// its listeners, and enforces the stop grace period: from the first
// request, the owner has `grace_period` (on `clock`) to call Complete()
// (MonitoredSession::close() does when a CheckpointSaverHook's end() has
// made the final save durable; without one, when every hook's end() ran).
// If it does not, on_grace_expired runs once, on the StopRequest's own
// watchdog thread (TF: Coordinator.join's stop_grace_period_secs, which
// bounds the same wait). One StopRequest serves one run: once complete, a
// later request is recorded and heard by listeners but starts no grace period.
// A request with an error made while close() runs makes close() return that
// error (the final checkpoint may already be saved).
#pragma once

#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "absl/time/time.h"
#include "foreman/clock.hpp"
#include "foreman/mutex.hpp"
#include "foreman/status.hpp"

namespace foreman {

struct StopRequestOptions {
  /// How long after the first request_stop() the stop may take to complete
  /// (TF's stop_grace_period_secs, default 120 s). Must be >= 0. This is the
  /// run's one grace-period setting: a session given this StopRequest
  /// (RuntimeOptions::stop) uses it, and leaves its own
  /// stop_grace_period_secs unset (foreman/monitored_session.hpp).
  absl::Duration grace_period = absl::Seconds(120);
  /// Measures the grace period. Not owned; must outlive the StopRequest.
  Clock* clock = Clock::Real();
  /// Runs once, on the watchdog thread, when the grace period ends before
  /// Complete(); it gets the grace period. Empty: an error is logged.
  /// A process-level owner (the `foreman train` CLI) exits here; a library
  /// caller may log, alert, or ignore it.
  std::function<void(absl::Duration grace_period)> on_grace_expired;
};

class StopRequest {
 public:
  explicit StopRequest(StopRequestOptions options = {});
  /// Stops and joins the watchdog (it does not run on_grace_expired then).
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  /// Requests a stop: OK is a clean stop, anything else a stop with that
  /// error. The first request wins (its status is kept; later ones are
  /// ignored). Starts the grace period. Thread-safe; never blocks on the
  /// training thread (listeners run on the caller's thread, see Listen).
  void request_stop(const Status& status = absl::OkStatus());
  /// Whether a stop was requested. Lock-free.
  bool stop_requested() const { return requested_.load(std::memory_order_acquire); }
  /// The first request's status (OK when none or a clean stop).
  Status status() const;

  /// The stop has done its work (the final checkpoint is durable): the grace
  /// period no longer applies. Idempotent; also fine before any request.
  /// Joins the grace-period watchdog (which returns at once), unless called
  /// on it (from on_grace_expired).
  void Complete();
  /// Whether Complete() was called.
  bool completed() const;
  /// The end of the grace period on options.clock's monotonic time, once a
  /// stop was requested and not yet completed.
  std::optional<absl::Duration> grace_deadline() const;
  /// StopRequestOptions::grace_period, as given. Thread-safe.
  absl::Duration grace_period() const { return options_.grace_period; }

  /// Calls `fn(status)` on every request_stop() from now on — at once (on
  /// this thread) when a stop was already requested. Returns an id for
  /// Unlisten(). `fn` runs under the StopRequest's lock: it must be quick and
  /// must not call back into this object. Thread-safe.
  int64_t Listen(std::function<void(const Status&)> fn);
  /// Removes a listener; when it returns, the listener is not running and
  /// will not run again.
  void Unlisten(int64_t id);

 private:
  void Watch(absl::Duration deadline);

  const StopRequestOptions options_;
  std::atomic<bool> requested_{false};
  mutable Mutex mu_;
  std::condition_variable_any cv_;  // Complete() and the destructor wake the watchdog
  Status status_ ABSL_GUARDED_BY(mu_);
  bool completed_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Duration> deadline_ ABSL_GUARDED_BY(mu_);
  int64_t next_listener_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::function<void(const Status&)>> listeners_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_ ABSL_GUARDED_BY(mu_);  // started by the first request_stop()
};

}  // namespace foreman
