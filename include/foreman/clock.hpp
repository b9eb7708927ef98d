// Clock: Foreman's one time source (design.md §6). Every timing decision
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
// Usage, waiting for a condition or a deadline, whichever comes first:
//   absl::MutexLock l(&mu_);
//   bool done = clock->AwaitWithDeadline(&mu_, absl::Condition(&stop_requested_),
//                                        clock->MonotonicNow() + absl::Seconds(5));
//
// (TF has no such seam: its hooks call time.time(); model: absl's
// clock_interface / SimulatedClock.) All methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/synchronization/mutex.h"
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

  /// Blocks until `cond` is true or MonotonicNow() >= `deadline`, and returns
  /// the value of `cond` at return. `mu` is held on entry and on return and is
  /// released while waiting; `cond` is evaluated with `mu` held, and
  /// re-evaluated whenever `mu` is released by another thread (absl::Mutex
  /// semantics) and whenever this clock's time advances.
  /// REQUIRES: the caller holds `mu`.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                 absl::Duration deadline) = 0;

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
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                         absl::Duration deadline) override;

  /// Moves both time lines forward by `d` (>= 0) and wakes every sleeper or
  /// waiter whose deadline has come.
  void Advance(absl::Duration d);
  /// Sets wall time only (a wall clock may jump, even backwards); monotonic
  /// time is unchanged.
  void SetWallTime(absl::Time t);

  /// Threads blocked in SleepFor() or AwaitWithDeadline() right now.
  int waiters() const;
  /// Blocks (in real time) until at least `n` threads are blocked in this
  /// clock, or `real_timeout` passes; returns whether they are. Lets a test
  /// advance time only once the code under test is waiting.
  bool BlockUntilWaiters(int n, absl::Duration real_timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace foreman
