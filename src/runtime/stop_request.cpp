// StopRequest (include/foreman/stop.hpp).
#include "foreman/stop.hpp"

#include <algorithm>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "platform/log.hpp"

namespace foreman {

StopRequest::StopRequest(StopRequestOptions options) : options_(std::move(options)) {}

StopRequest::~StopRequest() {
  std::thread watchdog;
  {
    MutexLock l(mu_);
    shutting_down_ = true;
    watchdog = std::move(watchdog_);
  }
  cv_.notify_all();
  if (watchdog.joinable()) watchdog.join();
}

void StopRequest::request_stop(const Status& status) {
  MutexLock l(mu_);
  if (requested_.load(std::memory_order_relaxed)) return;
  status_ = status;
  requested_.store(true, std::memory_order_release);
  for (auto& [id, fn] : listeners_) fn(status_);
  if (completed_ || shutting_down_) return;
  Clock* clock = options_.clock != nullptr ? options_.clock : Clock::Real();
  deadline_ = clock->MonotonicNow() + std::max(options_.grace_period, absl::ZeroDuration());
  try {
    watchdog_ = std::thread(&StopRequest::Watch, this, *deadline_);
  } catch (const std::system_error& e) {
    FOREMAN_LOG_ERROR("StopRequest: cannot start the grace-period watchdog: {}", e.what());
  }
}

Status StopRequest::status() const {
  MutexLock l(mu_);
  return status_;
}

void StopRequest::Complete() {
  std::thread watchdog;
  {
    MutexLock l(mu_);
    completed_ = true;
    deadline_.reset();
    if (watchdog_.joinable() && watchdog_.get_id() != std::this_thread::get_id()) watchdog = std::move(watchdog_);
  }
  cv_.notify_all();
  // The watchdog returns at once now: joined here, so that no finished
  // thread is left unjoined when the process then ends at once (a second
  // signal's _exit in foreman train; TSan reported it as a thread leak).
  if (watchdog.joinable()) watchdog.join();
}

bool StopRequest::completed() const {
  MutexLock l(mu_);
  return completed_;
}

std::optional<absl::Duration> StopRequest::grace_deadline() const {
  MutexLock l(mu_);
  return deadline_;
}

int64_t StopRequest::Listen(std::function<void(const Status&)> fn) {
  MutexLock l(mu_);
  const int64_t id = next_listener_++;
  if (requested_.load(std::memory_order_relaxed)) fn(status_);
  listeners_.emplace(id, std::move(fn));
  return id;
}

void StopRequest::Unlisten(int64_t id) {
  MutexLock l(mu_);
  listeners_.erase(id);
}

void StopRequest::Watch(absl::Duration deadline) {
  Clock* clock = options_.clock != nullptr ? options_.clock : Clock::Real();
  {
    MutexLock l(mu_);
    const bool done = clock->WaitUntil(mu_, cv_, deadline,
                                       [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return completed_ || shutting_down_; });
    if (done) return;
  }
  if (options_.on_grace_expired) {
    options_.on_grace_expired(options_.grace_period);
  } else {
    FOREMAN_LOG_ERROR("The stop requested {} ago has not completed (stop grace period); the final checkpoint "
                      "may be missing",
                      absl::FormatDuration(options_.grace_period));
  }
}

}  // namespace foreman
