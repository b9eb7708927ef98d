// Mutex and MutexLock: std::mutex with Clang's thread-safety annotations, so
// that members marked ABSL_GUARDED_BY(mu_) and functions marked
// ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) are checked at compile time
// (clang -Wthread-safety; libforeman builds with -Werror=thread-safety under
// clang; GCC ignores the annotations).
//
// Usage:
//
//   ```cpp
//   class Counter {
//    public:
//     void Add(int n) ABSL_LOCKS_EXCLUDED(mu_) {
//       {
//         foreman::MutexLock l(mu_);
//         AddLocked(n);
//       }
//       cv_.notify_all();
//     }
//     // Waits up to `timeout` for the count to reach `n`.
//     bool AwaitAtLeast(int n, foreman::Clock* clock, absl::Duration timeout) {
//       foreman::MutexLock l(mu_);
//       return clock->WaitUntil(mu_, cv_, clock->MonotonicNow() + timeout,
//                               [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return count_ >= n; });
//     }
//    private:
//     void AddLocked(int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { count_ += n; }
//     foreman::Mutex mu_;
//     std::condition_variable_any cv_;  // notified when count_ grows
//     int count_ ABSL_GUARDED_BY(mu_) = 0;
//   };
//
//   Counter counter;
//   std::thread adder([&] { counter.Add(2); });
//   bool reached = counter.AwaitAtLeast(2, foreman::Clock::Real(), absl::Seconds(5));
//   adder.join();
//   ```
//
// Condition variables: std::condition_variable_any, waiting on the Mutex
// itself or on a MutexLock (both are BasicLockable): `cv_.wait(l)`. The
// analysis does not see inside the wait (it unlocks and relocks), so to it
// the mutex stays held across the call, which is what the caller observes.
// A predicate lambda is analysed on its own: annotate it
// `[&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ... }`, or write the wait as
// `while (!cond) cv_.wait(l);`.
//
// Why not absl::Mutex: Debian's Abseil is not built with ThreadSanitizer, so
// TSan sees none of absl::Mutex's happens-before edges and reports every
// access it guards as a race. Mutex is a
// std::mutex (pthread underneath, which TSan intercepts) with annotations.
#pragma once

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace foreman {

/// A non-recursive exclusive lock: std::mutex with capability annotations.
/// Not copyable or movable. Thread-safe: that is what it is for. Locking a
/// Mutex the calling thread already holds, or unlocking one it does not hold,
/// is undefined behaviour (as for std::mutex); the analysis reports both when
/// it can see them. A Mutex must not be destroyed while held or waited on.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  /// Blocks until the calling thread holds the mutex.
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  /// Releases the mutex. REQUIRES: held by the calling thread.
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  /// Takes the mutex if it is free and returns true; returns false at once
  /// otherwise (it may also fail spuriously, as std::mutex::try_lock).
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }

  /// Tells the analysis that the calling thread holds the mutex (for code it
  /// cannot follow: a mutex reached through another pointer, a callback).
  /// Checks nothing at run time: std::mutex cannot say who holds it.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  /// The standard Lockable spellings of Lock/Unlock/TryLock, so that
  /// std::unique_lock<Mutex>, std::scoped_lock and
  /// std::condition_variable_any work with a Mutex. Prefer MutexLock: the
  /// analysis does not know what std::unique_lock holds.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool try_lock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }

 private:
  std::mutex mu_;
};

/// Holds a Mutex for its scope (std::lock_guard with annotations), and may
/// release it early and take it again (std::unique_lock's unlock/lock).
/// BasicLockable, so std::condition_variable_any can wait on it:
///
///   foreman::MutexLock l(mu_);
///   while (!ready_) cv_.wait(l);   // releases mu_ while blocked
///
/// The Mutex must outlive the MutexLock. A MutexLock belongs to the thread
/// that made it; it is not copyable or movable.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  /// Blocks until the calling thread holds `mu`.
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.Lock(); }
  /// Releases the mutex if this lock holds it.
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  /// Releases the mutex before the end of the scope. REQUIRES: held by this
  /// lock.
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    held_ = false;
    mu_.Unlock();
  }
  /// Takes the mutex again after Unlock(). REQUIRES: not held by this lock.
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_.Lock();
    held_ = true;
  }

  /// BasicLockable spellings of Lock/Unlock, for std::condition_variable_any.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { Lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { Unlock(); }

 private:
  Mutex& mu_;
  bool held_ = true;
};

}  // namespace foreman
