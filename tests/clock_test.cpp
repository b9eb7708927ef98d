// Tests for Clock::Real() and ManualClock (include/foreman/clock.hpp).
//
// ManualClock tests never sleep: a test waits (in bounded real time) until the
// thread under test is blocked in the clock, then moves time by hand. (One
// test gives a thread 50 ms of real time to show that it stays blocked.) Every
// thread a test starts is woken and joined at the end even when a check
// fails, so a failure is reported rather than hung.
#include "foreman/clock.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "foreman/logging.hpp"
#include "foreman/mutex.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using testing::Background;
using testing::kRealTimeout;

/// A flag that a thread waits for with WaitUntil.
struct Flag {
  Mutex mu;
  std::condition_variable_any cv;
  bool value ABSL_GUARDED_BY(mu) = false;

  /// Sets the flag under the mutex and notifies the waiters.
  void Set() {
    MutexLock l(mu);
    value = true;
    cv.notify_all();
  }

  /// Notifies the waiters without changing the flag (a spurious wake-up, as
  /// far as they can tell).
  void Poke() {
    MutexLock l(mu);
    cv.notify_all();
  }

  /// The predicate for WaitUntil (which calls it with mu held).
  std::function<bool()> IsSet() {
    return [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return value; };
  }
};

/// Whether `mu` is locked by some thread: another thread fails to take it.
/// (try_lock on a mutex the calling thread owns is undefined behaviour.)
template <typename M>
bool LockedElsewhere(M& mu) {
  bool locked = false;
  std::thread probe([&] {
    if (mu.try_lock()) {
      mu.unlock();
    } else {
      locked = true;
    }
  });
  probe.join();
  return locked;
}

/// Whether `mu` is really locked (by the calling thread, in these tests).
bool Holds(Mutex& mu) { return LockedElsewhere(mu); }

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

// -- ManualClock: WaitUntil --------------------------------------------------------

TEST_CASE("WaitUntil returns true when another thread makes the condition true") {
  ManualClock clock;
  Flag flag;
  std::atomic<int> result{-1};
  std::atomic<bool> held{false};
  Background waiter([&] {
    MutexLock l(flag.mu);
    const bool r = clock.WaitUntil(flag.mu, flag.cv, clock.MonotonicNow() + absl::Seconds(10),
                                   flag.IsSet());
    held = Holds(flag.mu);
    result = r ? 1 : 0;
  });
  CHECK(clock.BlockUntilWaiters(1, kRealTimeout));
  flag.Set();  // takes the mutex: the waiter released it while waiting
  CHECK(waiter.WaitDone(kRealTimeout));
  CHECK(result.load() == 1);
  CHECK(held.load());
  CHECK(clock.waiters() == 0);
  CHECK(clock.MonotonicNow() == absl::ZeroDuration());
  clock.Advance(kForever);
}

TEST_CASE("WaitUntil returns false once Advance passes the deadline") {
  ManualClock clock;
  Flag flag;
  std::atomic<int> result{-1};
  std::atomic<bool> held{false};
  Background waiter([&] {
    MutexLock l(flag.mu);
    const bool r = clock.WaitUntil(flag.mu, flag.cv, clock.MonotonicNow() + absl::Seconds(5),
                                   flag.IsSet());
    held = Holds(flag.mu);
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
  CHECK(held.load());
  CHECK(clock.waiters() == 0);

  if (!waiter.Done()) {
    flag.Set();
    clock.Advance(kForever);
  }
}

TEST_CASE("WaitUntil keeps waiting through notifications that leave the condition false") {
  ManualClock clock;
  Flag flag;
  std::atomic<int> result{-1};
  Background waiter([&] {
    MutexLock l(flag.mu);
    result = clock.WaitUntil(flag.mu, flag.cv, absl::Seconds(5), flag.IsSet());
  });
  CHECK(clock.BlockUntilWaiters(1, kRealTimeout));
  for (int i = 0; i < 10; ++i) flag.Poke();
  clock.Advance(absl::Seconds(4));  // wakes nobody: the deadline is later
  CHECK_FALSE(waiter.WaitDone(absl::Milliseconds(50)));
  CHECK(clock.waiters() == 1);
  CHECK(result.load() == -1);

  clock.Advance(absl::Seconds(1));
  CHECK(waiter.WaitDone(kRealTimeout));
  CHECK(result.load() == 0);
  CHECK(clock.waiters() == 0);

  if (!waiter.Done()) {
    flag.Set();
    clock.Advance(kForever);
  }
}

TEST_CASE("WaitUntil evaluates the predicate with the mutex held") {
  ManualClock clock;
  Flag flag;
  std::atomic<int> evaluations{0}, unlocked_evaluations{0};
  std::atomic<int> result{-1};
  Background waiter([&] {
    MutexLock l(flag.mu);
    result = clock.WaitUntil(flag.mu, flag.cv, absl::Seconds(5),
                             [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(flag.mu) {
      ++evaluations;
      if (!Holds(flag.mu)) ++unlocked_evaluations;
      return flag.value;
    });
  });
  CHECK(clock.BlockUntilWaiters(1, kRealTimeout));
  flag.Poke();
  flag.Set();
  CHECK(waiter.WaitDone(kRealTimeout));
  CHECK(result.load() == 1);
  CHECK(evaluations.load() >= 2);  // before waiting, and after Set()
  CHECK(unlocked_evaluations.load() == 0);
  clock.Advance(kForever);
}

TEST_CASE("An exception from the predicate leaves WaitUntil holding the lock, unregistered") {
  ManualClock clock;
  Flag flag;
  std::atomic<int> outcome{-1};  // 1: threw with the lock held
  Background waiter([&] {
    MutexLock l(flag.mu);
    try {
      clock.WaitUntil(flag.mu, flag.cv, absl::Seconds(5),
                      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(flag.mu) {
        if (flag.value) throw std::runtime_error("pred");
        return false;
      });
      outcome = 0;
    } catch (const std::runtime_error&) {
      outcome = Holds(flag.mu) ? 1 : 2;
    }
  });
  CHECK(clock.BlockUntilWaiters(1, kRealTimeout));
  flag.Set();  // the predicate throws when it next runs
  CHECK(waiter.WaitDone(kRealTimeout));
  CHECK(outcome.load() == 1);
  CHECK(clock.waiters() == 0);
  clock.Advance(kForever);  // must not touch the waiter that left
}

TEST_CASE("WaitUntil returns true at once when the condition already holds") {
  ManualClock clock;
  Flag flag;
  flag.Set();
  MutexLock l(flag.mu);
  CHECK(clock.WaitUntil(flag.mu, flag.cv, absl::Seconds(10), flag.IsSet()));
  CHECK(clock.WaitUntil(flag.mu, flag.cv, absl::ZeroDuration(), flag.IsSet()));
  CHECK(Holds(flag.mu));
  CHECK(clock.waiters() == 0);
}

TEST_CASE("WaitUntil with a deadline already reached returns false at once") {
  ManualClock clock;
  clock.Advance(absl::Seconds(5));
  Flag flag;
  MutexLock l(flag.mu);
  CHECK_FALSE(clock.WaitUntil(flag.mu, flag.cv, absl::Seconds(2), flag.IsSet()));
  CHECK_FALSE(clock.WaitUntil(flag.mu, flag.cv, absl::Seconds(5), flag.IsSet()));
  CHECK(Holds(flag.mu));
  CHECK(clock.waiters() == 0);
}

TEST_CASE("Advance wakes only the waiters whose deadline has come") {
  ManualClock clock;
  Flag early_flag, late_flag;
  std::atomic<int> early_result{-1}, late_result{-1};
  Background early([&] {
    MutexLock l(early_flag.mu);
    early_result =
        clock.WaitUntil(early_flag.mu, early_flag.cv, absl::Seconds(1), early_flag.IsSet());
  });
  Background late([&] {
    MutexLock l(late_flag.mu);
    late_result =
        clock.WaitUntil(late_flag.mu, late_flag.cv, absl::Seconds(5), late_flag.IsSet());
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

TEST_CASE("Two waiters on one mutex and condition variable both wake when their deadlines pass") {
  ManualClock clock;
  Flag flag;
  std::atomic<int> results{0};
  auto wait = [&](absl::Duration deadline) {
    MutexLock l(flag.mu);
    if (!clock.WaitUntil(flag.mu, flag.cv, deadline, flag.IsSet())) ++results;
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

TEST_CASE("A waiter may destroy its mutex and condition variable as soon as WaitUntil returns") {
  // The condition and the deadline race: when Advance has picked the waiter
  // but the condition wakes it first, the waiter must not return while Advance
  // is about to lock its mutex and notify its condition variable. Without
  // that guard this loop reliably ends in a use after free in an ASan build
  // (-Db_sanitize=address) or a TSan build; a plain build rarely notices.
  ManualClock clock;
  for (int i = 0; i < 3000; ++i) {
    auto flag = std::make_shared<Flag>();
    Flag* f = flag.get();
    // The waiter holds the only reference and drops it right after returning.
    Background waiter([&clock, flag = std::move(flag)]() mutable {
      {
        MutexLock l(flag->mu);
        clock.WaitUntil(flag->mu, flag->cv, clock.MonotonicNow() + absl::Milliseconds(1),
                        flag->IsSet());
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
  // Repeated so that a destructor which frees the clock before the woken
  // threads have left it ends in a use after free in an ASan or TSan build.
  // Each destruction logs a warning; only the first one is shown.
  for (int i = 0; i < 200; ++i) {
    if (i == 1) REQUIRE(ConfigureLogging(LogOptions{LogLevel::kError}).ok());
    auto clock = std::make_unique<ManualClock>();
    Flag flag;
    std::atomic<int> result{-1};
    Background sleeper([&] { clock->SleepFor(absl::Hours(1)); });
    Background waiter([&] {
      MutexLock l(flag.mu);
      result = clock->WaitUntil(flag.mu, flag.cv, absl::Hours(1), flag.IsSet());
    });
    CHECK(clock->BlockUntilWaiters(2, kRealTimeout));
    clock.reset();  // returns once both threads have left the clock
    CHECK(sleeper.WaitDone(kRealTimeout));
    CHECK(waiter.WaitDone(kRealTimeout));
    CHECK(result.load() == 0);
  }
  REQUIRE(ConfigureLogging(LogOptions{}).ok());
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

TEST_CASE("Real WaitUntil times out after the deadline and returns false") {
  Clock* real = Clock::Real();
  Flag flag;
  MutexLock l(flag.mu);
  const absl::Duration start = real->MonotonicNow();
  CHECK_FALSE(real->WaitUntil(flag.mu, flag.cv, start + absl::Milliseconds(20), flag.IsSet()));
  const absl::Duration waited = real->MonotonicNow() - start;
  CHECK(waited >= absl::Milliseconds(20));
  CHECK(waited < kRealTimeout);
  CHECK(Holds(flag.mu));
  CHECK_FALSE(real->WaitUntil(flag.mu, flag.cv, start, flag.IsSet()));
  CHECK(Holds(flag.mu));
}

TEST_CASE("Real WaitUntil keeps waiting through notifications that leave the condition false") {
  Clock* real = Clock::Real();
  Flag flag;
  std::atomic<bool> stop{false};
  Background poker([&] {
    while (!stop.load()) {
      flag.Poke();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  bool result = true;
  absl::Duration waited;
  {
    MutexLock l(flag.mu);
    const absl::Duration start = real->MonotonicNow();
    result = real->WaitUntil(flag.mu, flag.cv, start + absl::Milliseconds(30), flag.IsSet());
    waited = real->MonotonicNow() - start;
  }
  stop = true;
  CHECK_FALSE(result);
  CHECK(waited >= absl::Milliseconds(30));
}

TEST_CASE("Real WaitUntil returns true when another thread sets the condition") {
  Clock* real = Clock::Real();
  for (const absl::Duration timeout : {kRealTimeout, absl::InfiniteDuration()}) {
    CAPTURE(timeout);
    Flag flag;
    bool result = false;
    bool held = false;
    {
      Background setter([&] { flag.Set(); });
      MutexLock l(flag.mu);
      // An infinite deadline must not overflow the steady_clock time point.
      result = real->WaitUntil(flag.mu, flag.cv, real->MonotonicNow() + timeout, flag.IsSet());
      held = Holds(flag.mu);
    }
    CHECK(result);
    CHECK(held);
  }
}

}  // namespace
}  // namespace foreman

namespace foreman {
namespace {

// The pattern tests use to drive a polling thread: wait until it sleeps, then
// advance. A thread already released by an Advance() but not yet running must
// not count, or the loop advances twice for one wait and the thread sees time
// jump by more than one interval.
TEST_CASE("BlockUntilWaiters does not count a sleeper that Advance already released") {
  ManualClock clock;
  constexpr int kRounds = 200;
  std::vector<absl::Duration> woke_at;
  std::atomic<bool> done{false};
  std::thread poller([&] {
    for (int i = 0; i < kRounds; ++i) {
      clock.SleepFor(absl::Seconds(1));
      woke_at.push_back(clock.MonotonicNow());
    }
    done = true;
  });
  bool all_waited = true;
  for (int i = 0; i < kRounds && all_waited; ++i) {
    all_waited = clock.BlockUntilWaiters(1, absl::Seconds(20));
    clock.Advance(absl::Seconds(1));
  }
  // Without the rule the poller needs more Advance() calls than it got: give
  // them (bounded) so the test fails instead of hanging.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done && std::chrono::steady_clock::now() < give_up) {
    if (clock.BlockUntilWaiters(1, absl::Milliseconds(10))) clock.Advance(absl::Seconds(1));
  }
  poller.join();
  CHECK(all_waited);
  REQUIRE(woke_at.size() == static_cast<std::size_t>(kRounds));
  for (int i = 0; i < kRounds; ++i) CHECK(woke_at[i] == absl::Seconds(i + 1));
}

}  // namespace
}  // namespace foreman
