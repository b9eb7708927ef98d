// Clock::Real() and ManualClock (include/foreman/clock.hpp).
//
// ManualClock wakes two kinds of blocked threads when Advance() moves time:
//
//   sleepers  (SleepFor) wait on the clock's own mutex and condition
//             variable for the clock's time to reach their deadline;
//             Advance() notifies that condition variable.
//   waiters   (WaitUntil) wait on the *caller's* mutex and condition
//             variable, which the clock cannot see otherwise. Each registers
//             a Waiter (mutex, cv, deadline, `due` flag) in the clock and
//             waits for `pred() || waiter.due`. Advance() picks the waiters
//             whose deadline has come, pins them, releases the clock mutex,
//             then for each locks the waiter's mutex, sets `due`, notifies
//             the waiter's cv and unlocks (the technique of absl's
//             SimulatedClock, on standard condition variables).
//
// Lock order: a caller's mutex before the clock mutex, never the other way.
// A waiter holds its mutex while it registers and unregisters; Advance()
// never holds the clock mutex while it locks a waiter's mutex. A pinned
// Waiter (and its mutex and cv) stays alive until Advance() has unpinned it:
// the waiter waits for that before it returns.
//
// Only foreman::Mutex (a std::mutex) and standard condition variables here
// (pthread underneath, which ThreadSanitizer intercepts). What the analysis
// cannot follow (a Waiter's fields under the clock mutex) is said in
// comments.
#include "foreman/clock.hpp"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <set>
#include <vector>

#include "absl/time/clock.h"
#include "platform/log.hpp"

namespace foreman {

namespace {

/// Longest single std::chrono wait; longer ones are cut into pieces of this
/// size, so that a steady_clock time point never overflows (an
/// absl::InfiniteDuration deadline included).
constexpr absl::Duration kMaxChronoWait = absl::Hours(24 * 365);

/// `d` (>= 0 and finite: at most a time since the clock's origin plus
/// kMaxChronoWait) as a steady_clock duration, rounded up to a whole tick so
/// that a wait for it never ends before `d`.
std::chrono::steady_clock::duration ToSteadyDuration(absl::Duration d) {
  return std::chrono::ceil<std::chrono::steady_clock::duration>(
      absl::ToChronoNanoseconds(absl::Ceil(d, absl::Nanoseconds(1))));
}

}  // namespace

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

  bool WaitUntil(Mutex& mu, std::condition_variable_any& cv, absl::Duration deadline,
                 const std::function<bool()>& pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override {
    return Wait(mu, cv, deadline, pred);
  }

 private:
  /// WaitUntil on `lock` (held; a Mutex or a std::unique_lock) and `cv`
  /// (whose wait_until takes `lock`).
  template <typename Lock, typename CondVar>
  bool Wait(Lock& lock, CondVar& cv, absl::Duration deadline, const std::function<bool()>& pred) {
    // MonotonicNow() is steady_clock time since origin_, so the deadline on
    // steady_clock is origin_ + deadline. Loop on spurious wake-ups and on
    // the pieces of a wait longer than kMaxChronoWait.
    for (;;) {
      if (pred()) return true;
      const absl::Duration now = MonotonicNow();
      if (now >= deadline) return false;
      const absl::Duration until = now + std::min(deadline - now, kMaxChronoWait);
      cv.wait_until(lock, origin_ + ToSteadyDuration(until));
    }
  }

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

/// One thread blocked in ManualClock::WaitUntil(). Lives on that thread's
/// stack.
struct Waiter {
  explicit Waiter(absl::Duration d) : deadline(d) {}
  virtual ~Waiter() = default;

  /// Locks the caller's mutex, sets `due`, notifies the caller's condition
  /// variable, unlocks. REQUIRES: the clock mutex not held.
  virtual void Wake() = 0;

  /// Monotonic deadline.
  const absl::Duration deadline;
  /// Picked by Advance() once; it will not be picked again. Guarded by the
  /// clock mutex.
  bool picked = false;
  /// Number of Advance() calls that hold a pointer to this waiter outside the
  /// clock mutex. Guarded by the clock mutex.
  int pins = 0;
};

/// A waiter on a foreman::Mutex and a std::condition_variable_any.
struct MutexWaiter final : Waiter {
  MutexWaiter(Mutex* m, std::condition_variable_any* c, absl::Duration d)
      : Waiter(d), mu(m), cv(c) {}
  void Wake() override {
    MutexLock l(*mu);
    due = true;
    cv->notify_all();
  }

  /// The caller's mutex and condition variable.
  Mutex* const mu;
  std::condition_variable_any* const cv;
  /// Set by Advance() (or the destructor) once the deadline has come.
  bool due ABSL_GUARDED_BY(mu) = false;
};

}  // namespace

struct ManualClock::Impl {
  explicit Impl(absl::Time wall_start) : wall(wall_start) {}

  /// Picks the registered waiters whose deadline has come (all of them once
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

  /// Sets `due` on each picked waiter under its own mutex and notifies its
  /// condition variable, then unpins it. The clock mutex must not be held: a
  /// waiter's mutex comes first in the lock order.
  void Signal(const std::vector<Waiter*>& due) ABSL_LOCKS_EXCLUDED(mu) {
    if (due.empty()) return;
    for (Waiter* w : due) w->Wake();
    {
      MutexLock l(mu);
      for (Waiter* w : due) --w->pins;
    }
    changed.notify_all();
  }

  /// Registers `w` (false, and nothing registered, when its deadline has
  /// already come or the clock is shutting down).
  bool Register(Waiter* w) ABSL_LOCKS_EXCLUDED(mu) {
    MutexLock l(mu);
    if (shutting_down || monotonic >= w->deadline) return false;
    awaiters.push_back(w);
    ++waiters;
    changed.notify_all();
    return true;
  }

  /// Unregisters `w`: from here on no Advance() picks it. Returns true when an
  /// Advance() still holds it (pinned): the waiter must then release its own
  /// mutex and call AwaitUnpinned(w) before it returns.
  bool Unregister(Waiter* w) ABSL_LOCKS_EXCLUDED(mu) {
    MutexLock l(mu);
    auto it = std::find(awaiters.begin(), awaiters.end(), w);
    assert(it != awaiters.end());
    awaiters.erase(it);
    if (w->pins > 0) return true;
    --waiters;
    changed.notify_all();  // under the mutex: see SleepFor()
    return false;
  }

  /// Waits until no Advance() holds `w` any more, then leaves the clock.
  /// REQUIRES: the waiter's own mutex not held (Advance() locks it).
  void AwaitUnpinned(Waiter* w) ABSL_LOCKS_EXCLUDED(mu) {
    MutexLock l(mu);
    while (w->pins != 0) changed.wait(l);
    --waiters;
    changed.notify_all();
  }

  /// The clock's own mutex (after any caller's mutex in the lock order).
  Mutex mu;
  /// Notified (after `mu` is released) whenever the time moves, `waiters`
  /// changes, a pin is released or `shutting_down` is set.
  std::condition_variable_any changed;
  absl::Time wall ABSL_GUARDED_BY(mu);
  absl::Duration monotonic ABSL_GUARDED_BY(mu) = absl::ZeroDuration();
  /// Threads inside SleepFor() or WaitUntil() (past their fast path). A
  /// thread leaves this count as its last use of the clock.
  int waiters ABSL_GUARDED_BY(mu) = 0;
  /// Registered waiters, in registration order.
  std::vector<Waiter*> awaiters ABSL_GUARDED_BY(mu);
  /// Deadlines of the threads in SleepFor().
  std::multiset<absl::Duration> sleepers ABSL_GUARDED_BY(mu);

  /// Threads blocked for a deadline that has not come yet: a thread an
  /// Advance() has already released but that has not run yet is not counted.
  int Pending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (shutting_down) return 0;
    int n = static_cast<int>(std::distance(sleepers.upper_bound(monotonic), sleepers.end()));
    for (const Waiter* w : awaiters) n += !w->picked && w->deadline > monotonic;
    return n;
  }
  /// Set by the destructor: every wait ends at once.
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
};

// -- ManualClock --------------------------------------------------------------

ManualClock::ManualClock(absl::Time wall_start)
    : impl_(std::make_unique<Impl>(wall_start)) {}

/// Destroying a ManualClock while threads are blocked in it is a bug in the
/// caller; rather than freeing the state under them, the destructor logs a
/// warning, wakes them all (SleepFor returns early; WaitUntil returns the
/// value of its predicate) and waits until they have left. Any later call on
/// the clock is undefined behaviour, as for any destroyed object.
ManualClock::~ManualClock() {
  Impl& s = *impl_;
  std::vector<Waiter*> due;
  int blocked = 0;
  {
    MutexLock l(s.mu);
    s.shutting_down = true;
    blocked = s.waiters;
    due = s.PickDue();
  }
  if (blocked == 0) return;
  FOREMAN_LOG_WARN("ManualClock destroyed while {} thread(s) were blocked in it; waking them",
                   blocked);
  s.changed.notify_all();  // the sleepers
  s.Signal(due);           // the waiters
  MutexLock l(s.mu);
  while (s.waiters != 0) s.changed.wait(l);
}

absl::Time ManualClock::WallNow() {
  MutexLock l(impl_->mu);
  return impl_->wall;
}

absl::Duration ManualClock::MonotonicNow() {
  MutexLock l(impl_->mu);
  return impl_->monotonic;
}

void ManualClock::SleepFor(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return;
  Impl& s = *impl_;
  MutexLock l(s.mu);
  const absl::Duration deadline = s.monotonic + d;
  ++s.waiters;
  auto sleeper = s.sleepers.insert(deadline);
  s.changed.notify_all();
  while (!s.shutting_down && s.monotonic < deadline) s.changed.wait(l);
  s.sleepers.erase(sleeper);
  --s.waiters;
  // Notified under the mutex: once it is released, the destructor may free
  // `s` (this is the thread's last use of the clock).
  s.changed.notify_all();
}

bool ManualClock::WaitUntil(Mutex& mu, std::condition_variable_any& cv, absl::Duration deadline,
                            const std::function<bool()>& pred) {
  if (pred()) return true;
  Impl& s = *impl_;
  MutexWaiter w(&mu, &cv, deadline);
  w.mu->AssertHeld();  // w.mu is &mu, which the caller holds
  if (!s.Register(&w)) return false;  // pred() is false

  // Unregisters `w`; called with `mu` held, which it may release for a while.
  const auto leave = [&s, &w, &mu]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (s.Unregister(&w)) {
      // An Advance() picked `w` (so the deadline has come) and is about to
      // lock the mutex, or is waiting for it: let it finish with `w`, the
      // mutex and `cv` before they can go away.
      mu.Unlock();
      s.AwaitUnpinned(&w);
      mu.Lock();
    }
  };

  // Wakes when another thread changes the state under the mutex and notifies
  // `cv`, or when Advance() sets `due` under the mutex and notifies `cv`.
  try {
    while (!w.due && !pred()) cv.wait(mu);
  } catch (...) {  // from pred(): `w` must not stay registered
    leave();
    throw;
  }
  leave();
  return pred();
}

void ManualClock::Advance(absl::Duration d) {
  assert(d >= absl::ZeroDuration() && "ManualClock::Advance: negative duration");
  if (d <= absl::ZeroDuration()) return;
  Impl& s = *impl_;
  std::vector<Waiter*> due;
  {
    MutexLock l(s.mu);
    s.monotonic += d;
    s.wall += d;
    due = s.PickDue();
  }
  s.changed.notify_all();  // wakes the sleepers whose deadline has come
  s.Signal(due);
}

void ManualClock::SetWallTime(absl::Time t) {
  MutexLock l(impl_->mu);
  impl_->wall = t;
}

int ManualClock::waiters() const {
  MutexLock l(impl_->mu);
  return impl_->waiters;
}

bool ManualClock::BlockUntilWaiters(int n, absl::Duration real_timeout) {
  Impl& s = *impl_;
  MutexLock l(s.mu);
  const auto enough = [&s, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) { return s.Pending() >= n; };
  const absl::Duration timeout =
      std::clamp(real_timeout, absl::ZeroDuration(), kMaxChronoWait);
  return s.changed.wait_until(l, std::chrono::steady_clock::now() + ToSteadyDuration(timeout),
                              enough);
}

}  // namespace foreman
