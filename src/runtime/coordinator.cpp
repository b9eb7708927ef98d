// Coordinator and LooperThread (include/foreman/coordinator.hpp).
//
// The stop flag, the recorded status and the registered runners live in a
// Coordinator::State shared (std::shared_ptr) with every LooperThread's
// thread. join() may give up on a straggler and detach its thread; that
// thread still holds the State, so when its target finally returns it can
// read the flag (or report an error, which is then dropped: stop was
// requested) without touching a destroyed coordinator. A looper only calls
// the clock while stop is not requested, and a straggler exists only once
// stop was requested, so a detached thread never calls a clock that a test
// may already have destroyed.
//
// Lock order: State::mu, then a clock's own mutex (inside WaitUntil). User
// code (targets, runners' Join/IsRunning/destructors, step functions) is
// never called with State::mu held.
#include "foreman/coordinator.hpp"

#include <algorithm>
#include <system_error>
#include <utility>

#include "absl/strings/str_join.h"
#include "platform/log.hpp"

namespace foreman {

// -- Coordinator::State -------------------------------------------------------

bool Coordinator::State::IsCleanStop(const Status& s) const {
  if (s.ok()) return false;
  // decision 5: no list means {OUT_OF_RANGE}; an empty list means none.
  if (!clean_stop_codes.has_value()) return s.code() == absl::StatusCode::kOutOfRange;
  return std::find(clean_stop_codes->begin(), clean_stop_codes->end(), s.code()) !=
         clean_stop_codes->end();
}

Status Coordinator::State::RequestStop(const Status& status) {
  // B57: a clean-stop code is a stop without error.
  const Status filtered = IsCleanStop(status) ? absl::OkStatus() : status;
  {
    MutexLock l(mu);
    // B59: after join() the caller gets the error back; nothing is recorded.
    if (joined && !filtered.ok()) return filtered;
    if (!stop.load(std::memory_order_relaxed)) {
      // B57/B58: only the first request's error counts.
      if (!filtered.ok() && this->status.ok()) this->status = filtered;
      stop.store(true, std::memory_order_release);
    }
  }
  cv.notify_all();
  return absl::OkStatus();
}

// -- Coordinator --------------------------------------------------------------

Coordinator::Coordinator(std::optional<std::vector<absl::StatusCode>> clean_stop_codes,
                         Clock* clock)
    : state_(std::make_shared<State>(std::move(clean_stop_codes),
                                     clock != nullptr ? clock : Clock::Real())) {}

Coordinator::~Coordinator() {
  // B76. Nothing to wait for unless runners are still registered.
  bool has_runners = false;
  {
    MutexLock l(state_->mu);
    has_runners = !state_->runners.empty();
  }
  state_->RequestStop(absl::OkStatus()).IgnoreError();
  if (has_runners) join(absl::Seconds(120), /*ignore_live_threads=*/true).IgnoreError();
}

Status Coordinator::request_stop(const Status& status) { return state_->RequestStop(status); }

void Coordinator::clear_stop() {
  MutexLock l(state_->mu);
  state_->stop.store(false, std::memory_order_release);
  state_->status = absl::OkStatus();
  state_->joined = false;
}

Status Coordinator::status() const {
  MutexLock l(state_->mu);
  return state_->status;
}

bool Coordinator::wait_for_stop(std::optional<absl::Duration> timeout) {
  State& s = *state_;
  MutexLock l(s.mu);
  if (s.stop.load(std::memory_order_acquire)) return true;
  const absl::Duration deadline =
      timeout.has_value() ? s.clock->MonotonicNow() + *timeout : absl::InfiniteDuration();
  return s.clock->WaitUntil(s.mu, s.cv, deadline,
                            [&s] { return s.stop.load(std::memory_order_acquire); });
}

bool Coordinator::stop_on_exception(const std::function<Status()>& fn) {
  Status s = InvokeUserCode("Coordinator::stop_on_exception", fn);
  if (s.ok()) return true;
  // B67: reported and suppressed. After join() TF would raise it in this
  // thread; here it is at least not lost silently.
  Status not_recorded = request_stop(s);
  if (!not_recorded.ok()) {
    FOREMAN_LOG_WARN("Coordinator already joined; error not recorded: {}",
                     not_recorded.ToString());
  }
  return false;
}

Status Coordinator::register_runner(std::unique_ptr<RunnerInterface> runner) {
  if (runner == nullptr) return absl::InvalidArgumentError("register_runner: null runner");
  MutexLock l(state_->mu);
  if (state_->stop.load(std::memory_order_relaxed)) {
    return absl::FailedPreconditionError("The coordinator has been stopped.");
  }
  state_->runners.push_back(std::move(runner));
  return absl::OkStatus();
}

bool Coordinator::joined() const {
  MutexLock l(state_->mu);
  return state_->joined;
}

namespace {

bool AllStopped(const std::vector<std::unique_ptr<RunnerInterface>>& runners) {
  return std::none_of(runners.begin(), runners.end(),
                      [](const std::unique_ptr<RunnerInterface>& r) { return r->IsRunning(); });
}

}  // namespace

Status Coordinator::join(absl::Duration stop_grace_period, bool ignore_live_threads) {
  State& s = *state_;
  Clock* const clock = s.clock;
  std::vector<std::unique_ptr<RunnerInterface>> runners;
  {
    MutexLock l(s.mu);
    runners = std::move(s.runners);
    s.runners.clear();
  }

  // Waits until a LooperThread ends, stop is requested (when `until_stop`)
  // or `deadline` passes. `ends` is runner_ends read before the runners
  // were last looked at, so that an end in between is not missed.
  const auto wait = [&s, clock](uint64_t ends, bool until_stop, absl::Duration deadline) {
    MutexLock l(s.mu);
    clock->WaitUntil(s.mu, s.cv, deadline,
                     [&s, ends, until_stop]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
                       return s.runner_ends != ends ||
                              (until_stop && s.stop.load(std::memory_order_relaxed));
                     });
  };
  const auto runner_ends = [&s] {
    MutexLock l(s.mu);
    return s.runner_ends;
  };

  // B61: until every runner has finished or stop is requested, polling
  // every second.
  for (;;) {
    const uint64_t ends = runner_ends();
    if (should_stop() || AllStopped(runners)) break;
    wait(ends, /*until_stop=*/true, clock->MonotonicNow() + absl::Seconds(1));
  }

  // B62: the grace period, polling from 1 ms, doubling.
  const absl::Duration grace_deadline =
      clock->MonotonicNow() + std::max(stop_grace_period, absl::ZeroDuration());
  absl::Duration poll = absl::Milliseconds(1);
  for (;;) {
    const uint64_t ends = runner_ends();
    if (AllStopped(runners)) break;
    const absl::Duration now = clock->MonotonicNow();
    if (now >= grace_deadline) break;
    wait(ends, /*until_stop=*/false, std::min(now + poll, grace_deadline));
    poll *= 2;
  }

  // B63. Finished runners' errors go through request_stop while `joined` is
  // still false; stragglers are named and dropped.
  std::vector<std::string> stragglers;
  for (const std::unique_ptr<RunnerInterface>& r : runners) {
    if (r->IsRunning()) {
      stragglers.push_back(r->name());
      continue;
    }
    Status rs = r->Join();
    if (!rs.ok() && !s.IsCleanStop(rs)) s.RequestStop(rs).IgnoreError();
  }
  Status recorded;
  {
    MutexLock l(s.mu);
    s.joined = true;
    recorded = s.status;
  }
  runners.clear();  // outside the lock: destructors are runner code

  if (!recorded.ok()) return recorded;
  if (!stragglers.empty()) {
    const std::string message =
        "Coordinator stopped with threads still running: " + absl::StrJoin(stragglers, " ");
    if (!ignore_live_threads) return absl::DeadlineExceededError(message);
    FOREMAN_LOG_WARN("{}", message);
  }
  return absl::OkStatus();
}

// -- LooperThread -------------------------------------------------------------

StatusOr<LooperThread*> LooperThread::Start(Coordinator* coord, std::string name,
                                            std::optional<absl::Duration> interval,
                                            std::function<Status()> target) {
  if (coord == nullptr) return absl::InvalidArgumentError("LooperThread::Start: null coordinator");
  if (!target) {
    return absl::InvalidArgumentError("LooperThread::Start: empty target for looper '" + name + "'");
  }
  if (interval.has_value() && *interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("LooperThread::Start: interval of looper '" + name +
                                      "' must be positive, got " + absl::FormatDuration(*interval));
  }
  auto shared = std::make_shared<Shared>();
  shared->name = std::move(name);
  shared->interval = interval;
  shared->target = std::move(target);

  std::shared_ptr<Coordinator::State> state = coord->state_;
  std::unique_ptr<LooperThread> looper(new LooperThread(shared));
  LooperThread* const raw = looper.get();
  // Checked, started and registered under the lock, so that a concurrent
  // request_stop() either refuses the looper or finds it registered and
  // running.
  MutexLock l(state->mu);
  if (state->stop.load(std::memory_order_relaxed)) {
    return absl::FailedPreconditionError("The coordinator has been stopped.");
  }
  // B68: a timer starts now.
  const absl::Duration first_time = state->clock->MonotonicNow();
  try {
    looper->thread_ = std::thread(&LooperThread::Loop, state, shared, first_time);
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError("LooperThread::Start: cannot start a thread for looper '" +
                                        shared->name + "': " + e.what());
  }
  state->runners.push_back(std::move(looper));
  return raw;
}

void LooperThread::Loop(std::shared_ptr<Coordinator::State> coord, std::shared_ptr<Shared> shared,
                        absl::Duration first_time) {
  Coordinator::State& s = *coord;
  const std::string where = "LooperThread " + shared->name;
  Status final_status;
  absl::Duration next_time = first_time;
  for (;;) {
    if (shared->interval.has_value()) {
      // Python's `while not coord.wait_for_stop(next_timer_time - now)`: a
      // fixed schedule, at once when the target ran late.
      MutexLock l(s.mu);
      if (s.stop.load(std::memory_order_relaxed)) break;
      if (s.clock->WaitUntil(s.mu, s.cv, next_time,
                             [&s] { return s.stop.load(std::memory_order_relaxed); })) {
        break;
      }
      next_time += *shared->interval;
    } else if (s.stop.load(std::memory_order_acquire)) {
      break;
    }
    Status st = InvokeUserCode(where, shared->target);
    if (!st.ok()) {
      final_status = st;
      s.RequestStop(st).IgnoreError();
      break;
    }
  }
  {
    MutexLock l(shared->mu);
    shared->final_status = final_status;
  }
  shared->running.store(false, std::memory_order_release);
  {
    MutexLock l(s.mu);
    ++s.runner_ends;
  }
  s.cv.notify_all();
}

LooperThread::~LooperThread() {
  MutexLock l(join_mu_);
  if (!thread_.joinable()) return;
  if (shared_->running.load(std::memory_order_acquire) ||
      thread_.get_id() == std::this_thread::get_id()) {
    // A straggler (Coordinator::join): it holds what it uses and ends when
    // its target returns.
    thread_.detach();
  } else {
    thread_.join();
  }
}

Status LooperThread::Join() {
  MutexLock l(join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  MutexLock sl(shared_->mu);
  return shared_->final_status;
}

bool LooperThread::IsRunning() const { return shared_->running.load(std::memory_order_acquire); }

}  // namespace foreman
