// Tests for Clock::Real() and ManualClock (include/foreman/clock.hpp).
//
// ManualClock tests never sleep: a test waits (in bounded real time) until the
// thread under test is blocked in the clock, then moves time by hand. Every
// thread a test starts is woken and joined at the end even when a check
// fails, so a failure is reported rather than hung.
#include "foreman/clock.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include <doctest/doctest.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace foreman {
namespace {

/// Bound on every real-time wait for another thread; generous, since it is
/// only reached when a test fails.
constexpr absl::Duration kRealTimeout = absl::Seconds(10);

/// Runs `fn` on a new thread; joins it on destruction.
class Background {
 public:
  explicit Background(std::function<void()> fn)
      : thread_([this, fn = std::move(fn)] {
          fn();
          done_.Notify();
        }) {}
  ~Background() { thread_.join(); }

  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  /// Whether `fn` has returned, waiting for it at most `timeout` (real time).
  bool WaitDone(absl::Duration timeout) { return done_.WaitForNotificationWithTimeout(timeout); }
  /// Whether `fn` has returned, without waiting.
  bool Done() const { return done_.HasBeenNotified(); }

 private:
  absl::Notification done_;
  std::thread thread_;
};

/// A flag that a thread waits for with AwaitWithDeadline.
struct Flag {
  absl::Mutex mu;
  bool value ABSL_GUARDED_BY(mu) = false;

  void Set() {
    absl::MutexLock l(&mu);
    value = true;
  }
};

/// Far enough to pass any deadline a test uses; a failing test calls it
/// before joining its threads.
constexpr absl::Duration kForever = absl::Hours(24 * 365);

// -- ManualClock: time ---------------------------------------------------------

TEST_CASE("A ManualClock starts at its wall start time and at monotonic zero") {
  const absl::Time start = absl::FromUnixSeconds(1234567890);
  ManualClock clock(start);
  CHECK(clock.WallNow() == start);
  CHECK(clock.MonotonicNow() == absl::ZeroDuration());
  CHECK(clock.waiters() == 0);

  ManualClock default_clock;
  CHECK(default_clock.WallNow() == absl::FromUnixSeconds(1700000000));
  CHECK(default_clock.WallSeconds() == doctest::Approx(1700000000.0));
}

TEST_CASE("Advance moves the wall and the monotonic time forward together") {
  ManualClock clock;
  const absl::Time wall0 = clock.WallNow();
  clock.Advance(absl::Milliseconds(1500));
  CHECK(clock.MonotonicNow() == absl::Milliseconds(1500));
  CHECK(clock.WallNow() == wall0 + absl::Milliseconds(1500));
  CHECK(clock.WallSeconds() == doctest::Approx(1700000001.5));
  clock.Advance(absl::ZeroDuration());
  CHECK(clock.MonotonicNow() == absl::Milliseconds(1500));
}

TEST_CASE("SetWallTime moves only the wall time, even backwards") {
  ManualClock clock;
  clock.Advance(absl::Seconds(10));
  const absl::Time earlier = absl::FromUnixSeconds(1000);
  clock.SetWallTime(earlier);
  CHECK(clock.WallNow() == earlier);
  CHECK(clock.MonotonicNow() == absl::Seconds(10));
  clock.Advance(absl::Seconds(1));
  CHECK(clock.WallNow() == earlier + absl::Seconds(1));
  CHECK(clock.MonotonicNow() == absl::Seconds(11));
}

TEST_CASE("BlockUntilWaiters gives up after its real timeout when too few threads wait") {
  ManualClock clock;
  CHECK(clock.BlockUntilWaiters(0, absl::ZeroDuration()));
  CHECK_FALSE(clock.BlockUntilWaiters(1, absl::Milliseconds(20)));
}

// -- ManualClock: SleepFor ---------------------------------------------------------

TEST_CASE("SleepFor returns only once Advance reaches its deadline") {
  ManualClock clock;
  Background sleeper([&] { clock.SleepFor(absl::Seconds(10)); });
  CHECK(clock.BlockUntilWaiters(1, kRealTimeout));

  clock.Advance(absl::Seconds(4));
  CHECK(clock.BlockUntilWaiters(1, kRealTimeout));
  CHECK(clock.waiters() == 1);
  CHECK_FALSE(sleeper.Done());

  clock.Advance(absl::Seconds(5));
  CHECK(clock.waiters() == 1);
  CHECK_FALSE(sleeper.Done());

  clock.Advance(absl::Seconds(1));
  CHECK(sleeper.WaitDone(kRealTimeout));
  CHECK(clock.waiters() == 0);
  CHECK(clock.MonotonicNow() == absl::Seconds(10));

  if (!sleeper.Done()) clock.Advance(kForever);
}

TEST_CASE("SleepFor with a zero or negative duration returns at once") {
  ManualClock clock;
  Background sleeper([&] {
    clock.SleepFor(absl::ZeroDuration());
    clock.SleepFor(absl::Seconds(-3));
  });
  CHECK(sleeper.WaitDone(kRealTimeout));
  CHECK(clock.MonotonicNow() == absl::ZeroDuration());
  if (!sleeper.Done()) clock.Advance(kForever);
}

TEST_CASE("Sleepers wake one by one as Advance passes each deadline") {
  ManualClock clock;
  Background short_sleeper([&] { clock.SleepFor(absl::Seconds(1)); });
  Background long_sleeper([&] { clock.SleepFor(absl::Seconds(3)); });
  CHECK(clock.BlockUntilWaiters(2, kRealTimeout));

  clock.Advance(absl::Seconds(2));
  CHECK(short_sleeper.WaitDone(kRealTimeout));
  CHECK(clock.waiters() == 1);
  CHECK_FALSE(long_sleeper.Done());

  clock.Advance(absl::Seconds(1));
  CHECK(long_sleeper.WaitDone(kRealTimeout));
  CHECK(clock.waiters() == 0);

  clock.Advance(kForever);
}

TEST_CASE("SetWallTime does not wake a sleeper") {
  ManualClock clock;
  Background sleeper([&] { clock.SleepFor(absl::Seconds(1)); });
  CHECK(clock.BlockUntilWaiters(1, kRealTimeout));
  clock.SetWallTime(clock.WallNow() + absl::Hours(1));
  CHECK(clock.waiters() == 1);
  CHECK_FALSE(sleeper.Done());
  clock.Advance(absl::Seconds(1));
  CHECK(sleeper.WaitDone(kRealTimeout));
  clock.Advance(kForever);
}

// -- ManualClock: AwaitWithDeadline ------------------------------------------------

TEST_CASE("AwaitWithDeadline returns true when another thread makes the condition true") {
  ManualClock clock;
  Flag flag;
  std::atomic<int> result{-1};
  Background waiter([&] {
    absl::MutexLock l(&flag.mu);
    const bool r = clock.AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value),
                                           clock.MonotonicNow() + absl::Seconds(10));
    flag.mu.AssertHeld();
    result = r ? 1 : 0;
  });
  CHECK(clock.BlockUntilWaiters(1, kRealTimeout));
  flag.Set();  // takes the mutex: the waiter released it while waiting
  CHECK(waiter.WaitDone(kRealTimeout));
  CHECK(result.load() == 1);
  CHECK(clock.waiters() == 0);
  CHECK(clock.MonotonicNow() == absl::ZeroDuration());
  clock.Advance(kForever);
}

TEST_CASE("AwaitWithDeadline returns false once Advance passes the deadline") {
  ManualClock clock;
  Flag flag;
  std::atomic<int> result{-1};
  Background waiter([&] {
    absl::MutexLock l(&flag.mu);
    const bool r = clock.AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value),
                                           clock.MonotonicNow() + absl::Seconds(5));
    flag.mu.AssertHeld();
    result = r ? 1 : 0;
  });
  CHECK(clock.BlockUntilWaiters(1, kRealTimeout));

  clock.Advance(absl::Seconds(3));
  CHECK(clock.BlockUntilWaiters(1, kRealTimeout));
  CHECK_FALSE(waiter.Done());
  CHECK(result.load() == -1);

  clock.Advance(absl::Seconds(2));
  CHECK(waiter.WaitDone(kRealTimeout));
  CHECK(result.load() == 0);
  CHECK(clock.waiters() == 0);

  if (!waiter.Done()) {
    flag.Set();
    clock.Advance(kForever);
  }
}

TEST_CASE("AwaitWithDeadline returns true at once when the condition already holds") {
  ManualClock clock;
  Flag flag;
  flag.Set();
  absl::MutexLock l(&flag.mu);
  CHECK(clock.AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value), absl::Seconds(10)));
  CHECK(clock.AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value), absl::ZeroDuration()));
  CHECK(clock.waiters() == 0);
}

TEST_CASE("AwaitWithDeadline with a deadline already reached returns false at once") {
  ManualClock clock;
  clock.Advance(absl::Seconds(5));
  Flag flag;
  absl::MutexLock l(&flag.mu);
  CHECK_FALSE(clock.AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value), absl::Seconds(2)));
  CHECK_FALSE(clock.AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value), absl::Seconds(5)));
  CHECK(clock.waiters() == 0);
}

TEST_CASE("Advance wakes only the awaiters whose deadline has come") {
  ManualClock clock;
  Flag early_flag, late_flag;
  std::atomic<int> early_result{-1}, late_result{-1};
  Background early([&] {
    absl::MutexLock l(&early_flag.mu);
    early_result = clock.AwaitWithDeadline(&early_flag.mu, absl::Condition(&early_flag.value),
                                           absl::Seconds(1));
  });
  Background late([&] {
    absl::MutexLock l(&late_flag.mu);
    late_result = clock.AwaitWithDeadline(&late_flag.mu, absl::Condition(&late_flag.value),
                                          absl::Seconds(5));
  });
  CHECK(clock.BlockUntilWaiters(2, kRealTimeout));

  clock.Advance(absl::Seconds(2));
  CHECK(early.WaitDone(kRealTimeout));
  CHECK(early_result.load() == 0);
  CHECK(clock.waiters() == 1);
  CHECK_FALSE(late.Done());

  late_flag.Set();
  CHECK(late.WaitDone(kRealTimeout));
  CHECK(late_result.load() == 1);
  CHECK(clock.waiters() == 0);

  early_flag.Set();
  clock.Advance(kForever);
}

TEST_CASE("Two awaiters on one mutex both wake when their deadlines pass") {
  ManualClock clock;
  Flag flag;
  std::atomic<int> results{0};
  auto wait = [&](absl::Duration deadline) {
    absl::MutexLock l(&flag.mu);
    if (!clock.AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value), deadline)) ++results;
  };
  Background a([&] { wait(absl::Seconds(1)); });
  Background b([&] { wait(absl::Seconds(2)); });
  CHECK(clock.BlockUntilWaiters(2, kRealTimeout));
  clock.Advance(absl::Seconds(2));
  CHECK(a.WaitDone(kRealTimeout));
  CHECK(b.WaitDone(kRealTimeout));
  CHECK(results.load() == 2);
  flag.Set();
  clock.Advance(kForever);
}

TEST_CASE("An awaiter may destroy its mutex as soon as AwaitWithDeadline returns") {
  // The condition and the deadline race: when Advance has picked the waiter
  // but the condition wakes it first, the waiter must not return while Advance
  // is about to lock its mutex. Without that guard this loop reliably ends in
  // a use after free in an ASan build (-Db_sanitize=address); a plain build
  // rarely notices.
  ManualClock clock;
  for (int i = 0; i < 3000; ++i) {
    auto flag = std::make_shared<Flag>();
    Flag* f = flag.get();
    // The waiter holds the only reference and drops it right after returning.
    Background waiter([&clock, flag = std::move(flag)]() mutable {
      {
        absl::MutexLock l(&flag->mu);
        clock.AwaitWithDeadline(&flag->mu, absl::Condition(&flag->value),
                                clock.MonotonicNow() + absl::Milliseconds(1));
      }
      flag.reset();
    });
    CHECK(clock.BlockUntilWaiters(1, kRealTimeout));
    f->Set();  // last use of the flag by this thread
    clock.Advance(absl::Milliseconds(1));
    CHECK(waiter.WaitDone(kRealTimeout));
  }
  CHECK(clock.waiters() == 0);
}

TEST_CASE("Destroying a ManualClock wakes the threads still blocked in it") {
  auto clock = std::make_unique<ManualClock>();
  Flag flag;
  std::atomic<int> result{-1};
  Background sleeper([&] { clock->SleepFor(absl::Hours(1)); });
  Background waiter([&] {
    absl::MutexLock l(&flag.mu);
    result = clock->AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value), absl::Hours(1));
  });
  CHECK(clock->BlockUntilWaiters(2, kRealTimeout));
  clock.reset();  // returns once both threads have left the clock
  CHECK(sleeper.WaitDone(kRealTimeout));
  CHECK(waiter.WaitDone(kRealTimeout));
  CHECK(result.load() == 0);
}

// -- Clock::Real() -----------------------------------------------------------------

TEST_CASE("Clock::Real() is one clock whose wall time is the system's") {
  Clock* real = Clock::Real();
  REQUIRE(real != nullptr);
  CHECK(Clock::Real() == real);
  const absl::Time before = absl::Now();
  const absl::Time wall = real->WallNow();
  const absl::Time after = absl::Now();
  CHECK(before <= wall);
  CHECK(wall <= after);
  CHECK(real->WallSeconds() > 1.6e9);
}

TEST_CASE("The real monotonic time never decreases") {
  Clock* real = Clock::Real();
  absl::Duration last = real->MonotonicNow();
  CHECK(last >= absl::ZeroDuration());
  for (int i = 0; i < 10000; ++i) {
    const absl::Duration now = real->MonotonicNow();
    REQUIRE(now >= last);
    last = now;
  }
}

TEST_CASE("Real SleepFor sleeps at least the duration asked") {
  Clock* real = Clock::Real();
  const absl::Duration start = real->MonotonicNow();
  real->SleepFor(absl::Milliseconds(5));
  CHECK(real->MonotonicNow() - start >= absl::Milliseconds(5));
  real->SleepFor(absl::Seconds(-1));  // returns at once
}

TEST_CASE("Real AwaitWithDeadline times out after the deadline and returns false") {
  Clock* real = Clock::Real();
  Flag flag;
  absl::MutexLock l(&flag.mu);
  const absl::Duration start = real->MonotonicNow();
  CHECK_FALSE(real->AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value),
                                      start + absl::Milliseconds(20)));
  const absl::Duration waited = real->MonotonicNow() - start;
  CHECK(waited >= absl::Milliseconds(20));
  CHECK(waited < kRealTimeout);
  CHECK_FALSE(real->AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value), start));
}

TEST_CASE("Real AwaitWithDeadline returns true when another thread sets the condition") {
  Clock* real = Clock::Real();
  Flag flag;
  bool result = false;
  {
    Background setter([&] { flag.Set(); });
    absl::MutexLock l(&flag.mu);
    result = real->AwaitWithDeadline(&flag.mu, absl::Condition(&flag.value),
                                     real->MonotonicNow() + kRealTimeout);
  }
  CHECK(result);
}

}  // namespace
}  // namespace foreman
