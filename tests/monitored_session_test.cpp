// MonitoredSession and SingularMonitoredSession (spec §2-§4, B18-B54, B166;
// decisions 2-4; bug log H-05, H-09, H-11, H-14).
//
// The sessions come from FakeCreator (a raw Session whose variables it
// initializes itself, with injectable creation errors and an optional
// "checkpoint" it restores), so these tests exercise the wrapper stack alone;
// the real creators, hooks and checkpoints are in
// monitored_training_session_test.cpp. RecordingHook logs every callback.
#include "foreman/monitored_session.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "foreman/clock.hpp"
#include "foreman/mutex.hpp"
#include "foreman/stop.hpp"
#include "runtime/services.hpp"
#include "support/call_log.hpp"
#include "support/log_capture.hpp"
#include "support/recording_hook.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using testing::CallLog;
using testing::CapturedLog;
using testing::RecordingHook;
using testing::TempDir;

constexpr auto kWait = std::chrono::seconds(20);  // bound on every wait for another thread

// What the step does; set by a test before the run it affects.
struct StepScript {
  // Called with the global step before a "train_op" update; a non-OK status
  // fails the step before it changes anything.
  std::function<Status(int64_t step)> on_train;
  int train_calls = 0;
  std::vector<std::vector<std::string>> requested;  // per step, as the step saw it
};

// global_step, "w" (float, +1 per train_op). Fetches: train_op (the new
// step), loss, w, x / y (the fed value, or -1).
std::shared_ptr<Graph> MakeGraph(const std::shared_ptr<StepScript>& script) {
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph->AddVariable("w", Tensor::Scalar<float>(0.f)).ok());
  REQUIRE(graph
              ->SetStep([script](StepContext& ctx) -> Status {
                script->requested.push_back(ctx.requested());
                if (ctx.requested("train_op")) {
                  FOREMAN_ASSIGN_OR_RETURN(int64_t step, GetGlobalStep(ctx.variables()));
                  ++script->train_calls;
                  if (script->on_train) FOREMAN_RETURN_IF_ERROR(script->on_train(step));
                  FOREMAN_ASSIGN_OR_RETURN(Tensor * w, ctx.variables().Get("w"));
                  FOREMAN_ASSIGN_OR_RETURN(float wv, w->scalar<float>());
                  *w = Tensor::Scalar<float>(wv + 1.f);
                  FOREMAN_ASSIGN_OR_RETURN(int64_t next, IncrementGlobalStep(ctx.variables()));
                  ctx.Set("train_op", Tensor::Scalar<int64_t>(next));
                }
                if (ctx.requested("loss")) ctx.Set("loss", Tensor::Scalar<float>(0.5f));
                if (ctx.requested("w")) {
                  FOREMAN_ASSIGN_OR_RETURN(Tensor * w, ctx.variables().Get("w"));
                  ctx.Set("w", *w);
                }
                for (const char* name : {"x", "y"}) {
                  if (!ctx.requested(name)) continue;
                  const Tensor* fed = ctx.feed(name);
                  ctx.Set(name, fed != nullptr ? *fed : Tensor::Scalar<float>(-1.f));
                }
                return absl::OkStatus();
              })
              .ok());
  return graph;
}

int64_t Int(const Tensor& t) { return t.scalar<int64_t>().value(); }
float Float(const Tensor& t) { return t.scalar<float>().value(); }

// Creates raw sessions without a SessionManager: initializes what is not
// initialized, then "restores" `checkpoint` when set.
class FakeCreator : public SessionCreator {
 public:
  FakeCreator(std::shared_ptr<Graph> graph, std::shared_ptr<CallLog> log, SessionConfig config = {},
              std::string target = "")
      : scaffold_(std::make_shared<Scaffold>(graph)),
        graph_(std::move(graph)),
        log_(std::move(log)),
        config_(config),
        target_(std::move(target)) {}

  StatusOr<std::unique_ptr<Session>> create_session() override {
    {
      MutexLock l(mu_);
      ++calls;
    }
    cv_.notify_all();
    log_->Add("creator.create_session");
    if (!failures.empty()) {
      Status s = failures.front();
      failures.pop_front();
      return s;
    }
    FOREMAN_ASSIGN_OR_RETURN(auto session, Session::Create(graph_, target_, config_));
    FOREMAN_RETURN_IF_ERROR(session->WithVariables([&](VariableStore& vars) -> Status {
      for (const VariableDef& def : graph_->variables()) {
        if (vars.Contains(def.name)) continue;
        FOREMAN_ASSIGN_OR_RETURN(Tensor value, def.initializer());
        FOREMAN_RETURN_IF_ERROR(vars.Create(def.name, std::move(value), def.trainable));
      }
      for (const auto& [name, value] : checkpoint) FOREMAN_RETURN_IF_ERROR(vars.Assign(name, value));
      return absl::OkStatus();
    }));
    return session;
  }
  const std::shared_ptr<Scaffold>& scaffold() const override { return scaffold_; }
  const SessionConfig& config() const override { return config_; }

  // Blocks (real time, bounded) until create_session was called `n` times.
  bool WaitForCalls(int n) {
    MutexLock l(mu_);
    return cv_.wait_for(l, kWait, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls >= n; });
  }
  int Calls() {
    MutexLock l(mu_);
    return calls;
  }

  std::deque<Status> failures;               // returned by the next calls, in order
  std::map<std::string, Tensor> checkpoint;  // assigned after init

 private:
  Mutex mu_;
  std::condition_variable_any cv_;
  int calls ABSL_GUARDED_BY(mu_) = 0;

  std::shared_ptr<Scaffold> scaffold_;
  std::shared_ptr<Graph> graph_;
  std::shared_ptr<CallLog> log_;
  SessionConfig config_;
  std::string target_;
};

struct Fixture {
  std::shared_ptr<CallLog> log = std::make_shared<CallLog>();
  std::shared_ptr<StepScript> script = std::make_shared<StepScript>();
  std::shared_ptr<Graph> graph = MakeGraph(script);
  std::shared_ptr<FakeCreator> creator;

  explicit Fixture(SessionConfig config = {}, std::string target = "")
      : creator(std::make_shared<FakeCreator>(graph, log, config, std::move(target))) {}

  std::shared_ptr<RecordingHook> Hook(const std::string& name) { return std::make_shared<RecordingHook>(name, log); }

  // No back-off unless a test sets one: recovery tests need no clock.
  MonitoredSessionOptions Options(HookList hooks = {}) {
    MonitoredSessionOptions o;
    o.session_creator = creator;
    o.hooks = std::move(hooks);
    o.recovery.initial_backoff = absl::ZeroDuration();
    o.stop_grace_period_secs = 0;
    return o;
  }

  std::unique_ptr<MonitoredSession> Create(HookList hooks = {}) {
    auto s = MonitoredSession::Create(Options(std::move(hooks)));
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    return std::move(s).value();
  }
};

std::vector<std::string> Keys(const TensorMap& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : m) out.push_back(k);
  return out;
}

// A runner that stays alive until told to end (a straggler thread).
class FakeRunner : public RunnerInterface {
 public:
  explicit FakeRunner(std::shared_ptr<std::atomic<bool>> running) : running_(std::move(running)) {}
  Status Join() override { return absl::OkStatus(); }
  bool IsRunning() const override { return running_->load(); }
  std::string name() const override { return "fake_runner"; }

 private:
  std::shared_ptr<std::atomic<bool>> running_;
};

// -- §2 construction (B18-B23) ---------------------------------------------------

TEST_CASE("B18 a MonitoredSession from a graph alone initializes from scratch; one of graph/creator is required") {
  auto script = std::make_shared<StepScript>();
  MonitoredSessionOptions o;
  o.graph = MakeGraph(script);
  auto sess = MonitoredSession::Create(o);
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  auto out = (*sess)->run({"train_op", "w"});
  REQUIRE(out.ok());
  CHECK(Int(out->at("train_op")) == 1);
  CHECK(Float(out->at("w")) == 1.f);
  CHECK((*sess)->close().ok());

  auto none = MonitoredSession::Create(MonitoredSessionOptions{});
  CHECK(absl::IsInvalidArgument(none.status()));
}

// -- the one stop grace period: the StopRequest's ------------------------------------

TEST_CASE("stop_grace_period_secs unset, no StopRequest passed: the session's own has TF's 120 s; set: that") {
  auto script = std::make_shared<StepScript>();
  MonitoredSessionOptions o;
  o.graph = MakeGraph(script);
  CHECK_FALSE(o.stop_grace_period_secs.has_value());
  auto sess = MonitoredSession::Create(o);
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  REQUIRE((*sess)->stop_request() != nullptr);
  CHECK((*sess)->stop_request()->grace_period() == absl::Seconds(120));
  CHECK((*sess)->close().ok());

  o.graph = MakeGraph(script);
  o.stop_grace_period_secs = 7.5;
  auto set = MonitoredSession::Create(o);
  REQUIRE_MESSAGE(set.ok(), set.status().ToString());
  CHECK((*set)->stop_request()->grace_period() == absl::Milliseconds(7500));
  CHECK((*set)->close().ok());

  SingularMonitoredSessionOptions so;
  so.graph = MakeGraph(script);
  auto singular = SingularMonitoredSession::Create(so);
  REQUIRE_MESSAGE(singular.ok(), singular.status().ToString());
  CHECK((*singular)->stop_request()->grace_period() == absl::Seconds(120));
  CHECK((*singular)->close().ok());
}

TEST_CASE("stop_grace_period_secs unset, a StopRequest passed in RuntimeOptions::stop: its grace period is the run's") {
  auto script = std::make_shared<StepScript>();
  StopRequestOptions stop_options;
  stop_options.grace_period = absl::Seconds(5);
  auto stop = std::make_shared<StopRequest>(stop_options);
  MonitoredSessionOptions o;
  o.graph = MakeGraph(script);
  o.runtime.stop = stop;
  auto sess = MonitoredSession::Create(o);
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  CHECK((*sess)->stop_request() == stop);
  CHECK((*sess)->stop_request()->grace_period() == absl::Seconds(5));
  REQUIRE((*sess)->run({"train_op"}).ok());
  CHECK((*sess)->close().ok());

  // MonitoredTrainingSession passes it on unchanged.
  MonitoredTrainingSessionOptions mts;
  mts.graph = MakeGraph(script);
  mts.runtime.stop = stop;
  auto trained = MonitoredTrainingSession(mts);
  REQUIRE_MESSAGE(trained.ok(), trained.status().ToString());
  CHECK((*trained)->stop_request() == stop);
  CHECK((*trained)->close().ok());
}

TEST_CASE("stop_grace_period_secs set and a StopRequest with another grace period: INVALID_ARGUMENT naming both") {
  auto script = std::make_shared<StepScript>();
  auto stop = std::make_shared<StopRequest>(StopRequestOptions{});  // 120 s
  const std::string expected = "stop_grace_period_secs=5 but RuntimeOptions::stop's grace period is 120 s; set one";

  MonitoredSessionOptions o;
  o.graph = MakeGraph(script);
  o.stop_grace_period_secs = 5;
  o.runtime.stop = stop;
  auto sess = MonitoredSession::Create(o);
  REQUIRE(absl::IsInvalidArgument(sess.status()));
  CHECK(sess.status().message() == expected);

  SingularMonitoredSessionOptions so;
  so.graph = MakeGraph(script);
  so.stop_grace_period_secs = 5;
  so.runtime.stop = stop;
  auto singular = SingularMonitoredSession::Create(so);
  REQUIRE(absl::IsInvalidArgument(singular.status()));
  CHECK(singular.status().message() == expected);

  MonitoredTrainingSessionOptions mts;
  mts.graph = MakeGraph(script);
  mts.stop_grace_period_secs = 5;
  mts.runtime.stop = stop;
  auto trained = MonitoredTrainingSession(mts);
  REQUIRE(absl::IsInvalidArgument(trained.status()));
  CHECK(trained.status().message() == expected);

  // Nothing ran and the caller's StopRequest is untouched.
  CHECK(script->train_calls == 0);
  CHECK_FALSE(stop->stop_requested());
  CHECK_FALSE(stop->completed());
}

TEST_CASE("stop_grace_period_secs set and a StopRequest with the same grace period: accepted") {
  auto script = std::make_shared<StepScript>();
  StopRequestOptions stop_options;
  stop_options.grace_period = absl::Seconds(1.5);
  auto stop = std::make_shared<StopRequest>(stop_options);
  MonitoredSessionOptions o;
  o.graph = MakeGraph(script);
  o.stop_grace_period_secs = 1.5;
  o.runtime.stop = stop;
  auto sess = MonitoredSession::Create(o);
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  CHECK((*sess)->stop_request() == stop);
  CHECK((*sess)->stop_request()->grace_period() == absl::Milliseconds(1500));
  REQUIRE((*sess)->run({"train_op"}).ok());
  CHECK((*sess)->close().ok());
}

TEST_CASE("B19 Create calls begin() in order, creates the session, a fresh coordinator, then after_create_session in order") {
  Fixture f;
  auto a = f.Hook("a");
  auto b = f.Hook("b");
  auto sess = f.Create({a, b});
  CHECK(f.log->calls() == std::vector<std::string>{"a.begin", "b.begin", "creator.create_session",
                                                   "a.after_create_session", "b.after_create_session"});
  REQUIRE(a->coords.size() == 1);
  CHECK(a->coords[0] == sess->coordinator());
  CHECK(b->coords[0] == sess->coordinator());
  CHECK(a->sessions[0] != nullptr);
  CHECK(a->services != nullptr);  // attached before begin()
  CHECK(sess->close().ok());
}

TEST_CASE("B20 begin() once per MonitoredSession, after_create_session once per created session") {
  Fixture f;
  auto a = f.Hook("a");
  auto sess = f.Create({a});
  f.script->on_train = [&](int64_t) {
    return f.script->train_calls == 2 ? absl::AbortedError("preempted") : absl::OkStatus();
  };
  for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"train_op"}).ok());
  CHECK(sess->recoveries() == 1);
  CHECK(f.log->Count("a.begin") == 1);
  CHECK(f.log->Count("a.after_create_session") == 2);
  REQUIRE(a->coords.size() == 2);
  CHECK(a->coords[0] != a->coords[1]);  // a fresh coordinator per session
  CHECK(sess->coordinator() == a->coords[1]);
  CHECK(sess->close().ok());
}

TEST_CASE("B21 hooks may add variables in begin(); after creation the graph is finalized") {
  Fixture f;
  auto a = f.Hook("a");
  a->on_begin = [&] { return f.graph->AddVariable("added_in_begin", Tensor::Scalar<float>(7.f)); };
  bool initialized = false;
  a->on_create = [&](Session* s, Coordinator*) {
    return s->WithVariables([&](VariableStore& vars) {
      initialized = vars.Contains("added_in_begin");
      return absl::OkStatus();
    });
  };
  auto sess = f.Create({a});
  CHECK(initialized);
  CHECK(f.graph->finalized());
  Status late = f.graph->AddVariable("too_late", Tensor::Scalar<float>(0.f));
  CHECK(absl::IsFailedPrecondition(late));
  CHECK(sess->close().ok());
}

TEST_CASE("B22 close un-finalizes a graph that was not finalized before, and only then") {
  SUBCASE("not finalized before") {
    Fixture f;
    auto sess = f.Create();
    CHECK(f.graph->finalized());
    CHECK(sess->close().ok());
    CHECK_FALSE(f.graph->finalized());
    CHECK(f.graph->AddVariable("after_close", Tensor::Scalar<float>(0.f)).ok());
  }
  SUBCASE("finalized before") {
    Fixture f;
    f.graph->Finalize();
    auto sess = f.Create();
    CHECK(sess->close().ok());
    CHECK(f.graph->finalized());
  }
}

TEST_CASE("B23 SingularMonitoredSession: no recovery (ABORTED is returned), raw_session() until close") {
  auto log = std::make_shared<CallLog>();
  auto script = std::make_shared<StepScript>();
  SingularMonitoredSessionOptions o;
  o.graph = MakeGraph(script);
  auto a = std::make_shared<RecordingHook>("a", log);
  o.hooks = {a};
  o.stop_grace_period_secs = 0;
  auto created = SingularMonitoredSession::Create(o);
  REQUIRE_MESSAGE(created.ok(), created.status().ToString());
  auto& sess = *created;
  REQUIRE(sess->raw_session() != nullptr);
  CHECK(sess->raw_session() == a->sessions[0]);
  // The raw session runs without hooks.
  REQUIRE(sess->raw_session()->Run({"train_op"}).ok());
  CHECK(log->Count("a.before_run") == 0);

  script->on_train = [](int64_t) { return absl::AbortedError("preempted"); };
  auto out = sess->run({"train_op"});
  CHECK(absl::IsAborted(out.status()));
  CHECK(sess->recoveries() == 0);
  CHECK(log->Count("a.after_create_session") == 1);
  CHECK(sess->should_stop());
  CHECK(absl::IsAborted(sess->close()));
  CHECK(log->Count("a.end") == 0);  // B39
  CHECK(sess->raw_session() == nullptr);
}

// -- §3 run loop (B27-B45) ---------------------------------------------------------

TEST_CASE("B27 run() after should_stop is FAILED_PRECONDITION and runs nothing") {
  Fixture f;
  auto a = f.Hook("a");
  a->request_stop_in_after_run = true;
  auto sess = f.Create({a});
  REQUIRE(sess->run({"train_op"}).ok());
  CHECK(sess->should_stop());
  auto again = sess->run({"train_op"});
  CHECK(absl::IsFailedPrecondition(again.status()));
  CHECK(again.status().message() == "Run called even after should_stop requested.");
  CHECK(f.script->train_calls == 1);
  CHECK(f.log->Count("a.before_run") == 1);
  CHECK(sess->close().ok());
}

TEST_CASE("B28 one SessionRunContext per run, shared by every hook's before_run and after_run") {
  Fixture f;
  auto a = f.Hook("a");
  auto b = f.Hook("b");
  std::vector<std::string> seen_fetches;
  Session* seen_session = nullptr;
  a->on_before = [&](SessionRunContext& ctx) -> StatusOr<SessionRunArgs> {
    seen_fetches = ctx.original_args().fetches;
    CHECK(ctx.original_args().feeds.size() == (seen_fetches.size() == 2 ? 1u : 0u));
    seen_session = ctx.session();
    return SessionRunArgs{};
  };
  auto sess = f.Create({a, b});
  REQUIRE(sess->run({"train_op", "x"}, {{"x", Tensor::Scalar<float>(3.f)}}).ok());
  REQUIRE(sess->run({"train_op"}).ok());
  CHECK(seen_fetches == std::vector<std::string>{"train_op"});
  CHECK(seen_session == a->sessions[0]);
  REQUIRE(a->before_contexts.size() == 2);
  CHECK(a->before_contexts[0] == a->after_contexts[0]);
  CHECK(a->before_contexts[0] == b->before_contexts[0]);
  CHECK(a->before_contexts[0] == b->after_contexts[0]);
  CHECK(sess->close().ok());
}

TEST_CASE("B29 before_run is called on every hook in list order, then after_run in list order") {
  Fixture f;
  auto a = f.Hook("a");
  auto b = f.Hook("b");
  auto c = f.Hook("c");
  auto sess = f.Create({a, b, c});
  REQUIRE(sess->run({"train_op"}).ok());
  std::vector<std::string> runs;
  for (const auto& call : f.log->calls()) {
    if (call.find("_run") != std::string::npos) runs.push_back(call);
  }
  CHECK(runs == std::vector<std::string>{"a.before_run", "b.before_run", "c.before_run", "a.after_run", "b.after_run",
                                         "c.after_run"});
  CHECK(sess->close().ok());
}

TEST_CASE("B30 fetches are merged for the step; the caller gets exactly its own") {
  Fixture f;
  auto a = f.Hook("a");
  a->args.fetches = {"loss", "w"};
  auto b = f.Hook("b");
  b->args.fetches = {"loss"};
  auto sess = f.Create({a, b});
  auto out = sess->run({"train_op"});
  REQUIRE(out.ok());
  CHECK(Keys(*out) == std::vector<std::string>{"train_op"});
  REQUIRE(!f.script->requested.empty());
  CHECK(f.script->requested.back() == std::vector<std::string>{"loss", "train_op", "w"});
  CHECK(sess->close().ok());
}

TEST_CASE("B31 a hook that asked for no fetches gets results == nullptr; others get exactly theirs") {
  Fixture f;
  auto none = f.Hook("none");
  auto some = f.Hook("some");
  some->args.fetches = {"loss"};
  auto sess = f.Create({none, some});
  REQUIRE(sess->run({"train_op", "w"}).ok());
  REQUIRE(none->results.size() == 1);
  CHECK_FALSE(none->results[0].has_value());
  REQUIRE(some->results[0].has_value());
  CHECK(Keys(*some->results[0]) == std::vector<std::string>{"loss"});
  CHECK(Float(some->results[0]->at("loss")) == 0.5f);
  CHECK(sess->close().ok());
}

TEST_CASE("B30/B31 across runs: when the caller's or a hook's fetches change, each still gets exactly its own") {
  // MonitoredSession keeps the run's plan (merged fetches, each one's slots)
  // between runs and rebuilds it only on a change: every change must be seen.
  Fixture f;
  auto a = f.Hook("a");
  const std::vector<std::vector<std::string>> a_fetches = {{"w"}, {"loss", "global_step"}, {}, {"w", "w"}};
  int run = 0;
  a->on_before = [&](SessionRunContext&) -> StatusOr<SessionRunArgs> {
    SessionRunArgs args;
    args.fetches = a_fetches[static_cast<std::size_t>(run)];
    return args;
  };
  auto b = f.Hook("b");
  b->args.fetches = {"global_step"};
  auto sess = f.Create({a, b});
  // Runs 2 and 3 repeat the caller's fetches while the hook's change.
  const std::vector<std::vector<std::string>> caller = {{"train_op"}, {"w", "train_op", "w"}, {"loss"}, {"loss"}};
  std::vector<TensorMap> outs;
  for (run = 0; run < 4; ++run) {
    auto out = sess->run(caller[static_cast<std::size_t>(run)]);
    REQUIRE_MESSAGE(out.ok(), out.status().ToString());
    outs.push_back(*std::move(out));
  }
  CHECK(Keys(outs[0]) == std::vector<std::string>{"train_op"});
  CHECK(Keys(outs[1]) == std::vector<std::string>{"train_op", "w"});
  CHECK(Float(outs[1].at("w")) == 2.f);
  CHECK(Keys(outs[2]) == std::vector<std::string>{"loss"});
  CHECK(Keys(outs[3]) == std::vector<std::string>{"loss"});
  CHECK(Float(outs[3].at("loss")) == 0.5f);

  REQUIRE(a->results.size() == 4);
  REQUIRE(a->results[0].has_value());
  CHECK(Keys(*a->results[0]) == std::vector<std::string>{"w"});
  CHECK(Float(a->results[0]->at("w")) == 1.f);
  REQUIRE(a->results[1].has_value());
  CHECK(Keys(*a->results[1]) == std::vector<std::string>{"global_step", "loss"});
  CHECK(Int(a->results[1]->at("global_step")) == 1);
  CHECK_FALSE(a->results[2].has_value());
  REQUIRE(a->results[3].has_value());
  CHECK(Keys(*a->results[3]) == std::vector<std::string>{"w"});
  CHECK(Float(a->results[3]->at("w")) == 2.f);  // no train_op since run 1
  REQUIRE(b->results.size() == 4);
  for (int i = 0; i < 4; ++i) {
    REQUIRE(b->results[static_cast<std::size_t>(i)].has_value());
    CHECK(Keys(*b->results[static_cast<std::size_t>(i)]) == std::vector<std::string>{"global_step"});
    CHECK(Int(b->results[static_cast<std::size_t>(i)]->at("global_step")) == std::min(i, 2));
  }
  REQUIRE(f.script->requested.size() == 4);
  CHECK(f.script->requested[1] == std::vector<std::string>{"global_step", "loss", "train_op", "w"});
  CHECK(f.script->requested[2] == std::vector<std::string>{"global_step", "loss"});
  CHECK(f.script->requested[3] == std::vector<std::string>{"global_step", "loss", "w"});
  CHECK(sess->close().ok());
}

TEST_CASE("B32 feed merging: hook feeds reach the step; conflicts are INVALID_ARGUMENT with TF's messages") {
  SUBCASE("hook and user feeds are merged; empty hook feeds leave the user's") {
    Fixture f;
    auto a = f.Hook("a");
    auto b = f.Hook("b");
    b->args.feeds = {{"y", Tensor::Scalar<float>(5.f)}};
    auto sess = f.Create({a, b});
    auto out = sess->run({"x", "y"}, {{"x", Tensor::Scalar<float>(3.f)}});
    REQUIRE(out.ok());
    CHECK(Float(out->at("x")) == 3.f);
    CHECK(Float(out->at("y")) == 5.f);
    CHECK(sess->close().ok());
  }
  SUBCASE("two hooks feed the same tensor") {
    Fixture f;
    auto a = f.Hook("a");
    a->args.feeds = {{"x", Tensor::Scalar<float>(1.f)}};
    auto b = f.Hook("b");
    b->args.feeds = {{"x", Tensor::Scalar<float>(2.f)}};
    auto sess = f.Create({a, b});
    auto out = sess->run({"train_op"});
    CHECK(absl::IsInvalidArgument(out.status()));
    CHECK(out.status().message() == "Same tensor is fed by two hooks. Conflict(s): ['x']");
    CHECK(f.script->train_calls == 0);
    CHECK(absl::IsInvalidArgument(sess->close()));
  }
  SUBCASE("a hook and the user feed the same tensor") {
    Fixture f;
    auto a = f.Hook("a");
    a->args.feeds = {{"x", Tensor::Scalar<float>(1.f)}, {"y", Tensor::Scalar<float>(1.f)}};
    auto sess = f.Create({a});
    auto out = sess->run({"train_op"}, {{"x", Tensor::Scalar<float>(2.f)}, {"y", Tensor::Scalar<float>(2.f)}});
    CHECK(absl::IsInvalidArgument(out.status()));
    CHECK(out.status().message() == "Same tensor is fed by a SessionRunHook and user. Conflict(s): ['x', 'y']");
    CHECK(f.script->train_calls == 0);
    CHECK(absl::IsInvalidArgument(sess->close()));
  }
}

TEST_CASE("B33 run options: max of trace_level and timeout_in_ms, OR of report_tensor_allocations; one RunMetadata") {
  Fixture f;
  auto a = f.Hook("a");
  a->args.options.trace_level = RunOptions::kFullTrace;
  a->args.options.timeout_in_ms = 50;
  auto b = f.Hook("b");
  b->args.options.timeout_in_ms = 20000;
  b->args.options.report_tensor_allocations_upon_oom = true;
  auto sess = f.Create({a, b});
  RunOptions caller;
  caller.timeout_in_ms = 100;
  RunMetadata metadata;
  REQUIRE(sess->run({"train_op"}, {}, caller, &metadata).ok());
  for (const auto& hook : {a, b}) {
    REQUIRE(hook->options.size() == 1);
    CHECK(hook->options[0].trace_level == RunOptions::kFullTrace);
    CHECK(hook->options[0].timeout_in_ms == 20000);
    CHECK(hook->options[0].report_tensor_allocations_upon_oom);
    CHECK(hook->metadata[0] == &metadata);  // the caller's, shared
  }
  CHECK_FALSE(metadata.step_stats.empty());  // traced: the merged trace level reached the session
  CHECK(sess->close().ok());
}

TEST_CASE("B34 after_run is not called when the step fails") {
  Fixture f;
  auto a = f.Hook("a");
  auto sess = f.Create({a});
  f.script->on_train = [](int64_t) { return absl::InternalError("step failed"); };
  auto out = sess->run({"train_op"});
  CHECK(absl::IsInternal(out.status()));
  CHECK(f.log->Count("a.before_run") == 1);
  CHECK(f.log->Count("a.after_run") == 0);
  CHECK(absl::IsInternal(sess->close()));
}

TEST_CASE("B35 request_stop in after_run takes effect after every after_run of that run") {
  Fixture f;
  auto a = f.Hook("a");
  a->request_stop_in_after_run = true;
  auto b = f.Hook("b");
  bool stop_seen_by_b = true;
  b->on_after = [&](SessionRunContext& ctx, const SessionRunValues&) {
    stop_seen_by_b = ctx.stop_requested();
    return absl::OkStatus();
  };
  auto sess = f.Create({a, b});
  CHECK_FALSE(sess->should_stop());
  auto out = sess->run({"train_op"});
  REQUIRE(out.ok());  // the run is not interrupted
  CHECK(Int(out->at("train_op")) == 1);
  CHECK(f.log->Count("b.after_run") == 1);
  CHECK(stop_seen_by_b);  // the same context
  CHECK(sess->should_stop());
  CHECK(sess->close().ok());
  CHECK(f.log->Count("a.end") == 1);
}

TEST_CASE("B36 an after_run error skips later hooks' after_run, does not apply the stop flag, ends training") {
  Fixture f;
  auto a = f.Hook("a");
  a->request_stop_in_after_run = true;
  auto b = f.Hook("b");
  b->on_after = [](SessionRunContext&, const SessionRunValues&) { return absl::DataLossError("b failed"); };
  auto c = f.Hook("c");
  auto sess = f.Create({a, b, c});
  auto out = sess->run({"train_op"});
  CHECK(out.status() == absl::DataLossError("hook b::after_run: b failed"));  // code kept, hook named
  CHECK(f.log->Count("c.after_run") == 0);
  CHECK(sess->should_stop());
  // Not a clean stop although `a` asked for one: end() is not called.
  CHECK(sess->close() == absl::DataLossError("hook b::after_run: b failed"));
  CHECK(f.log->Count("a.end") == 0);
  CHECK(f.log->Count("c.end") == 0);
}

TEST_CASE("B37 should_stop: the hooks' flag, the coordinator, or a closed session") {
  SUBCASE("coordinator") {
    Fixture f;
    auto sess = f.Create();
    CHECK_FALSE(sess->should_stop());
    CHECK(sess->coordinator()->request_stop().ok());
    CHECK(sess->should_stop());
    CHECK(sess->close().ok());  // a clean request: OK
  }
  SUBCASE("closed") {
    Fixture f;
    auto sess = f.Create();
    CHECK(sess->close().ok());
    CHECK(sess->should_stop());
    // The last coordinator, stopped (TF: None; Foreman never returns null).
    REQUIRE(sess->coordinator() != nullptr);
    CHECK(sess->coordinator()->should_stop());
  }
  SUBCASE("SingularMonitoredSession reports the coordinator's error through stop_error()") {
    auto script = std::make_shared<StepScript>();
    SingularMonitoredSessionOptions o;
    o.graph = MakeGraph(script);
    o.stop_grace_period_secs = 0;
    auto sess = SingularMonitoredSession::Create(o);
    REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
    CHECK((*sess)->stop_error().ok());
    std::thread t([&] { (*sess)->coordinator()->request_stop(absl::AbortedError("ps lost")).IgnoreError(); });
    t.join();
    CHECK((*sess)->should_stop());  // no recovery layer: even a preemption error stops
    CHECK((*sess)->stop_error() == absl::AbortedError("ps lost"));
    CHECK((*sess)->close() == absl::AbortedError("ps lost"));
  }
}

TEST_CASE("B38 close() calls end() on every hook in order, with the raw session") {
  Fixture f;
  auto a = f.Hook("a");
  auto b = f.Hook("b");
  auto sess = f.Create({a, b});
  REQUIRE(sess->run({"train_op"}).ok());
  CHECK(sess->close().ok());
  CHECK(f.log->Ending(".end") == std::vector<std::string>{"a.end", "b.end"});
  REQUIRE(a->end_sessions.size() == 1);
  CHECK(a->end_sessions[0] == a->sessions[0]);
}

TEST_CASE("B39 end() is not called after an error: the step's, a hook's NaN loss") {
  SUBCASE("step error") {
    Fixture f;
    auto a = f.Hook("a");
    auto sess = f.Create({a});
    f.script->on_train = [](int64_t) { return absl::InternalError("boom"); };
    CHECK(absl::IsInternal(sess->run({"train_op"}).status()));
    CHECK(sess->close() == absl::InternalError("boom"));
    CHECK(f.log->Count("a.end") == 0);
  }
  SUBCASE("NanLossDuringTrainingError from a hook") {
    Fixture f;
    auto a = f.Hook("a");
    a->on_after = [](SessionRunContext&, const SessionRunValues&) {
      return NanLossDuringTrainingError("NaN loss during training.");
    };
    auto sess = f.Create({a});
    CHECK(IsNanLossDuringTraining(sess->run({"train_op"}).status()));
    Status closed = sess->close();
    CHECK(IsNanLossDuringTraining(closed));
    CHECK(f.log->Count("a.end") == 0);
  }
}

TEST_CASE("B40 OUT_OF_RANGE: no after_run for the failing step, but end() is called") {
  Fixture f;
  auto a = f.Hook("a");
  auto sess = f.Create({a});
  f.script->on_train = [](int64_t step) {
    return step == 2 ? absl::OutOfRangeError("End of sequence") : absl::OkStatus();
  };
  REQUIRE(sess->run({"train_op"}).ok());
  REQUIRE(sess->run({"train_op"}).ok());
  auto out = sess->run({"train_op"});
  CHECK(absl::IsOutOfRange(out.status()));
  CHECK(sess->should_stop());
  CHECK(f.log->Count("a.after_run") == 2);
  CHECK(sess->close().ok());
  CHECK(f.log->Count("a.end") == 1);
}

TEST_CASE("B41 close() returns OK after OUT_OF_RANGE and the error after any other") {
  for (Status error : {absl::OutOfRangeError("done"), absl::InvalidArgumentError("bad batch")}) {
    CAPTURE(error);
    Fixture f;
    auto sess = f.Create();
    f.script->on_train = [error](int64_t) { return error; };
    CHECK(sess->run({"train_op"}).status() == error);
    Status closed = sess->close();
    if (absl::IsOutOfRange(error)) {
      CHECK(closed.ok());
    } else {
      CHECK(closed == error);
    }
  }
}

TEST_CASE("B42 a failing end() still closes the rest; close returns its error") {
  Fixture f;
  auto a = f.Hook("a");
  a->on_end = [](Session*) { return absl::PermissionDeniedError("end failed"); };
  auto b = f.Hook("b");
  auto sess = f.Create({a, b});
  REQUIRE(sess->run({"train_op"}).ok());
  Coordinator* coord = sess->coordinator();
  CHECK(sess->close() == absl::PermissionDeniedError("hook a::end: end failed"));
  CHECK(f.log->Count("b.end") == 0);  // TF's loop: the exception leaves it
  CHECK(coord->should_stop());        // the coordinator was still stopped and joined
  CHECK(coord->joined());
  CHECK(sess->should_stop());
}

TEST_CASE("B43 decision 4: a second close() returns the first one's status and calls no hook") {
  Fixture f;
  auto a = f.Hook("a");
  auto sess = f.Create({a});
  f.script->on_train = [](int64_t) { return absl::InternalError("boom"); };
  CHECK_FALSE(sess->run({"train_op"}).ok());
  const auto calls = f.log->calls().size();
  CHECK(sess->close() == absl::InternalError("boom"));
  CHECK(sess->close() == absl::InternalError("boom"));
  CHECK(f.log->calls().size() == calls);
  CHECK(sess->should_stop());
  auto after = sess->run({"train_op"});
  CHECK(absl::IsFailedPrecondition(after.status()));
}

TEST_CASE("H-11 close() then destruction: end() exactly once, no second teardown") {
  Fixture f;
  auto a = f.Hook("a");
  {
    auto sess = f.Create({a});
    REQUIRE(sess->run({"train_op"}).ok());
    CHECK(sess->close().ok());
    CHECK(sess->close().ok());
  }
  CHECK(f.log->Count("a.end") == 1);
  // The destructor closes a session nobody closed.
  Fixture g;
  auto b = g.Hook("b");
  { auto sess = g.Create({b}); }
  CHECK(g.log->Count("b.end") == 1);
}

TEST_CASE("B44 run_step_fn: the raw session bypasses hooks, run_with_hooks does not, request_stop is a clean stop") {
  Fixture f;
  auto a = f.Hook("a");
  auto sess = f.Create({a});
  Status s = sess->run_step_fn([&](MonitoredStepContext& ctx) -> Status {
    CHECK(ctx.session() == a->sessions.back());
    FOREMAN_RETURN_IF_ERROR(ctx.session()->Run({"train_op"}).status());
    return absl::OkStatus();
  });
  CHECK(s.ok());
  CHECK(f.log->Count("a.before_run") == 0);
  s = sess->run_step_fn([&](MonitoredStepContext& ctx) -> Status {
    auto out = ctx.run_with_hooks({"train_op"});
    FOREMAN_RETURN_IF_ERROR(out.status());
    CHECK(Int(out->at("train_op")) == 2);
    ctx.request_stop();
    return absl::OkStatus();
  });
  CHECK(s.ok());
  CHECK(f.log->Count("a.before_run") == 1);
  CHECK(f.log->Count("a.after_run") == 1);
  CHECK(sess->should_stop());
  CHECK(sess->close().ok());
  CHECK(f.log->Count("a.end") == 1);
}

TEST_CASE("B45 a preemption error inside step_fn re-runs the whole function on a new session") {
  Fixture f;
  auto a = f.Hook("a");
  auto sess = f.Create({a});
  f.script->on_train = [&](int64_t) {
    return f.script->train_calls == 1 ? absl::UnavailableError("socket closed") : absl::OkStatus();
  };
  int calls = 0;
  std::vector<Session*> sessions;
  Status s = sess->run_step_fn([&](MonitoredStepContext& ctx) -> Status {
    ++calls;
    sessions.push_back(ctx.session());
    FOREMAN_RETURN_IF_ERROR(ctx.run_with_hooks({"loss"}).status());
    return ctx.run_with_hooks({"train_op"}).status();
  });
  CHECK(s.ok());
  CHECK(calls == 2);
  CHECK(sess->recoveries() == 1);
  CHECK(f.log->Count("a.after_create_session") == 2);
  CHECK(sessions[1] == a->sessions[1]);
  CHECK(f.log->Count("a.before_run") == 4);  // loss, train_op (failed), loss, train_op
  CHECK(sess->close().ok());
}

TEST_CASE("H-14 only run() calls hooks: run_step_fn's raw session does not") {
  Fixture f;
  auto counting = f.Hook("counting");
  LoggingTensorHook::Options lo;
  lo.tensors = {"loss"};
  lo.every_n_iter = 100;
  auto logging = LoggingTensorHook::Create(lo);
  REQUIRE(logging.ok());
  auto sess = f.Create({counting, *logging});
  for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"loss"}).ok());
  for (int i = 0; i < 2; ++i) {
    REQUIRE(sess->run_step_fn([](MonitoredStepContext& ctx) { return ctx.session()->Run({"loss"}).status(); }).ok());
  }
  CHECK(f.log->Count("counting.before_run") == 3);
  CHECK(f.log->Count("counting.after_run") == 3);
  CHECK((*logging)->iteration() == 3);  // auxiliary runs count as iterations (#11971)
  CHECK(sess->close().ok());
}

// -- §4 errors and recovery (B46-B54) -------------------------------------------------

TEST_CASE("B46 ABORTED and UNAVAILABLE are preemption errors; others are not") {
  for (Status error : {absl::AbortedError("a"), absl::UnavailableError("u")}) {
    CAPTURE(error);
    Fixture f;
    auto sess = f.Create();
    f.script->on_train = [&, error](int64_t) { return f.script->train_calls == 1 ? error : absl::OkStatus(); };
    auto out = sess->run({"train_op"});
    REQUIRE(out.ok());
    CHECK(sess->recoveries() == 1);
    CHECK(sess->close().ok());
  }
  for (Status error : {absl::DeadlineExceededError("d"), absl::CancelledError("c"), absl::InternalError("i")}) {
    CAPTURE(error);
    Fixture f;
    auto sess = f.Create();
    f.script->on_train = [error](int64_t) { return error; };
    CHECK(sess->run({"train_op"}).status() == error);
    CHECK(sess->recoveries() == 0);
    CHECK(sess->close() == error);
  }
}

TEST_CASE("B47 recovery: close, re-create (after_create_session again, not begin), re-run the same call") {
  CapturedLog captured;
  Fixture f;
  auto a = f.Hook("a");
  a->args.fetches = {"loss"};
  auto sess = f.Create({a});
  f.script->on_train = [&](int64_t) {
    return f.script->train_calls == 1 ? absl::AbortedError("worker restarted") : absl::OkStatus();
  };
  auto out = sess->run({"train_op"}, {{"x", Tensor::Scalar<float>(1.f)}});
  REQUIRE(out.ok());
  CHECK(Int(out->at("train_op")) == 1);  // the retried run's result
  CHECK(f.creator->Calls() == 2);
  CHECK(f.log->Count("a.begin") == 1);
  CHECK(f.log->Count("a.after_create_session") == 2);
  CHECK(f.log->Count("a.before_run") == 2);
  CHECK(f.log->Count("a.after_run") == 1);
  CHECK(f.script->requested.back() == std::vector<std::string>{"loss", "train_op"});
  CHECK(captured.text().find("worker restarted") != std::string::npos);
  CHECK(captured.text().find("a new session will be created") != std::string::npos);
  CHECK(sess->close().ok());
}

TEST_CASE("B47 preemption errors from before_run and after_create_session recover too") {
  {
    Fixture g;
    auto b = g.Hook("b");
    int before = 0;
    b->on_before = [&](SessionRunContext&) -> StatusOr<SessionRunArgs> {
      if (++before == 1) return absl::AbortedError("before_run");
      return SessionRunArgs{};
    };
    int creates = 0;
    b->on_create = [&](Session*, Coordinator*) {
      return ++creates == 2 ? absl::UnavailableError("after_create_session") : absl::OkStatus();
    };
    auto s2 = g.Create({b});
    REQUIRE(s2->run({"train_op"}).ok());
    CHECK(s2->recoveries() == 2);
    CHECK(creates == 3);
    CHECK(s2->close().ok());
  }
}

TEST_CASE("a recovery whose new session is told to stop at creation ends the run cleanly, without the step") {
  // A worker of a cluster recovers after the other workers reached
  // last_step: StopAtStepHook's after_create_session requests stop. TF's
  // _RecoverableSession reruns the call into B27's RuntimeError; here the
  // run returns CANCELLED "no step ran" and close() is a clean stop.
  Fixture f;
  auto stopper = f.Hook("stopper");
  int creates = 0;
  stopper->on_create = [&](Session*, Coordinator* coord) {
    return ++creates == 2 ? coord->request_stop() : absl::OkStatus();
  };
  auto sess = f.Create({stopper});
  f.script->on_train = [&](int64_t) {
    return f.script->train_calls == 1 ? absl::UnavailableError("ps task lost") : absl::OkStatus();
  };
  auto out = sess->run({"train_op"});
  CHECK(out.status().code() == absl::StatusCode::kCancelled);
  CHECK_MESSAGE(absl::StrContains(out.status().message(), "no step ran"), out.status());
  CHECK(f.script->train_calls == 1);  // the step was not run again
  CHECK(sess->recoveries() == 1);
  CHECK(sess->should_stop());
  CHECK(sess->close().ok());
  CHECK(f.log->Count("stopper.end") == 1);  // a clean stop: end() runs (the final checkpoint)
}

TEST_CASE("B48 unbounded recovery (TF parity): creation retried past max_recoveries with no back-off") {
  ManualClock clock;  // never advanced: any back-off would hang
  SessionConfig config;
  config.clock = &clock;
  Fixture f(config);
  for (int i = 0; i < 15; ++i) f.creator->failures.push_back(absl::AbortedError("not yet"));
  auto o = f.Options();
  o.recovery.unbounded = true;
  o.recovery.initial_backoff = absl::Seconds(10);
  auto result = std::async(std::launch::async, [&] { return MonitoredSession::Create(o); });
  REQUIRE(result.wait_for(kWait) == std::future_status::ready);
  auto sess = result.get();
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  CHECK((*sess)->recoveries() == 15);
  CHECK(f.creator->Calls() == 16);
  CHECK((*sess)->close().ok());
}

TEST_CASE("decision 2: bounded recovery gives up on creation after max_recoveries and shuts down") {
  Fixture f;
  for (int i = 0; i < 20; ++i) f.creator->failures.push_back(absl::UnavailableError("ps down"));
  auto a = f.Hook("a");
  auto o = f.Options({a});
  o.recovery.max_recoveries = 4;
  auto sess = MonitoredSession::Create(o);
  CHECK(sess.status() == absl::UnavailableError("ps down"));
  CHECK(f.creator->Calls() == 5);
  CHECK(f.log->Count("a.begin") == 1);
  CHECK(f.log->Count("a.end") == 0);
  CHECK_FALSE(f.graph->finalized());
}

TEST_CASE("B49 a recovery restores the checkpoint: the global step goes back, steps lost are counted and logged") {
  CapturedLog captured;
  Fixture f;
  f.creator->checkpoint = {{"global_step", Tensor::Scalar<int64_t>(2)}, {"w", Tensor::Scalar<float>(2.f)}};
  auto sess = f.Create();
  for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"train_op"}).ok());  // 3, 4, 5
  f.script->on_train = [](int64_t step) { return step == 5 ? absl::AbortedError("lost") : absl::OkStatus(); };
  auto out = sess->run({"train_op", "w"});
  REQUIRE(out.ok());
  CHECK(Int(out->at("train_op")) == 3);  // restored to 2, then the retried step
  CHECK(Float(out->at("w")) == 3.f);
  CHECK(sess->recoveries() == 1);
  CHECK(sess->steps_lost() == 3);
  CHECK(captured.text().find("global_step 5 before the error, 2 restored; 3 steps lost") != std::string::npos);
  CHECK(sess->close().ok());
}

TEST_CASE("B50 a preemption error reported to the coordinator is recovered from by the next run; others stop") {
  SUBCASE("preemption") {
    Fixture f;
    auto a = f.Hook("a");
    auto sess = f.Create({a});
    std::thread t([&] { sess->coordinator()->request_stop(absl::UnavailableError("ps restarted")).IgnoreError(); });
    t.join();
    CHECK_FALSE(sess->should_stop());
    REQUIRE(sess->run({"train_op"}).ok());
    CHECK(sess->recoveries() == 1);
    CHECK(f.log->Count("a.after_create_session") == 2);
    CHECK_FALSE(sess->should_stop());
    CHECK(sess->close().ok());
    CHECK(f.log->Count("a.end") == 1);
  }
  SUBCASE("another error") {
    Fixture f;
    auto sess = f.Create();
    std::thread t([&] { sess->coordinator()->request_stop(absl::InternalError("reader died")).IgnoreError(); });
    t.join();
    CHECK(sess->should_stop());
    CHECK(absl::IsFailedPrecondition(sess->run({"train_op"}).status()));
    CHECK(sess->close() == absl::InternalError("reader died"));
  }
}

TEST_CASE("B51 a thread's preemption error is the root cause of a failing run; the run's own errors stay off the coordinator") {
  Fixture f;
  auto a = f.Hook("a");
  auto sess = f.Create({a});
  f.script->on_train = [&](int64_t) -> Status {
    if (f.script->train_calls != 1) return absl::OkStatus();
    a->coords.back()->request_stop(absl::AbortedError("ps preempted")).IgnoreError();
    return absl::InternalError("symptom");
  };
  REQUIRE(sess->run({"train_op"}).ok());
  CHECK(sess->recoveries() == 1);

  f.script->on_train = [](int64_t) { return absl::InvalidArgumentError("bad input"); };
  CHECK(absl::IsInvalidArgument(sess->run({"train_op"}).status()));
  CHECK_FALSE(sess->coordinator()->should_stop());
  CHECK(sess->coordinator()->status().ok());
  CHECK(absl::IsInvalidArgument(sess->close()));
}

TEST_CASE("B52 close stops and joins the coordinator, ignoring straggler threads (logged)") {
  CapturedLog captured;
  Fixture f;
  auto sess = f.Create();
  auto running = std::make_shared<std::atomic<bool>>(true);
  REQUIRE(sess->coordinator()->register_runner(std::make_unique<FakeRunner>(running)).ok());
  Coordinator* coord = sess->coordinator();
  CHECK(sess->close().ok());
  CHECK(coord->should_stop());
  CHECK(coord->joined());
  CHECK(captured.text().find("Coordinator stopped with threads still running: fake_runner") != std::string::npos);
  running->store(false);
}

TEST_CASE("B54 the coordinator has no clean-stop codes: OUT_OF_RANGE from a thread is an error") {
  Fixture f;
  auto a = f.Hook("a");
  auto sess = f.Create({a});
  std::thread t([&] { sess->coordinator()->request_stop(absl::OutOfRangeError("queue closed")).IgnoreError(); });
  t.join();
  CHECK(sess->should_stop());
  CHECK(sess->close() == absl::OutOfRangeError("queue closed"));
  CHECK(f.log->Count("a.end") == 1);  // the main loop ended normally
}

TEST_CASE("B166 a thread's request_stop(error): should_stop, end() runs, close returns the error") {
  Fixture f;
  auto a = f.Hook("a");
  auto sess = f.Create({a});
  REQUIRE(sess->run({"train_op"}).ok());
  std::thread t([&] { sess->coordinator()->request_stop(absl::InvalidArgumentError("ValueError")).IgnoreError(); });
  t.join();
  CHECK(sess->should_stop());
  CHECK(sess->close() == absl::InvalidArgumentError("ValueError"));
  CHECK(f.log->Count("a.end") == 1);
}

// -- decision 2 / H-05: bounded recovery ---------------------------------------------------

TEST_CASE("H-05 an ABORTED hook is retried at most max_recoveries times, then the error ends training") {
  CapturedLog captured;
  Fixture f;
  auto a = f.Hook("a");
  int after_runs = 0;
  a->on_after = [&](SessionRunContext&, const SessionRunValues&) {
    return ++after_runs >= 3 ? absl::AbortedError("Horovod has been shut down") : absl::OkStatus();
  };
  auto o = f.Options({a});
  o.recovery.max_recoveries = 3;
  auto created = MonitoredSession::Create(o);
  REQUIRE(created.ok());
  auto& sess = *created;
  REQUIRE(sess->run({"train_op"}).ok());
  REQUIRE(sess->run({"train_op"}).ok());
  auto out = sess->run({"train_op"});
  CHECK(out.status() == absl::AbortedError("hook a::after_run: Horovod has been shut down"));
  CHECK(sess->recoveries() == 3);
  CHECK(f.log->Count("a.after_create_session") == 4);
  CHECK(captured.text().find("Giving up after 3 recoveries") != std::string::npos);
  CHECK(sess->should_stop());
  CHECK(sess->close() == absl::AbortedError("hook a::after_run: Horovod has been shut down"));
  CHECK(f.log->Count("a.end") == 0);
}

TEST_CASE("H-05 UNKNOWN from a hook propagates at once; end() is not called") {
  Fixture f;
  auto a = f.Hook("a");
  a->on_after = [](SessionRunContext&, const SessionRunValues&) { return absl::UnknownError("Horovod shut down"); };
  auto sess = f.Create({a});
  CHECK(sess->run({"train_op"}).status() == absl::UnknownError("hook a::after_run: Horovod shut down"));
  CHECK(sess->recoveries() == 0);
  CHECK(f.creator->Calls() == 1);
  CHECK(sess->close() == absl::UnknownError("hook a::after_run: Horovod shut down"));
  CHECK(f.log->Count("a.end") == 0);
}

TEST_CASE("decision 2: the back-off waits on the config's clock: initial * 2^(k-1), capped, times [0.5, 1.5)") {
  ManualClock clock;
  SessionConfig config;
  config.clock = &clock;
  Fixture f(config);
  auto o = f.Options();
  o.recovery.initial_backoff = absl::Seconds(1);
  o.recovery.max_backoff = absl::Seconds(5);
  o.recovery.max_recoveries = 100;
  o.recovery.seed = 42;
  auto created = MonitoredSession::Create(o);
  REQUIRE(created.ok());
  auto& sess = *created;
  f.script->on_train = [&](int64_t) {
    return f.script->train_calls <= 5 ? absl::AbortedError("flaky") : absl::OkStatus();
  };
  auto run = std::async(std::launch::async, [&] { return sess->run({"train_op"}); });
  // Uncapped, the 4th and 5th would wait 8 and 16 s (at least 4 and 8).
  const double base[] = {1, 2, 4, 5, 5};
  for (int k = 0; k < 5; ++k) {
    CAPTURE(k);
    REQUIRE(clock.BlockUntilWaiters(1, absl::Seconds(20)));
    const int calls = f.creator->Calls();
    const absl::Duration start = clock.MonotonicNow();
    clock.Advance(absl::Seconds(0.5 * base[k]) - absl::Milliseconds(1));
    CHECK(clock.waiters() == 1);  // not due yet: still asleep
    CHECK(f.creator->Calls() == calls);
    clock.Advance(start + absl::Seconds(1.5 * base[k]) - clock.MonotonicNow());
    REQUIRE(f.creator->WaitForCalls(calls + 1));  // due: a new session
  }
  REQUIRE(run.wait_for(kWait) == std::future_status::ready);
  CHECK(run.get().ok());
  CHECK(sess->recoveries() == 5);
  CHECK(sess->close().ok());
}

// Issue 12 (5, 7): what a recovery cost, for the actor API's Recovered
// message; and coordinator() from another thread between two sessions.
TEST_CASE("on_recovered reports detect, restore (back-off included), next good step and steps lost; "
          "coordinator() is never null between sessions") {
  ManualClock clock;
  SessionConfig config;
  config.clock = &clock;
  Fixture f(config);
  f.creator->checkpoint = {{"global_step", Tensor::Scalar<int64_t>(2)}, {"w", Tensor::Scalar<float>(2.f)}};
  auto o = f.Options();
  o.recovery.initial_backoff = absl::Seconds(4);  // 2 to 6 s with the jitter
  std::vector<RecoveryReport> reports;            // written on the training thread, read after it joined
  o.recovery.on_recovered = [&](const RecoveryReport& r) { reports.push_back(r); };
  auto created = MonitoredSession::Create(o);
  REQUIRE(created.ok());
  auto& sess = *created;
  for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"train_op"}).ok());  // 3, 4, 5
  CHECK(reports.empty());
  bool failed = false;
  f.script->on_train = [&](int64_t step) -> Status {
    if (step == 5 && !failed) {
      failed = true;
      return absl::AbortedError("ps lost");
    }
    if (failed) clock.Advance(absl::Milliseconds(250));  // the first step on the new session takes 250 ms
    return absl::OkStatus();
  };
  auto run = std::async(std::launch::async, [&] { return sess->run({"train_op"}); });
  struct EndBackoff {  // a failed REQUIRE must not leave `run` waiting forever
    ManualClock& clock;
    ~EndBackoff() { clock.Advance(absl::Hours(1)); }
  } end_backoff{clock};
  REQUIRE(clock.BlockUntilWaiters(1, absl::Seconds(20)));  // in the back-off: between two sessions
  Coordinator* between = sess->coordinator();              // (on main: null here)
  REQUIRE(between != nullptr);
  CHECK(between->should_stop());  // the old session's, stopped and joined
  CHECK(between->request_stop(absl::InternalError("late")) == absl::InternalError("late"));  // safe, no effect

  SUBCASE("a good step after the recovery completes the report") {
    clock.Advance(absl::Seconds(10));
    REQUIRE(run.wait_for(kWait) == std::future_status::ready);
    auto out = run.get();
    REQUIRE_MESSAGE(out.ok(), out.status().ToString());
    CHECK(Int(out->at("train_op")) == 3);
    CHECK(sess->coordinator() != between);
    REQUIRE(reports.size() == 1);
    const RecoveryReport& r = reports[0];
    CHECK(r.cause == absl::AbortedError("ps lost"));
    CHECK(r.recoveries == 1);
    CHECK(r.detect == absl::ZeroDuration());  // the clock did not move between failure and decision
    CHECK(r.restore == absl::Seconds(10));    // the back-off ended at that Advance
    REQUIRE(r.next_good_step.has_value());
    CHECK(*r.next_good_step == absl::Milliseconds(250));
    CHECK(r.global_step_before == 5);
    CHECK(r.restored_global_step == 2);
    CHECK(r.steps_lost == 3);
    CHECK(sess->close().ok());
    CHECK(reports.size() == 1);
  }
  SUBCASE("a stop during the recovery: close() reports it with no good step") {
    std::thread([&] { sess->request_stop(); }).join();
    REQUIRE(run.wait_for(kWait) == std::future_status::ready);
    CHECK(absl::IsCancelled(run.get().status()));
    CHECK(reports.empty());
    CHECK(sess->close().ok());
    REQUIRE(reports.size() == 1);
    CHECK_FALSE(reports[0].next_good_step.has_value());
    CHECK(reports[0].steps_lost == 3);
  }
  // After close(): the last coordinator, stopped.
  Coordinator* last = nullptr;
  std::thread([&] { last = sess->coordinator(); }).join();
  REQUIRE(last != nullptr);
  CHECK(last->should_stop());
}

TEST_CASE("decision 2: recoveries older than the window do not count") {
  ManualClock clock;
  SessionConfig config;
  config.clock = &clock;
  Fixture f(config);
  auto o = f.Options();
  o.recovery.max_recoveries = 1;
  o.recovery.window = absl::Seconds(60);
  auto created = MonitoredSession::Create(o);
  REQUIRE(created.ok());
  auto& sess = *created;
  f.script->on_train = [&](int64_t) {
    return f.script->train_calls % 2 == 1 ? absl::AbortedError("again") : absl::OkStatus();
  };
  REQUIRE(sess->run({"train_op"}).ok());  // call 1 fails, 2 succeeds: one recovery
  clock.Advance(absl::Seconds(61));
  REQUIRE(sess->run({"train_op"}).ok());  // call 3 fails: the first recovery left the window
  CHECK(sess->recoveries() == 2);
  clock.Advance(absl::Seconds(30));
  CHECK(absl::IsAborted(sess->run({"train_op"}).status()));  // call 5 fails: 1 in the window already
  CHECK(sess->recoveries() == 2);
  CHECK(absl::IsAborted(sess->close()));
}

// -- H-09, failures of construction, user code that throws ---------------------------------

TEST_CASE("H-09 OUT_OF_RANGE on run 7 is a clean stop; INVALID_ARGUMENT is not") {
  SUBCASE("OUT_OF_RANGE") {
    Fixture f;
    auto a = f.Hook("a");
    auto sess = f.Create({a});
    f.script->on_train = [](int64_t step) {
      return step == 6 ? absl::OutOfRangeError("End of sequence") : absl::OkStatus();
    };
    Status last;
    while (!sess->should_stop()) last = sess->run({"train_op"}).status();
    CHECK(absl::IsOutOfRange(last));
    CHECK(f.script->train_calls == 7);
    CHECK(f.log->Count("a.after_run") == 6);
    CHECK(sess->close().ok());
    CHECK(f.log->Count("a.end") == 1);
  }
  SUBCASE("INVALID_ARGUMENT") {
    Fixture f;
    auto a = f.Hook("a");
    auto sess = f.Create({a});
    f.script->on_train = [](int64_t step) {
      return step == 6 ? absl::InvalidArgumentError("bad record") : absl::OkStatus();
    };
    Status last;
    while (!sess->should_stop()) last = sess->run({"train_op"}).status();
    CHECK(absl::IsInvalidArgument(last));
    CHECK(f.log->Count("a.after_run") == 6);
    CHECK(sess->close() == absl::InvalidArgumentError("bad record"));
    CHECK(f.log->Count("a.end") == 0);
  }
}

TEST_CASE("a failing begin() or creator: Create returns the error, creates nothing more, stops the services") {
  TempDir dir;
  SUBCASE("begin") {
    Fixture f;
    auto a = f.Hook("a");
    a->on_begin = [&]() -> Status {
      FOREMAN_RETURN_IF_ERROR(a->services->SummaryWriter(dir.path()).status());  // starts a service
      return absl::FailedPreconditionError("Global step should be created to use a.");
    };
    auto b = f.Hook("b");
    auto sess = MonitoredSession::Create(f.Options({a, b}));
    CHECK(sess.status() == absl::FailedPreconditionError("hook a::begin: Global step should be created to use a."));
    CHECK(f.creator->Calls() == 0);
    CHECK(f.log->Count("b.begin") == 0);
    CHECK_FALSE(f.graph->finalized());
  }
  SUBCASE("creator") {
    Fixture f;
    f.creator->failures.push_back(absl::DataLossError("corrupt checkpoint"));
    auto a = f.Hook("a");
    auto sess = MonitoredSession::Create(f.Options({a}));
    CHECK(sess.status() == absl::DataLossError("corrupt checkpoint"));
    CHECK(f.creator->Calls() == 1);
    CHECK(f.log->Count("a.after_create_session") == 0);
    CHECK(f.log->Count("a.end") == 0);
  }
}

TEST_CASE("a hook that throws stops the tree and the caller receives that error") {
  TempDir dir;
  Fixture f;
  auto a = f.Hook("Thrower");
  std::shared_ptr<internal::SummaryWriterService> writer;
  a->on_begin = [&]() -> Status {
    FOREMAN_ASSIGN_OR_RETURN(writer, a->services->SummaryWriter(dir.path()));
    return absl::OkStatus();
  };
  a->on_after = [](SessionRunContext&, const SessionRunValues&) -> Status { throw std::runtime_error("boom"); };
  auto sess = f.Create({a});
  REQUIRE(writer != nullptr);
  CHECK(writer->Flush(absl::Seconds(5)).ok());
  auto out = sess->run({"train_op"});
  CHECK(absl::IsInternal(out.status()));
  CHECK(out.status().message().find("hook Thrower::after_run") != std::string::npos);
  CHECK(out.status().message().find("boom") != std::string::npos);
  CHECK(sess->should_stop());
  CHECK(sess->close() == out.status());
  CHECK(f.log->Count("Thrower.end") == 0);
  CHECK(absl::IsUnavailable(writer->Flush(absl::Seconds(5))));  // the tree is stopped
  writer.reset();  // before the session (and its runtime) goes
}

// Issue 12 (8): an error a hook *returns* is named by the hook and the
// callback, as a thrown one is; code and payloads are kept, and a message
// that already carries the prefix (a thrown error) gets it once.
TEST_CASE("an error a hook returns names the hook and the callback, keeping its code") {
  {
    Fixture f;
    auto a = f.Hook("Returner");
    a->on_after = [](SessionRunContext&, const SessionRunValues&) { return absl::DataLossError("disk gone"); };
    auto sess = f.Create({a});
    auto out = sess->run({"train_op"});
    CHECK(out.status() == absl::DataLossError("hook Returner::after_run: disk gone"));
    CHECK(sess->close() == out.status());
  }
  {
    Fixture f;
    auto a = f.Hook("Returner");
    a->on_before = [](SessionRunContext&) -> StatusOr<SessionRunArgs> {
      return NanLossDuringTrainingError("NaN loss during training.");
    };
    auto sess = f.Create({a});
    auto out = sess->run({"train_op"});
    CHECK(out.status().message() == "hook Returner::before_run: NaN loss during training.");
    CHECK(IsNanLossDuringTraining(out.status()));  // the payload is kept
    sess->close().IgnoreError();
  }
  {
    Fixture f;
    auto a = f.Hook("Returner");
    a->on_begin = [] { return absl::PermissionDeniedError("no"); };
    CHECK(MonitoredSession::Create(f.Options({a})).status() ==
          absl::PermissionDeniedError("hook Returner::begin: no"));
  }
  {
    Fixture f;
    auto a = f.Hook("Thrower");
    a->on_after = [](SessionRunContext&, const SessionRunValues&) -> Status { throw std::runtime_error("boom"); };
    auto sess = f.Create({a});
    CHECK(sess->run({"train_op"}).status() == absl::InternalError("hook Thrower::after_run: boom"));
    sess->close().IgnoreError();
  }
}

TEST_CASE("a step function that throws in run_step_fn ends training with INTERNAL") {
  Fixture f;
  auto sess = f.Create();
  Status s = sess->run_step_fn([](MonitoredStepContext&) -> Status { throw std::logic_error("oops"); });
  CHECK(absl::IsInternal(s));
  CHECK(s.message().find("oops") != std::string::npos);
  CHECK(sess->should_stop());
  CHECK(sess->close() == s);
}

}  // namespace
}  // namespace foreman
