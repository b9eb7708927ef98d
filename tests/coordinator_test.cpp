// Tests for Coordinator and LooperThread (include/foreman/coordinator.hpp):
// Python's semantics B55-B68 (spec decision 10), where TF's C++ Coordinator
// differs (B69-B76), and the straggler scenarios H-15, H-17, H-18.
//
// Time is a ManualClock: a test waits (bounded, real time) until the code
// under test is blocked in the clock, then advances it. Runners stuck "for
// ever" wait on a Blocker that the test releases before it ends, and every
// thread the test starts is joined, so nothing outlives a test case.
#include "foreman/coordinator.hpp"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "absl/time/time.h"
#include "foreman/clock.hpp"
#include "support/test_util.hpp"
#include "support/log_capture.hpp"

namespace foreman {
namespace {

using testing::Background;
using testing::kRealTimeout;

/// A one-shot event another thread waits for in real time.
class Latch {
 public:
  void Set() {
    std::lock_guard<std::mutex> l(mu_);
    set_ = true;
    cv_.notify_all();
  }
  bool Wait(absl::Duration timeout = kRealTimeout) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, absl::ToChronoMilliseconds(timeout), [this] { return set_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

/// Something a runner blocks on that never fires until the test releases it
/// (a full queue's enqueue, in TF's reports). Sets `gone` when destroyed, so
/// a test can wait until a detached thread has dropped it.
class Blocker {
 public:
  explicit Blocker(std::shared_ptr<Latch> gone = nullptr) : gone_(std::move(gone)) {}
  ~Blocker() {
    if (gone_) gone_->Set();
  }
  /// Blocks until Release(); counts the threads that entered.
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    ++entered_;
    cv_.notify_all();
    cv_.wait(l, [this] { return released_; });
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }
  bool WaitEntered(int n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, absl::ToChronoMilliseconds(kRealTimeout),
                        [this, n] { return entered_ >= n; });
  }

 private:
  std::shared_ptr<Latch> gone_;
  std::mutex mu_;
  std::condition_variable cv_;
  int entered_ = 0;
  bool released_ = false;
};

/// Releases a Blocker when the test scope ends, even after a failed check.
struct ReleaseOnExit {
  std::shared_ptr<Blocker> blocker;
  ~ReleaseOnExit() { blocker->Release(); }
};

/// A counter a looper target bumps; the test waits for a value.
class Counter {
 public:
  int Increment() {
    std::lock_guard<std::mutex> l(mu_);
    ++n_;
    cv_.notify_all();
    return n_;
  }
  int value() {
    std::lock_guard<std::mutex> l(mu_);
    return n_;
  }
  bool WaitAtLeast(int n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, absl::ToChronoMilliseconds(kRealTimeout), [this, n] { return n_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

/// A runner without a thread: the test decides when it has finished and
/// what its Join() returns. It cannot wake a waiting join(), so join() sees
/// it only when it polls.
struct FakeRunnerState {
  std::atomic<bool> running{true};
  std::atomic<int> joins{0};
  Status join_status;  // set before running turns false
};

class FakeRunner : public RunnerInterface {
 public:
  FakeRunner(std::string name, std::shared_ptr<FakeRunnerState> state)
      : name_(std::move(name)), state_(std::move(state)) {}
  Status Join() override {
    ++state_->joins;
    return state_->join_status;
  }
  bool IsRunning() const override { return state_->running.load(); }
  std::string name() const override { return name_; }

 private:
  std::string name_;
  std::shared_ptr<FakeRunnerState> state_;
};

std::shared_ptr<FakeRunnerState> AddFakeRunner(Coordinator& coord, const std::string& name) {
  auto state = std::make_shared<FakeRunnerState>();
  REQUIRE(coord.register_runner(std::make_unique<FakeRunner>(name, state)).ok());
  return state;
}

/// Starts a looper whose target blocks on `blocker`.
void StartStuckLooper(Coordinator& coord, const std::string& name,
                      const std::shared_ptr<Blocker>& blocker) {
  auto looper = LooperThread::Start(&coord, name, std::nullopt, [blocker]() -> Status {
    blocker->Wait();
    return absl::OkStatus();
  });
  REQUIRE(looper.ok());
}

// -- B55: clean-stop codes ---------------------------------------------------

TEST_CASE("B55 default clean-stop codes are {OUT_OF_RANGE}: an OUT_OF_RANGE stop records no error") {
  Coordinator coord;
  CHECK(coord.request_stop(absl::OutOfRangeError("end of input")).ok());
  CHECK(coord.should_stop());
  CHECK(coord.status().ok());
  CHECK(coord.join().ok());
}

TEST_CASE("B55 an explicit empty clean-stop list means none: OUT_OF_RANGE is an error") {
  Coordinator coord(std::vector<absl::StatusCode>{});
  coord.request_stop(absl::OutOfRangeError("end of input")).IgnoreError();
  CHECK(coord.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(coord.join().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("B55 custom clean-stop codes replace OUT_OF_RANGE") {
  Coordinator coord(std::vector<absl::StatusCode>{absl::StatusCode::kCancelled});
  coord.request_stop(absl::CancelledError("cancelled")).IgnoreError();
  CHECK(coord.status().ok());
  coord.clear_stop();
  coord.request_stop(absl::OutOfRangeError("end")).IgnoreError();
  CHECK(coord.status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("B69 differs: Foreman keeps Python's meaning of an empty list (TF C++ falls back to OUT_OF_RANGE)") {
  Coordinator python_like(std::vector<absl::StatusCode>{});
  Coordinator defaulted;
  python_like.request_stop(absl::OutOfRangeError("x")).IgnoreError();
  defaulted.request_stop(absl::OutOfRangeError("x")).IgnoreError();
  CHECK_FALSE(python_like.status().ok());
  CHECK(defaulted.status().ok());
}

// -- B56-B59: request_stop ---------------------------------------------------

TEST_CASE("B56 should_stop is false until request_stop, then true in every thread") {
  Coordinator coord;
  CHECK_FALSE(coord.should_stop());
  Background other([&coord] { coord.request_stop().IgnoreError(); });
  REQUIRE(other.WaitDone());
  CHECK(coord.should_stop());
  CHECK(coord.status().ok());
}

TEST_CASE("B57 the first request_stop's error is recorded, later ones are ignored") {
  Coordinator coord;
  CHECK(coord.request_stop(absl::InvalidArgumentError("first")).ok());
  CHECK(coord.request_stop(absl::InternalError("second")).ok());
  CHECK(coord.status() == absl::InvalidArgumentError("first"));
  CHECK(coord.join() == absl::InvalidArgumentError("first"));
}

TEST_CASE("B57 a clean-stop error is filtered to a stop without error, and a later error is then dropped") {
  Coordinator coord;
  coord.request_stop(absl::OutOfRangeError("end")).IgnoreError();
  coord.request_stop(absl::InternalError("late")).IgnoreError();
  CHECK(coord.should_stop());
  CHECK(coord.status().ok());
}

TEST_CASE("B58 / H-15 request_stop(); request_stop(err): the error is dropped and join returns OK") {
  Coordinator coord;
  CHECK(coord.request_stop().ok());
  CHECK(coord.request_stop(absl::InternalError("vanishes")).ok());
  CHECK(coord.status().ok());
  CHECK(coord.join().ok());
}

TEST_CASE("B71 differs: a second request_stop is not an error (TF C++ returns FAILED_PRECONDITION)") {
  Coordinator coord;
  CHECK(coord.request_stop().ok());
  CHECK(coord.request_stop().ok());
}

TEST_CASE("B59 request_stop(err) after join returns the error to the caller instead of recording it") {
  Coordinator coord;
  coord.request_stop().IgnoreError();
  REQUIRE(coord.join().ok());
  CHECK(coord.joined());
  CHECK(coord.request_stop(absl::InternalError("after join")) == absl::InternalError("after join"));
  CHECK(coord.status().ok());
  // Only errors are returned: an OK or clean-stop request is fine.
  CHECK(coord.request_stop().ok());
  CHECK(coord.request_stop(absl::OutOfRangeError("end")).ok());
  CHECK(coord.join().ok());
}

// -- B61-B63: join -----------------------------------------------------------

TEST_CASE("B61 join without request_stop waits for the runners, polling every second of the clock") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  auto runner = AddFakeRunner(coord, "runner");
  Status result = absl::UnknownError("not returned");
  Background join([&] { result = coord.join(); });
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  CHECK_FALSE(join.Done());
  // The runner finishes; join sees it only at its next poll, 1 s after the
  // first.
  runner->running = false;
  clock.Advance(absl::Milliseconds(999));
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  CHECK_FALSE(join.Done());
  clock.Advance(absl::Milliseconds(1));
  REQUIRE(join.WaitDone());
  CHECK(result.ok());
  CHECK(runner->joins == 1);
  CHECK(coord.joined());
  CHECK_FALSE(coord.should_stop());
}

TEST_CASE("B62 join does not wait for a poll when a LooperThread ends during the grace period") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  auto blocker = std::make_shared<Blocker>();
  ReleaseOnExit release{blocker};
  // The target blocks, then reports the end of input (a clean stop); the
  // thread still runs for a moment after requesting stop.
  auto looper = LooperThread::Start(&coord, "once", std::nullopt, [blocker]() -> Status {
    blocker->Wait();
    return absl::OutOfRangeError("done");
  });
  REQUIRE(looper.ok());
  Status result = absl::UnknownError("not returned");
  Background join([&] { result = coord.join(); });
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  blocker->Release();
  REQUIRE(join.WaitDone());  // no Advance: the looper's end woke join
  CHECK(result.ok());
}

TEST_CASE("B73 differs: join before request_stop is allowed and returns once the runners finish") {
  Coordinator coord;
  auto runner = AddFakeRunner(coord, "done");
  runner->running = false;
  CHECK(coord.join().ok());  // TF C++: FAILED_PRECONDITION "Joining coordinator without requesting to stop."
}

TEST_CASE("B62 after request_stop join waits up to the grace period for runners to finish") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  auto runner = AddFakeRunner(coord, "slow");
  coord.request_stop().IgnoreError();
  Status result = absl::UnknownError("not returned");
  Background join([&] { result = coord.join(absl::Milliseconds(200)); });
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  // Time moves 1 ms at a time. join polls at doubling intervals, each from
  // its own reading of the clock, so a poll that starts by t=50 ms ends by
  // t=101 ms: a runner done at 50 ms is seen well before the grace period
  // (200 ms) ends.
  for (int t = 1; t <= 50; ++t) {
    clock.BlockUntilWaiters(1, absl::Milliseconds(100));
    clock.Advance(absl::Milliseconds(1));
  }
  CHECK_FALSE(join.Done());
  runner->running = false;
  for (int t = 51; t < 200 && !join.WaitDone(absl::ZeroDuration()); ++t) {
    clock.BlockUntilWaiters(1, absl::Milliseconds(100));
    clock.Advance(absl::Milliseconds(1));
  }
  REQUIRE(join.WaitDone());
  CHECK(result.ok());
  CHECK(clock.MonotonicNow() < absl::Milliseconds(200));
}

TEST_CASE("B62 the grace period is measured on the coordinator's clock") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  auto runner = AddFakeRunner(coord, "stuck");
  coord.request_stop().IgnoreError();
  absl::Duration returned_at;
  Status result;
  Background join([&] {
    result = coord.join(absl::Milliseconds(200));
    returned_at = clock.MonotonicNow();
  });
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  clock.Advance(absl::Milliseconds(199));
  CHECK_FALSE(join.WaitDone(absl::Milliseconds(20)));  // the one real wait here
  clock.Advance(absl::Milliseconds(1));  // the clock stops at exactly 200 ms
  REQUIRE(join.WaitDone());
  CHECK(result.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(returned_at == absl::Milliseconds(200));
  runner->running = false;
}

TEST_CASE("B63 join sets joined and clears the registered runners") {
  Coordinator coord;
  auto runner = AddFakeRunner(coord, "r");
  runner->running = false;
  CHECK_FALSE(coord.joined());
  REQUIRE(coord.join().ok());
  CHECK(coord.joined());
  CHECK(runner->joins == 1);
  REQUIRE(coord.join().ok());
  CHECK(runner->joins == 1);  // not joined again: the set was cleared
}

TEST_CASE("B63 a recorded error takes precedence over stragglers") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  auto runner = AddFakeRunner(coord, "stuck");
  coord.request_stop(absl::InvalidArgumentError("bad value")).IgnoreError();
  CHECK(coord.join(absl::ZeroDuration()) == absl::InvalidArgumentError("bad value"));
  runner->running = false;
}

TEST_CASE("B63 a finished runner's error is fed to request_stop: the first non-clean one wins") {
  Coordinator coord;
  auto clean = AddFakeRunner(coord, "clean");
  auto first = AddFakeRunner(coord, "first");
  auto second = AddFakeRunner(coord, "second");
  clean->join_status = absl::OutOfRangeError("end");
  first->join_status = absl::DataLossError("first");
  second->join_status = absl::InternalError("second");
  clean->running = first->running = second->running = false;
  CHECK(coord.join() == absl::DataLossError("first"));
  CHECK(coord.status() == absl::DataLossError("first"));
}

TEST_CASE("B63 a runner error after stop was requested is dropped, as request_stop drops it (B58)") {
  Coordinator coord;
  auto runner = AddFakeRunner(coord, "late");
  runner->join_status = absl::InternalError("late");
  runner->running = false;
  coord.request_stop().IgnoreError();
  CHECK(coord.join().ok());
}

TEST_CASE("B63 with ignore_live_threads stragglers are logged and join returns OK") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  auto runner = AddFakeRunner(coord, "straggler");
  coord.request_stop().IgnoreError();
  testing::CapturedLog log;
  CHECK(coord.join(absl::ZeroDuration(), /*ignore_live_threads=*/true).ok());
  CHECK(log.text().find("Coordinator stopped with threads still running: straggler") !=
        std::string::npos);
  CHECK(coord.joined());
  runner->running = false;
}

// -- B64-B67 -----------------------------------------------------------------

TEST_CASE("B64 clear_stop resets the flag, the recorded error and joined") {
  Coordinator coord;
  coord.request_stop(absl::InternalError("boom")).IgnoreError();
  REQUIRE_FALSE(coord.join().ok());
  coord.clear_stop();
  CHECK_FALSE(coord.should_stop());
  CHECK(coord.status().ok());
  CHECK_FALSE(coord.joined());
  // Not joined any more: an error is recorded again, and runners register.
  coord.request_stop(absl::AbortedError("again")).IgnoreError();
  CHECK(coord.status() == absl::AbortedError("again"));
  coord.clear_stop();
  CHECK(coord.register_runner(std::make_unique<FakeRunner>("r", std::make_shared<FakeRunnerState>())).ok());
  coord.request_stop().IgnoreError();
  CHECK(coord.join(absl::ZeroDuration(), true).ok());
}

TEST_CASE("B65 status() returns the recorded error without clearing it") {
  Coordinator coord;
  CHECK(coord.status().ok());
  coord.request_stop(absl::UnavailableError("gone")).IgnoreError();
  CHECK(coord.status() == absl::UnavailableError("gone"));
  CHECK(coord.status() == absl::UnavailableError("gone"));
}

TEST_CASE("B66 wait_for_stop returns false when the clock passes the timeout") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  bool stopped = true;
  Background waiter([&] { stopped = coord.wait_for_stop(absl::Seconds(5)); });
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  clock.Advance(absl::Seconds(4));
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  CHECK_FALSE(waiter.Done());
  clock.Advance(absl::Seconds(1));
  REQUIRE(waiter.WaitDone());
  CHECK_FALSE(stopped);
}

TEST_CASE("B66 wait_for_stop returns true when stop is requested, with or without a timeout") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  bool with_timeout = false;
  bool without = false;
  Background a([&] { with_timeout = coord.wait_for_stop(absl::Seconds(5)); });
  Background b([&] { without = coord.wait_for_stop(); });
  REQUIRE(clock.BlockUntilWaiters(2, kRealTimeout));
  coord.request_stop().IgnoreError();
  REQUIRE(a.WaitDone());
  REQUIRE(b.WaitDone());
  CHECK(with_timeout);
  CHECK(without);
  CHECK(coord.wait_for_stop(absl::ZeroDuration()));  // at once once stopped
}

TEST_CASE("B67 stop_on_exception reports an error or exception to request_stop and suppresses it") {
  SUBCASE("returned error") {
    Coordinator coord;
    CHECK_FALSE(coord.stop_on_exception([] { return absl::NotFoundError("no file"); }));
    CHECK(coord.should_stop());
    CHECK(coord.status() == absl::NotFoundError("no file"));
  }
  SUBCASE("thrown exception") {
    Coordinator coord;
    CHECK_FALSE(coord.stop_on_exception([]() -> Status { throw std::runtime_error("kaboom"); }));
    CHECK(coord.status().code() == absl::StatusCode::kInternal);
    CHECK(std::string(coord.status().message()).find("kaboom") != std::string::npos);
  }
  SUBCASE("success") {
    Coordinator coord;
    CHECK(coord.stop_on_exception([] { return absl::OkStatus(); }));
    CHECK_FALSE(coord.should_stop());
  }
  SUBCASE("clean stop") {
    Coordinator coord;
    CHECK_FALSE(coord.stop_on_exception([] { return absl::OutOfRangeError("end"); }));
    CHECK(coord.should_stop());
    CHECK(coord.status().ok());
  }
}

// -- B68, B70: runners and LooperThread ---------------------------------------

TEST_CASE("B70 register_runner after stop fails with TF C++'s message and starts no looper") {
  Coordinator coord;
  coord.request_stop().IgnoreError();
  Status s = coord.register_runner(std::make_unique<FakeRunner>("r", std::make_shared<FakeRunnerState>()));
  CHECK(s == absl::FailedPreconditionError("The coordinator has been stopped."));
  bool ran = false;
  auto looper = LooperThread::Start(&coord, "late", std::nullopt, [&ran] {
    ran = true;
    return absl::OkStatus();
  });
  CHECK(looper.status() == absl::FailedPreconditionError("The coordinator has been stopped."));
  CHECK(coord.join().ok());
  CHECK_FALSE(ran);
}

TEST_CASE("B68 a back-to-back LooperThread runs its target until stop is requested") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  auto counter = std::make_shared<Counter>();
  auto looper = LooperThread::Start(&coord, "busy", std::nullopt, [counter] {
    counter->Increment();
    return absl::OkStatus();
  });
  REQUIRE(looper.ok());
  CHECK((*looper)->name() == "busy");
  REQUIRE(counter->WaitAtLeast(3));  // no clock involved
  coord.request_stop().IgnoreError();
  CHECK(coord.join().ok());
  const int calls = counter->value();
  CHECK(counter->value() == calls);  // the thread has ended
}

TEST_CASE("B68 a timed LooperThread runs at once, then every interval of the clock") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  auto counter = std::make_shared<Counter>();
  REQUIRE(LooperThread::Start(&coord, "timer", absl::Seconds(10), [counter] {
            counter->Increment();
            return absl::OkStatus();
          }).ok());
  REQUIRE(counter->WaitAtLeast(1));  // starting immediately
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  CHECK(counter->value() == 1);
  clock.Advance(absl::Seconds(9));
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  CHECK(counter->value() == 1);
  clock.Advance(absl::Seconds(1));
  REQUIRE(counter->WaitAtLeast(2));
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  clock.Advance(absl::Seconds(25));  // one late run, then back on the 10 s schedule
  REQUIRE(counter->WaitAtLeast(3));
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  // t=35: runs were due at 20 and 30; the run at 20 went late, the one at 30
  // follows at once.
  REQUIRE(counter->WaitAtLeast(4));
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  CHECK(counter->value() == 4);
  coord.request_stop().IgnoreError();  // wakes the waiting looper
  CHECK(coord.join().ok());
  CHECK(counter->value() == 4);
}

TEST_CASE("B68 a LooperThread reports its target's error to the coordinator and ends") {
  Coordinator coord;
  auto counter = std::make_shared<Counter>();
  auto looper = LooperThread::Start(&coord, "failing", std::nullopt, [counter]() -> Status {
    if (counter->Increment() == 3) return absl::DataLossError("corrupt record");
    return absl::OkStatus();
  });
  REQUIRE(looper.ok());
  CHECK(coord.wait_for_stop(absl::Seconds(60)));  // real clock: never reached
  CHECK(coord.join() == absl::DataLossError("corrupt record"));
  CHECK(counter->value() == 3);
}

TEST_CASE("B68 a LooperThread's exception becomes INTERNAL naming the looper") {
  Coordinator coord;
  REQUIRE(LooperThread::Start(&coord, "thrower", std::nullopt, []() -> Status {
            throw std::logic_error("broken invariant");
          }).ok());
  Status s = coord.join();
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(std::string(s.message()).find("LooperThread thrower") != std::string::npos);
  CHECK(std::string(s.message()).find("broken invariant") != std::string::npos);
}

TEST_CASE("B68 a LooperThread whose target reaches the end of input stops cleanly") {
  Coordinator coord;
  REQUIRE(LooperThread::Start(&coord, "reader", std::nullopt,
                              [] { return absl::OutOfRangeError("End of sequence"); }).ok());
  CHECK(coord.join().ok());
  CHECK(coord.should_stop());
}

TEST_CASE("B76 the destructor requests stop and joins the registered loopers") {
  auto counter = std::make_shared<Counter>();
  std::weak_ptr<Counter> weak = counter;
  {
    ManualClock clock;
    Coordinator coord(std::nullopt, &clock);
    REQUIRE(LooperThread::Start(&coord, "busy", std::nullopt, [counter] {
              counter->Increment();
              return absl::OkStatus();
            }).ok());
    counter.reset();
    REQUIRE(weak.lock()->WaitAtLeast(1));
  }
  // The looper's thread was joined and its target destroyed.
  CHECK(weak.expired());
}

// -- H-15, H-17, H-18: stragglers -------------------------------------------

TEST_CASE("H-15 a runner blocked on a condition that never fires: join reports it after the grace period") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  auto blocker = std::make_shared<Blocker>();
  ReleaseOnExit release{blocker};
  StartStuckLooper(coord, "QueueRunnerThread-input_producer", blocker);
  REQUIRE(blocker->WaitEntered(1));
  coord.request_stop().IgnoreError();
  Status result;
  Background join([&] { result = coord.join(absl::Milliseconds(200)); });
  REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
  clock.Advance(absl::Milliseconds(200));
  REQUIRE(join.WaitDone());
  CHECK(result == absl::DeadlineExceededError(
                      "Coordinator stopped with threads still running: "
                      "QueueRunnerThread-input_producer"));
  CHECK(coord.joined());
}

TEST_CASE("H-17 a detached straggler neither keeps the process alive nor touches the freed coordinator") {
  auto gone = std::make_shared<Latch>();
  auto blocker = std::make_shared<Blocker>(gone);
  {
    ReleaseOnExit release{blocker};
    testing::CapturedLog log;
    {
      ManualClock clock;
      auto coord = std::make_unique<Coordinator>(std::nullopt, &clock);
      StartStuckLooper(*coord, "QueueRunnerThread-dummy_queue-sync_token_q_EnqueueMany", blocker);
      REQUIRE(blocker->WaitEntered(1));
      coord->request_stop().IgnoreError();
      Status result = absl::UnknownError("not returned");
      Background join([&] { result = coord->join(absl::Milliseconds(100), /*ignore_live_threads=*/true); });
      REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
      clock.Advance(absl::Milliseconds(100));
      REQUIRE(join.WaitDone());
      CHECK(result.ok());
      CHECK(log.text().find("Coordinator stopped with threads still running: "
                            "QueueRunnerThread-dummy_queue-sync_token_q_EnqueueMany") !=
            std::string::npos);
      coord.reset();  // the straggler is still blocked
    }  // and the clock is gone too
    blocker.reset();
  }  // released: the detached thread returns from its target and ends
  // Its last reference to the target (and so the Blocker) is dropped as the
  // thread ends; under ASan a use of the freed coordinator would fail here.
  CHECK(gone->Wait());
}

TEST_CASE("H-18 three stuck threads: join(grace 0.1 s) names all three") {
  ManualClock clock;
  Coordinator coord(std::nullopt, &clock);
  auto blocker = std::make_shared<Blocker>();
  ReleaseOnExit release{blocker};
  for (const char* name : {"Thread-4", "Thread-6", "Thread-8"}) StartStuckLooper(coord, name, blocker);
  REQUIRE(blocker->WaitEntered(3));
  SUBCASE("straggler error") {
    coord.request_stop().IgnoreError();
    Status result;
    Background join([&] { result = coord.join(absl::Milliseconds(100)); });
    REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
    clock.Advance(absl::Milliseconds(100));
    REQUIRE(join.WaitDone());
    CHECK(result == absl::DeadlineExceededError(
                        "Coordinator stopped with threads still running: Thread-4 Thread-6 Thread-8"));
  }
  SUBCASE("a recorded error takes precedence") {
    coord.request_stop(absl::InvalidArgumentError("ValueError")).IgnoreError();
    Status result;
    Background join([&] { result = coord.join(absl::Milliseconds(100)); });
    REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
    clock.Advance(absl::Milliseconds(100));
    REQUIRE(join.WaitDone());
    CHECK(result == absl::InvalidArgumentError("ValueError"));
  }
}

}  // namespace
}  // namespace foreman
