// The actor API (design.md §4 b): a training job spawned into the test's own
// actor_system, its protocol, and the final Status as its exit reason.
#include "foreman/actor_api.hpp"

#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <atomic>
#include <chrono>

#include "foreman/checkpoint.hpp"
#include "foreman/hooks.hpp"
#include "support/test_util.hpp"

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
  std::atomic<int64_t> block_at{-1};
  std::atomic<bool> release{false};
  std::atomic<bool> blocked{false};

  std::shared_ptr<Graph> MakeGraph() {
    auto graph = std::make_shared<Graph>();
    REQUIRE(graph->CreateGlobalStep().ok());
    REQUIRE(graph->SetStep([this](StepContext& ctx) -> Status {
                    FOREMAN_ASSIGN_OR_RETURN(int64_t step, GetGlobalStep(ctx.variables()));
                    if (step == fail_at.load()) return fail_with;
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
  self->request(job, seconds(10), status_atom::value)
      .receive(
          [&](const std::string& state, int64_t gs, int64_t steps, const std::string& error) {
            reply = StatusReply{state, gs, steps, error};
          },
          [&](caf::error& e) { FAIL("status request failed: " << caf::to_string(e)); });
  return reply;
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

}  // namespace
}  // namespace foreman
