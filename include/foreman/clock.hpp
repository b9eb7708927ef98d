// Clock: Foreman's one time source. Every timing decision
// (SecondOrStepTimer, save/summary/flush intervals, grace periods, back-off,
// worker polls) asks a Clock, so tests drive time with a ManualClock and
// never sleep.
//
// Two time lines:
//   WallNow()       absl::Time, seconds since the epoch: event wall_time,
//                   checkpoint timestamps, file names. May jump.
//   MonotonicNow()  absl::Duration since an arbitrary origin: intervals and
//                   deadlines. Never goes back.
//
// Usage, waiting for a condition or a deadline, whichever comes first. The
// state is guarded by a std::mutex, and whoever changes it notifies a
// std::condition_variable:
//
//   // waiter
//   std::unique_lock<std::mutex> lock(mu_);
//   bool stopped = clock->WaitUntil(lock, cv_, clock->MonotonicNow() + absl::Seconds(5),
//                                   [this] { return stop_requested_; });
//
//   // another thread
//   {
//     std::lock_guard<std::mutex> l(mu_);
//     stop_requested_ = true;
//   }
//   cv_.notify_all();
//
// Foreman synchronises only with std::mutex / std::condition_variable
// (pthread underneath, which ThreadSanitizer understands), never with
// absl::Mutex: Debian's Abseil is not instrumented.
//
// (TF has no such seam: its hooks call time.time(); model: absl's
// clock_interface / SimulatedClock.) All methods are thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/time/time.h"

namespace foreman {

class Clock {
 public:
  virtual ~Clock() = default;

  /// The real clock (CLOCK_REALTIME / CLOCK_MONOTONIC). Never deleted.
  static Clock* Real();

  /// Wall-clock time.
  virtual absl::Time WallNow() = 0;
  /// Monotonic time since an arbitrary origin fixed for the clock's life.
  virtual absl::Duration MonotonicNow() = 0;
  /// Blocks the calling thread for `d` of this clock's time (returns at once
  /// for d <= 0).
  virtual void SleepFor(absl::Duration d) = 0;

  /// Blocks until `pred()` is true or MonotonicNow() >= `deadline`, and
  /// returns the value of `pred()` at return (so true means the condition
  /// holds, false that the deadline came first).
  ///
  /// `lock` owns its mutex on entry and on return, and releases it while
  /// waiting, as std::condition_variable::wait does; `pred` is only ever
  /// evaluated with the mutex held. `pred` is re-evaluated when `cv` is
  /// notified, so whoever changes the state `pred` reads must do so under the
  /// mutex and then notify `cv` (notify_all when several threads may wait on
  /// it); and when this clock's time passes `deadline`, on which the clock
  /// itself locks the mutex and notifies `cv`. Spurious wake-ups are absorbed.
  /// `lock`'s mutex and `cv` must outlive the call (they may be destroyed as
  /// soon as it returns). An exception from `pred` propagates, with the lock
  /// owning its mutex.
  /// REQUIRES: lock.owns_lock().
  virtual bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                         absl::Duration deadline, const std::function<bool()>& pred) = 0;

  /// Seconds since the epoch as a double (TF's time.time(); event wall_time).
  double WallSeconds() { return absl::ToDoubleSeconds(WallNow() - absl::UnixEpoch()); }
};

/// A clock that moves only when a test advances it. Sleepers and waiters wake
/// when their deadline is reached by Advance().
class ManualClock : public Clock {
 public:
  /// Starts at wall time `wall_start` and monotonic time 0.
  explicit ManualClock(absl::Time wall_start = absl::FromUnixSeconds(1700000000));
  ~ManualClock() override;

  absl::Time WallNow() override;
  absl::Duration MonotonicNow() override;
  void SleepFor(absl::Duration d) override;
  /// Wakes at the Advance() that reaches `deadline` (see Clock::WaitUntil).
  bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 absl::Duration deadline, const std::function<bool()>& pred) override;

  /// Moves both time lines forward by `d` (>= 0) and wakes every sleeper or
  /// waiter whose deadline has come.
  void Advance(absl::Duration d);
  /// Sets wall time only (a wall clock may jump, even backwards); monotonic
  /// time is unchanged.
  void SetWallTime(absl::Time t);

  /// Threads blocked in SleepFor() or WaitUntil() right now.
  int waiters() const;
  /// Blocks (in real time) until at least `n` threads are blocked in this
  /// clock for a deadline still in the future, or `real_timeout` passes;
  /// returns whether they are. Lets a test advance time only once the code
  /// under test is waiting. A thread that an Advance() has released but that
  /// has not run yet is not counted (waiters() still counts it), so
  /// "BlockUntilWaiters(1); Advance(d);" in a loop never advances twice for
  /// one wait.
  bool BlockUntilWaiters(int n, absl::Duration real_timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace foreman
