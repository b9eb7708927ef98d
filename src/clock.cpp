// Clock::Real() and ManualClock (include/foreman/clock.hpp).
//
// ManualClock wakes two kinds of blocked threads when Advance() moves time:
//
//   sleepers  (SleepFor) wait on the clock's own mutex for a condition that
//             reads the clock's time, so absl re-evaluates it when Advance()
//             releases that mutex.
//   awaiters  (AwaitWithDeadline) wait on the *caller's* mutex `mu`, which
//             the clock cannot see. Each registers a Waiter in the clock and
//             waits for `cond || waiter.due`. Advance() picks the waiters
//             whose deadline has come, pins them, releases the clock mutex,
//             then for each sets `due` under `mu` and unlocks `mu`, which
//             makes absl re-evaluate the waiter's condition (the technique of
//             absl's SimulatedClock).
//
// Lock order: a caller's `mu` before the clock mutex, never the other way.
// An awaiter holds `mu` while it registers and unregisters; Advance() never
// holds the clock mutex while it locks a waiter's `mu`. A pinned Waiter (and
// its `mu`) stays alive until Advance() has unpinned it: the awaiter waits
// for that before it returns.
#include "foreman/clock.hpp"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "log.hpp"

namespace foreman {

// -- Clock::Real() ------------------------------------------------------------

namespace {

/// CLOCK_REALTIME for wall time, std::chrono::steady_clock (CLOCK_MONOTONIC)
/// for monotonic time, measured from the moment the clock is first used.
class RealClock final : public Clock {
 public:
  RealClock() : origin_(std::chrono::steady_clock::now()) {}

  absl::Time WallNow() override { return absl::Now(); }

  absl::Duration MonotonicNow() override {
    return absl::FromChrono(std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - origin_));
  }

  void SleepFor(absl::Duration d) override {
    if (d > absl::ZeroDuration()) absl::SleepFor(d);
  }

  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                         absl::Duration deadline) override {
    mu->AssertHeld();
    // AwaitWithTimeout measures its timeout on absl's own clock; loop so that
    // an early return (for example after a wall-clock jump) waits out the rest
    // of the monotonic deadline.
    for (;;) {
      const absl::Duration remaining = deadline - MonotonicNow();
      if (remaining <= absl::ZeroDuration()) return cond.Eval();
      if (mu->AwaitWithTimeout(cond, remaining)) return true;
    }
  }

 private:
  const std::chrono::steady_clock::time_point origin_;
};

}  // namespace

Clock* Clock::Real() {
  // Constructed on first use (safe during static initialisation), never
  // deleted (safe during static destruction).
  static Clock* const real = new RealClock();
  return real;
}

// -- ManualClock::Impl --------------------------------------------------------

namespace {

/// One thread blocked in ManualClock::AwaitWithDeadline(). Lives on that
/// thread's stack.
struct Waiter {
  Waiter(absl::Mutex* m, absl::Duration d) : mu(m), deadline(d) {}

  /// The caller's mutex.
  absl::Mutex* const mu;
  /// Monotonic deadline.
  const absl::Duration deadline;
  /// Set by Advance() (or the destructor) once the deadline has come.
  /// Guarded by *mu.
  bool due = false;
  /// Picked by Advance() once; it will not be picked again. Guarded by the
  /// clock mutex.
  bool picked = false;
  /// Number of Advance() calls that hold a pointer to this waiter outside the
  /// clock mutex. Guarded by the clock mutex.
  int pins = 0;
};

}  // namespace

struct ManualClock::Impl {
  explicit Impl(absl::Time wall_start) : wall(wall_start) {}

  /// Picks the registered awaiters whose deadline has come (all of them once
  /// `shutting_down`) and pins them; Signal() must follow.
  std::vector<Waiter*> PickDue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<Waiter*> due;
    for (Waiter* w : awaiters) {
      if (!w->picked && (shutting_down || w->deadline <= monotonic)) {
        w->picked = true;
        ++w->pins;
        due.push_back(w);
      }
    }
    return due;
  }

  /// Sets `due` on each picked waiter under its own mutex (so absl
  /// re-evaluates its condition on unlock), then unpins it.
  void Signal(const std::vector<Waiter*>& due) ABSL_LOCKS_EXCLUDED(mu) {
    if (due.empty()) return;
    for (Waiter* w : due) {
      w->mu->Lock();
      w->due = true;
      w->mu->Unlock();
    }
    absl::MutexLock l(&mu);
    for (Waiter* w : due) --w->pins;
  }

  /// The clock's own mutex (after any caller's mutex in the lock order).
  absl::Mutex mu;
  absl::Time wall ABSL_GUARDED_BY(mu);
  absl::Duration monotonic ABSL_GUARDED_BY(mu) = absl::ZeroDuration();
  /// Threads inside SleepFor() or AwaitWithDeadline() (past their fast path).
  /// A thread leaves this count as its last use of the clock.
  int waiters ABSL_GUARDED_BY(mu) = 0;
  /// Registered awaiters, in registration order.
  std::vector<Waiter*> awaiters ABSL_GUARDED_BY(mu);
  /// Set by the destructor: every wait ends at once.
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
};

// -- ManualClock --------------------------------------------------------------

ManualClock::ManualClock(absl::Time wall_start)
    : impl_(std::make_unique<Impl>(wall_start)) {}

/// Destroying a ManualClock while threads are blocked in it is a bug in the
/// caller; rather than freeing the state under them, the destructor logs a
/// warning, wakes them all (SleepFor returns early; AwaitWithDeadline returns
/// the value of its condition) and waits until they have left. Any later
/// call on the clock is undefined behaviour, as for any destroyed object.
ManualClock::~ManualClock() {
  Impl& s = *impl_;
  std::vector<Waiter*> due;
  int blocked = 0;
  {
    absl::MutexLock l(&s.mu);
    s.shutting_down = true;
    blocked = s.waiters;
    due = s.PickDue();
  }
  if (blocked == 0) return;
  FOREMAN_LOG_WARN("ManualClock destroyed while {} thread(s) were blocked in it; waking them",
                   blocked);
  s.Signal(due);
  absl::MutexLock l(&s.mu);
  s.mu.Await(absl::Condition(
      +[](Impl* impl) ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl->mu) { return impl->waiters == 0; },
      &s));
}

absl::Time ManualClock::WallNow() {
  absl::MutexLock l(&impl_->mu);
  return impl_->wall;
}

absl::Duration ManualClock::MonotonicNow() {
  absl::MutexLock l(&impl_->mu);
  return impl_->monotonic;
}

void ManualClock::SleepFor(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return;
  Impl& s = *impl_;
  absl::MutexLock l(&s.mu);
  const absl::Duration deadline = s.monotonic + d;
  ++s.waiters;
  auto reached = [&s, deadline]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    return s.shutting_down || s.monotonic >= deadline;
  };
  s.mu.Await(absl::Condition(&reached));
  --s.waiters;
}

// The analysis cannot follow `mu`, held on entry and on return but released
// and re-acquired on the rare path below.
bool ManualClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                    absl::Duration deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  mu->AssertHeld();
  if (cond.Eval()) return true;
  Impl& s = *impl_;
  Waiter w(mu, deadline);
  {
    absl::MutexLock l(&s.mu);
    if (s.shutting_down || s.monotonic >= deadline) return false;  // cond is false
    s.awaiters.push_back(&w);
    ++s.waiters;
  }

  // Wakes when another thread makes `cond` true and releases `mu`, or when
  // Advance() sets `due` under `mu`.
  auto ready = [&w, &cond]() { return w.due || cond.Eval(); };
  mu->Await(absl::Condition(&ready));

  bool pinned = false;
  {
    absl::MutexLock l(&s.mu);
    auto it = std::find(s.awaiters.begin(), s.awaiters.end(), &w);
    assert(it != s.awaiters.end());
    s.awaiters.erase(it);  // from here on no Advance() picks `w`
    pinned = w.pins > 0;
    if (!pinned) --s.waiters;
  }
  if (pinned) {
    // An Advance() picked `w` (so the deadline has come) and is about to lock
    // `mu`, or is waiting for it: let it finish with `w` and `mu` before they
    // can go away.
    mu->Unlock();
    {
      absl::MutexLock l(&s.mu);
      s.mu.Await(absl::Condition(
          +[](Waiter* waiter) { return waiter->pins == 0; }, &w));
      --s.waiters;
    }
    mu->Lock();
  }
  return cond.Eval();
}

void ManualClock::Advance(absl::Duration d) {
  assert(d >= absl::ZeroDuration() && "ManualClock::Advance: negative duration");
  if (d <= absl::ZeroDuration()) return;
  std::vector<Waiter*> due;
  {
    absl::MutexLock l(&impl_->mu);
    impl_->monotonic += d;
    impl_->wall += d;
    due = impl_->PickDue();
  }  // Releasing the mutex wakes the sleepers whose deadline has come.
  impl_->Signal(due);
}

void ManualClock::SetWallTime(absl::Time t) {
  absl::MutexLock l(&impl_->mu);
  impl_->wall = t;
}

int ManualClock::waiters() const {
  absl::MutexLock l(&impl_->mu);
  return impl_->waiters;
}

bool ManualClock::BlockUntilWaiters(int n, absl::Duration real_timeout) {
  Impl& s = *impl_;
  absl::MutexLock l(&s.mu);
  auto enough = [&s, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { return s.waiters >= n; };
  return s.mu.AwaitWithTimeout(absl::Condition(&enough), real_timeout);
}

}  // namespace foreman
