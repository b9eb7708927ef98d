// Tests for the hooks whose work goes to service actors (src/runtime/hooks/
// service_hooks.cpp): CheckpointSaverHook (B102-B108, decision 11, H-12,
// H-23), StepCounterHook (B109-B111), SummarySaverHook (B112-B116, H-32).
//
// The hooks are driven directly, as a MonitoredSession drives them: a
// Runtime with its own actor system, a raw Session, then begin,
// after_create_session, per run before_run -> Session::Run(merged fetches)
// -> after_run, and end. Files go to a MemEnv; schedules in seconds run on
// a ManualClock. Every real-time wait is bounded.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/coordinator.hpp"
#include "foreman/event_reader.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/session.hpp"
#include "foreman/summary.hpp"
#include "foreman/variable_store.hpp"
#include "runtime/runtime.hpp"
#include "runtime/services.hpp"
#include "support/events.hpp"
#include "support/fake_services.hpp"
#include "support/gated_env.hpp"
#include "support/log_capture.hpp"

namespace foreman {
namespace {

using internal::Runtime;
using testing::CapturedLog;
using testing::GatedEnv;
using testing::SessionLogSteps;
using Steps = std::vector<int64_t>;

constexpr absl::Duration kWait = absl::Seconds(20);

std::string Msg(const Status& s) { return std::string(s.message()); }

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

/// A model with global_step and w. "train_op" increments the global step;
/// "summaries" / "extra_summary" answer serialized Summaries; "noop" does
/// nothing. Counts how often the summaries were asked for.
std::shared_ptr<Graph> MakeGraph(std::shared_ptr<std::atomic<int>> summary_requests, bool with_global_step = true) {
  auto graph = std::make_shared<Graph>();
  if (with_global_step) REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph->AddVariable("w", Tensor::Scalar<float>(1.5f)).ok());
  REQUIRE(graph
              ->SetStep([summary_requests](StepContext& ctx) -> Status {
                if (ctx.requested("train_op")) {
                  FOREMAN_ASSIGN_OR_RETURN(int64_t step, IncrementGlobalStep(ctx.variables()));
                  ctx.Set("train_op", Tensor::Scalar<int64_t>(step));
                }
                if (ctx.requested("noop")) ctx.Set("noop", Tensor::Scalar<int64_t>(0));
                if (ctx.requested("summaries")) {
                  if (summary_requests) ++*summary_requests;
                  ctx.Set("summaries", Tensor::Scalar<std::string>(ScalarSummary("loss", 0.5f)));
                }
                if (ctx.requested("extra_summary")) {
                  ctx.Set("extra_summary", Tensor::Scalar<std::string>(ScalarSummary("accuracy", 0.75f)));
                }
                return absl::OkStatus();
              })
              .ok());
  return graph;
}

/// A MonitoredSession's hook calls, by hand.
struct Harness {
  Env* env;
  ManualClock clock;
  SessionConfig config;
  std::unique_ptr<Runtime> runtime;
  std::shared_ptr<Graph> graph;
  std::unique_ptr<Session> session;
  Coordinator coord{std::vector<absl::StatusCode>{}};
  HookList hooks;
  std::vector<std::string> fetches = {"train_op"};
  std::shared_ptr<std::atomic<int>> summary_requests = std::make_shared<std::atomic<int>>(0);

  explicit Harness(Env* e, bool with_global_step = true) : env(e) {
    config.env = env;
    config.clock = &clock;
    auto rt = Runtime::Create(nullptr, config);
    REQUIRE_MESSAGE(rt.ok(), rt.status().ToString());
    runtime = *std::move(rt);
    graph = MakeGraph(summary_requests, with_global_step);
    runtime->SetCoordinator(&coord);
  }
  ~Harness() {
    runtime->SetCoordinator(nullptr);
    hooks.clear();
    runtime->Shutdown(kWait).IgnoreError();
  }

  /// A new session whose variables hold their initial values, global_step
  /// set to `step`.
  void NewSession(int64_t step = 0) {
    if (session != nullptr) REQUIRE(session->Close().ok());
    auto s = Session::Create(graph, "", config);
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    session = *std::move(s);
    REQUIRE(session
                ->WithVariables([&](VariableStore& vars) -> Status {
                  for (const VariableDef& def : graph->variables()) {
                    FOREMAN_ASSIGN_OR_RETURN(Tensor value, def.initializer());
                    FOREMAN_RETURN_IF_ERROR(vars.Create(def.name, std::move(value), def.trainable));
                  }
                  if (graph->has_global_step()) FOREMAN_RETURN_IF_ERROR(SetGlobalStep(vars, step));
                  return absl::OkStatus();
                })
                .ok());
  }

  Status Begin(int64_t step = 0) {
    for (auto& hook : hooks) {
      if (auto* user = dynamic_cast<internal::ServiceUser*>(hook.get())) user->AttachServices(runtime.get());
      FOREMAN_RETURN_IF_ERROR(hook->begin());
    }
    return CreateSession(step);
  }
  Status CreateSession(int64_t step) {
    NewSession(step);
    for (auto& hook : hooks) FOREMAN_RETURN_IF_ERROR(hook->after_create_session(session.get(), &coord));
    return absl::OkStatus();
  }

  /// One hooked run; returns whether a hook asked to stop.
  StatusOr<bool> Run() {
    SessionRunArgs original;
    original.fetches = fetches;
    SessionRunContext ctx(&original, session.get());
    std::vector<std::vector<std::string>> own(hooks.size());
    std::set<std::string> all(fetches.begin(), fetches.end());
    for (size_t i = 0; i < hooks.size(); ++i) {
      FOREMAN_ASSIGN_OR_RETURN(SessionRunArgs args, hooks[i]->before_run(ctx));
      own[i] = args.fetches;
      all.insert(args.fetches.begin(), args.fetches.end());
    }
    FOREMAN_ASSIGN_OR_RETURN(TensorMap results, session->Run(std::vector<std::string>(all.begin(), all.end())));
    RunOptions options;
    for (size_t i = 0; i < hooks.size(); ++i) {
      TensorMap mine;
      for (const auto& f : own[i]) mine.emplace(f, results.at(f));
      SessionRunValues values;
      values.results = own[i].empty() ? nullptr : &mine;
      values.options = &options;
      FOREMAN_RETURN_IF_ERROR(hooks[i]->after_run(ctx, values));
    }
    return ctx.stop_requested();
  }

  /// `n` runs (stops early when a hook asks); the number run.
  int RunSteps(int n, absl::Duration advance_per_run = absl::ZeroDuration()) {
    for (int i = 0; i < n; ++i) {
      clock.Advance(advance_per_run);
      StatusOr<bool> stop = Run();
      REQUIRE_MESSAGE(stop.ok(), stop.status().ToString());
      if (*stop) return i + 1;
    }
    return n;
  }

  Status End() {
    for (auto& hook : hooks) FOREMAN_RETURN_IF_ERROR(hook->end(session.get()));
    return absl::OkStatus();
  }

  int64_t GlobalStep() { return *session->GlobalStep(); }

  /// Stops the services (flushes and closes the event files).
  void Shutdown() {
    runtime->SetCoordinator(nullptr);
    Status s = runtime->Shutdown(kWait);
    CHECK_MESSAGE(s.ok(), s.ToString());
  }
};

std::shared_ptr<CheckpointSaverHook> MakeCheckpointHook(CheckpointSaverHook::Options o) {
  auto hook = CheckpointSaverHook::Create(std::move(o));
  REQUIRE_MESSAGE(hook.ok(), hook.status().ToString());
  return *hook;
}

CheckpointSaverHook::Options CheckpointOptions(Harness& h, std::optional<int64_t> save_steps,
                                             std::optional<double> save_secs = std::nullopt) {
  CheckpointSaverHook::Options o;
  o.checkpoint_dir = "/ckpt";
  o.save_steps = save_steps;
  o.save_secs = save_secs;
  o.env = h.env;
  o.clock = &h.clock;
  return o;
}

/// The steps in the names of the bundles in `dir`.
Steps CheckpointSteps(Env* env, const std::string& dir) {
  auto prefixes = ListCheckpointPrefixes(env, dir);
  REQUIRE_MESSAGE(prefixes.ok(), prefixes.status().ToString());
  Steps steps;
  for (const std::string& p : *prefixes) steps.push_back(std::stoll(p.substr(p.rfind('-') + 1)));
  return steps;
}

/// The events of the one event file in `dir`. With `writing`, a record the
/// writer is still appending is ignored.
std::vector<Event> ReadEvents(Env* env, const std::string& dir, bool writing = false) {
  auto files = ListEventFiles(env, dir);
  REQUIRE_MESSAGE(files.ok(), files.status().ToString());
  REQUIRE(files->size() == 1);
  auto events = ReadEventFile(env, files->front(), /*allow_truncated_tail=*/writing);
  REQUIRE_MESSAGE(events.ok(), events.status().ToString());
  return *events;
}

/// (step, value) of every summary value tagged `tag`.
std::vector<std::pair<int64_t, double>> Scalars(const std::vector<Event>& events, const std::string& tag) {
  std::vector<std::pair<int64_t, double>> out;
  for (const Event& e : events) {
    for (const SummaryValue& v : e.values) {
      if (v.tag == tag) out.emplace_back(e.step, v.scalar);
    }
  }
  return out;
}

Steps StepsOf(const std::vector<std::pair<int64_t, double>>& values) {
  Steps steps;
  for (const auto& [step, value] : values) steps.push_back(step);
  return steps;
}

/// Records every callback, and asks for a stop on the `stop_on`-th after_save.
class RecordingListener : public CheckpointSaverListener {
 public:
  explicit RecordingListener(int stop_on = 0) : stop_on_(stop_on) {}
  Status begin() override {
    calls.push_back("begin");
    return absl::OkStatus();
  }
  Status before_save(Session*, int64_t step) override {
    calls.push_back(absl::StrCat("before_save ", step));
    return absl::OkStatus();
  }
  StatusOr<bool> after_save(Session*, int64_t step) override {
    calls.push_back(absl::StrCat("after_save ", step));
    return ++after_saves_ == stop_on_;
  }
  Status end(Session*, int64_t step) override {
    calls.push_back(absl::StrCat("end ", step));
    return absl::OkStatus();
  }
  std::vector<std::string> calls;

 private:
  int stop_on_;
  int after_saves_ = 0;
};

// -- no services, no global step --------------------------------------------------------------

TEST_CASE("service hooks need the session's services: FAILED_PRECONDITION without them") {
  MemEnv env;
  auto ckpt = MakeCheckpointHook([&] {
    CheckpointSaverHook::Options o;
    o.checkpoint_dir = "/ckpt";
    o.save_steps = 10;
    o.env = &env;
    return o;
  }());
  Status s = ckpt->begin();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Msg(s) == "CheckpointSaverHook needs a MonitoredSession or Supervisor (no services attached)");

  auto counter = *StepCounterHook::Create({});
  s = counter->begin();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Msg(s) == "StepCounterHook needs a MonitoredSession or Supervisor (no services attached)");

  SummarySaverHook::Options so;
  so.save_steps = 10;
  so.output_dir = "/logs";
  so.summary_op = {"summaries"};
  auto summary = *SummarySaverHook::Create(so);
  s = summary->begin();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Msg(s) == "SummarySaverHook needs a MonitoredSession or Supervisor (no services attached)");
}

TEST_CASE("B102 B109 B112 B124 service hooks need a global step: FAILED_PRECONDITION, TF's message") {
  MemEnv env;
  Harness h(&env, /*with_global_step=*/false);
  h.hooks.push_back(MakeCheckpointHook(CheckpointOptions(h, 10)));
  Status s = h.Begin();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Msg(s) == "Global step should be created to use CheckpointSaverHook.");

  h.hooks = {*StepCounterHook::Create({})};
  s = h.Begin();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Msg(s) == "Global step should be created to use StepCounterHook.");

  SummarySaverHook::Options so;
  so.save_steps = 10;
  so.output_dir = "/logs";
  so.summary_op = {"summaries"};
  h.hooks = {*SummarySaverHook::Create(so)};
  s = h.Begin();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Msg(s) == "Global step should be created to use SummarySaverHook.");
}

TEST_CASE("B102 CheckpointSaverHook: exactly one of save_secs / save_steps; a checkpoint_dir") {
  CheckpointSaverHook::Options o;
  o.checkpoint_dir = "/ckpt";
  auto neither = CheckpointSaverHook::Create(o);
  CHECK(neither.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(neither.status()) == "Either every_secs or every_steps should be provided.");
  o.save_secs = 1;
  o.save_steps = 1;
  auto both = CheckpointSaverHook::Create(o);
  CHECK(Msg(both.status()) == "Can not provide both every_secs and every_steps.");
  o.save_secs.reset();
  o.checkpoint_dir = "";
  CHECK(CheckpointSaverHook::Create(o).status().code() == absl::StatusCode::kInvalidArgument);
  o.checkpoint_dir = "/ckpt";
  o.steps_per_run = 0;
  CHECK(CheckpointSaverHook::Create(o).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("B102 CheckpointSaverHook uses the saver it is given, else a default one keeping 5") {
  MemEnv env;
  {
    Harness h(&env);
    SaverOptions so;
    so.env = &env;
    so.max_to_keep = 1;
    auto options = CheckpointOptions(h, 1);
    options.saver = std::shared_ptr<Saver>(*Saver::Create(so));
    h.hooks.push_back(MakeCheckpointHook(options));
    REQUIRE(h.Begin().ok());
    h.RunSteps(3);
    REQUIRE(h.End().ok());
    CHECK(CheckpointSteps(&env, "/ckpt") == Steps{3});
  }
  MemEnv env2;
  Harness h(&env2);
  auto options = CheckpointOptions(h, 1);
  options.checkpoint_dir = "/ckpt2";
  h.hooks.push_back(MakeCheckpointHook(options));
  REQUIRE(h.Begin().ok());
  h.RunSteps(7);
  REQUIRE(h.End().ok());
  CHECK(CheckpointSteps(&env2, "/ckpt2") == Steps{3, 4, 5, 6, 7});
}

TEST_CASE("B109 StepCounterHook: exactly one of every_n_steps / every_n_secs") {
  StepCounterHook::Options o;
  o.every_n_secs = 5;  // every_n_steps keeps its default 100
  auto both = StepCounterHook::Create(o);
  CHECK(both.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(both.status()) == "exactly one of every_n_steps and every_n_secs should be provided.");
  o.every_n_steps.reset();
  CHECK(StepCounterHook::Create(o).ok());
}

// -- CheckpointSaverHook ---------------------------------------------------------------------

TEST_CASE("B103 CheckpointSaverHook saves at the current step in after_create_session, after every creation") {
  MemEnv env;
  Harness h(&env);
  auto hook = MakeCheckpointHook(CheckpointOptions(h, 100));
  h.hooks.push_back(hook);
  REQUIRE(h.Begin(/*step=*/0).ok());
  REQUIRE(h.runtime->WaitForPendingSaves(kWait).ok());
  CHECK(CheckpointSteps(&env, "/ckpt") == Steps{0});
  h.RunSteps(3);
  // A re-created session (a recovery or restart at step 200) is saved again.
  REQUIRE(h.CreateSession(200).ok());
  REQUIRE(h.runtime->WaitForPendingSaves(kWait).ok());
  CHECK(CheckpointSteps(&env, "/ckpt") == Steps{0, 200});
  h.RunSteps(1);
  REQUIRE(h.End().ok());  // 201 != 200: the final save.
  CHECK(hook->saved_steps() == Steps{0, 200, 201});
}

TEST_CASE("B104 B107 B106 CheckpointSaverHook save_steps=100 to 250: checkpoints at 0, 100, 200, 250 with CHECKPOINT events") {
  MemEnv env;
  Harness h(&env);
  auto hook = MakeCheckpointHook(CheckpointOptions(h, 100));
  h.hooks.push_back(hook);
  REQUIRE(h.Begin().ok());
  h.RunSteps(250);
  CHECK(h.GlobalStep() == 250);
  REQUIRE(h.End().ok());
  CHECK(hook->saved_steps() == Steps{0, 100, 200, 250});
  CHECK(CheckpointSteps(&env, "/ckpt") == Steps{0, 100, 200, 250});
  auto state = ReadCheckpointState(&env, "/ckpt");
  REQUIRE(state.ok());
  REQUIRE(state->has_value());
  CHECK(ResolveCheckpointPath("/ckpt", (*state)->model_checkpoint_path) == "/ckpt/model.ckpt-250");
  h.Shutdown();
  // B106: in checkpoint_dir's event file, at the saved step, path without "-<step>".
  std::vector<Event> events = ReadEvents(&env, "/ckpt");
  CHECK(SessionLogSteps(events, SessionLogStatus::kCheckpoint) == Steps{0, 100, 200, 250});
  for (const Event& e : events) {
    if (e.kind == Event::Kind::kSessionLog) CHECK(e.checkpoint_path == "/ckpt/model.ckpt");
  }
}

TEST_CASE("B105 CheckpointSaverHook end() does not save a step that was just saved") {
  MemEnv env;
  Harness h(&env);
  auto hook = MakeCheckpointHook(CheckpointOptions(h, 100));
  h.hooks.push_back(hook);
  REQUIRE(h.Begin().ok());
  h.RunSteps(200);
  REQUIRE(h.End().ok());
  CHECK(hook->saved_steps() == Steps{0, 100, 200});
  h.Shutdown();
  CHECK(SessionLogSteps(ReadEvents(&env, "/ckpt"), SessionLogStatus::kCheckpoint) == Steps{0, 100, 200});
}

TEST_CASE("CheckpointSaverHook::SaveNow saves the current step off the schedule, waited for, once per step") {
  MemEnv env;
  Harness h(&env);
  auto hook = MakeCheckpointHook(CheckpointOptions(h, 1000));
  h.hooks.push_back(hook);
  REQUIRE(h.Begin().ok());
  h.RunSteps(37);
  REQUIRE(hook->SaveNow(h.session.get()).ok());
  // Waited for: on disk as it returns (no WaitForPendingSaves).
  CHECK(CheckpointSteps(&env, "/ckpt") == Steps{0, 37});
  REQUIRE(hook->SaveNow(h.session.get()).ok());  // the step just saved: not again
  REQUIRE(h.End().ok());                         // nor by end()
  CHECK(hook->saved_steps() == Steps{0, 37});
}

TEST_CASE("B107 CheckpointSaverHook save_secs on the Clock: saves when 10 s have passed") {
  MemEnv env;
  Harness h(&env);
  auto hook = MakeCheckpointHook(CheckpointOptions(h, std::nullopt, 10.0));
  h.hooks.push_back(hook);
  REQUIRE(h.Begin().ok());
  h.RunSteps(7, absl::Seconds(4));  // t = 4, 8, 12 (step 3), 16, 20, 24 (step 6), 28
  REQUIRE(h.End().ok());
  CHECK(hook->saved_steps() == Steps{0, 3, 6, 7});
}

TEST_CASE("B108 CheckpointSaverListener: callbacks in order, only when the hook saves (first and final saves too)") {
  MemEnv env;
  Harness h(&env);
  auto listener = std::make_shared<RecordingListener>();
  auto options = CheckpointOptions(h, 2);
  options.listeners = {listener};
  h.hooks.push_back(MakeCheckpointHook(options));
  REQUIRE(h.Begin().ok());
  h.RunSteps(3);
  REQUIRE(h.End().ok());
  CHECK(listener->calls == std::vector<std::string>{"begin", "before_save 0", "after_save 0", "before_save 2",
                                                    "after_save 2", "before_save 3", "after_save 3", "end 3"});
}

TEST_CASE("H-12 a listener's after_save stop ends training at the saved step; end() does not save again") {
  MemEnv env;
  CapturedLog log;
  Harness h(&env);
  auto listener = std::make_shared<RecordingListener>(/*stop_on=*/3);
  auto options = CheckpointOptions(h, 10);
  options.listeners = {listener};
  auto hook = MakeCheckpointHook(options);
  h.hooks.push_back(hook);
  REQUIRE(h.Begin().ok());
  const int runs = h.RunSteps(100);
  CHECK(runs == 20);  // the run that reached step 20 asked to stop
  CHECK(h.GlobalStep() == 20);
  REQUIRE(h.End().ok());
  CHECK(hook->saved_steps() == Steps{0, 10, 20});
  CHECK(listener->calls.back() == "end 20");
  CHECK(Count(absl::StrJoin(listener->calls, ","), "before_save") == 3);
  h.Shutdown();
  CHECK(CheckpointSteps(&env, "/ckpt") == Steps{0, 10, 20});
  const std::string text = log.text();
  CHECK_MESSAGE(absl::StrContains(text, "A CheckpointSaverListener requested that training be stopped. listener: "
                                        "foreman::(anonymous namespace)::RecordingListener"),
                text);
}

TEST_CASE("H-23 CheckpointSaverHook save_steps=1 over 8 runs: the state file lists the 5 newest (4..8)") {
  MemEnv env;
  Harness h(&env);
  auto hook = MakeCheckpointHook(CheckpointOptions(h, 1));
  h.hooks.push_back(hook);
  REQUIRE(h.Begin().ok());
  h.RunSteps(8);
  REQUIRE(h.End().ok());
  CHECK(hook->saved_steps() == Steps{0, 1, 2, 3, 4, 5, 6, 7, 8});
  auto state = ReadCheckpointState(&env, "/ckpt");
  REQUIRE(state.ok());
  REQUIRE(state->has_value());
  std::vector<std::string> listed;
  for (const auto& p : (*state)->all_model_checkpoint_paths) listed.push_back(ResolveCheckpointPath("/ckpt", p));
  CHECK(listed == std::vector<std::string>{"/ckpt/model.ckpt-4", "/ckpt/model.ckpt-5", "/ckpt/model.ckpt-6",
                                           "/ckpt/model.ckpt-7", "/ckpt/model.ckpt-8"});
  CHECK(CheckpointSteps(&env, "/ckpt") == Steps{4, 5, 6, 7, 8});
}

TEST_CASE("decision 11 a save due while one is in flight waits for it; the schedule stays TF's") {
  MemEnv mem;
  GatedEnv env(&mem);
  Harness h(&env);
  auto hook = MakeCheckpointHook(CheckpointOptions(h, 2));
  h.hooks.push_back(hook);
  REQUIRE(h.Begin().ok());
  REQUIRE(h.runtime->WaitForPendingSaves(kWait).ok());  // step 0 written
  env.Hold(".data-");
  h.RunSteps(2);  // starts the save of step 2, which hangs in the actor
  REQUIRE(env.WaitUntilHeld(1, kWait));
  h.RunSteps(1);  // step 3: nothing due, the training thread does not wait
  CHECK(hook->waited_saves() == 0);

  // Step 4 is due while step 2 is in flight: the training thread waits.
  std::atomic<bool> step2_durable_when_run_returned{false};
  Status run4;
  std::thread training([&] {
    run4 = h.Run().status();
    step2_durable_when_run_returned = mem.FileExists("/ckpt/model.ckpt-2.index").ok();
  });
  const absl::Time deadline = absl::Now() + kWait;
  while (hook->waited_saves() == 0 && absl::Now() < deadline) std::this_thread::yield();
  CHECK(hook->waited_saves() == 1);
  CHECK(mem.FileExists("/ckpt/model.ckpt-2.index").code() == absl::StatusCode::kNotFound);
  env.Release();
  training.join();
  CHECK(run4.ok());
  CHECK(step2_durable_when_run_returned);

  REQUIRE(h.runtime->WaitForPendingSaves(kWait).ok());  // step 4, so that step 6 need not wait
  h.RunSteps(2);
  REQUIRE(h.End().ok());
  CHECK(hook->waited_saves() == 1);
  CHECK(hook->saved_steps() == Steps{0, 2, 4, 6});
  CHECK(CheckpointSteps(&mem, "/ckpt") == Steps{0, 2, 4, 6});
}

TEST_CASE("decision 11 a failed save ends training with its Status at a later step boundary") {
  MemEnv mem;
  GatedEnv env(&mem);
  Harness h(&env);
  h.hooks.push_back(MakeCheckpointHook(CheckpointOptions(h, 1)));
  REQUIRE(h.Begin().ok());
  REQUIRE(h.runtime->WaitForPendingSaves(kWait).ok());
  env.Fail(".data-", absl::ResourceExhaustedError("disk full"));
  Status failed;
  for (int i = 0; i < 3 && failed.ok(); ++i) failed = h.Run().status();
  CHECK(failed.code() == absl::StatusCode::kResourceExhausted);
  CHECK_MESSAGE(absl::StrContains(Msg(failed), "disk full"), failed.ToString());
  // It also reached the coordinator (the session stops even if no hook runs).
  REQUIRE(h.coord.wait_for_stop(kWait));
  CHECK(h.coord.status().code() == absl::StatusCode::kResourceExhausted);
}

/// Services whose checkpoint saver only records each save's snapshot; the
/// test completes the tickets, handing the buffers back or not.
class RecordingServices : public testing::FakeServices {
 public:
  struct Save {
    std::map<std::string, Tensor> snapshot;
    std::shared_ptr<internal::SaveTicket> ticket;
  };
  class Checkpoints : public internal::CheckpointService {
   public:
    explicit Checkpoints(std::shared_ptr<Saver> saver) : saver_(std::move(saver)) {}
    std::shared_ptr<internal::SaveTicket> StartSave(std::map<std::string, Tensor> snapshot, int64_t step) override {
      auto ticket = std::make_shared<internal::SaveTicket>();
      ticket->step = step;
      saves.push_back(Save{std::move(snapshot), ticket});
      return ticket;
    }
    const std::string& directory() const override { return dir_; }
    const std::shared_ptr<Saver>& saver() const override { return saver_; }
    std::vector<Save> saves;  // only the training thread touches it

   private:
    std::string dir_ = "/ckpt";
    std::shared_ptr<Saver> saver_;
  };

  using FakeServices::FakeServices;
  StatusOr<std::shared_ptr<internal::CheckpointService>> CheckpointSaver(const std::string&,
                                                                          std::shared_ptr<Saver> saver,
                                                                          const std::string&) override {
    if (checkpoints == nullptr) checkpoints = std::make_shared<Checkpoints>(std::move(saver));
    return std::shared_ptr<internal::CheckpointService>(checkpoints);
  }

  std::shared_ptr<Checkpoints> checkpoints;
};

/// The data pointers of a snapshot's tensors, by name.
std::map<std::string, const char*> Buffers(const std::map<std::string, Tensor>& snapshot) {
  std::map<std::string, const char*> out;
  for (const auto& [name, t] : snapshot) out.emplace(name, t.raw_data());
  return out;
}

void SetW(Session& session, float w) {
  REQUIRE(session.WithVariables([&](VariableStore& vars) { return vars.Assign("w", Tensor::Scalar<float>(w)); }).ok());
}

float W(const std::map<std::string, Tensor>& snapshot) { return *snapshot.at("w").scalar<float>(); }
int64_t Step(const std::map<std::string, Tensor>& snapshot) { return *snapshot.at("global_step").scalar<int64_t>(); }

TEST_CASE("CheckpointSaverHook copies each save into the buffers the previous save handed back, never into one in flight") {
  MemEnv env;
  Harness h(&env);
  RecordingServices services(&env, &h.clock);
  auto options = CheckpointOptions(h, 1);
  options.save_timeout = absl::Milliseconds(50);
  auto hook = MakeCheckpointHook(options);
  h.hooks.push_back(hook);
  hook->AttachServices(&services);
  REQUIRE(hook->begin().ok());
  h.NewSession(0);
  REQUIRE(hook->after_create_session(h.session.get(), &h.coord).ok());  // save 0: new buffers
  auto& saves = services.checkpoints->saves;
  REQUIRE(saves.size() == 1);
  const std::map<std::string, const char*> first = Buffers(saves[0].snapshot);
  CHECK(W(saves[0].snapshot) == 1.5f);
  saves[0].ticket->Complete(absl::OkStatus(), "/ckpt/model.ckpt-0", absl::ZeroDuration(),
                            std::move(saves[0].snapshot));  // handed back

  SetW(*h.session, 2.0f);
  REQUIRE(h.Run().ok());  // step 1: copied into save 0's buffers, in place
  REQUIRE(saves.size() == 2);
  CHECK(Buffers(saves[1].snapshot) == first);
  CHECK(W(saves[1].snapshot) == 2.0f);
  CHECK(Step(saves[1].snapshot) == 1);

  // Save 1 is in flight: the save due at step 2 waits for it (and times out
  // here) without touching its buffers.
  SetW(*h.session, 3.0f);
  CHECK(h.Run().status().code() == absl::StatusCode::kDeadlineExceeded);
  REQUIRE(saves.size() == 2);
  CHECK(W(saves[1].snapshot) == 2.0f);
  CHECK(Step(saves[1].snapshot) == 1);

  // Save 1 completes without handing its buffers back: the next save gets new
  // ones, and save 1's stay as they were.
  saves[1].ticket->Complete(absl::OkStatus(), "/ckpt/model.ckpt-1", absl::ZeroDuration());
  REQUIRE(h.Run().ok());  // step 3
  REQUIRE(saves.size() == 3);
  CHECK(Buffers(saves[2].snapshot) != first);
  CHECK(W(saves[2].snapshot) == 3.0f);
  CHECK(Step(saves[2].snapshot) == 3);
  CHECK(W(saves[1].snapshot) == 2.0f);
  CHECK(Step(saves[1].snapshot) == 1);
  saves[2].ticket->Complete(absl::OkStatus(), "/ckpt/model.ckpt-3", absl::ZeroDuration(),
                            std::move(saves[2].snapshot));
  REQUIRE(h.End().ok());  // step 3 was just saved: no final save
  CHECK(hook->saved_steps() == Steps{0, 1, 3});
}

TEST_CASE("CheckpointSaverHook: saves in a row through the checkpoint_saver, reusing buffers, restore to their own values") {
  MemEnv env;
  Harness h(&env);
  h.hooks.push_back(MakeCheckpointHook(CheckpointOptions(h, 1)));
  REQUIRE(h.Begin().ok());  // step 0, w 1.5
  for (int step = 1; step <= 3; ++step) {
    REQUIRE(h.runtime->WaitForPendingSaves(kWait).ok());  // so that the next save finds its buffers back
    SetW(*h.session, 10.0f * static_cast<float>(step));
    REQUIRE(h.Run().ok());
  }
  REQUIRE(h.End().ok());
  REQUIRE(CheckpointSteps(&env, "/ckpt") == Steps{0, 1, 2, 3});
  for (int step = 0; step <= 3; ++step) {
    CAPTURE(step);
    auto reader = BundleReader::Open(&env, absl::StrCat("/ckpt/model.ckpt-", step));
    REQUIRE(reader.ok());
    CHECK(*(*reader)->Lookup("w")->scalar<float>() == (step == 0 ? 1.5f : 10.0f * static_cast<float>(step)));
    CHECK(*(*reader)->Lookup("global_step")->scalar<int64_t>() == step);
  }
}

TEST_CASE("CheckpointSaverHook: a save hanging past save_timeout is DEADLINE_EXCEEDED, not a hang") {
  MemEnv mem;
  GatedEnv env(&mem);
  Harness h(&env);
  auto options = CheckpointOptions(h, 1);
  options.save_timeout = absl::Milliseconds(50);
  h.hooks.push_back(MakeCheckpointHook(options));
  REQUIRE(h.Begin().ok());
  REQUIRE(h.runtime->WaitForPendingSaves(kWait).ok());
  env.Hold(".data-");
  REQUIRE(h.Run().ok());  // starts the save of step 1
  REQUIRE(env.WaitUntilHeld(1, kWait));
  Status s = h.Run().status();  // step 2 is due: waits 50 ms for step 1
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_MESSAGE(absl::StrContains(Msg(s), "step 1"), s.ToString());
  env.Release();
}

// -- StepCounterHook --------------------------------------------------------------------------

TEST_CASE("B110 StepCounterHook: the first trigger primes; global_step/sec at 101 and 201 (log and summary)") {
  MemEnv env;
  CapturedLog log;
  {
    Harness h(&env);
    StepCounterHook::Options o;
    o.output_dir = "/logs";
    o.clock = &h.clock;
    h.hooks.push_back(*StepCounterHook::Create(o));
    REQUIRE(h.Begin().ok());
    h.RunSteps(250, absl::Milliseconds(500));  // 2 steps per second
    REQUIRE(h.End().ok());
    h.Shutdown();
  }
  auto values = Scalars(ReadEvents(&env, "/logs"), "global_step/sec");
  CHECK(StepsOf(values) == Steps{101, 201});
  for (const auto& [step, v] : values) CHECK(v == doctest::Approx(2.0));
  CHECK(Count(log.text(), "global_step/sec: 2") == 2);
}

TEST_CASE("B111 StepCounterHook warns the first 5 times the global step did not increase") {
  MemEnv env;
  CapturedLog log;
  {
    Harness h(&env);
    h.fetches = {"noop"};  // never increments the global step
    StepCounterHook::Options o;
    o.clock = &h.clock;
    h.hooks.push_back(*StepCounterHook::Create(o));
    REQUIRE(h.Begin().ok());
    h.RunSteps(9);
    h.Shutdown();
  }
  const std::string warning =
      "It seems that global step (tf.train.get_global_step) has not been increased. Current value (could be "
      "stable): 0 vs previous value: 0.";
  CHECK(Count(log.text(), warning) == 5);
}

// -- SummarySaverHook -------------------------------------------------------------------------

SummarySaverHook::Options SummaryOptions(Harness& h, std::vector<std::string> ops = {"summaries"}) {
  SummarySaverHook::Options o;
  o.save_steps = 100;
  o.output_dir = "/logs";
  o.summary_op = std::move(ops);
  o.clock = &h.clock;
  return o;
}

TEST_CASE("B113 B114 B115 B116 SummarySaverHook: START at 1, summaries at 1, 101, 201; end() flushes") {
  MemEnv env;
  Harness h(&env);
  h.hooks.push_back(*SummarySaverHook::Create(SummaryOptions(h)));
  REQUIRE(h.Begin().ok());
  h.RunSteps(250);
  // B113: fetched on the first run and when due for the predicted next step.
  CHECK(*h.summary_requests == 3);
  // B116: the events sit in the writer's queue (the clock never reached
  // flush_secs) until end() flushes.
  CHECK(Scalars(ReadEvents(&env, "/logs", /*writing=*/true), "loss").empty());
  REQUIRE(h.End().ok());
  std::vector<Event> events = ReadEvents(&env, "/logs");
  CHECK(SessionLogSteps(events, SessionLogStatus::kStart) == Steps{1});
  CHECK(StepsOf(Scalars(events, "loss")) == Steps{1, 101, 201});
}

TEST_CASE("B115 SummarySaverHook merges several summary ops into one event") {
  MemEnv env;
  Harness h(&env);
  h.hooks.push_back(*SummarySaverHook::Create(SummaryOptions(h, {"summaries", "extra_summary"})));
  REQUIRE(h.Begin().ok());
  h.RunSteps(1);
  REQUIRE(h.End().ok());
  std::vector<Event> events = ReadEvents(&env, "/logs");
  int with_both = 0;
  for (const Event& e : events) {
    if (e.values.size() == 2 && e.step == 1) ++with_both;
  }
  CHECK(with_both == 1);
}

TEST_CASE("B112 SummarySaverHook without output_dir writes nothing; without summary ops only START") {
  MemEnv env;
  Harness h(&env);
  auto o = SummaryOptions(h);
  o.output_dir = "";
  auto quiet = *SummarySaverHook::Create(o);
  auto start_only = *SummarySaverHook::Create(SummaryOptions(h, {}));
  h.hooks = {quiet, start_only};
  REQUIRE(h.Begin().ok());
  h.RunSteps(150);
  REQUIRE(h.End().ok());
  // Neither fetches a summary: the output-less hook does nothing at all (TF
  // would still fetch it on every run), the other has no summary op.
  CHECK(*h.summary_requests == 0);
  std::vector<Event> events = ReadEvents(&env, "/logs");
  CHECK(SessionLogSteps(events, SessionLogStatus::kStart) == Steps{1});
  CHECK(Scalars(events, "loss").empty());
}

TEST_CASE("B114 SummarySaverHook: START carries the restored step + 1 after a restart") {
  MemEnv env;
  Harness h(&env);
  h.hooks.push_back(*SummarySaverHook::Create(SummaryOptions(h)));
  REQUIRE(h.Begin(/*step=*/300).ok());
  h.RunSteps(2);
  REQUIRE(h.End().ok());
  std::vector<Event> events = ReadEvents(&env, "/logs");
  CHECK(SessionLogSteps(events, SessionLogStatus::kStart) == Steps{301});
  CHECK(StepsOf(Scalars(events, "loss")) == Steps{301});
}

// -- all three, as MonitoredTrainingSession installs them --------------------------------------

TEST_CASE("H-32 summaries at 1, 101, 201 and global_step/sec at 101, 201 while checkpoints are at 0, 100, 200, 250") {
  MemEnv env;
  Harness h(&env);
  StepCounterHook::Options sc;
  sc.output_dir = "/logs";
  sc.clock = &h.clock;
  auto ckpt = MakeCheckpointHook(CheckpointOptions(h, 100));
  h.hooks = {*StepCounterHook::Create(sc), *SummarySaverHook::Create(SummaryOptions(h)), ckpt};
  REQUIRE(h.Begin().ok());
  h.RunSteps(250, absl::Seconds(1));
  REQUIRE(h.End().ok());
  h.Shutdown();
  std::vector<Event> events = ReadEvents(&env, "/logs");  // one file shared by both hooks (B151)
  CHECK(SessionLogSteps(events, SessionLogStatus::kStart) == Steps{1});
  CHECK(StepsOf(Scalars(events, "loss")) == Steps{1, 101, 201});
  CHECK(StepsOf(Scalars(events, "global_step/sec")) == Steps{101, 201});
  CHECK(ckpt->saved_steps() == Steps{0, 100, 200, 250});
  CHECK(CheckpointSteps(&env, "/ckpt") == Steps{0, 100, 200, 250});
}

}  // namespace
}  // namespace foreman
