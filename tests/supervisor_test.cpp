// Supervisor and managed_session (spec §15, B155-B162; H-08).
#include "foreman/supervisor.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <memory>

#include "absl/strings/match.h"
#include "foreman/checkpoint.hpp"
#include "foreman/event_reader.hpp"
#include "foreman/summary.hpp"
#include "support/log_capture.hpp"
#include "support/test_util.hpp"
#include "support/scripted_hook.hpp"
#include "support/training_graph.hpp"

namespace foreman {
namespace {

using testing::TempDir;

// global_step and w; "train_op" adds 1 to both; "summaries" reports w.
std::shared_ptr<Graph> TrainGraph(std::atomic<int>* summary_runs = nullptr) {
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph->AddVariable("w", Tensor::Scalar<float>(0.0f)).ok());
  REQUIRE(graph->AddSummaryOp("summaries").ok());
  REQUIRE(graph
              ->SetStep([summary_runs](StepContext& ctx) -> Status {
                FOREMAN_ASSIGN_OR_RETURN(Tensor * w, ctx.variables().Get("w"));
                if (ctx.requested("train_op")) {
                  w->data<float>()[0] += 1.0f;
                  FOREMAN_RETURN_IF_ERROR(IncrementGlobalStep(ctx.variables()).status());
                  ctx.Set("train_op", Tensor::Scalar<int64_t>(1));
                }
                if (ctx.requested("summaries")) {
                  if (summary_runs != nullptr) ++*summary_runs;
                  ctx.Set("summaries", Tensor::Scalar<std::string>(ScalarSummary("w", w->data<float>()[0])));
                }
                return absl::OkStatus();
              })
              .ok());
  return graph;
}

std::vector<Event> AllEvents(const std::string& logdir) {
  std::vector<Event> all;
  auto files = ListEventFiles(Env::Default(), logdir);
  if (!files.ok()) return all;
  for (const std::string& f : *files) {
    auto events = ReadEventFile(Env::Default(), f, /*allow_truncated_tail=*/true);
    REQUIRE(events.ok());
    all.insert(all.end(), events->begin(), events->end());
  }
  return all;
}

int CountSessionLogs(const std::vector<Event>& events, SessionLogStatus status) {
  int n = 0;
  for (const Event& e : events) n += e.kind == Event::Kind::kSessionLog && e.session_status == status;
  return n;
}

// The newest checkpoint's prefix, or "" when there is none.
std::string Latest(const std::string& dir) {
  auto latest = LatestCheckpoint(Env::Default(), dir);
  return latest.ok() && latest->has_value() ? **latest : "";
}

// The standard services fire at once on their own threads (B158); tests that
// need their first round done wait until every looper sleeps on the clock.
void AwaitServices(ManualClock& clock, int n) { REQUIRE(clock.BlockUntilWaiters(n, absl::Seconds(20))); }

SupervisorOptions Options(std::shared_ptr<Graph> graph, const std::string& logdir, ManualClock* clock) {
  SupervisorOptions o;
  o.graph = std::move(graph);
  o.logdir = logdir;
  o.config.clock = clock;
  o.config.intra_op_parallelism_threads = 1;
  o.stop_grace_secs = 5;
  return o;
}

TEST_CASE("B155 Supervisor fills TF's defaults and finalizes the graph") {
  ManualClock clock;
  auto graph = TrainGraph();
  auto sv = Supervisor::Create(Options(graph, "", &clock));
  REQUIRE(sv.ok());
  CHECK(graph->finalized());
  const SupervisorOptions& o = (*sv)->options();
  CHECK(static_cast<bool>(o.init_op));
  CHECK(static_cast<bool>(o.ready_op));
  CHECK(static_cast<bool>(o.ready_for_local_init_op));
  CHECK(static_cast<bool>(o.local_init_op));
  CHECK(o.save_summaries_secs == 120);
  CHECK(o.save_model_secs == 600);
  CHECK((*sv)->is_chief());
  CHECK(Supervisor::Create(SupervisorOptions{}).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("B156 a non-chief Supervisor writes no summaries and no checkpoints") {
  ManualClock clock;
  TempDir dir;
  auto o = Options(TrainGraph(), dir.path(), &clock);
  o.is_chief = false;
  auto sv = Supervisor::Create(o);
  REQUIRE(sv.ok());
  CHECK((*sv)->options().logdir.empty());
  CHECK_FALSE((*sv)->options().save_model_secs.has_value());
  auto session = Session::Create(TrainGraph());
  REQUIRE(session.ok());
  CHECK((*sv)->start_standard_services(session->get()).code() == absl::StatusCode::kFailedPrecondition);
  CHECK((*sv)->summary_computed(session->get(), ScalarSummary("x", 1)).code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("B157-B159 the chief's services start at once; stop() writes STOP and no final checkpoint") {
  ManualClock clock;
  TempDir dir;
  std::atomic<int> summary_runs{0};
  auto sv = Supervisor::Create(Options(TrainGraph(&summary_runs), dir.path(), &clock));
  REQUIRE(sv.ok());
  auto session = (*sv)->prepare_or_wait_for_session();
  REQUIRE(session.ok());
  CHECK((*session)->UninitializedVariables().empty());
  // Three looper threads fire at once, then wait for their interval.
  REQUIRE(clock.BlockUntilWaiters(3, absl::Seconds(20)));
  CHECK(summary_runs == 1);
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE(latest.ok());
  REQUIRE(latest->has_value());
  CHECK(**latest == dir.path() + "/model.ckpt-0");

  // Train 7 steps, then let 120 s pass: summary and step counter fire again.
  for (int i = 0; i < 7; ++i) REQUIRE((*session)->Run({"train_op"}).ok());
  clock.Advance(absl::Seconds(120));
  for (int i = 0; i < 2000 && summary_runs < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(summary_runs == 2);
  AwaitServices(clock, 3);
  // Up to 600 s in 120 s steps: the checkpoint service saves at the current
  // step (7) at 600 s.
  for (int i = 0; i < 4; ++i) {
    clock.Advance(absl::Seconds(120));
    for (int j = 0; j < 2000 && summary_runs < 3 + i; ++j) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    AwaitServices(clock, 3);
  }
  for (int i = 0; i < 2000 && Latest(dir.path()) != dir.path() + "/model.ckpt-7"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(Latest(dir.path()) == dir.path() + "/model.ckpt-7");

  // B159: stop writes STOP without a step and closes the writer; no final
  // checkpoint even though 3 more steps ran.
  for (int i = 0; i < 3; ++i) REQUIRE((*session)->Run({"train_op"}).ok());
  CHECK((*sv)->stop().ok());
  CHECK(Latest(dir.path()) == dir.path() + "/model.ckpt-7");
  std::vector<Event> events = AllEvents(dir.path());
  CHECK(CountSessionLogs(events, SessionLogStatus::kStart) == 1);
  CHECK(CountSessionLogs(events, SessionLogStatus::kCheckpoint) == 2);
  CHECK(CountSessionLogs(events, SessionLogStatus::kStop) == 1);
  std::vector<double> rates;
  bool saw_w_at_7 = false;
  for (const Event& e : events) {
    if (e.kind == Event::Kind::kSessionLog && e.session_status == SessionLogStatus::kStart) CHECK(e.step == 0);
    if (e.kind == Event::Kind::kSessionLog && e.session_status == SessionLogStatus::kStop) CHECK(e.step == 0);
    if (e.kind == Event::Kind::kSessionLog && e.session_status == SessionLogStatus::kCheckpoint) {
      CHECK((e.step == 0 || e.step == 7));
      CHECK(e.checkpoint_path == dir.path() + "/model.ckpt");
    }
    for (const SummaryValue& v : e.values) {
      if (v.tag == "global_step/sec") {
        CHECK(e.step == 7);
        rates.push_back(v.scalar);
      }
      if (v.tag == "w" && e.step == 7) saw_w_at_7 = v.scalar == 7.0;
    }
  }
  // First firing primed; at 120 s: 7 steps in 120 s; then none per 120 s.
  REQUIRE(rates.size() == 5);
  CHECK(rates[0] == doctest::Approx(7.0 / 120.0));
  for (std::size_t i = 1; i < rates.size(); ++i) CHECK(rates[i] == 0.0);
  CHECK(saw_w_at_7);
}

TEST_CASE("B157 prepare_or_wait_for_session restores from logdir and clears a previous stop") {
  ManualClock clock;
  TempDir dir;
  {
    auto sv = Supervisor::Create(Options(TrainGraph(), dir.path(), &clock));
    REQUIRE(sv.ok());
    Status s = (*sv)->managed_session([&](Session& sess) -> Status {
      AwaitServices(clock, 3);
      for (int i = 0; i < 4; ++i) FOREMAN_RETURN_IF_ERROR(sess.Run({"train_op"}).status());
      return absl::OkStatus();
    });
    CHECK(s.ok());
  }
  // Only the immediate checkpoint at step 0 exists (no final save, B159).
  auto o = Options(TrainGraph(), dir.path(), &clock);
  o.save_model_secs.reset();
  auto sv = Supervisor::Create(o);
  REQUIRE(sv.ok());
  (*sv)->request_stop().IgnoreError();
  auto session = (*sv)->prepare_or_wait_for_session();
  REQUIRE(session.ok());
  CHECK_FALSE((*sv)->should_stop());
  CHECK(*(*session)->GlobalStep() == 0);
  CHECK((*sv)->stop().ok());
}

TEST_CASE("A chief Supervisor on a directory another owner holds is refused before it reads or writes there") {
  ManualClock clock;
  TempDir dir;
  // A first run leaves a checkpoint; then another owner holds the directory.
  {
    auto sv = Supervisor::Create(Options(TrainGraph(), dir.path(), &clock));
    REQUIRE(sv.ok());
    REQUIRE((*sv)->managed_session([&](Session& sess) -> Status {
                  AwaitServices(clock, 3);
                  return sess.Run({"train_op"}).status();
                }).ok());
  }
  auto listing = [&] {
    auto names = Env::Default()->GetChildren(dir.path());
    std::vector<std::string> sorted = names.ok() ? *names : std::vector<std::string>{"<unreadable>"};
    std::sort(sorted.begin(), sorted.end());
    return sorted;
  };
  const std::vector<std::string> before = listing();
  auto lock = LockCheckpointDirectory(Env::Default(), dir.path());
  REQUIRE(lock.ok());
  auto sv = Supervisor::Create(Options(TrainGraph(), dir.path(), &clock));
  REQUIRE(sv.ok());
  testing::CapturedLog logs;
  auto session = (*sv)->prepare_or_wait_for_session();
  CHECK(session.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(session.status().message(), "in use"));
  CHECK_FALSE(absl::StrContains(logs.text(), "Restoring parameters"));  // nothing read
  CHECK(listing() == before);  // no new event file
}

TEST_CASE("B160 managed_session: OUT_OF_RANGE from the block is a clean stop") {
  ManualClock clock;
  TempDir dir;
  auto sv = Supervisor::Create(Options(TrainGraph(), dir.path(), &clock));
  REQUIRE(sv.ok());
  int runs = 0;
  Status s = (*sv)->managed_session([&](Session& sess) -> Status {
    while (!(*sv)->should_stop()) {
      FOREMAN_RETURN_IF_ERROR(sess.Run({"train_op"}).status());
      if (++runs == 5) return absl::OutOfRangeError("End of sequence");
    }
    return absl::OkStatus();
  });
  CHECK(s.ok());
  CHECK(runs == 5);
}

TEST_CASE("B160 H-08 managed_session returns ABORTED to the caller: no recovery, no final checkpoint") {
  ManualClock clock;
  TempDir dir;
  auto sv = Supervisor::Create(Options(TrainGraph(), dir.path(), &clock));
  REQUIRE(sv.ok());
  int attempts = 0;
  Status s = (*sv)->managed_session([&](Session& sess) -> Status {
    AwaitServices(clock, 3);
    ++attempts;
    for (int i = 0; i < 5; ++i) FOREMAN_RETURN_IF_ERROR(sess.Run({"train_op"}).status());
    return absl::UnavailableError("Socket closed");
  });
  CHECK(s == absl::UnavailableError("Socket closed"));
  CHECK(attempts == 1);
  CHECK(Latest(dir.path()) == dir.path() + "/model.ckpt-0");
  // The user's retry loop around managed_session restores and goes on.
  s = (*sv)->managed_session([&](Session& sess) -> Status {
    CHECK(*sess.GlobalStep() == 0);
    return absl::OkStatus();
  });
  CHECK(s.ok());
}

// Issue 12 (8): TF's SVTimerCheckpointThread logs "Saving checkpoint to path
// <save_path>" (no step) before each save; so does Foreman's.
TEST_CASE("B158 the checkpoint service logs each save as TF's Supervisor does") {
  ManualClock clock;
  TempDir dir;
  testing::CapturedLog log;
  auto sv = Supervisor::Create(Options(TrainGraph(), dir.path(), &clock));
  REQUIRE(sv.ok());
  auto session = (*sv)->prepare_or_wait_for_session();
  REQUIRE(session.ok());
  AwaitServices(clock, 3);  // the checkpoint looper saved once and waits
  CHECK(Latest(dir.path()) == dir.path() + "/model.ckpt-0");
  CHECK(absl::StrContains(log.text(), "Saving checkpoint to path " + dir.path() + "/model.ckpt\n"));
  CHECK((*sv)->stop().ok());
}

// Issue 12 (8): managed_session returned its error to the caller; the
// destructor, whose join finds that error again, does not log it a second
// time. An error nobody was given is still logged.
TEST_CASE("B160 ~Supervisor does not log the error managed_session returned") {
  ManualClock clock;
  {
    auto sv = Supervisor::Create(Options(TrainGraph(), "", &clock));
    REQUIRE(sv.ok());
    Status s = (*sv)->managed_session([](Session&) -> Status { return absl::UnavailableError("Socket closed"); });
    CHECK(s == absl::UnavailableError("Socket closed"));
    testing::CapturedLog log;
    sv->reset();
    CHECK_FALSE(absl::StrContains(log.text(), "Socket closed"));
  }
  {
    auto sv = Supervisor::Create(Options(TrainGraph(), "", &clock));
    REQUIRE(sv.ok());
    CHECK((*sv)->request_stop(absl::InternalError("never returned to anyone")).ok());
    testing::CapturedLog log;
    sv->reset();
    CHECK(absl::StrContains(log.text(), "Supervisor: INTERNAL: never returned to anyone"));
  }
}

TEST_CASE("B160 an exception thrown by the block becomes the returned Status") {
  ManualClock clock;
  auto sv = Supervisor::Create(Options(TrainGraph(), "", &clock));
  REQUIRE(sv.ok());
  Status s = (*sv)->managed_session([&](Session&) -> Status { throw std::runtime_error("user bug"); });
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(s.message().find("user bug") != absl::string_view::npos);
}

TEST_CASE("B161 an error after stop was requested is swallowed") {
  ManualClock clock;
  auto sv = Supervisor::Create(Options(TrainGraph(), "", &clock));
  REQUIRE(sv.ok());
  Status s = (*sv)->managed_session([&](Session&) -> Status {
    (*sv)->request_stop().IgnoreError();
    return absl::InternalError("raised after the stop");
  });
  CHECK(s.ok());
}

TEST_CASE("B162 summary_computed writes at the current step; loop() runs on the coordinator") {
  ManualClock clock;
  TempDir dir;
  auto o = Options(TrainGraph(), dir.path(), &clock);
  o.save_model_secs.reset();
  o.save_summaries_secs.reset();
  auto sv = Supervisor::Create(o);
  REQUIRE(sv.ok());
  std::atomic<int> looped{0};
  Status s = (*sv)->managed_session([&](Session& sess) -> Status {
    for (int i = 0; i < 3; ++i) FOREMAN_RETURN_IF_ERROR(sess.Run({"train_op"}).status());
    FOREMAN_RETURN_IF_ERROR((*sv)->summary_computed(&sess, ScalarSummary("custom", 2.5f)));
    FOREMAN_RETURN_IF_ERROR((*sv)->summary_computed(&sess, ScalarSummary("custom", 1.5f), 42));
    auto looper = (*sv)->loop(absl::Seconds(10), [&]() -> Status {
      ++looped;
      return absl::OkStatus();
    });
    FOREMAN_RETURN_IF_ERROR(looper.status());
    // Fires at once (B68), then after each 10 s.
    if (!clock.BlockUntilWaiters(1, absl::Seconds(20))) return absl::DeadlineExceededError("looper");
    clock.Advance(absl::Seconds(10));
    for (int i = 0; i < 4000 && looped < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return absl::OkStatus();
  });
  CHECK(s.ok());
  CHECK(looped == 2);
  std::vector<int64_t> steps;
  for (const Event& e : AllEvents(dir.path())) {
    for (const SummaryValue& v : e.values) {
      if (v.tag == "custom") steps.push_back(e.step);
    }
  }
  CHECK(steps == std::vector<int64_t>{3, 42});
}

TEST_CASE("B162 a service error reported to the coordinator is what managed_session returns") {
  ManualClock clock;
  auto sv = Supervisor::Create(Options(TrainGraph(), "", &clock));
  REQUIRE(sv.ok());
  Status s = (*sv)->managed_session([&](Session&) -> Status {
    auto looper = (*sv)->loop(std::nullopt, []() -> Status { return absl::DataLossError("bad record"); });
    FOREMAN_RETURN_IF_ERROR(looper.status());
    if (!(*sv)->wait_for_stop(absl::Seconds(0))) {
      // wait_for_stop uses the manual clock: poll the flag in real time.
      for (int i = 0; i < 2000 && !(*sv)->should_stop(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return absl::OkStatus();
  });
  CHECK(s == absl::DataLossError("bad record"));
}

}  // namespace
}  // namespace foreman

// -- adversarial cases (issue 4's review; were tests/breaker_test.cpp) -------------

namespace foreman {
namespace adversarial {
namespace {

using testing::Bounded;
using testing::MakeGraph;
using testing::Model;
using testing::TempDir;

TEST_CASE("Supervisor: two supervisors on one logdir: the second's managed_session fails on the lock, bounded") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto make = [&] {
    SupervisorOptions o;
    o.graph = MakeGraph(model);
    o.logdir = dir.path();
    o.config.clock = &clock;
    o.stop_grace_secs = 5;
    auto sv = Supervisor::Create(o);
    REQUIRE_MESSAGE(sv.ok(), sv.status().ToString());
    return std::move(sv).value();
  };
  auto sv1 = make();
  auto sv2 = make();
  Status inner;
  Status s1 = Bounded([&] {
    return sv1->managed_session([&](Session& sess) -> Status {
      REQUIRE(clock.BlockUntilWaiters(3, absl::Seconds(20)));
      FOREMAN_RETURN_IF_ERROR(sess.Run({"train_op"}).status());
      inner = sv2->managed_session([&](Session&) -> Status { return absl::OkStatus(); });
      return absl::OkStatus();
    });
  });
  CHECK(s1.ok());
  CHECK_MESSAGE(absl::IsFailedPrecondition(inner), inner.ToString());
  // Once sv1 stopped, the directory is free.
  Status s2 = Bounded([&] { return sv2->managed_session([&](Session&) -> Status { return absl::OkStatus(); }); });
  CHECK_MESSAGE(s2.ok(), s2.ToString());
}

}  // namespace
}  // namespace adversarial
}  // namespace foreman
