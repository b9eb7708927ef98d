// Restart policies for the service actors (include/foreman/restart_policy.hpp),
// OTP's supervisor vocabulary, through a real MonitoredTrainingSession: TF's
// default (a failing service ends the run), a summary writer restarted after
// EIO onto a new event file with its lost events reported, a checkpoint
// saver restarted after its own save error (the save lost, the final one
// saved again; also under a Supervisor), intensity
// exceeded, permanent / transient / temporary, the three strategies, and
// the policy's validation and back-off. Faults come from FaultyEnv and from
// FaultInjectionHook's ActorFaults (fault.hpp). No sleeps: a ManualClock for
// the session, bounded polls for what the actors do.
#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/clock.hpp"
#include "foreman/event_reader.hpp"
#include "foreman/fault.hpp"
#include "foreman/hooks.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/restart_policy.hpp"
#include "foreman/supervisor.hpp"
#include "foreman/variable_store.hpp"
#include "runtime/services.hpp"
#include "support/events.hpp"
#include "support/fake_services.hpp"
#include "support/log_capture.hpp"
#include "support/test_util.hpp"
#include "support/training_graph.hpp"

namespace foreman {
namespace {

using testing::MakeGraph;
using testing::Model;
using testing::Open;
using testing::TempDir;

// A session writing the "loss" summary at every step into `dir` (TF's
// SummarySaverHook, save_summaries_steps = 1), with a step counter there
// too when `step_counter`; no checkpoint saver.
MonitoredTrainingSessionOptions Options(const std::string& dir, Env* env, ManualClock* clock, HookList hooks,
                                        int64_t last_step, bool step_counter = false) {
  MonitoredTrainingSessionOptions o = testing::QuietOptions(dir, clock, std::move(hooks), last_step);
  o.config.env = env;
  o.save_summaries_steps = int64_t{1};
  if (step_counter) o.log_step_count_steps = int64_t{1};
  return o;
}

// Runs at most `n` steps (fewer when the session stops); the last status.
Status Steps(MonitoredSession& sess, int n) {
  Status last;
  for (int i = 0; i < n && !sess.should_stop(); ++i) last = sess.run({"train_op"}).status();
  return last;
}

// Polls (bounded, real time) until `pred` holds.
bool Eventually(const std::function<bool()>& pred) {
  const absl::Time deadline = absl::Now() + testing::kRealTimeout;
  while (!pred()) {
    if (absl::Now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

bool HasRestarts(const MonitoredSession& sess, std::size_t n) {
  return Eventually([&] { return sess.service_restarts().size() >= n; });
}

// The nth append to an event file: its file_version record is append 1,
// then each event is one append (RecordWriter writes a record whole).
EnvFault EventFileEio(int64_t nth, bool repeat = false) {
  EnvFault f;
  f.id = "eio";
  f.path_pattern = "*events.out.tfevents*";
  f.op = EnvOp::kAppend;
  f.kind = EnvFault::Kind::kError;
  f.error = EIO;
  f.nth = nth;
  f.repeat = repeat;
  return f;
}

std::shared_ptr<FaultInjectionHook> KillAt(const std::string& service, int64_t step, bool normal = false) {
  ActorFault f;
  f.id = absl::StrCat("kill-", service);
  f.service = service;
  f.kind = ActorFault::Kind::kKill;
  f.at_step = step;
  f.exit_normally = normal;
  FaultInjectionHook::Options o;
  o.actors = {f};
  auto hook = FaultInjectionHook::Create(o);
  REQUIRE_MESSAGE(hook.ok(), hook.status().ToString());
  return *hook;
}

std::shared_ptr<FaultInjectionHook> ActorHook(std::vector<ActorFault> faults) {
  FaultInjectionHook::Options o;
  o.actors = std::move(faults);
  auto hook = FaultInjectionHook::Create(o);
  REQUIRE_MESSAGE(hook.ok(), hook.status().ToString());
  return *hook;
}

ActorFault Fault(std::string id, std::string service, ActorFault::Kind kind, int64_t at_step) {
  ActorFault f;
  f.id = std::move(id);
  f.service = std::move(service);
  f.kind = kind;
  f.at_step = at_step;
  return f;
}

std::vector<std::string> EventFiles(const std::string& dir) {
  auto files = ListEventFiles(Env::Default(), dir);
  REQUIRE_MESSAGE(files.ok(), files.status().ToString());
  return *files;
}

// What most tests share: a fresh directory and the session's ManualClock,
// Options() over them, and the usual course of a run through a restart.
struct SessionFixture {
  TempDir dir;
  ManualClock clock;

  MonitoredTrainingSessionOptions Opts(HookList hooks, int64_t last_step, bool step_counter = false,
                                       Env* env = Env::Default()) {
    return Options(dir.path(), env, &clock, std::move(hooks), last_step, step_counter);
  }

  // Opens a session with `o`, runs `before` steps (each OK), waits (bounded)
  // until `records` restarts or removals are recorded, runs on to
  // `last_step` (each OK) and closes it (OK); the records.
  std::vector<ServiceRestart> TrainThroughRestart(const MonitoredTrainingSessionOptions& o, int before,
                                                  std::size_t records, int last_step) {
    auto sess = Open(o);
    CHECK(Steps(*sess, before).ok());
    REQUIRE(HasRestarts(*sess, records));
    CHECK(Steps(*sess, last_step).ok());
    CHECK(sess->close().ok());
    return sess->service_restarts();
  }
};

RestartPolicy Restarting(RestartType type, int max_restarts = 3) {
  RestartPolicy p;
  p.type = type;
  p.max_restarts = max_restarts;
  p.period = absl::Seconds(60);
  return p;
}

// -- TF's default -----------------------------------------------------------------------

TEST_CASE_FIXTURE(SessionFixture, "default policy (TF): a summary writer whose event file fails EIO ends the run with that error") {
  FaultyEnv env(Env::Default(), 1);
  REQUIRE(env.AddFault(EventFileEio(6)).ok());
  auto sess = Open(Opts({}, 40, false, &env));
  Steps(*sess, 40).IgnoreError();
  const Status s = sess->close();
  CHECK(absl::IsInternal(s));
  CHECK_MESSAGE(absl::StrContains(s.message(), "Input/output error (injected fault eio)"), s.ToString());
  CHECK(InjectedFaultId(s) == std::optional<std::string>("eio"));
  CHECK(sess->service_restarts().empty());
  CHECK(EventFiles(dir.path()).size() == 1);
}

TEST_CASE_FIXTURE(SessionFixture, "default policy (TF): a killed service actor ends the run, naming the injected actor fault") {
  auto hook = KillAt("summary_writer", 3);
  auto sess = Open(Opts({hook}, 40));
  Steps(*sess, 40).IgnoreError();
  const Status s = sess->close();
  CHECK(absl::IsInternal(s));
  // The coordinator's report, or the summary hook's end() finding the
  // writer gone, whichever the run meets first: both name the fault.
  CHECK_MESSAGE(absl::StrContains(s.message(), "injected actor fault kill-summary_writer"), s.ToString());
  // The exit reason's payload crossed the actors (exit reason, report).
  CHECK(InjectedFaultId(s) == std::optional<std::string>("kill-summary_writer"));
  CHECK(sess->service_restarts().empty());
  const auto fired = hook->fired();
  REQUIRE(fired.size() == 1);
  CHECK(fired[0].path == "actor:summary_writer");
  CHECK(fired[0].op == EnvOp::kAny);
  CHECK(fired[0].op_index == 3);
}

// -- the summary writer example ----------------------------------------------------------

TEST_CASE_FIXTURE(SessionFixture, "permanent summary_writer: after EIO it restarts onto a new event file and training continues; "
          "the lost events are reported") {
  testing::CapturedLog log;
  FaultyEnv env(Env::Default(), 1);
  // The first event file (named for the ManualClock's first second) fails
  // from its 6th append on; the restarted writer's next file is fine.
  EnvFault broken = EventFileEio(6, /*repeat=*/true);
  broken.path_pattern = "*events.out.tfevents.1700000000.*";
  REQUIRE(env.AddFault(broken).ok());
  auto o = Opts({}, 30, false, &env);
  o.runtime.restart.services["summary_writer"] = RestartType::kPermanent;
  o.runtime.restart.max_restarts = 3;
  o.runtime.restart.period = absl::Seconds(60);
  auto sess = Open(o);
  CHECK(Steps(*sess, 30).ok());
  REQUIRE(HasRestarts(*sess, 1));
  CHECK(sess->close().ok());
  CHECK(!env.fired().empty());

  const auto restarts = sess->service_restarts();
  REQUIRE(restarts.size() == 1);
  const ServiceRestart& r = restarts[0];
  CHECK(r.service == absl::StrCat("summary_writer(", dir.path(), ")"));
  CHECK(r.restarted);
  CHECK_FALSE(r.by_strategy);
  CHECK(absl::IsInternal(r.reason));
  CHECK(absl::StrContains(r.reason.message(), "Input/output error (injected fault eio)"));
  CHECK(r.events_lost > 0);
  CHECK(r.events_lost == static_cast<int64_t>(r.steps_lost.size()));

  // A new file in the same logdir; every step's summary is in a file or
  // reported lost, never both.
  const auto files = EventFiles(dir.path());
  REQUIRE(files.size() == 2);
  std::multiset<int64_t> seen;
  for (int64_t step : testing::SummarySteps(testing::Events(dir.path()), "loss")) seen.insert(step);
  for (int64_t step : r.steps_lost) {
    if (step < 0) continue;  // a SessionLog without a step
    CHECK_MESSAGE(seen.count(step) == 0, "step ", step, " both written and reported lost");
    seen.insert(step);
  }
  // (SummarySaverHook writes at global_step 1..30.)
  for (int64_t step = 1; step <= 30; ++step) CHECK_MESSAGE(seen.count(step) == 1, "step ", step);
  const std::string text = log.text();
  CHECK_MESSAGE(absl::StrContains(text, absl::StrCat(r.events_lost, " queued event(s) lost, at step(s) [")), text);
  CHECK(absl::StrContains(text, "restarted (permanent restart 1"));
}

TEST_CASE_FIXTURE(SessionFixture, "intensity exceeded: a summary writer failing on every write escalates; the run fails with its last error") {
  FaultyEnv env(Env::Default(), 1);
  // From the first event on, every append fails, the new files' too.
  REQUIRE(env.AddFault(EventFileEio(2, /*repeat=*/true)).ok());
  auto o = Opts({}, 1000000, false, &env);
  o.runtime.restart = Restarting(RestartType::kPermanent, 2);
  auto sess = Open(o);
  // Trains until the escalation stops the run (bounded).
  Status last;
  CHECK(Eventually([&] {
    if (!sess->should_stop()) last = sess->run({"train_op"}).status();
    return sess->should_stop();
  }));
  const Status s = sess->close();
  CHECK(absl::IsInternal(s));
  CHECK_MESSAGE(absl::StrContains(s.message(), "Input/output error (injected fault eio)"), s.ToString());
  CHECK(sess->service_restarts().size() == 2);  // the third failure escalates
  (void)last;
}

TEST_CASE_FIXTURE(SessionFixture, "intensity is counted within the period on the session's Clock") {
  ActorFault a;
  a.service = "summary_writer";
  a.kind = ActorFault::Kind::kKill;
  FaultInjectionHook::Options fo;
  for (int64_t step : {2, 6}) {
    a.id = absl::StrCat("kill-", step);
    a.at_step = step;
    fo.actors.push_back(a);
  }
  auto hook = FaultInjectionHook::Create(fo);
  REQUIRE(hook.ok());
  auto o = Opts({*hook}, 10);
  o.runtime.restart = Restarting(RestartType::kPermanent, 1);
  o.runtime.restart.period = absl::Seconds(10);
  auto sess = Open(o);
  CHECK(Steps(*sess, 4).ok());
  REQUIRE(HasRestarts(*sess, 1));
  clock.Advance(absl::Seconds(11));  // the first restart leaves the period
  CHECK(Steps(*sess, 10).ok());
  REQUIRE(HasRestarts(*sess, 2));
  CHECK(sess->close().ok());
  CHECK(sess->service_restarts().size() == 2);
}

// -- restart types (OTP) -----------------------------------------------------------------

TEST_CASE_FIXTURE(SessionFixture, "permanent: restarted after a normal exit too") {
  auto o = Opts({KillAt("summary_writer", 3, /*normal=*/true)}, 8);
  o.runtime.restart = Restarting(RestartType::kPermanent);
  const auto r = TrainThroughRestart(o, 5, 1, 8);
  REQUIRE(r.size() == 1);
  CHECK(r[0].restarted);
  CHECK(r[0].reason.ok());  // a normal exit
  CHECK(EventFiles(dir.path()).size() == 2);
  // The steps after the restart reach the new file.
  const auto steps = testing::SummarySteps(testing::Events(dir.path()), "loss");
  CHECK(std::count(steps.begin(), steps.end(), 7) == 1);
}

TEST_CASE_FIXTURE(SessionFixture, "transient: restarted after an abnormal exit") {
  auto o = Opts({KillAt("summary_writer", 3)}, 8);
  o.runtime.restart = Restarting(RestartType::kTransient);
  const auto r = TrainThroughRestart(o, 5, 1, 8);
  REQUIRE(r.size() == 1);
  CHECK(r[0].restarted);
  CHECK(r[0].reason.message() == "injected actor fault kill-summary_writer");
  CHECK(InjectedFaultId(r[0].reason) == std::optional<std::string>("kill-summary_writer"));
}

TEST_CASE_FIXTURE(SessionFixture, "transient: a normal exit removes it; the run goes on without it and ends OK") {
  auto o = Opts({KillAt("summary_writer", 3, /*normal=*/true)}, 8);
  o.runtime.restart = Restarting(RestartType::kTransient);
  const auto r = TrainThroughRestart(o, 5, 1, 8);
  REQUIRE(r.size() == 1);
  CHECK_FALSE(r[0].restarted);
  CHECK(r[0].reason.ok());
  CHECK(EventFiles(dir.path()).size() == 1);
  const auto steps = testing::SummarySteps(testing::Events(dir.path()), "loss");
  CHECK(std::count(steps.begin(), steps.end(), 7) == 0);  // nobody wrote it
}

TEST_CASE_FIXTURE(SessionFixture, "temporary: never restarted, even after an abnormal exit; the run ends OK") {
  auto o = Opts({KillAt("summary_writer", 3)}, 8);
  o.runtime.restart = Restarting(RestartType::kPermanent);
  o.runtime.restart.services["summary_writer"] = RestartType::kTemporary;
  const auto r = TrainThroughRestart(o, 5, 1, 8);
  REQUIRE(r.size() == 1);
  CHECK_FALSE(r[0].restarted);
  CHECK(r[0].reason.message() == "injected actor fault kill-summary_writer");
  CHECK(EventFiles(dir.path()).size() == 1);
}

TEST_CASE_FIXTURE(SessionFixture,
                  "permanent checkpoint_saver: killed, restarted with the same directory lock; later saves land") {
  auto hook = ActorHook({Fault("kill-saver", "checkpoint_saver", ActorFault::Kind::kKill, 2)});
  auto o = Opts({hook}, 8);
  o.save_checkpoint_steps = int64_t{4};
  o.runtime.restart = Restarting(RestartType::kPermanent);
  // The kill fires at the run of global_step 2 (of the first 3). A save
  // requested while the saver is down would fail: wait for the restart.
  const auto r = TrainThroughRestart(o, 3, 1, 8);
  REQUIRE(r.size() == 1);
  CHECK(r[0].service == absl::StrCat("checkpoint_saver(", dir.path(), ")"));
  CHECK(r[0].events_lost == -1);  // not a summary writer
  const auto checkpoints = testing::Checkpoints(dir.path());
  CHECK(std::find(checkpoints.begin(), checkpoints.end(), "model.ckpt-4") != checkpoints.end());
  CHECK(checkpoints.back() == "model.ckpt-8");
}

// EIO on the first append to the data file of the checkpoint of `step`
// (every one of them with `repeat`, then `step` < 0: any checkpoint's).
EnvFault CheckpointDataEio(int64_t step, bool repeat = false) {
  EnvFault f;
  f.id = "ckpt-eio";
  f.path_pattern = step < 0 ? "*.data-*" : absl::StrCat("*model.ckpt-", step, ".data-*");
  f.op = EnvOp::kAppend;
  f.kind = EnvFault::Kind::kError;
  f.error = EIO;
  f.nth = 1;
  f.repeat = repeat;
  return f;
}

TEST_CASE("default policy (TF): a checkpoint_saver's own save error (EIO) ends the run with it") {
  TempDir dir;
  ManualClock clock;
  FaultyEnv env(Env::Default(), 1);
  REQUIRE(env.AddFault(CheckpointDataEio(4)).ok());
  auto o = Options(dir.path(), &env, &clock, {}, 12);
  o.save_checkpoint_steps = int64_t{4};
  auto sess = Open(o);
  Status last;
  for (int i = 0; i < 12 && !sess->should_stop() && last.ok(); ++i) last = sess->run({"train_op"}).status();
  const Status closed = sess->close();
  CHECK_FALSE(closed.ok());
  CHECK_MESSAGE(absl::StrContains(closed.message(), "saving the checkpoint of step 4"), closed.ToString());
  CHECK(sess->service_restarts().empty());
  CHECK(testing::Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0"});
}

TEST_CASE("permanent checkpoint_saver: its own save error (EIO) ends that incarnation; the save is lost with a "
          "WARNING naming its step, the saver restarts, the next saves land, the run ends OK") {
  TempDir dir;
  ManualClock clock;
  testing::CapturedLog log;
  FaultyEnv env(Env::Default(), 1);
  REQUIRE(env.AddFault(CheckpointDataEio(4)).ok());
  auto o = Options(dir.path(), &env, &clock, {}, 12);
  o.save_checkpoint_steps = int64_t{4};
  o.runtime.restart.services["checkpoint_saver"] = RestartType::kPermanent;
  o.runtime.restart.max_restarts = 3;
  o.runtime.restart.period = absl::Seconds(60);
  auto sess = Open(o);
  CHECK(Steps(*sess, 12).ok());
  CHECK(sess->close().ok());
  CHECK(env.fired().size() == 1);
  const auto r = sess->service_restarts();
  REQUIRE(r.size() == 1);
  CHECK(r[0].service == absl::StrCat("checkpoint_saver(", dir.path(), ")"));
  CHECK(r[0].restarted);
  CHECK_MESSAGE(absl::StrContains(r[0].reason.message(), "saving the checkpoint of step 4"), r[0].reason.ToString());
  CHECK(absl::StrContains(r[0].reason.message(), "Input/output error (injected fault ckpt-eio)"));
  CHECK(r[0].saves_lost == std::vector<int64_t>{4});
  CHECK(r[0].events_lost == -1);
  // Only verified checkpoints are listed; the one lost is not, the next ones are.
  CHECK(testing::Checkpoints(dir.path()) ==
        std::vector<std::string>{"model.ckpt-0", "model.ckpt-8", "model.ckpt-12"});
  const std::string text = log.text();
  CHECK_MESSAGE(absl::StrContains(text, "The checkpoint of step 4 was lost"), text);
  CHECK(absl::StrContains(text, "the checkpoint save(s) of step(s) [4] lost"));
}

TEST_CASE("permanent checkpoint_saver: a lost final checkpoint is saved again at end() on the restarted saver") {
  TempDir dir;
  ManualClock clock;
  testing::CapturedLog log;
  FaultyEnv env(Env::Default(), 1);
  REQUIRE(env.AddFault(CheckpointDataEio(12)).ok());
  auto o = Options(dir.path(), &env, &clock, {}, 12);
  o.save_checkpoint_steps = int64_t{4};
  o.runtime.restart = Restarting(RestartType::kPermanent);
  auto sess = Open(o);
  CHECK(Steps(*sess, 12).ok());
  CHECK(sess->close().ok());
  CHECK(env.fired().size() == 1);
  const auto r = sess->service_restarts();
  REQUIRE(r.size() == 1);
  CHECK(r[0].saves_lost == std::vector<int64_t>{12});
  const auto checkpoints = testing::Checkpoints(dir.path());
  REQUIRE_FALSE(checkpoints.empty());
  CHECK(checkpoints.back() == "model.ckpt-12");
  CHECK_MESSAGE(absl::StrContains(log.text(), "Saving the final checkpoint of step 12 again"), log.text());
}

TEST_CASE("permanent checkpoint_saver: save errors beyond the restart intensity escalate; the run fails with the "
          "save's error") {
  TempDir dir;
  ManualClock clock;
  FaultyEnv env(Env::Default(), 1);
  REQUIRE(env.AddFault(CheckpointDataEio(-1, /*repeat=*/true)).ok());
  auto o = Options(dir.path(), &env, &clock, {}, 20);
  o.save_checkpoint_steps = int64_t{4};
  o.runtime.restart = Restarting(RestartType::kPermanent, /*max_restarts=*/1);
  auto sess = Open(o);
  Status last;
  for (int i = 0; i < 20 && !sess->should_stop() && last.ok(); ++i) last = sess->run({"train_op"}).status();
  const Status closed = sess->close();
  CHECK_FALSE(closed.ok());
  CHECK_MESSAGE(absl::StrContains(closed.message(), "saving the checkpoint of step"), closed.ToString());
  CHECK(absl::StrContains(closed.message(), "Input/output error"));
  const auto r = sess->service_restarts();
  REQUIRE(r.size() == 1);  // the first failure restarted it, the second escalated
  CHECK(r[0].saves_lost == std::vector<int64_t>{0});
  CHECK(testing::Checkpoints(dir.path()).empty());
}

// A Supervisor on `env` under a permanent restart policy, summaries off, and
// its prepared session (which must outlive the Supervisor's services: the
// members are destroyed Supervisor first).
struct PreparedSupervisor {
  std::unique_ptr<Session> session;
  std::unique_ptr<Supervisor> sv;
  Supervisor* operator->() const { return sv.get(); }
};
PreparedSupervisor PermanentSupervisor(const std::string& logdir, ManualClock* clock, Env* env,
                                       std::optional<double> save_model_secs) {
  SupervisorOptions so;
  so.graph = MakeGraph(std::make_shared<Model>());
  so.logdir = logdir;
  so.save_model_secs = save_model_secs;
  so.save_summaries_secs = std::nullopt;
  so.config.clock = clock;
  so.config.env = env;
  so.runtime.restart = Restarting(RestartType::kPermanent);
  auto sv = Supervisor::Create(so);
  REQUIRE_MESSAGE(sv.ok(), sv.status().ToString());
  auto session = (*sv)->prepare_or_wait_for_session();
  REQUIRE_MESSAGE(session.ok(), session.status().ToString());
  return PreparedSupervisor{*std::move(session), *std::move(sv)};
}

TEST_CASE_FIXTURE(SessionFixture, "Supervisor takes the policy too: its summary writer is restarted after EIO") {
  FaultyEnv env(Env::Default(), 1);
  REQUIRE(env.AddFault(EventFileEio(2)).ok());  // the first event (START) fails
  auto sv = PermanentSupervisor(dir.path(), &clock, &env, /*save_model_secs=*/std::nullopt);
  REQUIRE(Eventually([&] { return !sv->service_restarts().empty(); }));
  CHECK(sv->stop().ok());
  const auto r = sv->service_restarts();
  REQUIRE(r.size() == 1);
  CHECK(r[0].restarted);
  CHECK(absl::StrContains(r[0].reason.message(), "Input/output error (injected fault eio)"));
  CHECK(EventFiles(dir.path()).size() == 2);
}

TEST_CASE("Supervisor: under a permanent policy its checkpoint thread's failed save is lost with a WARNING; the "
          "saver restarts and the next save lands") {
  TempDir dir;
  ManualClock clock;
  testing::CapturedLog log;
  FaultyEnv env(Env::Default(), 1);
  REQUIRE(env.AddFault(CheckpointDataEio(-1)).ok());  // the first save's data file
  auto sv = PermanentSupervisor(dir.path(), &clock, &env, /*save_model_secs=*/10.0);
  // The checkpoint thread saves at once (TF's LooperThread), and that save fails.
  REQUIRE(Eventually([&] { return !sv->service_restarts().empty(); }));
  REQUIRE(Eventually([&] { return absl::StrContains(log.text(), "The checkpoint of step 0 was lost"); }));
  // Its next firing saves on the restarted saver.
  REQUIRE(clock.BlockUntilWaiters(1, testing::kRealTimeout));
  clock.Advance(absl::Seconds(10));
  REQUIRE(Eventually([&] {
    auto prefixes = ListCheckpointPrefixes(Env::Default(), dir.path());
    return prefixes.ok() && !prefixes->empty();
  }));
  CHECK(sv->stop().ok());
  const auto r = sv->service_restarts();
  REQUIRE(r.size() == 1);
  CHECK(r[0].restarted);
  CHECK(r[0].saves_lost == std::vector<int64_t>{0});
  CHECK(testing::Checkpoints(dir.path()) == std::vector<std::string>{"model.ckpt-0"});
}

// -- strategies ------------------------------------------------------------------------
// Services in start order: summary_writer(<dir>), then step_counter(<dir>).

std::vector<std::pair<std::string, bool>> Restarted(const std::vector<ServiceRestart>& records) {
  std::vector<std::pair<std::string, bool>> out;
  for (const ServiceRestart& r : records) {
    out.emplace_back(r.service.substr(0, r.service.find('(')), r.by_strategy);
  }
  return out;
}

void RunStrategy(RestartStrategy strategy, const std::string& victim, std::size_t expected_records,
                 std::vector<std::pair<std::string, bool>>* restarted) {
  SessionFixture f;
  auto o = f.Opts({KillAt(victim, 3)}, 8, /*step_counter=*/true);
  o.runtime.restart = Restarting(RestartType::kPermanent);
  o.runtime.restart.strategy = strategy;
  *restarted = Restarted(f.TrainThroughRestart(o, 5, expected_records, 8));
}

TEST_CASE("one_for_one: only the service that exited is restarted") {
  std::vector<std::pair<std::string, bool>> r;
  RunStrategy(RestartStrategy::kOneForOne, "summary_writer", 1, &r);
  CHECK(r == std::vector<std::pair<std::string, bool>>{{"summary_writer", false}});
}

TEST_CASE("one_for_all: a step_counter's exit restarts every service, in start order") {
  std::vector<std::pair<std::string, bool>> r;
  RunStrategy(RestartStrategy::kOneForAll, "step_counter", 2, &r);
  CHECK(r == std::vector<std::pair<std::string, bool>>{{"summary_writer", true}, {"step_counter", false}});
}

TEST_CASE("one_for_all: a temporary sibling is stopped with the group and removed, never restarted (OTP)") {
  SessionFixture f;
  auto o = f.Opts({KillAt("step_counter", 3)}, 8, /*step_counter=*/true);
  o.runtime.restart = Restarting(RestartType::kPermanent);
  o.runtime.restart.strategy = RestartStrategy::kOneForAll;
  o.runtime.restart.services["summary_writer"] = RestartType::kTemporary;
  const std::vector<ServiceRestart> records = f.TrainThroughRestart(o, 5, 2, 8);
  REQUIRE(records.size() == 2);
  const ServiceRestart* writer = nullptr;
  const ServiceRestart* counter = nullptr;
  for (const ServiceRestart& r : records) (absl::StartsWith(r.service, "summary_writer") ? writer : counter) = &r;
  REQUIRE(writer != nullptr);
  REQUIRE(counter != nullptr);
  CHECK_FALSE(writer->restarted);
  CHECK(writer->by_strategy);
  CHECK(absl::IsCancelled(writer->reason));
  CHECK_MESSAGE(absl::StrContains(writer->reason.message(), "stopped by the restart strategy (one_for_all) when step_counter("),
                writer->reason.ToString());
  CHECK(absl::StartsWith(counter->service, "step_counter"));
  CHECK(counter->restarted);
  CHECK_FALSE(counter->by_strategy);
}

TEST_CASE("rest_for_one: the summary writer's exit restarts it and the step counter started after it") {
  std::vector<std::pair<std::string, bool>> r;
  RunStrategy(RestartStrategy::kRestForOne, "summary_writer", 2, &r);
  CHECK(r == std::vector<std::pair<std::string, bool>>{{"summary_writer", false}, {"step_counter", true}});
}

TEST_CASE("rest_for_one: the step counter's exit restarts only it (nothing started after it)") {
  std::vector<std::pair<std::string, bool>> r;
  RunStrategy(RestartStrategy::kRestForOne, "step_counter", 1, &r);
  CHECK(r == std::vector<std::pair<std::string, bool>>{{"step_counter", false}});
}

// -- the policy itself --------------------------------------------------------------------

TEST_CASE("ValidateRestartPolicy: the default is TF's and valid; bad fields are INVALID_ARGUMENT naming them") {
  RestartPolicy p;
  CHECK(p.IsTensorFlowDefault());
  CHECK(ValidateRestartPolicy(p).ok());
  struct Case {
    std::function<void(RestartPolicy&)> edit;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {[](RestartPolicy& q) { q.services["input"] = RestartType::kPermanent; }, "unknown service \"input\""},
      {[](RestartPolicy& q) { q.max_restarts = -1; }, "max_restarts must be >= 0, got -1"},
      {[](RestartPolicy& q) {
         q.max_restarts = 1;
         q.period = absl::ZeroDuration();
       },
       "period must be > 0"},
      {[](RestartPolicy& q) { q.initial_backoff = absl::Seconds(2); }, "initial_backoff 2s exceeds max_backoff 1s"},
      {[](RestartPolicy& q) { q.max_backoff = absl::Seconds(61); }, "max_backoff must be <= 1m"},
      {[](RestartPolicy& q) { q.initial_backoff = -absl::Seconds(1); }, "back-off must be >= 0"},
      {[](RestartPolicy& q) { q.strategy = static_cast<RestartStrategy>(7); }, "strategy out of range: 7"},
  };
  for (const Case& c : cases) {
    RestartPolicy q;
    c.edit(q);
    const Status s = ValidateRestartPolicy(q);
    CHECK(absl::IsInvalidArgument(s));
    CHECK_MESSAGE(absl::StrContains(s.message(), c.expected), s.ToString());
  }
}

TEST_CASE_FIXTURE(SessionFixture, "a session with an invalid restart policy is not created") {
  auto o = Opts({}, 3);
  o.runtime.restart.max_restarts = -2;
  auto sess = MonitoredTrainingSession(std::move(o));
  CHECK(absl::IsInvalidArgument(sess.status()));
}

TEST_CASE("RestartBackoff doubles to max_backoff with a seeded jitter in [0.5, 1.5)") {
  RestartPolicy p;
  p.initial_backoff = absl::Milliseconds(100);
  p.max_backoff = absl::Milliseconds(350);
  const std::string svc = "summary_writer(/logs)";
  const absl::Duration bases[] = {absl::Milliseconds(100), absl::Milliseconds(200), absl::Milliseconds(350),
                                  absl::Milliseconds(350)};
  for (int k = 1; k <= 4; ++k) {
    const absl::Duration b = RestartBackoff(p, svc, k);
    CHECK(b >= bases[k - 1] * 0.5);
    CHECK(b < bases[k - 1] * 1.5);
    CHECK(b == RestartBackoff(p, svc, k));  // a pure function
  }
  RestartPolicy other = p;
  other.seed = 99;
  bool differs = false;
  for (int k = 1; k <= 4; ++k) differs = differs || RestartBackoff(other, svc, k) != RestartBackoff(p, svc, k);
  CHECK(differs);
  p.initial_backoff = absl::ZeroDuration();
  CHECK(RestartBackoff(p, svc, 3) == absl::ZeroDuration());
}

TEST_CASE_FIXTURE(SessionFixture, "a restart waits its back-off: the record carries RestartBackoff's value") {
  auto o = Opts({KillAt("summary_writer", 2)}, 6);
  o.runtime.restart = Restarting(RestartType::kPermanent);
  o.runtime.restart.initial_backoff = absl::Milliseconds(20);
  o.runtime.restart.max_backoff = absl::Milliseconds(20);
  o.runtime.restart.seed = 5;
  const auto r = TrainThroughRestart(o, 4, 1, 6);
  REQUIRE(r.size() == 1);
  CHECK(r[0].backoff == RestartBackoff(o.runtime.restart, r[0].service, 1));
  CHECK(r[0].backoff >= absl::Milliseconds(10));
}

// -- actor faults (fault.hpp: ActorFault) -------------------------------------------------

TEST_CASE_FIXTURE(SessionFixture, "kill checkpoint_saver (TF default): the run fails INTERNAL naming the fault; fired as actor:checkpoint_saver") {
  auto hook = ActorHook({Fault("kill-saver", "checkpoint_saver", ActorFault::Kind::kKill, 3)});
  auto o = Opts({hook}, 40);
  o.save_checkpoint_steps = int64_t{2};
  auto sess = Open(o);
  Steps(*sess, 40).IgnoreError();
  const Status s = sess->close();
  CHECK(absl::IsInternal(s));
  CHECK_MESSAGE(absl::StrContains(s.message(), "injected actor fault kill-saver"), s.ToString());
  CHECK(InjectedFaultId(s) == std::optional<std::string>("kill-saver"));
  const auto fired = hook->fired();
  REQUIRE(fired.size() == 1);
  CHECK(fired[0].path == "actor:checkpoint_saver");
  CHECK(fired[0].op_index == 3);
}

TEST_CASE_FIXTURE(SessionFixture, "kill step_counter (TF default): the run fails INTERNAL naming the fault") {
  auto hook = ActorHook({Fault("kill-counter", "step_counter", ActorFault::Kind::kKill, 2)});
  auto sess = Open(Opts({hook}, 40, /*step_counter=*/true));
  Steps(*sess, 40).IgnoreError();
  const Status s = sess->close();
  CHECK(absl::IsInternal(s));
  CHECK_MESSAGE(absl::StrContains(s.message(), "injected actor fault kill-counter"), s.ToString());
  CHECK(InjectedFaultId(s) == std::optional<std::string>("kill-counter"));
}

// The kill waits (ServiceFaults::Kill's Completions) until the supervisor
// has decided, so what it did is visible as soon as the run of the kill's
// step returns: no poll (but for a restart after a back-off: scheduled
// then, made later).
TEST_CASE_FIXTURE(SessionFixture, "a kill's run returns once the policy is applied: the run stopped (TF), the "
                                  "restart scheduled after its back-off or the removal recorded") {
  SUBCASE("TF's default: the run's error is set, so it stops after the kill's step") {
    auto sess = Open(Opts({KillAt("summary_writer", 3)}, 40));
    for (int i = 0; i < 3; ++i) REQUIRE(sess->run({"train_op"}).ok());
    CHECK_FALSE(sess->should_stop());
    sess->run({"train_op"}).IgnoreError();  // global_step 3: the kill
    CHECK(sess->should_stop());
    const Status s = sess->close();
    CHECK(InjectedFaultId(s) == std::optional<std::string>("kill-summary_writer"));
  }
  SUBCASE("permanent with a back-off: restarted and recorded") {
    auto o = Opts({KillAt("summary_writer", 3)}, 40);
    o.runtime.restart = Restarting(RestartType::kPermanent);
    o.runtime.restart.initial_backoff = absl::Milliseconds(20);
    o.runtime.restart.max_backoff = absl::Milliseconds(20);
    auto sess = Open(o);
    CHECK(Steps(*sess, 4).ok());  // global_steps 0-3
    // Scheduled when the kill's run returned; made after the back-off.
    REQUIRE(HasRestarts(*sess, 1));
    const auto r = sess->service_restarts();
    REQUIRE(r.size() == 1);
    CHECK(r[0].restarted);
    CHECK(r[0].backoff > absl::ZeroDuration());
    CHECK(sess->close().ok());
  }
  SUBCASE("temporary: removed and recorded") {
    auto o = Opts({KillAt("summary_writer", 3)}, 40);
    o.runtime.restart = Restarting(RestartType::kTemporary);
    auto sess = Open(o);
    CHECK(Steps(*sess, 4).ok());
    const auto r = sess->service_restarts();
    REQUIRE(r.size() == 1);
    CHECK_FALSE(r[0].restarted);
    CHECK(sess->close().ok());
  }
}

// Services whose kills the supervisor never answers (ServiceFaults::Kill's
// Completions stay open): only what a FaultInjectionHook uses.
class UnansweredKills : public testing::FakeServices, public internal::ServiceFaults {
 public:
  explicit UnansweredKills(Clock* clock) : FakeServices(Env::Default(), clock) {}
  internal::ServiceFaults* service_faults() override { return this; }
  int Kill(const std::string& service, const std::string& fault_id, bool,
           std::vector<std::shared_ptr<internal::Completion>>* applied) override {
    kills.push_back(absl::StrCat(service, " ", fault_id));
    applied->push_back(never_);
    return 1;
  }
  int DelayOrDrop(const std::string&, const std::string&, bool, int64_t, absl::Duration) override { return 0; }

  std::vector<std::string> kills;

 private:
  std::shared_ptr<internal::Completion> never_ = std::make_shared<internal::Completion>();
};

TEST_CASE("a kill the supervisor never answers: before_run goes on after 5 s (real time) with a WARNING") {
  testing::CapturedLog log;
  ManualClock clock;
  UnansweredKills services(&clock);
  auto hook = KillAt("summary_writer", 0);
  hook->AttachServices(&services);
  auto session = Session::Create(MakeGraph(std::make_shared<Model>()));
  REQUIRE(session.ok());
  const std::shared_ptr<Graph>& graph = (*session)->graph();
  REQUIRE((*session)
              ->WithVariables([&graph](VariableStore& vars) -> Status {
                for (const VariableDef& def : graph->variables()) {
                  FOREMAN_ASSIGN_OR_RETURN(Tensor value, def.initializer());
                  FOREMAN_RETURN_IF_ERROR(vars.Create(def.name, std::move(value), def.trainable));
                }
                return absl::OkStatus();
              })
              .ok());
  SessionRunArgs original;
  SessionRunContext ctx(&original, session->get());
  const absl::Time start = absl::Now();
  CHECK(hook->before_run(ctx).ok());  // the run goes on
  CHECK(absl::Now() - start >= absl::Seconds(5));
  CHECK(services.kills == std::vector<std::string>{"summary_writer kill-summary_writer"});
  CHECK_MESSAGE(absl::StrContains(log.text(), "injected fault kill-summary_writer: the supervisor did not apply the "
                                              "policy to the kill of summary_writer within 5s; the run goes on"),
                log.text());
}

TEST_CASE_FIXTURE(SessionFixture, "kill at_time: fires at the first run once that much Clock time has passed") {
  ActorFault f = Fault("later", "summary_writer", ActorFault::Kind::kKill, -1);
  f.at_time = absl::Seconds(10);
  auto hook = ActorHook({f});
  auto o = Opts({hook}, 40);
  o.runtime.restart = Restarting(RestartType::kPermanent);
  auto sess = Open(o);
  CHECK(Steps(*sess, 3).ok());
  CHECK(hook->fired().empty());
  clock.Advance(absl::Seconds(10));
  CHECK(Steps(*sess, 1).ok());
  const auto fired = hook->fired();
  REQUIRE(fired.size() == 1);
  CHECK(fired[0].op_index == 3);  // the run that started at global_step 3
  REQUIRE(HasRestarts(*sess, 1));
  CHECK(sess->close().ok());
}

TEST_CASE_FIXTURE(SessionFixture, "an actor fault marked fired by an earlier process does not fire again") {
  auto hook = ActorHook({Fault("kill-once", "summary_writer", ActorFault::Kind::kKill, 2)});
  hook->MarkFired({FiredFault{"kill-once", "actor:summary_writer", EnvOp::kAny, 2}});
  auto sess = Open(Opts({hook}, 6));
  CHECK(Steps(*sess, 6).ok());
  CHECK(sess->close().ok());
  CHECK(hook->fired().empty());
}

TEST_CASE_FIXTURE(SessionFixture, "delay summary_writer: its next batch waits the delay on the session's Clock, then is written") {
  ActorFault f = Fault("slow", "summary_writer", ActorFault::Kind::kDelay, 2);
  f.delay = absl::Seconds(5);
  auto hook = ActorHook({f});
  auto sess = Open(Opts({hook}, 6));
  CHECK(Steps(*sess, 6).ok());
  // The writer sleeps in the ManualClock until the test moves it on.
  REQUIRE(clock.BlockUntilWaiters(1, testing::kRealTimeout));
  clock.Advance(absl::Seconds(5));
  CHECK(sess->close().ok());
  const auto steps = testing::SummarySteps(testing::Events(dir.path()), "loss");
  CHECK(steps == std::vector<int64_t>{1, 2, 3, 4, 5, 6});  // nothing lost, in order
}

TEST_CASE_FIXTURE(SessionFixture, "drop summary_writer: its next batch of events is dropped with a WARNING; the run goes on") {
  testing::CapturedLog log;
  auto hook = ActorHook({Fault("drop", "summary_writer", ActorFault::Kind::kDrop, 2)});
  auto sess = Open(Opts({hook}, 6));
  CHECK(Steps(*sess, 6).ok());
  CHECK(sess->close().ok());
  const auto steps = testing::SummarySteps(testing::Events(dir.path()), "loss");
  CHECK(steps.size() < 6);
  CHECK_MESSAGE(absl::StrContains(log.text(), "event(s) dropped (injected actor fault drop)"), log.text());
}

TEST_CASE_FIXTURE(SessionFixture, "drop checkpoint_saver: the dropped save's ticket fails DEADLINE_EXCEEDED and the run ends with it") {
  auto hook = ActorHook({Fault("drop-save", "checkpoint_saver", ActorFault::Kind::kDrop, 1)});
  auto o = Opts({hook}, 40);
  o.save_checkpoint_steps = int64_t{2};
  auto sess = Open(o);
  Steps(*sess, 40).IgnoreError();
  const Status s = sess->close();
  CHECK(absl::IsDeadlineExceeded(s));  // what the hook's wait for a lost save would end with; no recovery
  CHECK(sess->recoveries() == 0);
  CHECK_MESSAGE(absl::StrContains(s.message(), "was dropped (injected actor fault drop-save)"), s.ToString());
  CHECK(InjectedFaultId(s) == std::optional<std::string>("drop-save"));
}

TEST_CASE("FaultInjectionHook::Create rejects bad actor faults naming the fault and field") {
  struct Case {
    std::function<void(ActorFault&)> edit;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {[](ActorFault& f) { f.service = "ps"; }, "service must be summary_writer, checkpoint_saver, step_counter or input_pipeline"},
      {[](ActorFault& f) { f.at_time = absl::Seconds(1); }, "exactly one of at_step (>= 0) and at_time (>= 0)"},
      {[](ActorFault& f) { f.at_step = -1; }, "exactly one of at_step (>= 0) and at_time (>= 0)"},
      {[](ActorFault& f) { f.count = 0; }, "count must be >= 1, got 0"},
      {[](ActorFault& f) { f.delay = -absl::Seconds(1); }, "delay must be >= 0"},
      {[](ActorFault& f) { f.id = ""; }, "empty id"},
      {[](ActorFault& f) { f.id = "a\x1b"; }, "actors[0]: id \"a\\033\" has a control character (0x1b) at byte 1"},
  };
  for (const Case& c : cases) {
    ActorFault f = Fault("a", "summary_writer", ActorFault::Kind::kKill, 3);
    c.edit(f);
    FaultInjectionHook::Options o;
    o.actors = {f};
    auto hook = FaultInjectionHook::Create(o);
    REQUIRE_FALSE(hook.ok());
    CHECK(absl::IsInvalidArgument(hook.status()));
    CHECK_MESSAGE(absl::StrContains(hook.status().message(), c.expected), hook.status().ToString());
  }
}

// -- the text form (ParseRestartPolicy, RestartPolicyText) ---------------------------

TEST_CASE("ParseRestartPolicy: every part sets its field; unset fields keep TF's defaults") {
  auto p = ParseRestartPolicy(
      "rest_for_one,transient,summary_writer=permanent,checkpoint_saver=temporary,max_restarts=3,period_secs=0.5,"
      "initial_backoff_ms=10,max_backoff_ms=2000,seed=18446744073709551615");
  REQUIRE_MESSAGE(p.ok(), p.status().ToString());
  CHECK(p->strategy == RestartStrategy::kRestForOne);
  CHECK(p->type == RestartType::kTransient);
  CHECK(p->services == std::map<std::string, RestartType>{{"checkpoint_saver", RestartType::kTemporary},
                                                          {"summary_writer", RestartType::kPermanent}});
  CHECK(p->max_restarts == 3);
  CHECK(p->period == absl::Milliseconds(500));
  CHECK(p->initial_backoff == absl::Milliseconds(10));
  CHECK(p->max_backoff == absl::Seconds(2));
  CHECK(p->seed == UINT64_MAX);

  auto one = ParseRestartPolicy("max_restarts=1");
  REQUIRE(one.ok());
  const RestartPolicy defaults;
  CHECK(one->strategy == defaults.strategy);
  CHECK(one->type == defaults.type);
  CHECK(one->services.empty());
  CHECK(one->period == defaults.period);
  CHECK(one->initial_backoff == defaults.initial_backoff);
  CHECK(one->max_backoff == defaults.max_backoff);
  CHECK(one->seed == 0);
  auto tf = ParseRestartPolicy("one_for_one");
  REQUIRE(tf.ok());
  CHECK(tf->IsTensorFlowDefault());
  auto period = ParseRestartPolicy("max_restarts=1,period_secs=60");
  REQUIRE(period.ok());
  CHECK(period->period == absl::Seconds(60));
}

TEST_CASE("ParseRestartPolicy refuses a bad text with INVALID_ARGUMENT naming the part and its position") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "--restart-policy must not be empty (leave it out for TF's default)"},
      {"  ", "--restart-policy must not be empty (leave it out for TF's default)"},
      {"bogus", "--restart-policy \"bogus\": part 1 \"bogus\": expected a strategy (one_for_one, one_for_all, "
                "rest_for_one), a restart type (permanent, transient, temporary) or key=value"},
      {"one_for_one,max_restarts=x",
       "part 2 \"max_restarts=x\": max_restarts must be an integer in [0, 1000000] (decimal digits)"},
      {"max_restarts=3,max_restarts=4", "part 2 \"max_restarts=4\": max_restarts given twice"},
      {"one_for_one,one_for_all", "part 2 \"one_for_all\": a second strategy"},
      {"permanent,temporary", "part 2 \"temporary\": a second default restart type"},
      {"=3", "part 1 \"=3\": no key before '='"},
      {"writer=permanent,max_restarts=1", "part 1 \"writer=permanent\": RestartPolicy: services: unknown service \"writer\""},
      {"max_restarts=1,foo=permanent", "part 2 \"foo=permanent\": RestartPolicy: services: unknown service \"foo\""},
      {"max_restarts=1,foo=bar", "part 2 \"foo=bar\": unknown key \"foo\" (max_restarts, period_secs"},
      {"period_secs=0", "part 1 \"period_secs=0\": period_secs must be a positive decimal number of seconds"},
      {" one_for_one", "part 1 \" one_for_one\": whitespace is not allowed"},
      {"permanent,max_restarts = 3", "part 2 \"max_restarts = 3\": whitespace is not allowed"},
      {"max_restarts=+3", "part 1 \"max_restarts=+3\": max_restarts must be an integer"},
      {"max_restarts=0x10", "part 1 \"max_restarts=0x10\": max_restarts must be an integer"},
      {"max_restarts=1000001", "part 1 \"max_restarts=1000001\": max_restarts must be an integer in [0, 1000000]"},
      {"seed=-1", "part 1 \"seed=-1\": seed must be a non-negative 64-bit integer (decimal digits)"},
      {"seed=18446744073709551616", "part 1 \"seed=18446744073709551616\": seed must be a non-negative 64-bit"},
      {"period_secs=1e-300", "part 1 \"period_secs=1e-300\": period_secs must be a positive decimal"},
      {"period_secs=0.0001", "part 1 \"period_secs=0.0001\": period_secs must be a positive decimal number of "
                             "seconds, at most 1000000000, with at most 3 decimals (millisecond resolution)"},
      {"period_secs=inf", "part 1 \"period_secs=inf\": period_secs must be a positive decimal"},
      {"summary_writer=", "part 1 \"summary_writer=\": bad restart type \"\" for summary_writer (expected "
                          "permanent, transient or temporary)"},
      {"checkpoint_saver=Permanent", "part 1 \"checkpoint_saver=Permanent\": bad restart type \"Permanent\" for "
                                     "checkpoint_saver"},
      {"max_restarts=1,initial_backoff_ms=5000",
       "part 2 \"initial_backoff_ms=5000\": initial_backoff_ms (5000) must not exceed max_backoff_ms (1000, the "
       "default)"},
      {"max_backoff_ms=10,initial_backoff_ms=20",
       "part 2 \"initial_backoff_ms=20\": initial_backoff_ms (20) must not exceed max_backoff_ms (10)"},
      {"max_backoff_ms=60001", "part 1 \"max_backoff_ms=60001\": max_backoff_ms must be an integer number of "
                               "milliseconds in [0, 60000] (decimal digits)"},
      {"permanent,,max_restarts=1", "part 2 \"\": empty"},
      {"permanent,", "part 2 \"\": empty"},
      {"tab\there", "part 1 \"tab\\there\": whitespace is not allowed"},
  };
  for (const auto& [text, expected] : cases) {
    auto p = ParseRestartPolicy(text);
    REQUIRE_MESSAGE(!p.ok(), "accepted: '", text, "'");
    CHECK(absl::IsInvalidArgument(p.status()));
    CHECK_MESSAGE(absl::StrContains(p.status().message(), expected), "'", text, "': ", p.status().message());
  }
}

TEST_CASE("RestartPolicyText names every field and parses back to an equal policy") {
  RestartPolicy p;
  CHECK(RestartPolicyText(p) ==
        "one_for_one,permanent,max_restarts=0,period_secs=5,initial_backoff_ms=0,max_backoff_ms=1000,seed=0");
  p.strategy = RestartStrategy::kOneForAll;
  p.type = RestartType::kTemporary;
  p.services = {{"summary_writer", RestartType::kPermanent}, {"input_pipeline", RestartType::kTransient}};
  p.max_restarts = 7;
  p.period = absl::Milliseconds(2500);
  p.initial_backoff = absl::Milliseconds(20);
  p.max_backoff = absl::Seconds(60);
  p.seed = 42;
  const std::string text = RestartPolicyText(p);
  CHECK(text ==
        "one_for_all,temporary,input_pipeline=transient,summary_writer=permanent,max_restarts=7,period_secs=2.5,"
        "initial_backoff_ms=20,max_backoff_ms=60000,seed=42");
  auto back = ParseRestartPolicy(text);
  REQUIRE_MESSAGE(back.ok(), back.status().ToString());
  CHECK(back->strategy == p.strategy);
  CHECK(back->type == p.type);
  CHECK(back->services == p.services);
  CHECK(back->max_restarts == p.max_restarts);
  CHECK(back->period == p.period);
  CHECK(back->initial_backoff == p.initial_backoff);
  CHECK(back->max_backoff == p.max_backoff);
  CHECK(back->seed == p.seed);
  CHECK(RestartPolicyText(*back) == text);
}

}  // namespace
}  // namespace foreman
