// The actor API (design.md §4 b): a training job spawned into the test's own
// actor_system, its protocol, and the final Status as its exit reason.
#include "foreman/actor_api.hpp"

#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "foreman/checkpoint.hpp"
#include "foreman/hooks.hpp"
#include "support/test_util.hpp"
#include "foreman/monitored_session.hpp"
#include "support/call_log.hpp"
#include "support/scripted_hook.hpp"
#include "support/stop_at_step.hpp"
#include "support/training_graph.hpp"

namespace foreman {
namespace {

using testing::TempDir;
using std::chrono::seconds;

struct StatusReply {
  std::string state;
  int64_t global_step = -2;
  int64_t local_steps = -2;
  std::string error;
};

// A step that counts; fails with `fail_with` at global step `fail_at`;
// blocks at `block_at` until `release` is set (so a test can talk to the job
// while it is mid-run).
struct Model {
  std::atomic<int64_t> fail_at{-1};
  Status fail_with;
  bool fail_once = false;          // then fail_at is cleared by the failure
  std::atomic<bool> failed{false};
  std::atomic<int64_t> block_at{-1};
  std::atomic<bool> release{false};
  std::atomic<bool> blocked{false};

  std::shared_ptr<Graph> MakeGraph() {
    auto graph = std::make_shared<Graph>();
    REQUIRE(graph->CreateGlobalStep().ok());
    REQUIRE(graph->SetStep([this](StepContext& ctx) -> Status {
                    FOREMAN_ASSIGN_OR_RETURN(int64_t step, GetGlobalStep(ctx.variables()));
                    if (step == fail_at.load()) {
                      if (fail_once) fail_at = -1;
                      failed = true;
                      return fail_with;
                    }
                    if (step == block_at.load()) {
                      blocked = true;
                      for (int i = 0; i < 20000 && !release.load(); ++i) {
                        std::this_thread::sleep_for(std::chrono::milliseconds(1));
                      }
                    }
                    if (ctx.requested("train_op")) {
                      FOREMAN_RETURN_IF_ERROR(IncrementGlobalStep(ctx.variables()).status());
                      ctx.Set("train_op", Tensor::Scalar<int64_t>(1));
                    }
                    if (ctx.requested("loss")) ctx.Set("loss", Tensor::Scalar<float>(0.25f));
                    return absl::OkStatus();
                  })
                .ok());
    return graph;
  }
};

struct Fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> system;
  Fixture() {
    cfg.set("scheduler.max-threads", 2);
    ConfigureActorSystem(cfg);
    system = std::make_unique<caf::actor_system>(cfg);
  }
  ~Fixture() {
    system->await_all_actors_done();
  }
};

TrainingJob Job(Model& model, const std::string& dir, int64_t last_step) {
  TrainingJob job;
  job.options.graph = model.MakeGraph();
  job.options.checkpoint_dir = dir;
  job.options.save_checkpoint_steps = 10;
  job.options.config.intra_op_parallelism_threads = 1;
  if (last_step > 0) {
    StopAtStepHook::Options stop;
    stop.last_step = last_step;
    job.options.hooks = {StopAtStepHook::Create(stop).value()};
  }
  return job;
}

StatusReply AskStatus(caf::scoped_actor& self, const caf::actor& job) {
  StatusReply reply;
  self->request(job, seconds(10), job_status_atom::value)
      .receive(
          [&](const JobStatus& s) {
            reply = StatusReply{s.state, s.global_step, s.local_steps, s.status().ok() ? "" : s.status().ToString()};
          },
          [&](caf::error& e) { FAIL("status request failed: " << caf::to_string(e)); });
  return reply;
}

// What a subscriber received, in order, until JobFinished (or 60 s).
struct Received {
  std::vector<ProgressStep> progress;
  std::vector<CheckpointSaved> saves;
  std::vector<Recovered> recoveries;
  std::vector<JobFinished> finished;
  int after_finished = 0;  // messages after JobFinished (must be none)
};

Received Collect(caf::scoped_actor& self, std::chrono::seconds timeout = seconds(60)) {
  Received r;
  bool done = false;
  auto late = [&r] {
    if (!r.finished.empty()) ++r.after_finished;
  };
  self->receive_while([&] { return !done; })(
      [&](const ProgressStep& m) {
        late();
        r.progress.push_back(m);
      },
      [&](const CheckpointSaved& m) {
        late();
        r.saves.push_back(m);
      },
      [&](const Recovered& m) {
        late();
        r.recoveries.push_back(m);
      },
      [&](const JobFinished& m) {
        r.finished.push_back(m);
        done = true;
      },
      caf::after(timeout) >> [&] { done = true; });
  return r;
}

// Waits (bounded) until no actor runs in `system`; false on timeout.
bool AwaitNoActors(caf::actor_system& system, std::chrono::seconds timeout = seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (system.registry().running() != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

Status AwaitDown(caf::scoped_actor& self, const caf::actor& job) {
  Status outcome = absl::DeadlineExceededError("no down_msg within 60 s");
  bool done = false;
  self->receive_while([&] { return !done; })(
      [&](caf::down_msg& dm) {
        if (dm.source == job) {
          outcome = StatusFromExitReason(dm.reason);
          done = true;
        }
      },
      caf::after(seconds(60)) >> [&] { done = true; });
  return outcome;
}

TEST_CASE("Status and exit reasons map both ways, code and message kept") {
  CHECK_FALSE(ExitReasonFromStatus(absl::OkStatus()));
  for (absl::StatusCode code : {absl::StatusCode::kAborted, absl::StatusCode::kDataLoss,
                                absl::StatusCode::kOutOfRange, absl::StatusCode::kInternal,
                                absl::StatusCode::kUnauthenticated}) {
    Status s(code, "message of " + absl::StatusCodeToString(code));
    CHECK(StatusFromExitReason(ExitReasonFromStatus(s)) == s);
  }
  Status marked = absl::InternalError("injected actor fault k");
  marked.SetPayload("foreman.InjectedFault", absl::Cord("k"));
  CHECK(StatusFromExitReason(ExitReasonFromStatus(marked)) == marked);  // payloads kept too
  CHECK(StatusFromExitReason(caf::error{}).ok());
  CHECK(StatusFromExitReason(caf::make_error(caf::exit_reason::normal)).ok());
  CHECK(StatusFromExitReason(caf::make_error(caf::exit_reason::user_shutdown)).code() ==
        absl::StatusCode::kCancelled);
  CHECK(StatusFromExitReason(caf::make_error(caf::exit_reason::kill)).code() == absl::StatusCode::kCancelled);
  CHECK(StatusFromExitReason(caf::make_error(caf::sec::runtime_error)).code() == absl::StatusCode::kUnknown);
}

TEST_CASE("system.render prints a Foreman exit reason as its Status code and message") {
  Fixture fx;
  CHECK(fx.system->render(ExitReasonFromStatus(absl::DataLossError("bad bytes in model.ckpt-5"))) ==
        "DATA_LOSS: bad bytes in model.ckpt-5");
  CHECK(fx.system->render(ExitReasonFromStatus(absl::CancelledError(""))) == "CANCELLED");
}

TEST_CASE("stop_atom before start_atom: the job runs no step and exits normally after its final checkpoint") {
  TempDir dir;
  Model model;
  Fixture fx;
  std::atomic<int> results{0};
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob job = Job(model, dir.path(), /*last_step=*/1000);
    job.on_results = [&](const TensorMap&) {
      ++results;
      return absl::OkStatus();
    };
    caf::actor handle = SpawnTrainingJob(*fx.system, std::move(job));
    self->monitor(handle);
    self->send(handle, stop_atom::value);
    self->send(handle, start_atom::value);
    Status outcome = AwaitDown(self, handle);
    CHECK_MESSAGE(outcome.ok(), outcome.ToString());
  }
  CHECK(results == 0);
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE(latest.ok());
  REQUIRE(latest->has_value());
  CHECK(**latest == dir.path() + "/model.ckpt-0");
}

// Issue 30 bug 3: the header's rule holds without any start_atom.
TEST_CASE("stop_atom alone on an idle job: no step runs, the final checkpoint is written, the job ends OK") {
  TempDir dir;
  Model model;
  Fixture fx;
  std::atomic<int> results{0};
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob job = Job(model, dir.path(), /*last_step=*/1000);
    job.on_results = [&](const TensorMap&) {
      ++results;
      return absl::OkStatus();
    };
    caf::actor handle = SpawnTrainingJob(*fx.system, std::move(job));
    self->monitor(handle);
    self->send(handle, subscribe_atom::value);
    self->send(handle, stop_atom::value);
    Received r = Collect(self);
    REQUIRE(r.finished.size() == 1);
    CHECK(r.finished[0].status().ok());
    Status outcome = AwaitDown(self, handle);
    CHECK_MESSAGE(outcome.ok(), outcome.ToString());
  }
  CHECK(results == 0);
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE(latest.ok());
  REQUIRE(latest->has_value());
  CHECK(**latest == dir.path() + "/model.ckpt-0");
}

// Issue 30 bug 2: JobFinished is the last message after a kill too (no
// handler runs for exit_reason::kill): from the loop once it has closed the
// session, or at once for a job that never started.
TEST_CASE("a killed job's subscribers still get JobFinished (CANCELLED), last; also when it was idle") {
  TempDir dir;
  Model model;
  model.block_at = 3;
  Fixture fx;
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob spec = Job(model, dir.path(), 0);
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    self->send(job, subscribe_atom::value);
    self->send(job, start_atom::value);
    for (int i = 0; i < 20000 && !model.blocked.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(model.blocked.load());
    self->send_exit(job, caf::exit_reason::kill);
    model.release = true;
    Received r = Collect(self);
    REQUIRE(r.finished.size() == 1);
    CHECK(r.finished[0].status().code() == absl::StatusCode::kCancelled);
    CHECK_MESSAGE(absl::StrContains(r.finished[0].message, "kill"), r.finished[0].message);
    CHECK(AwaitDown(self, job).code() == absl::StatusCode::kCancelled);
    // Nothing after it.
    bool more = false;
    self->receive([&](const ProgressStep&) { more = true; }, [&](const CheckpointSaved&) { more = true; },
                  [&](const JobFinished&) { more = true; }, caf::after(std::chrono::milliseconds(200)) >> [] {});
    CHECK_FALSE(more);

    TempDir idle_dir;
    caf::actor idle = SpawnTrainingJob(*fx.system, Job(model, idle_dir.path(), 0));
    self->send(idle, subscribe_atom::value);
    StatusOr<JobStatus> st = absl::UnknownError("no answer");
    self->request(idle, seconds(20), job_status_atom::value)
        .receive([&](const JobStatus& s) { st = s; }, [&](caf::error&) {});  // the subscription is in
    self->send_exit(idle, caf::exit_reason::kill);
    Received idle_r = Collect(self, seconds(20));
    REQUIRE(idle_r.finished.size() == 1);
    CHECK(idle_r.finished[0].status().code() == absl::StatusCode::kCancelled);
  }
  fx.system->await_all_actors_done();
  CHECK(fx.system->registry().running() == 0);
}

// Issue 30 bug 1: OTP's restart at the down_msg. A killed job's down_msg
// comes while its loop still closes the session that holds the checkpoint
// directory's lock; the restarted job on the same directory waits for that
// (checkpoint_lock.hpp) instead of being refused by its own process.
TEST_CASE("a job restarted on the same directory at a killed job's down_msg is not refused by the closing one") {
  Fixture fx;
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    TempDir dir;  // fresh: each round's killed job must reach its blocking step
    Model model;
    model.block_at = 2;
    caf::scoped_actor self{*fx.system};
    TrainingJob spec = Job(model, dir.path(), 0);
    spec.start_immediately = true;
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    for (int i = 0; i < 20000 && !model.blocked.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!model.blocked.load()) {
      model.release = true;
      FAIL("the job never reached its blocking step");
    }
    self->send_exit(job, caf::exit_reason::kill);
    CHECK(AwaitDown(self, job).code() == absl::StatusCode::kCancelled);
    // The loop is still inside its blocked step, holding the lock; it
    // closes the session only after the restart is already waiting.
    Model second;
    caf::actor restarted = SpawnTrainingJob(*fx.system, Job(second, dir.path(), 3));
    self->monitor(restarted);
    self->send(restarted, start_atom::value);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    model.release = true;
    Status outcome = AwaitDown(self, restarted);
    CHECK_MESSAGE(outcome.ok(), outcome.ToString());
    // It trained on from the killed job's final checkpoint to its own end.
    StatusOr<std::optional<std::string>> latest = LatestCheckpoint(Env::Default(), dir.path());
    REQUIRE(latest.ok());
    REQUIRE(latest->has_value());
    CHECK(absl::EndsWith(**latest, "model.ckpt-3"));
  }
}

// Issue 30 point 10: one subscriber, two jobs; every message says whose.
TEST_CASE("every message and JobStatus carry the job's id: TrainingJob::job_id, or its checkpoint directory") {
  TempDir named_dir;
  TempDir default_dir;
  Model named_model;
  Model default_model;
  Fixture fx;
  caf::scoped_actor self{*fx.system};
  TrainingJob named = Job(named_model, named_dir.path(), 6);
  named.job_id = "experiment-7";
  named.progress_every_steps = 1;
  TrainingJob by_dir = Job(default_model, default_dir.path(), 4);
  by_dir.progress_every_steps = 1;
  caf::actor a = SpawnTrainingJob(*fx.system, std::move(named));
  caf::actor b = SpawnTrainingJob(*fx.system, std::move(by_dir));
  for (const caf::actor& job : {a, b}) {
    self->send(job, subscribe_atom::value);
    self->send(job, start_atom::value);
  }
  std::map<std::string, std::vector<int64_t>> steps;  // by job_id
  std::map<std::string, int> saves;
  std::map<std::string, JobFinished> finished;
  bool timed_out = false;
  self->receive_while([&] { return finished.size() < 2 && !timed_out; })(
      [&](const ProgressStep& m) { steps[m.job_id].push_back(m.global_step); },
      [&](const CheckpointSaved& m) {
        ++saves[m.job_id];
        CHECK(absl::StartsWith(m.path, m.job_id == "experiment-7" ? named_dir.path() : m.job_id));
      },
      [&](const JobFinished& m) { finished.emplace(m.job_id, m); },
      caf::after(seconds(60)) >> [&] { timed_out = true; });
  REQUIRE_FALSE(timed_out);
  CHECK(steps["experiment-7"] == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  CHECK(steps[default_dir.path()] == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(steps.size() == 2);
  CHECK(saves["experiment-7"] >= 1);
  CHECK(saves[default_dir.path()] >= 1);
  CHECK(saves.size() == 2);
  REQUIRE(finished.count("experiment-7") == 1);
  REQUIRE(finished.count(default_dir.path()) == 1);
  CHECK(finished["experiment-7"].global_step == 6);
  CHECK(finished[default_dir.path()].global_step == 4);
}

// Issue 30 point 10: "stop, and answer me when the final checkpoint is durable".
TEST_CASE("stop_and_wait_atom answers with the final checkpoint once durable, or the job's error") {
  Fixture fx;
  SUBCASE("a running job: its final checkpoint, on disk when the answer comes") {
    TempDir dir;
    Model model;
    caf::scoped_actor self{*fx.system};
    TrainingJob spec = Job(model, dir.path(), 0);  // no last step: runs until stopped
    spec.start_immediately = true;
    spec.job_id = "waited";
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    for (int i = 0; i < 20000 && AskStatus(self, job).global_step < 5; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::optional<CheckpointSaved> saved;
    self->request(job, seconds(60), stop_and_wait_atom::value)
        .receive([&](const CheckpointSaved& c) { saved = c; },
                 [&](caf::error& e) { FAIL("stop_and_wait failed: " << fx.system->render(e)); });
    REQUIRE(saved.has_value());
    CHECK(saved->job_id == "waited");
    CHECK(saved->global_step >= 5);
    CHECK(saved->path == dir.path() + "/model.ckpt-" + std::to_string(saved->global_step));
    CHECK(std::filesystem::exists(saved->path + ".index"));
    StatusOr<std::optional<std::string>> latest = LatestCheckpoint(Env::Default(), dir.path());
    REQUIRE(latest.ok());
    CHECK(latest->value_or("") == saved->path);
  }
  SUBCASE("before start_atom: the checkpoint of step 0") {
    TempDir dir;
    Model model;
    caf::scoped_actor self{*fx.system};
    caf::actor job = SpawnTrainingJob(*fx.system, Job(model, dir.path(), 0));
    self->request(job, seconds(60), stop_and_wait_atom::value)
        .receive([&](const CheckpointSaved& c) { CHECK(c.path == dir.path() + "/model.ckpt-0"); },
                 [&](caf::error& e) { FAIL("stop_and_wait failed: " << fx.system->render(e)); });
  }
  SUBCASE("no checkpoint_dir: FAILED_PRECONDITION naming the job") {
    Model model;
    caf::scoped_actor self{*fx.system};
    TrainingJob spec = Job(model, "", 0);
    spec.job_id = "nowhere";
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->request(job, seconds(60), stop_and_wait_atom::value)
        .receive([&](const CheckpointSaved& c) { FAIL("answered " << c.path); },
                 [&](caf::error& e) {
                   const Status s = StatusFromExitReason(e);
                   CHECK(absl::IsFailedPrecondition(s));
                   CHECK_MESSAGE(absl::StrContains(s.message(), "'nowhere'"), s.ToString());
                 });
  }
  SUBCASE("a job that fails: its error") {
    TempDir dir;
    Model model;
    model.fail_at = 2;
    model.fail_with = absl::DataLossError("step broke");
    caf::scoped_actor self{*fx.system};
    TrainingJob spec = Job(model, dir.path(), 0);
    spec.start_immediately = true;
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    for (int i = 0; i < 20000 && !model.failed.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    self->request(job, seconds(60), stop_and_wait_atom::value)
        .receive([&](const CheckpointSaved& c) { FAIL("answered " << c.path); },
                 [&](caf::error& e) {
                   // The job may be gone already (its request then fails as
                   // request_receiver_down); otherwise its Status comes back.
                   if (e.category() == caf::atom("system")) return;
                   CHECK(StatusFromExitReason(e).code() == absl::StatusCode::kDataLoss);
                 });
  }
}

TEST_CASE("a typed handle speaks the same protocol: subscribe, start, status, stop_and_wait, down") {
  TempDir dir;
  Model model;
  Fixture fx;
  caf::scoped_actor self{*fx.system};
  TrainingJob spec = Job(model, dir.path(), 0);
  spec.progress_every_steps = 1;
  training_job_actor job = SpawnTypedTrainingJob(*fx.system, std::move(spec));
  self->monitor(job);
  self->send(job, subscribe_atom::value);
  self->send(job, start_atom::value);
  bool progressed = false;
  self->receive([&](const ProgressStep& p) { progressed = p.global_step >= 1; },
                caf::after(seconds(60)) >> [] {});
  CHECK(progressed);
  self->request(job, seconds(10), job_status_atom::value)
      .receive([&](const JobStatus& s) { CHECK(s.state == "running"); },
               [&](caf::error& e) { FAIL("status: " << fx.system->render(e)); });
  std::string final_path;
  self->request(job, seconds(60), stop_and_wait_atom::value)
      .receive([&](const CheckpointSaved& c) { final_path = c.path; },
               [&](caf::error& e) { FAIL("stop_and_wait: " << fx.system->render(e)); });
  CHECK(absl::StartsWith(final_path, dir.path() + "/model.ckpt-"));
  // The plain handle is the same actor.
  CHECK(caf::actor_cast<caf::actor>(job).address() == job.address());
  Status outcome = AwaitDown(self, caf::actor_cast<caf::actor>(job));
  CHECK_MESSAGE(outcome.ok(), outcome.ToString());
}

TEST_CASE("JobStatus names the job") {
  TempDir dir;
  Model model;
  Fixture fx;
  caf::scoped_actor self{*fx.system};
  TrainingJob spec = Job(model, dir.path(), 3);
  spec.job_id = "status-job";
  caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
  self->request(job, seconds(10), job_status_atom::value)
      .receive([&](const JobStatus& s) { CHECK(s.job_id == "status-job"); },
               [&](caf::error& e) { FAIL("status request failed: " << caf::to_string(e)); });
  self->send_exit(job, caf::exit_reason::user_shutdown);
}

TEST_CASE("A job waits for start, trains to its last step and exits normally, in the caller's system") {
  TempDir dir;
  Model model;
  Fixture fx;
  {
    caf::scoped_actor self{*fx.system};
    caf::actor job = SpawnTrainingJob(*fx.system, Job(model, dir.path(), 25));
    self->monitor(job);
    StatusReply idle = AskStatus(self, job);
    CHECK(idle.state == "idle");
    CHECK(idle.global_step == -1);
    self->send(job, start_atom::value);
    self->send(job, start_atom::value);  // a second start is a no-op
    CHECK(AwaitDown(self, job).ok());
  }
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE(latest.ok());
  CHECK(latest->value_or("") == dir.path() + "/model.ckpt-25");
}

TEST_CASE("status answers while the loop trains; stop_atom is a clean stop with a final checkpoint") {
  TempDir dir;
  Model model;
  model.block_at = 7;
  Fixture fx;
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob spec = Job(model, dir.path(), 0);
    spec.start_immediately = true;
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    for (int i = 0; i < 20000 && !model.blocked.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(model.blocked.load());
    StatusReply running = AskStatus(self, job);
    CHECK(running.state == "running");
    CHECK(running.global_step == 7);
    CHECK(running.local_steps == 7);
    CHECK(running.error.empty());
    // The job's actors live in this system: the job, its loop and the
    // session's service actors.
    CHECK(fx.system->registry().running() >= 3);
    self->send(job, stop_atom::value);
    StatusReply stopping = AskStatus(self, job);
    CHECK(stopping.state == "stopping");
    model.release = true;
    CHECK(AwaitDown(self, job).ok());
  }
  // Stopped after the step in flight (7 -> 8); end() saved step 8.
  CHECK(LatestCheckpoint(Env::Default(), dir.path())->value_or("") == dir.path() + "/model.ckpt-8");
}

TEST_CASE("A failing step ends the job with that Status as its exit reason; no actor is left") {
  TempDir dir;
  Model model;
  model.fail_at = 12;
  model.fail_with = absl::InvalidArgumentError("Incompatible shapes: [128,10] vs. [64,10]");
  Fixture fx;
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob spec = Job(model, dir.path(), 100);
    spec.start_immediately = true;
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    CHECK(AwaitDown(self, job) == model.fail_with);
  }
  fx.system->await_all_actors_done();
  CHECK(fx.system->registry().running() == 0);
  // No final checkpoint after an error (B39): the last one is the step-10 save.
  CHECK(LatestCheckpoint(Env::Default(), dir.path())->value_or("") == dir.path() + "/model.ckpt-10");
}

TEST_CASE("on_results errors end the job with that error") {
  TempDir dir;
  Model model;
  Fixture fx;
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob spec = Job(model, dir.path(), 100);
    spec.start_immediately = true;
    int calls = 0;
    spec.on_results = [calls](const TensorMap& results) mutable -> Status {
      if (results.count("train_op") != 1) return absl::InternalError("missing train_op");
      if (++calls == 3) throw std::runtime_error("consumer crashed");
      return absl::OkStatus();
    };
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    Status outcome = AwaitDown(self, job);
    CHECK(outcome.code() == absl::StatusCode::kInternal);
    CHECK(outcome.message().find("consumer crashed") != absl::string_view::npos);
    // Named after the callback the user wrote, not the internal hook that
    // calls it (issue 30 point 10).
    CHECK_MESSAGE(absl::StartsWith(outcome.message(), "TrainingJob.on_results: "), outcome.ToString());
    CHECK_MESSAGE(!absl::StrContains(outcome.message(), "Hook"), outcome.ToString());
  }
  {
    caf::scoped_actor self{*fx.system};
    Model second;
    TempDir other;
    TrainingJob spec = Job(second, other.path(), 100);
    spec.start_immediately = true;
    spec.on_results = [](const TensorMap&) -> Status { return absl::DataLossError("bad results"); };
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    Status outcome = AwaitDown(self, job);
    CHECK(outcome.code() == absl::StatusCode::kDataLoss);
    CHECK(outcome.message() == "TrainingJob.on_results: bad results");
  }
}

TEST_CASE("Shutting the job down mid-run ends it with CANCELLED and leaves no actor running") {
  TempDir dir;
  Model model;
  model.block_at = 3;
  Fixture fx;
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob spec = Job(model, dir.path(), 0);
    spec.start_immediately = true;
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    for (int i = 0; i < 20000 && !model.blocked.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(model.blocked.load());
    self->send_exit(job, caf::exit_reason::user_shutdown);
    model.release = true;
    CHECK(AwaitDown(self, job).code() == absl::StatusCode::kCancelled);
  }
  fx.system->await_all_actors_done();
  CHECK(fx.system->registry().running() == 0);
}

TEST_CASE("A job whose session cannot be created exits with that error") {
  Model model;
  Fixture fx;
  caf::scoped_actor self{*fx.system};
  TrainingJob spec;
  spec.start_immediately = true;  // no graph: MonitoredTrainingSession refuses
  caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
  self->monitor(job);
  CHECK(AwaitDown(self, job).code() == absl::StatusCode::kInvalidArgument);
}

// -- issue 12 (5): progress for subscribers -------------------------------------

TEST_CASE("A subscriber gets ProgressStep on schedule, CheckpointSaved per save, Recovered, then JobFinished") {
  TempDir dir;
  Model model;
  model.fail_at = 15;  // once: restored to 10, 5 steps lost
  model.fail_once = true;
  model.fail_with = absl::UnavailableError("ps task 0 restarted");
  Fixture fx;
  caf::scoped_actor self{*fx.system};
  TrainingJob spec = Job(model, dir.path(), 25);
  spec.fetches = {"train_op", "loss"};
  spec.progress_every_steps = 10;
  spec.options.recovery.initial_backoff = absl::ZeroDuration();
  caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
  self->monitor(job);
  self->send(job, subscribe_atom::value);
  self->send(job, subscribe_atom::value, caf::actor_cast<caf::actor>(self.ptr()));  // the same subscriber: one subscription
  self->send(job, start_atom::value);
  Received r = Collect(self);
  REQUIRE(r.finished.size() == 1);
  CHECK(r.finished[0].status().ok());
  CHECK(r.finished[0].global_step == 25);
  CHECK(r.after_finished == 0);
  // Every 10 global steps from the first one seen; after the restore to 10
  // the step is published again once it is 10 past the last one.
  std::vector<int64_t> steps;
  for (const auto& p : r.progress) steps.push_back(p.global_step);
  CHECK(steps == std::vector<int64_t>{1, 11, 21});
  REQUIRE_FALSE(r.progress.empty());
  CHECK(r.progress[0].values == std::map<std::string, double>{{"loss", 0.25}, {"train_op", 1.0}});
  // The first save, every 10 steps, the new session's save at the restored
  // step, and end()'s final save.
  std::vector<int64_t> saved;
  for (const auto& c : r.saves) {
    saved.push_back(c.global_step);
    CHECK(c.path == dir.path() + "/model.ckpt-" + std::to_string(c.global_step));
  }
  CHECK(saved == std::vector<int64_t>{0, 10, 10, 20, 25});
  REQUIRE(r.recoveries.size() == 1);
  const Recovered& rec = r.recoveries[0];
  CHECK(rec.status() == model.fail_with);
  CHECK(rec.recoveries == 1);
  CHECK(rec.global_step == 10);
  CHECK(rec.steps_lost == 5);
  CHECK(rec.detect_ms >= 0);
  CHECK(rec.restore_ms >= 0);
  CHECK(rec.next_good_step_ms >= 0);  // a step ran after the recovery
  CHECK(AwaitDown(self, job).ok());
}

TEST_CASE("Without a subscriber (none, or unsubscribed) a job sends no progress message") {
  TempDir dir;
  Model model;
  Fixture fx;
  caf::scoped_actor self{*fx.system};
  TrainingJob spec = Job(model, dir.path(), 25);
  spec.progress_every_steps = 1;
  caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
  self->monitor(job);
  self->send(job, subscribe_atom::value);
  self->send(job, unsubscribe_atom::value);
  self->send(job, start_atom::value);
  int messages = 0;
  Status outcome = absl::DeadlineExceededError("no down_msg within 60 s");
  bool done = false;
  self->receive_while([&] { return !done; })(
      [&](const ProgressStep&) { ++messages; }, [&](const CheckpointSaved&) { ++messages; },
      [&](const JobFinished&) { ++messages; },
      [&](caf::down_msg& dm) {
        outcome = StatusFromExitReason(dm.reason);
        done = true;
      },
      caf::after(seconds(60)) >> [&] { done = true; });
  CHECK(outcome.ok());
  CHECK(messages == 0);
  CHECK(LatestCheckpoint(Env::Default(), dir.path())->value_or("") == dir.path() + "/model.ckpt-25");
}

TEST_CASE("An event-based subscriber handles the typed messages in its behavior; one that exits is dropped") {
  TempDir dir;
  Model model;
  Fixture fx;
  std::atomic<int64_t> last_progress{-1};
  std::atomic<int> finished{0};
  // (spawn with an argument: see actors/README.md on UBSan)
  auto watcher = fx.system->spawn([&](caf::event_based_actor* self, int) -> caf::behavior {
    return {
        [&](const ProgressStep& p) { last_progress = p.global_step; },
        [](const CheckpointSaved&) {},
        [&, self](const JobFinished& f) {
          if (f.status().ok()) ++finished;
          self->quit();
        },
    };
  }, 0);
  // Exits at the first message it gets: the job drops it.
  auto quitter = fx.system->spawn([](caf::event_based_actor* self, int) -> caf::behavior {
    return {[self](const ProgressStep&) { self->quit(); }, [self](const CheckpointSaved&) { self->quit(); }};
  }, 0);
  // Handles none of them: CAF answers each with an unexpected_message error
  // (and prints it on stderr), which the job must survive.
  auto deaf = fx.system->spawn([](caf::event_based_actor*, int) -> caf::behavior { return {[](int) {}}; }, 0);
  {
    caf::scoped_actor self{*fx.system};
    TrainingJob spec = Job(model, dir.path(), 25);
    spec.progress_every_steps = 5;
    caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
    self->monitor(job);
    self->send(job, subscribe_atom::value, watcher);
    self->send(job, subscribe_atom::value, quitter);
    self->send(job, subscribe_atom::value, deaf);
    self->send(job, start_atom::value);
    Status outcome = AwaitDown(self, job);
    CHECK_MESSAGE(outcome.ok(), outcome.ToString());
  }
  caf::anon_send_exit(deaf, caf::exit_reason::user_shutdown);
  deaf = nullptr;
  quitter = nullptr;
  watcher = nullptr;
  REQUIRE(AwaitNoActors(*fx.system));
  CHECK(finished == 1);
  CHECK(last_progress == 21);  // 1, 6, 11, 16, 21
}

TEST_CASE("A negative progress_every_steps ends the job with INVALID_ARGUMENT naming it") {
  Model model;
  TempDir dir;
  Fixture fx;
  caf::scoped_actor self{*fx.system};
  TrainingJob spec = Job(model, dir.path(), 25);
  spec.progress_every_steps = -1;
  spec.start_immediately = true;
  caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
  self->monitor(job);
  Status outcome = AwaitDown(self, job);
  CHECK(outcome.code() == absl::StatusCode::kInvalidArgument);
  CHECK(outcome.message().find("progress_every_steps must be >= 0, got -1") != absl::string_view::npos);
}

// -- issue 12 (6): dropping the last handle -------------------------------------

TEST_CASE("A started job whose every handle is dropped trains on to its last step and saves its final checkpoint") {
  TempDir dir;
  Model model;
  Fixture fx;
  {
    TrainingJob spec = Job(model, dir.path(), 25);  // 25: only end() saves it
    spec.start_immediately = true;
    SpawnTrainingJob(*fx.system, std::move(spec));  // the handle is dropped at once
  }
  REQUIRE(AwaitNoActors(*fx.system));
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE(latest.ok());
  CHECK(latest->value_or("") == dir.path() + "/model.ckpt-25");
}

TEST_CASE("A job never started whose handle is dropped ends without training") {
  TempDir dir;
  Model model;
  Fixture fx;
  SpawnTrainingJob(*fx.system, Job(model, dir.path(), 25));
  REQUIRE(AwaitNoActors(*fx.system));
  CHECK(LatestCheckpoint(Env::Default(), dir.path())->value_or("") == "");
}

TEST_CASE("job_status_atom answers a running job's state, step, code and message") {
  TempDir dir;
  Model model;
  model.block_at = 4;
  Fixture fx;
  caf::scoped_actor self{*fx.system};
  TrainingJob spec = Job(model, dir.path(), 0);
  spec.start_immediately = true;
  caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
  self->monitor(job);
  for (int i = 0; i < 20000 && !model.blocked.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(model.blocked.load());
  JobStatus typed;
  self->request(job, seconds(10), job_status_atom::value)
      .receive([&](const JobStatus& s) { typed = s; },
               [&](caf::error& e) { FAIL("job_status request failed: " << caf::to_string(e)); });
  CHECK(typed.state == "running");
  CHECK(typed.global_step == 4);
  CHECK(typed.code == 0);
  CHECK(typed.message.empty());
  self->send(job, stop_atom::value);
  model.release = true;
  CHECK(AwaitDown(self, job).ok());
}

// -- issue 12 (7): stopping from another thread ---------------------------------

TEST_CASE("stop_atom from a plain thread racing a recovery: the back-off ends, the job ends OK with its checkpoint") {
  TempDir dir;
  Model model;
  model.fail_at = 6;  // once: restored to 4
  model.fail_once = true;
  model.fail_with = absl::UnavailableError("worker 1 lost");
  Fixture fx;
  caf::scoped_actor self{*fx.system};
  TrainingJob spec = Job(model, dir.path(), 1000);
  spec.options.save_checkpoint_steps = 4;
  spec.options.recovery.initial_backoff = absl::Seconds(40);  // 20 to 60 s: only the stop ends it soon
  spec.start_immediately = true;
  caf::actor job = SpawnTrainingJob(*fx.system, std::move(spec));
  self->monitor(job);
  self->send(job, subscribe_atom::value);
  const auto begin = std::chrono::steady_clock::now();
  std::thread stopper([&] {
    for (int i = 0; i < 20000 && !model.failed.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    caf::anon_send(job, stop_atom::value);
  });
  Received r = Collect(self);
  stopper.join();
  const auto took = std::chrono::steady_clock::now() - begin;
  REQUIRE(model.failed.load());
  REQUIRE(r.finished.size() == 1);
  CHECK_MESSAGE(r.finished[0].status().ok(), r.finished[0].status().ToString());
  CHECK(r.finished[0].global_step == 4);
  CHECK(took < seconds(15));
  REQUIRE(r.recoveries.size() == 1);
  CHECK(r.recoveries[0].next_good_step_ms == -1);  // stopped before a step ran on the new session
  CHECK(r.recoveries[0].steps_lost == 2);
  CHECK(AwaitDown(self, job).ok());
  CHECK(LatestCheckpoint(Env::Default(), dir.path())->value_or("") == dir.path() + "/model.ckpt-4");
}

}  // namespace
}  // namespace foreman

// -- adversarial cases (issue 4's review; were tests/breaker_test.cpp) -------------
// Shutdown mid-run, a failing result consumer, stop before start. Every wait
// is bounded.

namespace foreman {
namespace adversarial {
namespace {

using testing::CallLog;
using testing::Checkpoints;
using testing::LastStep;
using testing::MakeGraph;
using testing::Model;
using testing::ScriptedHook;
using testing::TempDir;

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
}  // namespace adversarial
}  // namespace foreman
