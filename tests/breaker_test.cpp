// Adversarial tests of the training runtime (issue 4 review): preemption at
// awkward points, failing saves, throwing hooks, double close, cross-thread
// stop, directory locks, chief + worker, restarts, the actor API. Every wait
// is bounded.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "foreman/actor_api.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/clock.hpp"
#include "foreman/event_reader.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/summary.hpp"
#include "foreman/supervisor.hpp"
#include "support/call_log.hpp"
#include "support/gated_env.hpp"
#include "support/log_capture.hpp"
#include "support/stop_at_step.hpp"
#include "support/test_util.hpp"
#include "support/training_graph.hpp"

namespace foreman {
namespace {

using testing::LastStep;
using testing::NumSteps;

using testing::CallLog;
using testing::CapturedLog;
using testing::Checkpoints;
using testing::GatedEnv;
using testing::Int;
using testing::MakeGraph;
using testing::Model;
using testing::Open;
using testing::TempDir;

constexpr auto kWait = std::chrono::seconds(20);

// A hook whose callbacks log, and fail (status or exception) where told.
class ScriptedHook : public SessionRunHook {
 public:
  ScriptedHook(std::string name, std::shared_ptr<CallLog> log) : name_(std::move(name)), log_(std::move(log)) {}
  std::string name() const override { return name_; }
  // callback -> what it does on its n-th call (1-based): an error, or throws.
  std::function<Status(const std::string& callback, int n)> script;
  bool throws = false;

  Status Do(const std::string& cb) {
    log_->Add(name_ + "." + cb);
    const int n = ++counts_[cb];
    if (!script) return absl::OkStatus();
    Status s = script(cb, n);
    if (!s.ok() && throws) throw std::runtime_error(std::string(s.message()));
    return s;
  }
  Status begin() override { return Do("begin"); }
  Status after_create_session(Session*, Coordinator* c) override {
    coord = c;
    return Do("after_create_session");
  }
  StatusOr<SessionRunArgs> before_run(SessionRunContext&) override {
    FOREMAN_RETURN_IF_ERROR(Do("before_run"));
    return SessionRunArgs{};
  }
  Status after_run(SessionRunContext&, const SessionRunValues&) override { return Do("after_run"); }
  Status end(Session*) override { return Do("end"); }
  Coordinator* coord = nullptr;

 private:
  std::string name_;
  std::shared_ptr<CallLog> log_;
  std::map<std::string, int> counts_;
};

MonitoredTrainingSessionOptions ChiefOptions(std::shared_ptr<Graph> graph, const std::string& checkpoint_dir,
                                             ManualClock* clock) {
  MonitoredTrainingSessionOptions o;
  o.graph = std::move(graph);
  o.checkpoint_dir = checkpoint_dir;
  o.config.clock = clock;
  o.stop_grace_period_secs = 0;
  o.recovery.initial_backoff = absl::ZeroDuration();
  o.runtime.shutdown_timeout = absl::Seconds(20);
  return o;
}

// Runs `f` on another thread; fails the test (instead of hanging) past kWait.
template <class F>
auto Bounded(F f) {
  auto fut = std::async(std::launch::async, std::move(f));
  REQUIRE_MESSAGE(fut.wait_for(kWait) == std::future_status::ready, "timed out: hang");
  return fut.get();
}

// Polls (bounded) until an asynchronous save has written `path`.
void WaitForFile(const std::string& path) {
  for (int i = 0; i < 20000 && !Env::Default()->FileExists(path).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE_MESSAGE(Env::Default()->FileExists(path).ok(), path);
}

// -- preemption at awkward points --------------------------------------------------------

TEST_CASE("ABORTED from after_create_session at creation: retried with back-off on the ManualClock, then trains") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto hook = std::make_shared<ScriptedHook>("flaky", log);
  hook->script = [](const std::string& cb, int n) {
    return cb == "after_create_session" && n <= 2 ? absl::AbortedError("ps restarting") : absl::OkStatus();
  };
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.recovery.initial_backoff = absl::Seconds(1);
  o.recovery.max_backoff = absl::Seconds(1);
  o.hooks = {hook};
  auto created = std::async(std::launch::async, [&] { return MonitoredTrainingSession(o); });
  for (int i = 0; i < 2; ++i) {
    REQUIRE(clock.BlockUntilWaiters(1, absl::Seconds(20)));
    clock.Advance(absl::Seconds(2));  // > 1 s * jitter (< 1.5)
    // The woken sleeper counts until it runs; wait for it to leave.
    for (int j = 0; j < 20000 && clock.waiters() > 0; ++j) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(created.wait_for(kWait) == std::future_status::ready);
  auto sess = created.get();
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  CHECK((*sess)->recoveries() == 2);
  CHECK(log->Count("flaky.begin") == 1);
  CHECK(log->Count("flaky.after_create_session") == 3);
  for (int i = 0; i < 3; ++i) REQUIRE((*sess)->run({"train_op"}).ok());
  CHECK((*sess)->close().ok());
  CHECK(Checkpoints(dir.path()).back() == "model.ckpt-3");
}

TEST_CASE("ABORTED at every step from k on: bounded, the error is returned, no end(), nothing hangs") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto hook = std::make_shared<ScriptedHook>("user", log);
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{2};
  o.recovery.max_recoveries = 3;
  o.hooks = {hook};
  auto sess = Open(o);
  model->on_train = [](int64_t step) { return step >= 5 ? absl::AbortedError("gone") : absl::OkStatus(); };
  Status last;
  int runs = 0;
  while (!sess->should_stop() && runs < 100) {
    ++runs;
    last = sess->run({"train_op"}).status();
  }
  CHECK(absl::IsAborted(last));
  CHECK(sess->recoveries() == 3);
  CHECK(absl::IsAborted(Bounded([&] { return sess->close(); })));
  CHECK(log->Count("user.end") == 0);
  CHECK(log->Count("user.after_create_session") == 4);
}

TEST_CASE("ABORTED from a hook's end(): close returns it, later end()s are skipped, nothing hangs") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto a = std::make_shared<ScriptedHook>("a", log);
  auto b = std::make_shared<ScriptedHook>("b", log);
  a->script = [](const std::string& cb, int) { return cb == "end" ? absl::AbortedError("late") : absl::OkStatus(); };
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.hooks = {a, b};
  auto sess = Open(o);
  REQUIRE(sess->run({"train_op"}).ok());
  Status s = Bounded([&] { return sess->close(); });
  CHECK(absl::IsAborted(s));
  CHECK(log->Count("b.end") == 0);
  CHECK(sess->should_stop());
  CHECK(sess->close() == s);
}

TEST_CASE("the final save in end() failing: close returns the save's error; the step-0 checkpoint stays") {
  TempDir dir;
  ManualClock clock;
  GatedEnv env(Env::Default());
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.config.env = &env;
  o.save_checkpoint_steps = int64_t{100};
  auto sess = Open(o);
  for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"train_op"}).ok());
  WaitForFile(dir / "model.ckpt-0.index");  // the step-0 save is asynchronous
  env.Fail(".index", absl::ResourceExhaustedError("disk full"));
  Status s = Bounded([&] { return sess->close(); });
  CHECK_MESSAGE(absl::IsResourceExhausted(s), s.ToString());
  env.Fail("", absl::OkStatus());
  CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0"});
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE(latest.ok());
  CHECK(latest->value_or("") == dir / "model.ckpt-0");
}

TEST_CASE("the final save in end() failing with ABORTED: close returns it (no recovery in close), bounded") {
  TempDir dir;
  ManualClock clock;
  GatedEnv env(Env::Default());
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.config.env = &env;
  o.save_checkpoint_steps = int64_t{100};
  auto sess = Open(o);
  for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"train_op"}).ok());
  WaitForFile(dir / "model.ckpt-0.index");
  env.Fail(".index", absl::AbortedError("nfs went away"));
  Status s = Bounded([&] { return sess->close(); });
  CHECK_MESSAGE(absl::IsAborted(s), s.ToString());
  CHECK(sess->recoveries() == 0);
}

// A save error is a local failure of the checkpoint_saver service; a new
// session does not cure it (the runtime's error is sticky), so recovering from
// it only costs a recovery and then hides the error behind "Run called even
// after should_stop requested.".
TEST_CASE("a checkpoint save failing with UNAVAILABLE ends training with that error, without a recovery") {
  TempDir dir;
  ManualClock clock;
  GatedEnv env(Env::Default());
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto hook = std::make_shared<ScriptedHook>("user", log);
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.config.env = &env;
  o.save_checkpoint_steps = int64_t{2};
  o.hooks = {hook};
  auto sess = Open(o);
  REQUIRE(sess->run({"train_op"}).ok());
  WaitForFile(dir / "model.ckpt-0.index");
  env.Fail(".index", absl::UnavailableError("object store unreachable"));
  Status last;
  int runs = 0;
  while (!sess->should_stop() && runs < 20) {
    ++runs;
    last = sess->run({"train_op"}).status();
    if (!last.ok()) break;
  }
  env.Fail("", absl::OkStatus());
  CHECK_MESSAGE(absl::IsUnavailable(last), last.ToString());
  CHECK(last.message().find("object store unreachable") != std::string::npos);
  CHECK(sess->recoveries() == 0);
  Status c = Bounded([&] { return sess->close(); });
  CHECK_MESSAGE(absl::IsUnavailable(c), c.ToString());
}

TEST_CASE("ABORTED while a save is in flight: the recovery waits for it and restores that checkpoint") {
  TempDir dir;
  ManualClock clock;
  GatedEnv env(Env::Default());
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.config.env = &env;
  o.save_checkpoint_steps = int64_t{10};
  o.log_step_count_steps = std::nullopt;
  o.save_summaries_steps = Defaultable<int64_t>::None();
  auto sess = Open(o);
  // The step-0 save is asynchronous: it must not be the one held (step 10's
  // hand-off would then wait for it until the gate's 30-s safety release).
  WaitForFile(dir / "model.ckpt-0.index");
  for (int i = 0; i < 9; ++i) REQUIRE(sess->run({"train_op"}).ok());
  env.Hold(".data-");
  REQUIRE(sess->run({"train_op"}).ok());  // step 10: the save is handed off and held
  REQUIRE(env.WaitUntilHeld(1, absl::Seconds(10)));
  MonitoredSession* raw = sess.get();
  std::thread releaser([&] {
    // Release only once the recovery has begun (the training thread waits).
    for (int i = 0; i < 2000 && raw->recoveries() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    env.Release();
  });
  bool injected = false;
  model->on_train = [&](int64_t step) -> Status {
    if (step == 11 && !injected) {
      injected = true;
      return absl::AbortedError("preempted");
    }
    return absl::OkStatus();
  };
  REQUIRE(sess->run({"train_op"}).ok());  // 10 -> 11, the save of 10 still held
  auto out = Bounded([&] { return sess->run({"train_op"}); });  // ABORTED at 11
  releaser.join();
  REQUIRE_MESSAGE(out.ok(), out.status().ToString());
  CHECK(Int(out->at("train_op")) == 11);  // restored 10, re-ran
  CHECK(sess->steps_lost() == 1);
  CHECK(Bounded([&] { return sess->close(); }).ok());
}

// -- throwing hooks -------------------------------------------------------------------------

TEST_CASE("a hook that throws in each callback: the error names hook and callback; Create or close returns it") {
  for (const std::string cb : {"begin", "after_create_session", "before_run", "after_run", "end"}) {
    CAPTURE(cb);
    TempDir dir;
    ManualClock clock;
    auto model = std::make_shared<Model>();
    auto log = std::make_shared<CallLog>();
    auto bad = std::make_shared<ScriptedHook>("Bad", log);
    auto later = std::make_shared<ScriptedHook>("Later", log);
    bad->throws = true;
    bad->script = [cb](const std::string& c, int) {
      return c == cb ? absl::InternalError("boom in " + c) : absl::OkStatus();
    };
    auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
    o.hooks = {bad, later};
    auto created = Bounded([&] { return MonitoredTrainingSession(o); });
    if (cb == "begin" || cb == "after_create_session") {
      REQUIRE(!created.ok());
      CHECK(created.status().message().find("Bad::" + cb) != std::string::npos);
      CHECK(created.status().message().find("boom in " + cb) != std::string::npos);
      CHECK(log->Count("Later.end") == 0);
      // The lock is released: another session on the directory works.
      bad->script = nullptr;
      auto again = Bounded([&] { return MonitoredTrainingSession(o); });
      REQUIRE_MESSAGE(again.ok(), again.status().ToString());
      CHECK((*again)->close().ok());
      continue;
    }
    REQUIRE_MESSAGE(created.ok(), created.status().ToString());
    auto sess = std::move(created).value();
    Status r = sess->run({"train_op"}).status();
    Status c = Bounded([&] { return sess->close(); });
    Status err = cb == "end" ? c : r;
    CHECK(!err.ok());
    CHECK_MESSAGE(err.message().find("Bad::" + cb) != std::string::npos, err.ToString());
    CHECK(c == err);
    if (cb != "end") CHECK(log->Count("Later.end") == 0);
    CHECK(sess->should_stop());
  }
}

TEST_CASE("OUT_OF_RANGE from a hook's after_run is a clean stop: end() runs, close OK, final checkpoint") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto hook = std::make_shared<ScriptedHook>("eoi", log);
  hook->script = [](const std::string& cb, int n) {
    return cb == "after_run" && n == 3 ? absl::OutOfRangeError("End of sequence") : absl::OkStatus();
  };
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{100};
  o.hooks = {hook};
  auto sess = Open(o);
  Status last;
  while (!sess->should_stop()) last = sess->run({"train_op"}).status();
  CHECK(absl::IsOutOfRange(last));
  CHECK(sess->close().ok());
  CHECK(log->Count("eoi.end") == 1);
  CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0", "model.ckpt-3"});
}

// -- close ----------------------------------------------------------------------------------

TEST_CASE("destructor without close after a failed run: no end(), services stopped, directory unlocked") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto hook = std::make_shared<ScriptedHook>("user", log);
  {
    auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
    o.hooks = {hook};
    auto sess = Open(o);
    model->on_train = [](int64_t) { return absl::InvalidArgumentError("bad batch"); };
    CHECK(absl::IsInvalidArgument(sess->run({"train_op"}).status()));
    CHECK(absl::IsFailedPrecondition(sess->run({"train_op"}).status()));
    Bounded([&] { sess.reset(); return 0; });
  }
  CHECK(log->Count("user.end") == 0);
  model->on_train = nullptr;
  auto sess = Open(ChiefOptions(MakeGraph(model), dir.path(), &clock));
  CHECK(sess->close().ok());
}

TEST_CASE("run() and run_step_fn() after close are FAILED_PRECONDITION; should_stop stays true") {
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), "", &clock);
  auto sess = Open(o);
  CHECK(sess->close().ok());
  CHECK(absl::IsFailedPrecondition(sess->run({"train_op"}).status()));
  CHECK(absl::IsFailedPrecondition(sess->run_step_fn([](MonitoredStepContext&) { return absl::OkStatus(); })));
  CHECK(sess->should_stop());
  // The last coordinator, stopped (TF: None; Foreman never returns null).
  REQUIRE(sess->coordinator() != nullptr);
  CHECK(sess->coordinator()->should_stop());
}

// -- other threads ----------------------------------------------------------------------------

TEST_CASE("should_stop() polled from another thread while training, and request_stop from a service thread") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto hook = std::make_shared<ScriptedHook>("user", log);
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{3};
  o.hooks = {hook};
  auto sess = Open(o);
  std::atomic<bool> done{false};
  std::atomic<int> polls{0};
  std::thread poller([&] {
    while (!done.load()) {
      (void)sess->should_stop();
      (void)sess->recoveries();
      ++polls;
    }
  });
  Coordinator* coord = sess->coordinator();
  REQUIRE(coord != nullptr);
  std::atomic<bool> go{false};
  std::thread service([&] {
    while (!go.load()) std::this_thread::yield();
    coord->request_stop().IgnoreError();
  });
  int runs = 0;
  while (!sess->should_stop() && runs < 100000) {
    auto r = sess->run({"train_op"});
    if (!r.ok()) {
      // The service thread's request_stop can land between should_stop()
      // and run(): then run() refuses (B27), which is the clean outcome.
      CHECK_MESSAGE(absl::IsFailedPrecondition(r.status()), r.status().ToString());
      CHECK(sess->should_stop());
      break;
    }
    if (++runs == 20) go = true;
  }
  service.join();
  CHECK(sess->should_stop());
  CHECK(Bounded([&] { return sess->close(); }).ok());
  done = true;
  poller.join();
  CHECK(log->Count("user.end") == 1);
  CHECK(polls.load() > 0);
}

// -- directory lock ---------------------------------------------------------------------------

TEST_CASE("two sessions on one checkpoint dir: the second fails naming the lock; after close a third works") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto first = Open(ChiefOptions(MakeGraph(model), dir.path(), &clock));
  auto second = Bounded([&] { return MonitoredTrainingSession(ChiefOptions(MakeGraph(model), dir.path(), &clock)); });
  CHECK(absl::IsFailedPrecondition(second.status()));
  CHECK(!second.status().message().empty());
  REQUIRE(first->run({"train_op"}).ok());
  CHECK(first->close().ok());
  auto third = Open(ChiefOptions(MakeGraph(model), dir.path(), &clock));
  auto out = third->run({"global_step", "train_op"});
  REQUIRE(out.ok());
  CHECK(Int(out->at("global_step")) == 1);
  CHECK(third->close().ok());
}

TEST_CASE("an unwritable checkpoint_dir fails Create with the file error, bounded") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  // A regular file where the directory should be.
  REQUIRE(WriteStringToFile(Env::Default(), dir / "file", "x").ok());
  auto sess = Bounded(
      [&] { return MonitoredTrainingSession(ChiefOptions(MakeGraph(model), dir / "file" + "/ckpt", &clock)); });
  CHECK(!sess.ok());
}

// -- chief + worker -----------------------------------------------------------------------------

TEST_CASE("chief and worker over inproc: the worker waits, trains on shared values, recovers from ABORTED") {
  const std::string target = "inproc://breaker_cw";
  ResetInprocTarget(target);
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto graph = MakeGraph(model);
  MonitoredTrainingSessionOptions wo;
  wo.graph = MakeGraph(model);
  wo.master = target;
  wo.is_chief = false;
  wo.max_wait_secs = 600;
  wo.recovery_wait_secs = 5;
  wo.config.clock = &clock;
  wo.stop_grace_period_secs = 0;
  wo.recovery.initial_backoff = absl::ZeroDuration();
  auto worker_f = std::async(std::launch::async, [&] { return MonitoredTrainingSession(wo); });
  REQUIRE(clock.BlockUntilWaiters(1, absl::Seconds(20)));
  auto co = ChiefOptions(graph, dir.path(), &clock);
  co.master = target;
  auto chief = Open(co);
  REQUIRE(chief->run({"train_op"}).ok());
  clock.Advance(absl::Seconds(5));
  REQUIRE(worker_f.wait_for(kWait) == std::future_status::ready);
  auto worker = worker_f.get();
  REQUIRE_MESSAGE(worker.ok(), worker.status().ToString());
  auto out = (*worker)->run({"global_step", "train_op"});
  REQUIRE(out.ok());
  CHECK(Int(out->at("global_step")) == 1);
  bool injected = false;
  model->on_train = [&](int64_t) -> Status {
    if (!injected) {
      injected = true;
      return absl::AbortedError("worker preempted");
    }
    return absl::OkStatus();
  };
  auto w2 = Bounded([&] { return (*worker)->run({"train_op"}); });
  REQUIRE_MESSAGE(w2.ok(), w2.status().ToString());
  CHECK((*worker)->recoveries() == 1);
  CHECK(Int(w2->at("train_op")) == 3);  // the worker never restores: shared values kept
  CHECK(Bounded([&] { return (*worker)->close(); }).ok());
  CHECK(Bounded([&] { return chief->close(); }).ok());
  ResetInprocTarget(target);
}

// -- decision 9 / restarts -------------------------------------------------------------------------

TEST_CASE("decision 9 restart at or past StopAtStepHook's last_step trains nothing, saves nothing new") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  {
    auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
    o.hooks = {StopAtStepHook::Create(LastStep(5)).value()};
    auto sess = Open(o);
    while (!sess->should_stop()) REQUIRE(sess->run({"train_op"}).ok());
    CHECK(sess->close().ok());
  }
  CHECK(model->train_calls == 5);
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.hooks = {StopAtStepHook::Create(LastStep(5)).value()};
  auto sess = Open(o);
  CHECK(sess->should_stop());
  CHECK(absl::IsFailedPrecondition(sess->run({"train_op"}).status()));
  CHECK(sess->close().ok());
  CHECK(model->train_calls == 5);
  CHECK(Checkpoints(dir.path()).back() == "model.ckpt-5");
}

TEST_CASE("decision 9 StopAtStepHook in chief_only_hooks (before the saver hook) still stops before the first step") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  {
    auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
    auto sess = Open(o);
    for (int i = 0; i < 5; ++i) REQUIRE(sess->run({"train_op"}).ok());
    CHECK(sess->close().ok());
  }
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.chief_only_hooks = {StopAtStepHook::Create(LastStep(3)).value()};
  auto sess = Open(o);
  CHECK(sess->should_stop());
  CHECK(sess->close().ok());
  CHECK(model->train_calls == 5);
}

TEST_CASE("StopAtStepHook num_steps counts from the first session, not from each recovery (B99)") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{2};
  o.hooks = {StopAtStepHook::Create(NumSteps(6)).value()};
  auto sess = Open(o);
  bool injected = false;
  model->on_train = [&](int64_t step) -> Status {
    if (step == 3 && !injected) {
      injected = true;
      return absl::AbortedError("x");
    }
    return absl::OkStatus();
  };
  int runs = 0;
  while (!sess->should_stop() && runs < 50) {
    ++runs;
    REQUIRE(sess->run({"train_op"}).ok());
  }
  CHECK(sess->close().ok());
  CHECK(Checkpoints(dir.path()).back() == "model.ckpt-6");
}


// -- bug-report replays through MonitoredTrainingSession ---------------------------------------------

class StopOnNthSave : public CheckpointSaverListener {
 public:
  explicit StopOnNthSave(int n) : n_(n) {}
  StatusOr<bool> after_save(Session*, int64_t step) override {
    steps.push_back(step);
    return static_cast<int>(steps.size()) == n_;
  }
  Status end(Session*, int64_t step) override {
    end_step = step;
    return absl::OkStatus();
  }
  std::vector<int64_t> steps;
  int64_t end_step = -1;

 private:
  int n_;
};

TEST_CASE("H-12 through MTS: after_save true on the 3rd save stops right after step 20; end() saves nothing new") {
  CapturedLog captured;
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto listener = std::make_shared<StopOnNthSave>(3);
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{10};
  o.checkpoint_listeners = {listener};
  auto sess = Open(o);
  int runs = 0;
  while (!sess->should_stop() && runs < 100) {
    ++runs;
    REQUIRE(sess->run({"train_op"}).ok());
  }
  CHECK(runs == 20);
  CHECK(Bounded([&] { return sess->close(); }).ok());
  CHECK(listener->steps == std::vector<int64_t>{0, 10, 20});
  CHECK(listener->end_step == 20);
  CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0", "model.ckpt-10", "model.ckpt-20"});
  CHECK(captured.text().find("A CheckpointSaverListener requested that training be stopped") != std::string::npos);
  CHECK(captured.text().find("StopOnNthSave") != std::string::npos);
}

int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

TEST_CASE("H-28 through MTS: 3 training runs then 7 eval runs warn exactly 5 times; none without the counter") {
  for (bool counter : {true, false}) {
    CAPTURE(counter);
    CapturedLog captured;
    TempDir dir;
    ManualClock clock;
    auto model = std::make_shared<Model>();
    auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
    if (!counter) o.log_step_count_steps = std::nullopt;
    auto sess = Open(o);
    for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"train_op"}).ok());
    const std::string warning = "has not been increased";
    CHECK(CountOf(captured.text(), warning) == 0);
    for (int i = 0; i < 7; ++i) REQUIRE(sess->run({"summaries"}).ok());
    CHECK(CountOf(captured.text(), warning) == (counter ? 5 : 0));
    if (counter) CHECK(captured.text().find("Current value (could be stable): 3 vs previous value: 3") != std::string::npos);
    CHECK(sess->close().ok());
  }
}

TEST_CASE("H-23 through MTS: save_checkpoint_steps=1 over 8 runs keeps 4..8") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{1};
  auto sess = Open(o);
  for (int i = 0; i < 8; ++i) REQUIRE(sess->run({"train_op"}).ok());
  CHECK(sess->close().ok());
  CHECK(Checkpoints(dir.path()) ==
        std::vector<std::string>{"model.ckpt-4", "model.ckpt-5", "model.ckpt-6", "model.ckpt-7", "model.ckpt-8"});
  auto state = ReadCheckpointState(Env::Default(), dir.path());
  REQUIRE(state.ok());
  REQUIRE(state->has_value());
  CHECK((*state)->all_model_checkpoint_paths.size() == 5);
}

TEST_CASE("H-11 through MTS: explicit close then destruction: end() once, the final save once") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto hook = std::make_shared<ScriptedHook>("user", log);
  {
    auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
    o.hooks = {hook};
    auto sess = Open(o);
    REQUIRE(sess->run({"train_op"}).ok());
    CHECK(sess->close().ok());
    CHECK(sess->close().ok());
  }
  CHECK(log->Count("user.end") == 1);
  CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0", "model.ckpt-1"});
}

// -- Supervisor ----
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
//---------------------------------------------------------------------------------


// -- actor API ---------------------------------------------------------------------------------------

struct ActorFixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> system;
  ActorFixture() {
    cfg.set("scheduler.max-threads", 2);
    system = std::make_unique<caf::actor_system>(cfg);
  }
  ~ActorFixture() { system->await_all_actors_done(); }
};

Status AwaitDown(caf::scoped_actor& self, const caf::actor& job) {
  Status outcome = absl::DeadlineExceededError("no down_msg within 20 s");
  bool done = false;
  self->receive_while([&] { return !done; })(
      [&](caf::down_msg& dm) {
        if (dm.source == job) {
          outcome = StatusFromExitReason(dm.reason);
          done = true;
        }
      },
      caf::after(std::chrono::seconds(20)) >> [&] { done = true; });
  return outcome;
}

// Polls the job's JobStatus until its state is `state` (10 s at most).
bool AwaitJobState(caf::scoped_actor& self, const caf::actor& job, const std::string& state) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    bool reached = false;
    self->request(job, std::chrono::seconds(1), job_status_atom::value)
        .receive([&](const JobStatus& s) { reached = s.state == state; }, [&](caf::error&) {});
    if (reached) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// actor_api.hpp: "Killing the job ... closes the session (no end(): not a
// clean stop)".
TEST_CASE("actor API: a job shut down mid-run calls no end() and writes no final checkpoint") {
  TempDir dir;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto hook = std::make_shared<ScriptedHook>("user", log);
  std::atomic<bool> blocked{false};
  std::atomic<bool> release{false};
  model->on_train = [&](int64_t step) -> Status {
    if (step == 3) {
      blocked = true;
      for (int i = 0; i < 20000 && !release.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return absl::OkStatus();
  };
  ActorFixture fx;
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob spec;
    spec.options.graph = MakeGraph(model);
    spec.options.checkpoint_dir = dir.path();
    spec.options.save_checkpoint_steps = int64_t{100};
    spec.options.hooks = {hook};
    spec.start_immediately = true;
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    for (int i = 0; i < 20000 && !blocked.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(blocked.load());
    self->send_exit(job, caf::exit_reason::user_shutdown);
    // Release the step only once the job took the exit ("stopping"): released
    // earlier, a loaded machine ran the loop to step 100 (a periodic save)
    // before the job actor read its exit_msg.
    REQUIRE(AwaitJobState(self, job, "stopping"));
    release = true;
    CHECK(AwaitDown(self, job).code() == absl::StatusCode::kCancelled);
  }
  fx.system->await_all_actors_done();
  CHECK(log->Count("user.end") == 0);
  CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0"});
}

// An on_results error ends training as a hook error does: no end() (B39),
// no final checkpoint after the consumer failed (on_results runs in the job's
// control hook's after_run).
TEST_CASE("actor API: an on_results error runs no end() and writes no final checkpoint") {
  TempDir dir;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto hook = std::make_shared<ScriptedHook>("user", log);
  ActorFixture fx;
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob spec;
    spec.options.graph = MakeGraph(model);
    spec.options.checkpoint_dir = dir.path();
    spec.options.save_checkpoint_steps = int64_t{100};
    spec.options.hooks = {hook};
    spec.start_immediately = true;
    int calls = 0;
    spec.on_results = [calls](const TensorMap&) mutable -> Status {
      return ++calls == 3 ? absl::DataLossError("consumer lost data") : absl::OkStatus();
    };
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    CHECK(AwaitDown(self, job).code() == absl::StatusCode::kDataLoss);
  }
  fx.system->await_all_actors_done();
  CHECK(log->Count("user.end") == 0);
  CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0"});
}

// stop_atom before start_atom: the job must not hang (it either trains
// nothing and ends cleanly, or ignores the stop).
TEST_CASE("actor API: stop_atom then start_atom on an idle job ends the job cleanly, bounded") {
  TempDir dir;
  auto model = std::make_shared<Model>();
  ActorFixture fx;
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob spec;
    spec.options.graph = MakeGraph(model);
    spec.options.checkpoint_dir = dir.path();
    spec.options.hooks = {StopAtStepHook::Create(LastStep(5)).value()};
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    self->send(job, stop_atom::value);
    self->send(job, start_atom::value);
    self->send(job, start_atom::value);
    CHECK(AwaitDown(self, job).ok());
  }
  fx.system->await_all_actors_done();
  CHECK(model->train_calls <= 5);
}

}  // namespace
}  // namespace foreman
