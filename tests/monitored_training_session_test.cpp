// MonitoredTrainingSession: TF's USE_DEFAULT rules and the hooks it adds
// (B1-B17, decision 1), and the cross-cutting scenarios with real creators,
// hooks, service actors and checkpoints (B163-B167; bug log H-07, H-09,
// H-26, H-29).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <stdexcept>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/checkpoint.hpp"
#include "foreman/clock.hpp"
#include "foreman/event_reader.hpp"
#include "foreman/fault.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/stop.hpp"
#include "foreman/summary.hpp"
#include "support/call_log.hpp"
#include "support/events.hpp"
#include "support/log_capture.hpp"
#include "support/recording_hook.hpp"
#include "support/test_util.hpp"
#include "support/training_graph.hpp"
#include "foreman/mem_env.hpp"
#include "support/gated_env.hpp"
#include "support/scripted_hook.hpp"
#include "support/stop_at_step.hpp"

namespace foreman {
namespace {

using testing::CallLog;
using testing::CapturedLog;
using testing::Checkpoints;
using testing::Events;
using testing::Int;
using testing::KeptAfterPurge;
using testing::MakeGraph;
using testing::Model;
using testing::Open;
using testing::RecordingHook;
using testing::SessionLogSteps;
using testing::SummarySteps;
using testing::TempDir;

constexpr auto kWait = std::chrono::seconds(20);

class RecordingListener : public CheckpointSaverListener {
 public:
  explicit RecordingListener(std::shared_ptr<CallLog> log) : log_(std::move(log)) {}
  Status begin() override {
    log_->Add("listener.begin");
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<CallLog> log_;
};

// Writes a checkpoint of step `step` (global_step and w) into `dir`.
void WriteCheckpoint(const std::string& dir, int64_t step) {
  auto saver = Saver::Create({});
  REQUIRE(saver.ok());
  std::map<std::string, Tensor> tensors{{"global_step", Tensor::Scalar<int64_t>(step)},
                                        {"w", Tensor::Scalar<float>(static_cast<float>(step))}};
  REQUIRE((*saver)->Save(tensors, dir + "/model.ckpt", step).ok());
}

// A chief's options with a manual clock (no timer fires by itself).
MonitoredTrainingSessionOptions ChiefOptions(std::shared_ptr<Graph> graph, const std::string& checkpoint_dir,
                                             ManualClock* clock) {
  MonitoredTrainingSessionOptions o;
  o.graph = std::move(graph);
  o.checkpoint_dir = checkpoint_dir;
  o.config.clock = clock;
  o.stop_grace_period_secs = 0;
  o.recovery.initial_backoff = absl::ZeroDuration();
  return o;
}

MonitoredTrainingSessionPlan Plan(const MonitoredTrainingSessionOptions& o) {
  auto plan = PlanMonitoredTrainingSession(o);
  REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
  return *plan;
}

MonitoredTrainingSessionOptions PlanOptions(const std::string& checkpoint_dir = "/ckpt") {
  MonitoredTrainingSessionOptions o;
  o.graph = std::make_shared<Graph>();
  o.checkpoint_dir = checkpoint_dir;
  return o;
}

// -- §1 arguments and defaults (B1-B17) ------------------------------------------------

TEST_CASE("B1 summaries default to every 100 steps when neither frequency is given") {
  auto plan = Plan(PlanOptions());
  CHECK(plan.save_summaries_steps == std::optional<int64_t>(100));
  CHECK_FALSE(plan.save_summaries_secs.has_value());
  CHECK(plan.summary_saver_hook);
}

TEST_CASE("B2 only save_summaries_secs given (a value or None): steps becomes None") {
  auto o = PlanOptions();
  o.save_summaries_secs = 30.0;
  auto plan = Plan(o);
  CHECK_FALSE(plan.save_summaries_steps.has_value());
  CHECK(plan.save_summaries_secs == std::optional<double>(30.0));
  CHECK(plan.summary_saver_hook);

  o.save_summaries_secs = Defaultable<double>::None();
  plan = Plan(o);
  CHECK_FALSE(plan.save_summaries_steps.has_value());
  CHECK_FALSE(plan.save_summaries_secs.has_value());
  CHECK_FALSE(plan.summary_saver_hook);
}

TEST_CASE("B3 only save_summaries_steps given: secs becomes None") {
  auto o = PlanOptions();
  o.save_summaries_steps = int64_t{7};
  auto plan = Plan(o);
  CHECK(plan.save_summaries_steps == std::optional<int64_t>(7));
  CHECK_FALSE(plan.save_summaries_secs.has_value());
}

TEST_CASE("B4 checkpoints default to every 600 seconds") {
  auto plan = Plan(PlanOptions());
  CHECK(plan.save_checkpoint_secs == std::optional<double>(600));
  CHECK_FALSE(plan.save_checkpoint_steps.has_value());
  CHECK(plan.checkpoint_saver_hook);
}

TEST_CASE("B5 only one checkpoint frequency given: the other becomes None") {
  auto o = PlanOptions();
  o.save_checkpoint_steps = int64_t{10};
  auto plan = Plan(o);
  CHECK(plan.save_checkpoint_steps == std::optional<int64_t>(10));
  CHECK_FALSE(plan.save_checkpoint_secs.has_value());

  auto p = PlanOptions();
  p.save_checkpoint_secs = 60.0;
  plan = Plan(p);
  CHECK(plan.save_checkpoint_secs == std::optional<double>(60));
  CHECK_FALSE(plan.save_checkpoint_steps.has_value());
}

TEST_CASE("B6 save_checkpoint_secs=None with steps left at default: no CheckpointSaverHook") {
  auto o = PlanOptions();
  o.save_checkpoint_secs = Defaultable<double>::None();
  auto plan = Plan(o);
  CHECK_FALSE(plan.save_checkpoint_secs.has_value());
  CHECK_FALSE(plan.save_checkpoint_steps.has_value());
  CHECK_FALSE(plan.checkpoint_saver_hook);
}

TEST_CASE("B7 a frequency of 0 or below disables its hook") {
  auto o = PlanOptions();
  o.save_checkpoint_steps = int64_t{0};
  o.save_summaries_secs = -1.0;
  auto plan = Plan(o);
  CHECK_FALSE(plan.checkpoint_saver_hook);
  CHECK_FALSE(plan.summary_saver_hook);

  auto p = PlanOptions();
  p.save_checkpoint_secs = -5.0;
  p.save_summaries_steps = int64_t{0};
  plan = Plan(p);
  CHECK_FALSE(plan.checkpoint_saver_hook);
  CHECK_FALSE(plan.summary_saver_hook);
}

TEST_CASE("B8 decision 1: both frequencies of a pair set is INVALID_ARGUMENT naming both") {
  SUBCASE("checkpoints, including secs=0 with steps=100") {
    for (double secs : {600.0, 0.0}) {
      auto o = PlanOptions();
      o.save_checkpoint_secs = secs;
      o.save_checkpoint_steps = int64_t{100};
      auto plan = PlanMonitoredTrainingSession(o);
      CHECK(absl::IsInvalidArgument(plan.status()));
      CHECK(plan.status().message().find("save_checkpoint_secs") != std::string::npos);
      CHECK(plan.status().message().find("save_checkpoint_steps") != std::string::npos);
      CHECK(MonitoredTrainingSession(o).status() == plan.status());
    }
  }
  SUBCASE("summaries") {
    auto o = PlanOptions();
    o.save_summaries_secs = 10.0;
    o.save_summaries_steps = int64_t{100};
    auto plan = PlanMonitoredTrainingSession(o);
    CHECK(absl::IsInvalidArgument(plan.status()));
    CHECK(plan.status().message().find("save_summaries_secs") != std::string::npos);
    CHECK(plan.status().message().find("save_summaries_steps") != std::string::npos);
  }
}

TEST_CASE("B9 summary_dir defaults to checkpoint_dir; without either there are no summary hooks") {
  auto plan = Plan(PlanOptions("/ckpt"));
  CHECK(plan.summary_dir == "/ckpt");
  CHECK(plan.step_counter_hook);
  CHECK(plan.summary_saver_hook);

  plan = Plan(PlanOptions(""));
  CHECK(plan.summary_dir.empty());
  CHECK_FALSE(plan.step_counter_hook);
  CHECK_FALSE(plan.summary_saver_hook);
  CHECK_FALSE(plan.checkpoint_saver_hook);

  auto o = PlanOptions("");
  o.summary_dir = "/summaries";
  plan = Plan(o);
  CHECK(plan.summary_dir == "/summaries");
  CHECK(plan.step_counter_hook);
  CHECK(plan.summary_saver_hook);
  CHECK_FALSE(plan.checkpoint_saver_hook);
}

TEST_CASE("B10 StepCounterHook only with log_step_count_steps > 0") {
  auto o = PlanOptions();
  o.log_step_count_steps = std::nullopt;
  CHECK_FALSE(Plan(o).step_counter_hook);
  o.log_step_count_steps = 0;
  CHECK_FALSE(Plan(o).step_counter_hook);
  o.log_step_count_steps = 50;
  CHECK(Plan(o).step_counter_hook);
  CHECK(Plan(o).log_step_count_steps == 50);
}

// Issue 12 (8): log_step_count_steps is a Defaultable like its siblings:
// left alone it is TF's 100; None() turns the hook off.
TEST_CASE("B10 log_step_count_steps is Defaultable: USE_DEFAULT is 100, None() is off") {
  auto o = PlanOptions();
  CHECK(o.log_step_count_steps.use_default());
  CHECK(Plan(o).step_counter_hook);
  CHECK(Plan(o).log_step_count_steps == 100);
  o.log_step_count_steps = Defaultable<int64_t>::None();
  CHECK_FALSE(Plan(o).step_counter_hook);
  CHECK_FALSE(Plan(o).log_step_count_steps.has_value());
}

TEST_CASE("B11 CheckpointSaverHook only with checkpoint_dir and an enabled frequency") {
  auto o = PlanOptions("");
  o.save_checkpoint_steps = int64_t{10};
  CHECK_FALSE(Plan(o).checkpoint_saver_hook);
  o.checkpoint_dir = "/ckpt";
  CHECK(Plan(o).checkpoint_saver_hook);
}

TEST_CASE("B12 chief hook order: chief_only_hooks, the default hooks, then hooks") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.chief_only_hooks = {std::make_shared<RecordingHook>("chief", log)};
  o.hooks = {std::make_shared<RecordingHook>("user", log)};
  o.checkpoint_listeners = {std::make_shared<RecordingListener>(log)};  // its begin() is CheckpointSaverHook's
  auto sess = Open(o);
  std::vector<std::string> begins;
  for (const auto& c : log->calls()) {
    if (c.find("begin") != std::string::npos) begins.push_back(c);
  }
  CHECK(begins == std::vector<std::string>{"chief.begin", "listener.begin", "user.begin"});
  REQUIRE(sess->run({"train_op"}).ok());
  CHECK(sess->close().ok());
}

TEST_CASE("B13 a worker waits for the chief's values, runs only `hooks`, never restores or saves") {
  TempDir chief_dir;
  TempDir worker_dir;
  const std::string target = "inproc://mts_b13";
  ResetInprocTarget(target);
  WriteCheckpoint(worker_dir.path(), 7);  // must not be restored
  auto model = std::make_shared<Model>();
  auto graph = MakeGraph(model);
  auto log = std::make_shared<CallLog>();

  MonitoredTrainingSessionOptions c;
  c.graph = graph;
  c.master = target;
  c.checkpoint_dir = chief_dir.path();
  c.stop_grace_period_secs = 0;
  auto chief = Open(c);
  for (int i = 0; i < 3; ++i) REQUIRE(chief->run({"train_op"}).ok());

  MonitoredTrainingSessionOptions w;
  w.graph = graph;
  w.master = target;
  w.is_chief = false;
  w.checkpoint_dir = worker_dir.path();
  w.chief_only_hooks = {std::make_shared<RecordingHook>("chief_only", log)};
  w.hooks = {std::make_shared<RecordingHook>("user", log)};
  w.stop_grace_period_secs = 0;
  CHECK_FALSE(Plan(w).checkpoint_saver_hook);
  CHECK_FALSE(Plan(w).summary_saver_hook);
  CHECK_FALSE(Plan(w).step_counter_hook);
  auto worker = Open(w);
  auto out = worker->run({"global_step", "train_op"});
  REQUIRE(out.ok());
  CHECK(Int(out->at("global_step")) == 3);  // the chief's values, not the checkpoint's 7
  CHECK(log->Count("chief_only.begin") == 0);
  CHECK(log->Count("user.before_run") == 1);
  CHECK(worker->close().ok());
  CHECK(Checkpoints(worker_dir.path()) == std::vector<std::string>{"model.ckpt-7"});
  CHECK(Events(worker_dir.path()).empty());
  CHECK(chief->close().ok());
  ResetInprocTarget(target);
}

TEST_CASE("B14 the chief restores from checkpoint_dir even without a CheckpointSaverHook") {
  TempDir dir;
  ManualClock clock;
  WriteCheckpoint(dir.path(), 7);
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_secs = Defaultable<double>::None();
  CHECK_FALSE(Plan(o).checkpoint_saver_hook);
  auto sess = Open(o);
  auto out = sess->run({"global_step", "train_op"});
  REQUIRE(out.ok());
  CHECK(Int(out->at("global_step")) == 7);
  CHECK(model->w_initialized == 0);
  CHECK(sess->close().ok());
  CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-7"});
}

TEST_CASE("B15 the scaffold (and its saver) is shared by the creator and the default hooks") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto graph = MakeGraph(model);
  SaverOptions so;
  so.max_to_keep = 1;
  so.clock = &clock;
  auto saver = Saver::Create(so);
  REQUIRE(saver.ok());
  ScaffoldOptions sc;
  sc.saver = std::shared_ptr<Saver>(std::move(saver).value());
  auto scaffold = std::make_shared<Scaffold>(graph, sc);
  auto o = ChiefOptions(nullptr, dir.path(), &clock);
  o.scaffold = scaffold;
  o.save_checkpoint_steps = int64_t{1};
  auto sess = Open(o);
  for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"train_op"}).ok());
  CHECK(sess->close().ok());
  CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-3"});  // max_to_keep 1
}

TEST_CASE("B16 max_wait_secs is ignored by the chief; stop_grace_period_secs bounds close()'s join") {
  CapturedLog captured;
  TempDir dir;
  auto model = std::make_shared<Model>();
  MonitoredTrainingSessionOptions o;
  o.graph = MakeGraph(model);
  o.checkpoint_dir = dir.path();
  o.max_wait_secs = 0;
  o.stop_grace_period_secs = 0.3;  // on the real clock: close() waits this long for the straggler
  auto sess = Open(o);
  REQUIRE(sess->run({"train_op"}).ok());

  struct Straggler : RunnerInterface {
    std::shared_ptr<std::atomic<bool>> running = std::make_shared<std::atomic<bool>>(true);
    Status Join() override { return absl::OkStatus(); }
    bool IsRunning() const override { return running->load(); }
    std::string name() const override { return "straggler"; }
  };
  auto straggler = std::make_unique<Straggler>();
  auto running = straggler->running;
  REQUIRE(sess->coordinator()->register_runner(std::move(straggler)).ok());
  const auto start = std::chrono::steady_clock::now();
  CHECK(sess->close().ok());  // ignore_live_threads: only logged
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(300));
  CHECK(captured.text().find("Coordinator stopped with threads still running: straggler") != std::string::npos);
  running->store(false);
}

// B17 (distribute-coordinator worker contexts) is not emulated: Foreman has
// no distribute coordinator, so there is nothing to test.

TEST_CASE("an in-process recovery writes SessionLog START at the restored step + 1, so TensorBoard shows each replayed summary once") {
  // Found by `foreman chaos --preset steps --seed 0`: TF's SummarySaverHook
  // writes START only after the first run of the hook's life (B114), so the
  // summaries of the steps a recovery replays were in the event file twice
  // for TensorBoard's purge rule (B154). As after a restarted process, the
  // first run of a recovered session now writes START at its post-run step.
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{5};
  o.save_summaries_steps = int64_t{1};
  StepFault preempt;
  preempt.id = "preempt";
  preempt.code = absl::StatusCode::kAborted;
  preempt.at_step = 7;
  auto faults = FaultInjectionHook::Create({{preempt}, {}, /*seed=*/0});
  REQUIRE(faults.ok());
  o.hooks = {*faults};
  auto sess = Open(o);
  for (int i = 0; i < 9; ++i) REQUIRE(sess->run({"train_op"}).ok());  // 7 runs lose 2 steps: global_step 7
  CHECK(sess->recoveries() == 1);
  CHECK(sess->close().ok());
  auto events = Events(dir.path());
  // The first session: START at 1, summaries at 1..7; the recovered one
  // restores step 5: START at 6 purges 6 and 7, then 6..7 are written again.
  CHECK(SessionLogSteps(events, SessionLogStatus::kStart) == std::vector<int64_t>{1, 6});
  std::map<int64_t, int> once;
  for (int64_t step = 1; step <= 7; ++step) once[step] = 1;
  CHECK(KeptAfterPurge(events, "loss") == once);
}

// -- §16 cross-cutting scenarios ----------------------------------------------------------

TEST_CASE("B163 fresh chief with defaults, 5 runs: checkpoints 0 and 5, START and the summary at 1, no global_step/sec") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto sess = Open(ChiefOptions(MakeGraph(model), dir.path(), &clock));
  for (int i = 0; i < 5; ++i) REQUIRE(sess->run({"train_op"}).ok());
  CHECK(sess->close().ok());

  CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0", "model.ckpt-5"});
  auto state = ReadCheckpointState(Env::Default(), dir.path());
  REQUIRE(state.ok());
  REQUIRE(state->has_value());
  CHECK(ResolveCheckpointPath(dir.path(), (*state)->model_checkpoint_path) == dir / "model.ckpt-5");
  CHECK((*state)->all_model_checkpoint_paths.size() == 2);

  auto files = ListEventFiles(Env::Default(), dir.path());
  REQUIRE(files.ok());
  CHECK(files->size() == 1);
  auto events = Events(dir.path());
  REQUIRE(!events.empty());
  CHECK(events[0].kind == Event::Kind::kFileVersion);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(SessionLogSteps(events, SessionLogStatus::kStart) == std::vector<int64_t>{1});
  CHECK(SummarySteps(events, "loss") == std::vector<int64_t>{1});
  CHECK(SessionLogSteps(events, SessionLogStatus::kCheckpoint) == std::vector<int64_t>{0, 5});
  CHECK(SummarySteps(events, "global_step/sec").empty());
}

TEST_CASE("B164 restart on the same directory: restored, re-saved at the restored step, no init, retention continues") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  {
    auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
    o.save_checkpoint_steps = int64_t{1};
    auto sess = Open(o);
    for (int i = 0; i < 5; ++i) REQUIRE(sess->run({"train_op"}).ok());
    CHECK(sess->close().ok());
  }
  CHECK(model->w_initialized == 1);
  CHECK(Checkpoints(dir.path()) ==
        std::vector<std::string>{"model.ckpt-1", "model.ckpt-2", "model.ckpt-3", "model.ckpt-4", "model.ckpt-5"});
  const std::size_t events_before = Events(dir.path()).size();

  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{1};
  auto sess = Open(o);
  auto out = sess->run({"global_step", "train_op"});
  REQUIRE(out.ok());
  CHECK(Int(out->at("global_step")) == 5);
  CHECK(model->w_initialized == 1);  // restored: the init op did not run
  for (int i = 0; i < 2; ++i) REQUIRE(sess->run({"train_op"}).ok());
  CHECK(sess->close().ok());
  auto events = Events(dir.path());
  std::vector<Event> second(events.begin() + static_cast<std::ptrdiff_t>(events_before), events.end());
  auto saves = SessionLogSteps(second, SessionLogStatus::kCheckpoint);
  REQUIRE(!saves.empty());
  CHECK(saves.front() == 5);  // after_create_session re-saved the restored step
  // 1, 2, 3 were deleted by the restarted saver: the retention list continued.
  CHECK(Checkpoints(dir.path()) ==
        std::vector<std::string>{"model.ckpt-4", "model.ckpt-5", "model.ckpt-6", "model.ckpt-7", "model.ckpt-8"});
}

TEST_CASE("the chief removes the temporaries of interrupted saves at start-up, and nothing else") {
  TempDir dir;
  ManualClock clock;
  Env* env = Env::Default();
  // What a save killed mid-write leaves (bundle_writer.cpp's naming), with
  // and without a step, padded, a second data shard...
  const std::vector<std::string> stale = {
      "model.ckpt-30.data-00000-of-00001.tempstate12345678901234567890",
      "model.ckpt-30.index.tempstate987",
      "model.ckpt-00000040.index.tempstate5",
      "model.ckpt.data-00001-of-00002.tempstate42",
  };
  // ... and files that only look like it: another prefix, not a temporary,
  // a non-numeric or extended suffix, a state-file temporary.
  const std::vector<std::string> kept = {
      "other.ckpt-30.index.tempstate1",
      "model.ckpt-30.tempstate1",
      "model.ckpt-30.index.tempstate",
      "model.ckpt-30.index.tempstate12x",
      "model.ckpt-30.index.tempstate1.bak",
      "model.ckpt-x.index.tempstate1",
      "model.ckpt-30.data-0-of-1.tempstate1",
      "model.ckptX-30.index.tempstate1",
      "checkpoint.tmp1-0",
      "notes.txt",
  };
  for (const auto& name : stale) REQUIRE(WriteStringToFile(env, dir / name, "partial bytes").ok());
  for (const auto& name : kept) REQUIRE(WriteStringToFile(env, dir / name, "keep").ok());

  CapturedLog log;
  auto model = std::make_shared<Model>();
  auto sess = Open(ChiefOptions(MakeGraph(model), dir.path(), &clock));
  for (const auto& name : stale) {
    CHECK_MESSAGE(absl::IsNotFound(env->FileExists(dir / name)), name);
    CHECK_MESSAGE(absl::StrContains(log.text(), absl::StrCat("Removed ", dir / name, " (13 bytes)")), log.text());
  }
  for (const auto& name : kept) CHECK_MESSAGE(env->FileExists(dir / name).ok(), name);
  CHECK(sess->close().ok());
}

TEST_CASE("B165 a worker with no chief polls every recovery_wait_secs and fails with DEADLINE_EXCEEDED") {
  CapturedLog captured;
  const std::string target = "inproc://mts_b165";
  ResetInprocTarget(target);
  ManualClock clock;
  auto model = std::make_shared<Model>();
  MonitoredTrainingSessionOptions o;
  o.graph = MakeGraph(model);
  o.master = target;
  o.is_chief = false;
  o.max_wait_secs = 90;
  o.recovery_wait_secs = 30;
  o.config.clock = &clock;
  auto created = std::async(std::launch::async, [&] { return MonitoredTrainingSession(o); });
  for (int i = 0; i < 3; ++i) {
    REQUIRE(clock.BlockUntilWaiters(1, absl::Seconds(20)));
    clock.Advance(absl::Seconds(30));
  }
  REQUIRE(created.wait_for(kWait) == std::future_status::ready);
  auto sess = created.get();
  CHECK(absl::IsDeadlineExceeded(sess.status()));
  CHECK(sess.status().message().find("Session was not ready after waiting 90 secs.") != std::string::npos);
  CHECK(clock.MonotonicNow() == absl::Seconds(90));
  CHECK(captured.text().find("Waiting for model to be ready") != std::string::npos);
  ResetInprocTarget(target);
}

TEST_CASE("B26 H-01 MonitoredTrainingSession exposes the worker's readiness poll interval (recovery_wait_secs)") {
  CapturedLog captured;
  const std::string target = "inproc://mts_b26";
  ResetInprocTarget(target);
  ManualClock clock;
  auto model = std::make_shared<Model>();
  MonitoredTrainingSessionOptions o;
  o.graph = MakeGraph(model);
  o.master = target;
  o.is_chief = false;
  o.max_wait_secs = 10;
  o.recovery_wait_secs = 5;  // TF: fixed at 30 s
  o.config.clock = &clock;
  auto created = std::async(std::launch::async, [&] { return MonitoredTrainingSession(o); });
  for (int i = 0; i < 2; ++i) {
    REQUIRE(clock.BlockUntilWaiters(1, absl::Seconds(20)));
    clock.Advance(absl::Seconds(5));
  }
  REQUIRE(created.wait_for(kWait) == std::future_status::ready);
  auto sess = created.get();
  CHECK(absl::IsDeadlineExceeded(sess.status()));
  CHECK(clock.MonotonicNow() == absl::Seconds(10));
  ResetInprocTarget(target);
}

TEST_CASE("B167 H-07 UNAVAILABLE at step 15 with save_checkpoint_steps=10: restored to 10, re-saved, re-run to 11") {
  CapturedLog captured;
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto log = std::make_shared<CallLog>();
  auto hook = std::make_shared<RecordingHook>("user", log);
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{10};
  o.log_step_count_steps = 5;  // the StepCounterHook lives through the recovery
  o.hooks = {hook};
  auto sess = Open(o);
  bool injected = false;
  model->on_train = [&](int64_t step) -> Status {
    if (step == 15 && !injected) {
      injected = true;
      return absl::UnavailableError("OS Error");
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < 15; ++i) REQUIRE(sess->run({"train_op"}).ok());
  auto out = sess->run({"train_op"});
  REQUIRE_MESSAGE(out.ok(), out.status().ToString());
  CHECK(Int(out->at("train_op")) == 11);  // the failed run, re-executed on the restored step
  CHECK(sess->recoveries() == 1);
  CHECK(sess->steps_lost() == 5);
  CHECK(log->Count("user.begin") == 1);
  CHECK(log->Count("user.after_create_session") == 2);
  CHECK(captured.text().find("OS Error") != std::string::npos);
  CHECK(captured.text().find("global_step 15 before the error, 10 restored; 5 steps lost") != std::string::npos);
  CHECK(sess->close().ok());
  auto saves = SessionLogSteps(Events(dir.path()), SessionLogStatus::kCheckpoint);
  CHECK(saves == std::vector<int64_t>{0, 10, 10, 11});  // 10 again at re-creation, 11 at end()
}

// Issue 14 point 4 (beyond TF): the recovery's metrics as recovery/... scalars in
// the chief's event file, equal to the RecoveryReport, surviving TensorBoard's purge.
TEST_CASE("a recovery is written as recovery/... summaries at its first good step, after that step's SessionLog START") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{10};
  o.save_summaries_steps = int64_t{5};
  std::vector<RecoveryReport> reports;
  o.recovery.on_recovered = [&](const RecoveryReport& r) { reports.push_back(r); };
  auto sess = Open(o);
  bool injected = false;
  model->on_train = [&](int64_t step) -> Status {
    if (step == 15 && !injected) {
      injected = true;
      clock.Advance(absl::Milliseconds(250));  // the failure takes a while to come back
      return absl::AbortedError("preempted");
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < 17; ++i) REQUIRE(sess->run({"train_op"}).ok());
  REQUIRE(sess->close().ok());
  REQUIRE(reports.size() == 1);

  const std::vector<Event> events = Events(dir.path());
  CHECK(SummarySteps(events, "recovery/steps_lost") == std::vector<int64_t>{11});
  CHECK(SummarySteps(events, "recovery/recoveries") == std::vector<int64_t>{11});
  CHECK(SummarySteps(events, "recovery/detect_secs") == std::vector<int64_t>{11});
  CHECK(SummarySteps(events, "recovery/restore_secs") == std::vector<int64_t>{11});
  CHECK(SummarySteps(events, "recovery/next_good_step_secs") == std::vector<int64_t>{11});
  std::map<std::string, float> values;
  std::size_t summary_at = 0, last_start_at = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.kind == Event::Kind::kSessionLog && e.session_status == SessionLogStatus::kStart) last_start_at = i;
    for (const SummaryValue& v : e.values) {
      if (absl::StartsWith(v.tag, "recovery/")) {
        values[v.tag] = static_cast<float>(v.scalar);
        summary_at = i;
      }
    }
  }
  CHECK(values["recovery/steps_lost"] == static_cast<float>(reports[0].steps_lost));
  CHECK(values["recovery/steps_lost"] == 5.0f);
  CHECK(values["recovery/recoveries"] == 1.0f);
  CHECK(values["recovery/detect_secs"] == static_cast<float>(absl::ToDoubleSeconds(reports[0].detect)));
  CHECK(values["recovery/restore_secs"] == static_cast<float>(absl::ToDoubleSeconds(reports[0].restore)));
  REQUIRE(reports[0].next_good_step.has_value());
  CHECK(values["recovery/next_good_step_secs"] ==
        static_cast<float>(absl::ToDoubleSeconds(*reports[0].next_good_step)));
  // Beyond TF: the restored session's first run writes a START at 11, which
  // purges what the failed session wrote at steps 11..15; the recovery
  // summary comes after it.
  CHECK(SessionLogSteps(events, SessionLogStatus::kStart) == std::vector<int64_t>{1, 11});
  CHECK(summary_at > last_start_at);
  CHECK(SummarySteps(events, "loss") == std::vector<int64_t>{1, 6, 11, 11});  // the first 11 purged
}

TEST_CASE("two recoveries to one checkpoint: the later purges the earlier's recovery summary with its steps") {
  // Found by `foreman chaos --preset steps` (seeds 130, 221, 265): written at
  // the restored step, both recoveries' values sat at step 10 and no START
  // purged the first.
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{10};
  o.save_summaries_steps = int64_t{100};
  std::vector<RecoveryReport> reports;
  o.recovery.on_recovered = [&](const RecoveryReport& r) { reports.push_back(r); };
  StepFault first, second;
  first.id = "first";
  first.code = absl::StatusCode::kAborted;
  first.at_step = 13;
  second.id = "second";
  second.code = absl::StatusCode::kUnavailable;
  second.at_step = 15;
  auto faults = FaultInjectionHook::Create({{first, second}, {}, /*seed=*/0});
  REQUIRE(faults.ok());
  o.hooks = {*faults};
  auto sess = Open(o);
  // 13 runs, the 14th recovers (to 10) and re-runs 10; 15th-18th reach 15;
  // the 19th recovers again and re-runs 10; the 20th reaches 12.
  for (int i = 0; i < 20; ++i) REQUIRE(sess->run({"train_op"}).ok());
  REQUIRE(sess->close().ok());
  REQUIRE(reports.size() == 2);
  CHECK(reports[0].restored_global_step == 10);
  CHECK(reports[1].restored_global_step == 10);

  const std::vector<Event> events = Events(dir.path());
  CHECK(SummarySteps(events, "recovery/steps_lost") == std::vector<int64_t>{11, 11});
  CHECK(SessionLogSteps(events, SessionLogStatus::kStart) == std::vector<int64_t>{1, 11, 11});
  CHECK(KeptAfterPurge(events, "recovery/steps_lost") == std::map<int64_t, int>{{11, 1}});
  float kept_steps_lost = -1;
  for (const Event& e : events) {
    for (const SummaryValue& v : e.values) {
      if (v.tag == "recovery/steps_lost") kept_steps_lost = static_cast<float>(v.scalar);  // the last one
    }
  }
  CHECK(kept_steps_lost == 5.0f);  // the second recovery: 15 - 10
}

TEST_CASE("recovery summaries: none when the chief writes no summaries, none for a fault-free run") {
  for (bool summaries : {false, true}) {
    CAPTURE(summaries);
    TempDir dir;
    ManualClock clock;
    auto model = std::make_shared<Model>();
    auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
    o.save_checkpoint_steps = int64_t{10};
    if (summaries) {
      o.save_summaries_steps = int64_t{5};
    } else {
      o.save_summaries_steps = std::nullopt;
      o.save_summaries_secs = std::nullopt;
      o.log_step_count_steps = std::nullopt;
    }
    int reports = 0;
    o.recovery.on_recovered = [&](const RecoveryReport&) { ++reports; };
    auto sess = Open(o);
    model->on_train = [&](int64_t step) -> Status {
      // Without summaries: a recovery that must not write any.
      if (!summaries && step == 12 && reports == 0) return absl::AbortedError("preempted");
      return absl::OkStatus();
    };
    for (int i = 0; i < 14; ++i) REQUIRE(sess->run({"train_op"}).ok());
    REQUIRE(sess->close().ok());
    CHECK(reports == (summaries ? 0 : 1));
    CHECK(SummarySteps(Events(dir.path()), "recovery/steps_lost").empty());
  }
}

TEST_CASE("H-09 OUT_OF_RANGE on run 7 saves the final checkpoint at step 6; INVALID_ARGUMENT does not") {
  for (bool clean : {true, false}) {
    CAPTURE(clean);
    TempDir dir;
    ManualClock clock;
    auto model = std::make_shared<Model>();
    auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
    o.save_checkpoint_steps = int64_t{100};
    const Status error = clean ? absl::OutOfRangeError("End of sequence") : absl::InvalidArgumentError("bad");
    model->on_train = [error](int64_t step) { return step == 6 ? error : absl::OkStatus(); };
    auto sess = Open(o);
    Status last;
    while (!sess->should_stop()) last = sess->run({"train_op"}).status();
    CHECK(last == error);
    if (clean) {
      CHECK(sess->close().ok());
      CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0", "model.ckpt-6"});
    } else {
      CHECK(sess->close() == error);
      CHECK(Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0"});
    }
  }
}

TEST_CASE("H-26 a saving hook without checkpoint_dir does not restore; checkpoint_dir does") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  // Runs 1 and 2 save through their own hook; run 3 leaves it to MTS.
  auto run = [&](const std::string& checkpoint_dir) -> int64_t {
    auto o = ChiefOptions(MakeGraph(model), checkpoint_dir, &clock);
    if (checkpoint_dir.empty()) {
      CheckpointSaverHook::Options ho;
      ho.checkpoint_dir = dir.path();
      ho.save_steps = 1;
      ho.clock = &clock;
      auto hook = CheckpointSaverHook::Create(ho);
      REQUIRE(hook.ok());
      o.hooks = {*hook};
    }
    auto sess = Open(o);
    auto out = sess->run({"global_step", "train_op"});
    REQUIRE(out.ok());
    for (int i = 0; i < 2; ++i) REQUIRE(sess->run({"train_op"}).ok());
    CHECK(sess->close().ok());
    return Int(out->at("global_step"));
  };
  CHECK(run("") == 0);
  CHECK(!Checkpoints(dir.path()).empty());
  CHECK(model->w_initialized == 1);
  CHECK(run("") == 0);  // from scratch again
  CHECK(model->w_initialized == 2);
  CHECK(run(dir.path()) == 3);  // resumed
  CHECK(model->w_initialized == 2);
}

// TF fails in begin(); Foreman's hooks see the graph only through the session
// (begin() has no argument), so the check comes in after_create_session: still
// before any step, and nothing is saved.
TEST_CASE("H-29 no usable global step: MonitoredTrainingSession fails at creation naming the hook, before any step") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  // Foreman cannot hold two global steps (TF's ambiguous collection).
  auto two = std::make_shared<Graph>();
  REQUIRE(two->CreateGlobalStep().ok());
  CHECK(absl::IsAlreadyExists(two->CreateGlobalStep()));

  auto graph = MakeGraph(model, /*global_step=*/false);
  auto o = ChiefOptions(graph, dir.path(), &clock);
  o.log_step_count_steps = std::nullopt;
  o.save_summaries_steps = Defaultable<int64_t>::None();
  auto sess = MonitoredTrainingSession(o);
  CHECK(absl::IsFailedPrecondition(sess.status()));
  CHECK(sess.status().message().find("Global step should be created to use CheckpointSaverHook.") !=
        std::string::npos);
  CHECK(model->train_calls == 0);
  CHECK_FALSE(graph->finalized());  // B22 on the failed creation too
  CHECK(Checkpoints(dir.path()).empty());
}


// -- MonitoredSession::request_stop: one home for a stop ----------------------------

TEST_CASE("request_stop from another thread during a recovery ends the run cleanly with a final checkpoint") {
  CapturedLog captured;
  TempDir dir;
  ManualClock clock;  // never advanced: the 10 s back-off ends only by the stop
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{4};
  o.recovery.initial_backoff = absl::Seconds(10);
  std::atomic<bool> failed{false};
  model->on_train = [&](int64_t step) -> Status {
    if (step == 6 && !failed.exchange(true)) return absl::UnavailableError("ps task lost");
    return absl::OkStatus();
  };
  auto sess = Open(o);
  Status last_run;
  auto training = std::async(std::launch::async, [&] {
    while (!sess->should_stop()) {
      auto r = sess->run({"train_op"});
      if (!r.ok()) {
        last_run = r.status();
        break;
      }
    }
    return sess->close();
  });
  // The error has happened and the recovery began (it counts itself first).
  for (int i = 0; i < 2000 && !(failed && sess->recoveries() == 1); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(sess->recoveries() == 1);
  sess->request_stop();  // another thread, mid-recovery
  REQUIRE_MESSAGE(training.wait_for(kWait) == std::future_status::ready, "the stop did not end the recovery");
  Status closed = training.get();
  CHECK_MESSAGE(closed.ok(), closed.ToString());
  CHECK(absl::IsCancelled(last_run));  // the interrupted run: a clean end, no step
  CHECK(model->train_calls == 7);      // steps 0-5, then the failed one; none after the stop
  CHECK(sess->steps_lost() == 2);      // 6 before the error, 4 restored
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE(latest.ok());
  REQUIRE(latest->has_value());
  CHECK(**latest == dir.path() + "/model.ckpt-4");
  // Saved at 0 and 4, at 4 again when the new session was created, and the
  // final checkpoint of end() is that same step (nothing newer to save).
  CHECK(SessionLogSteps(Events(dir.path()), SessionLogStatus::kCheckpoint) == std::vector<int64_t>{0, 4, 4});
  CHECK(sess->stop_request()->completed());
}

TEST_CASE("request_stop before the first run: no step runs, close() saves and returns OK") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto sess = Open(ChiefOptions(MakeGraph(model), dir.path(), &clock));
  sess->request_stop();
  CHECK(sess->should_stop());
  int runs = 0;
  while (!sess->should_stop()) {
    ++runs;
    if (!sess->run({"train_op"}).ok()) break;
  }
  CHECK(runs == 0);
  CHECK(sess->close().ok());
  CHECK(model->train_calls == 0);
  CHECK(SessionLogSteps(Events(dir.path()), SessionLogStatus::kCheckpoint) == std::vector<int64_t>{0});
}

TEST_CASE("a StopRequest given in RuntimeOptions and stopped before the session exists: no step runs") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.stop_grace_period_secs.reset();  // the StopRequest's grace period is the one setting
  StopRequestOptions stop_options;
  stop_options.clock = &clock;
  o.runtime.stop = std::make_shared<StopRequest>(stop_options);
  o.runtime.stop->request_stop();
  auto sess = Open(o);
  CHECK(sess->should_stop());
  CHECK(sess->stop_request() == o.runtime.stop);
  CHECK(sess->close().ok());
  CHECK(model->train_calls == 0);
  CHECK(o.runtime.stop->completed());
}

TEST_CASE("request_stop with an error is an abort: no end(), no final checkpoint, close() returns it") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_checkpoint_steps = int64_t{100};
  auto sess = Open(o);
  for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"train_op"}).ok());
  sess->request_stop(absl::InternalError("operator abort"));
  CHECK(sess->should_stop());
  Status closed = sess->close();
  CHECK(absl::IsInternal(closed));
  CHECK(closed.message() == "operator abort");
  CHECK(SessionLogSteps(Events(dir.path()), SessionLogStatus::kCheckpoint) == std::vector<int64_t>{0});
}


// A hook whose end() takes (clock) time, as foreman train's final evaluation.
class SlowEndHook : public SessionRunHook {
 public:
  explicit SlowEndHook(ManualClock* clock) : clock_(clock) {}
  std::string name() const override { return "SlowEndHook"; }
  Status end(Session*) override {
    clock_->Advance(absl::Seconds(60));
    return absl::OkStatus();
  }

 private:
  ManualClock* clock_;
};

TEST_CASE("the stop grace period ends with the final checkpoint, not with the later hooks' end()") {
  TempDir dir;
  ManualClock clock;
  std::atomic<int> expired{0};
  auto model = std::make_shared<Model>();
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.stop_grace_period_secs.reset();  // the StopRequest's grace period is the one setting
  StopRequestOptions stop_options;
  stop_options.clock = &clock;
  stop_options.grace_period = absl::Seconds(5);
  stop_options.on_grace_expired = [&](absl::Duration) { ++expired; };
  auto stop = std::make_shared<StopRequest>(stop_options);
  o.runtime.stop = stop;
  o.hooks = {std::make_shared<SlowEndHook>(&clock)};  // after the CheckpointSaverHook
  {
    auto sess = Open(o);
    for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"train_op"}).ok());
    sess->request_stop();
    CHECK(sess->close().ok());
    CHECK(stop->completed());
  }
  o.runtime.stop.reset();
  stop.reset();  // joins the watchdog: a late on_grace_expired would have run by now
  CHECK(expired == 0);
  CHECK(SessionLogSteps(Events(dir.path()), SessionLogStatus::kCheckpoint) == std::vector<int64_t>{0, 3});
}

TEST_CASE("a StopRequest no one stopped is not completed by close() or by a failed creation") {
  ManualClock clock;
  auto model = std::make_shared<Model>();
  StopRequestOptions stop_options;
  stop_options.clock = &clock;
  MonitoredSessionOptions o;
  o.graph = MakeGraph(model);
  o.runtime.stop = std::make_shared<StopRequest>(stop_options);
  {
    auto sess = MonitoredSession::Create(o);
    REQUIRE(sess.ok());
    REQUIRE((*sess)->run({"train_op"}).ok());
    CHECK((*sess)->close().ok());
  }
  CHECK_FALSE(o.runtime.stop->completed());
  class FailingBegin : public SessionRunHook {
   public:
    std::string name() const override { return "FailingBegin"; }
    Status begin() override { return absl::UnavailableError("not yet"); }
  };
  o.graph = MakeGraph(model);
  o.hooks = {std::make_shared<FailingBegin>()};
  CHECK_FALSE(MonitoredSession::Create(o).ok());
  CHECK_FALSE(o.runtime.stop->completed());
  // So a later run still gets its grace period.
  o.runtime.stop->request_stop();
  CHECK(o.runtime.stop->grace_deadline().has_value());
  o.runtime.stop->Complete();
}

// -- a busy checkpoint directory -------------------------------------------------------

// Issue 12 (13): the StepCounterHook and SummarySaverHook come before the
// CheckpointSaverHook (B12) and opened their event file in the directory
// before the CheckpointSaverHook's begin() found it locked, leaving an events
// file (a file_version record) in another run's directory. The lock is now
// taken first.
TEST_CASE("a busy checkpoint_dir is refused before any event file is written there; the lock goes at close()") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto held = LockCheckpointDirectory(Env::Default(), dir.path());  // another owner (this process's lock table)
  REQUIRE(held.ok());
  auto o = ChiefOptions(MakeGraph(model), dir.path(), &clock);
  o.save_summaries_steps = 1;  // B12: the step counter and the summary saver write into checkpoint_dir
  o.log_step_count_steps = 1;
  auto refused = MonitoredTrainingSession(o);
  CHECK(absl::IsFailedPrecondition(refused.status()));
  CHECK_MESSAGE(refused.status().message().find("is in use") != std::string::npos, refused.status().ToString());
  auto files = ListEventFiles(Env::Default(), dir.path());
  REQUIRE(files.ok());
  CHECK_MESSAGE(files->empty(), "an events file was written into the busy directory: ", (*files)[0]);
  CHECK(model->train_calls == 0);

  // Free again: the session takes the lock and keeps it until close(), not
  // until it is destroyed.
  held->reset();
  auto sess = Open(ChiefOptions(MakeGraph(model), dir.path(), &clock));
  CHECK(absl::IsFailedPrecondition(LockCheckpointDirectory(Env::Default(), dir.path()).status()));
  REQUIRE(sess->run({"train_op"}).ok());
  CHECK(sess->close().ok());
  CHECK(LockCheckpointDirectory(Env::Default(), dir.path()).ok());
}

}  // namespace
}  // namespace foreman

// -- adversarial cases (issue 4's review; were tests/breaker_test.cpp) -------------
// Preemption at awkward points, failing saves, throwing hooks, double close,
// cross-thread stop, directory locks, chief + worker, restarts, bug-report
// replays through MonitoredTrainingSession. Every wait is bounded.

namespace foreman {
namespace adversarial {
namespace {

using testing::Bounded;
using testing::CallLog;
using testing::CapturedLog;
using testing::Checkpoints;
using testing::GatedEnv;
using testing::Int;
using testing::LastStep;
using testing::MakeGraph;
using testing::Model;
using testing::NumSteps;
using testing::Open;
using testing::ScriptedHook;
using testing::TempDir;

constexpr auto kWait = std::chrono::seconds(20);

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

}  // namespace
}  // namespace adversarial
}  // namespace foreman
