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
// state is guarded by a foreman::Mutex (foreman/mutex.hpp), and whoever
// changes it notifies a std::condition_variable_any:
//
//   ```cpp
//   #include <condition_variable>
//   #include <thread>
//   #include "foreman/clock.hpp"
//   #include "foreman/mutex.hpp"
//   foreman::Clock* clock = foreman::Clock::Real();
//   foreman::Mutex mu;
//   std::condition_variable_any cv;
//   bool stop_requested = false;  // guarded by mu
//   std::thread another_thread([&] {
//     {
//       foreman::MutexLock l(mu);
//       stop_requested = true;
//     }
//     cv.notify_all();
//   });
//   bool stopped;
//   {  // the waiter: true once stop_requested, false at the deadline
//     foreman::MutexLock l(mu);
//     stopped = clock->WaitUntil(mu, cv, clock->MonotonicNow() + absl::Seconds(5),
//                                [&] { return stop_requested; });
//   }
//   another_thread.join();
//   ```
//
// Foreman synchronises only with foreman::Mutex (a std::mutex) and standard
// condition variables (pthread underneath, which ThreadSanitizer
// understands), never with absl::Mutex: Debian's Abseil is not instrumented.
//
// (TF has no such seam: its hooks call time.time(); model: absl's
// clock_interface / SimulatedClock.) All methods are thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "foreman/mutex.hpp"

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
  /// The caller holds `mu` on entry and on return; it is released while
  /// waiting, as std::condition_variable_any::wait does; `pred` is only ever
  /// evaluated with `mu` held. `pred` is re-evaluated when `cv` is notified,
  /// so whoever changes the state `pred` reads must do so under `mu` and then
  /// notify `cv` (notify_all when several threads may wait on it); and when
  /// this clock's time passes `deadline`, on which the clock itself locks `mu`
  /// and notifies `cv`. Spurious wake-ups are absorbed. `mu` and `cv` must
  /// outlive the call (they may be destroyed as soon as it returns). An
  /// exception from `pred` propagates, with `mu` held.
  virtual bool WaitUntil(Mutex& mu, std::condition_variable_any& cv, absl::Duration deadline,
                         const std::function<bool()>& pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

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
  bool WaitUntil(Mutex& mu, std::condition_variable_any& cv, absl::Duration deadline,
                 const std::function<bool()>& pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) override;

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
