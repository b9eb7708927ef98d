// StopRequest (include/foreman/stop.hpp): first request wins, listeners, and
// the stop grace period on a ManualClock.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "foreman/clock.hpp"
#include "foreman/stop.hpp"

namespace foreman {
namespace {

TEST_CASE("StopRequest: the first request wins; later ones change nothing") {
  StopRequest stop;
  CHECK_FALSE(stop.stop_requested());
  CHECK(stop.status().ok());
  CHECK_FALSE(stop.grace_deadline().has_value());
  stop.request_stop(absl::AbortedError("first"));
  stop.request_stop();
  stop.request_stop(absl::InternalError("third"));
  CHECK(stop.stop_requested());
  CHECK(absl::IsAborted(stop.status()));
  CHECK(stop.status().message() == "first");
  stop.Complete();
}

TEST_CASE("StopRequest: grace_period() is the option as given, TF's 120 s by default") {
  CHECK(StopRequest().grace_period() == absl::Seconds(120));
  StopRequestOptions o;
  o.grace_period = absl::Seconds(5);
  StopRequest stop(o);
  CHECK(stop.grace_period() == absl::Seconds(5));
  stop.request_stop();
  CHECK(stop.grace_period() == absl::Seconds(5));  // a request does not change it
  stop.Complete();
}

TEST_CASE("StopRequest: a listener hears every request from when it listens, at once when one came before") {
  StopRequest stop;
  std::vector<Status> heard;
  const int64_t id = stop.Listen([&](const Status& s) { heard.push_back(s); });
  CHECK(heard.empty());
  stop.request_stop(absl::CancelledError("x"));
  REQUIRE(heard.size() == 1);
  CHECK(absl::IsCancelled(heard[0]));
  std::vector<Status> late;
  const int64_t late_id = stop.Listen([&](const Status& s) { late.push_back(s); });
  CHECK(late.size() == 1);  // the earlier request, at once
  stop.Unlisten(id);
  stop.Unlisten(late_id);
  stop.Complete();
}

TEST_CASE("StopRequest: the grace period runs on the clock; on_grace_expired runs once when Complete() is late") {
  ManualClock clock;
  std::atomic<int> expired{0};
  absl::Duration seen;
  StopRequestOptions o;
  o.grace_period = absl::Seconds(5);
  o.clock = &clock;
  o.on_grace_expired = [&](absl::Duration grace) {
    seen = grace;
    ++expired;
  };
  StopRequest stop(o);
  stop.request_stop();
  REQUIRE(stop.grace_deadline().has_value());
  CHECK(*stop.grace_deadline() == clock.MonotonicNow() + absl::Seconds(5));
  REQUIRE(clock.BlockUntilWaiters(1, absl::Seconds(20)));
  clock.Advance(absl::Seconds(4));
  CHECK(expired == 0);
  clock.Advance(absl::Seconds(1));
  for (int i = 0; i < 2000 && expired == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(expired == 1);
  CHECK(seen == absl::Seconds(5));
}

TEST_CASE("StopRequest: Complete() within the grace period disarms it") {
  ManualClock clock;
  std::atomic<int> expired{0};
  StopRequestOptions o;
  o.grace_period = absl::Seconds(5);
  o.clock = &clock;
  o.on_grace_expired = [&](absl::Duration) { ++expired; };
  {
    StopRequest stop(o);
    stop.request_stop();
    REQUIRE(clock.BlockUntilWaiters(1, absl::Seconds(20)));
    stop.Complete();
    CHECK(stop.completed());
    CHECK_FALSE(stop.grace_deadline().has_value());
    clock.Advance(absl::Seconds(60));
  }  // the destructor joins the watchdog
  CHECK(expired == 0);
}

TEST_CASE("StopRequest: request_stop from many threads at once records exactly one status") {
  StopRequest stop;
  std::atomic<int> calls{0};
  stop.Listen([&](const Status&) { ++calls; });
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&stop, i] { stop.request_stop(absl::InternalError(std::to_string(i))); });
  }
  for (auto& t : threads) t.join();
  CHECK(calls == 1);
  CHECK(absl::IsInternal(stop.status()));
  stop.Complete();
}

}  // namespace
}  // namespace foreman
