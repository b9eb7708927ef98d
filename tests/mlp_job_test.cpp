// The MLP training job (include/foreman/mlp_job.hpp) under a real
// MonitoredTrainingSession, on a small synthetic data set of Fashion-MNIST's
// layout: the three ways a batch reaches the step (the input pipeline, the
// training thread, gathered on the device) train bitwise the same weights,
// also when the gathered run is interrupted and resumed; a cluster worker's
// step computes gradients and applies them on the parameter servers
// (StepContext::ApplyGradients, fake ps tasks); TF's exponential_decay and
// its underflow warning; the evaluation's cadence and its event files; the
// progress the observer hears; and the job's refusals.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/monitored_session.hpp"
#include "support/events.hpp"
#include "support/fake_remote_values.hpp"
#include "support/test_util.hpp"
#include "support/tiny_mnist.hpp"
#include "support/training_graph.hpp"

namespace foreman {
namespace {

using testing::TempDir;

using testing::TinyData;

// 2 epochs of 5 batches of 100 (the last of each a remainder of 50): 10 steps.
MlpJobSettings TinySettings(const std::string& dir) {
  MlpJobSettings s;
  s.checkpoint_dir = dir;
  s.data_dir = "tiny";
  s.hidden = "4";
  s.batch_size = 100;
  s.epochs = 2;
  s.threads = 1;
  s.seed = 5;
  s.eval_every_steps = 5;
  s.device = "cpu";
  s.log_step_count_steps = 0;
  REQUIRE(ValidateMlpJobSettings(s).ok());
  return s;
}

MlpJobOptions TinyOptions(const std::string& dir, MlpJobInput input = MlpJobInput::kInputPipeline) {
  MlpJobOptions o;
  o.settings = TinySettings(dir);
  o.data = TinyData();
  o.input = input;
  return o;
}

std::unique_ptr<MlpJob> Job(MlpJobOptions options) {
  auto job = MlpJob::Create(std::move(options));
  REQUIRE_MESSAGE(job.ok(), job.status().ToString());
  return std::move(*job);
}

// Runs the job's session to its end; close()'s status.
Status Train(MlpJob& job, MonitoredTrainingSessionOptions options) {
  auto session = MonitoredTrainingSession(std::move(options));
  REQUIRE_MESSAGE(session.ok(), session.status().ToString());
  Status started = job.StartInput(**session);
  REQUIRE_MESSAGE(started.ok(), started.ToString());
  while (!(*session)->should_stop()) {
    if (!(*session)->run({"train_op"}).ok()) break;
  }
  return (*session)->close();
}
Status Train(MlpJob& job) { return Train(job, job.SessionOptions()); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string Weights(const std::string& dir, int64_t step) {
  const std::string data = ReadFile(absl::StrCat(dir, "/model.ckpt-", step, ".data-00000-of-00001"));
  REQUIRE_FALSE(data.empty());
  return data;
}

// What an observer heard.
struct Recorder : MlpJobObserver {
  std::vector<MlpJobProgress> steps;
  std::vector<MlpJobEval> evals;
  std::vector<std::string> warnings;
  int ends = 0;
  void OnStep(const MlpJobProgress& p) override { steps.push_back(p); }
  void OnEval(const MlpJobEval& e) override { evals.push_back(e); }
  void OnWarning(const std::string& w) override { warnings.push_back(w); }
  void OnEnd() override { ++ends; }
};

TEST_CASE("the input pipeline, the training thread and batches gathered on the CPU device train bitwise the same "
          "weights and evaluations") {
  TempDir tmp;
  struct Path {
    MlpJobInput input;
    const char* name;
  };
  const std::vector<Path> paths = {{MlpJobInput::kInputPipeline, "pipeline"},
                                   {MlpJobInput::kOnTrainingThread, "thread"},
                                   {MlpJobInput::kGatherOnDevice, "gathered"}};
  std::vector<MlpJobResult> results;
  for (const Path& p : paths) {
    CAPTURE(p.name);
    auto job = Job(TinyOptions(tmp / p.name, p.input));
    CHECK(job->total_steps() == 10);
    CHECK(job->gathers_on_device() == (p.input == MlpJobInput::kGatherOnDevice));
    CHECK(job->plan().spec.input_dim == 36);
    Status closed = Train(*job);
    REQUIRE_MESSAGE(closed.ok(), closed.ToString());
    results.push_back(job->result());
    CHECK(results.back().local_steps == 10);
    CHECK(results.back().examples == 900);
    CHECK(results.back().steps_trained == 10);
    CHECK((results.back().pipeline_batches > 0) == (p.input == MlpJobInput::kInputPipeline));
    REQUIRE(results.back().eval.has_value());
    CHECK(results.back().eval->global_step == 10);
    CHECK(results.back().test_examples == 120);
  }
  const std::string weights = Weights(tmp / "pipeline", 10);
  CHECK(Weights(tmp / "thread", 10) == weights);
  CHECK(Weights(tmp / "gathered", 10) == weights);
  for (const MlpJobResult& r : results) {
    CHECK(r.eval->accuracy == results[0].eval->accuracy);
    CHECK(r.eval->loss == results[0].eval->loss);
  }
  // Evaluated on the test set at 5 and 10, each written once into eval/.
  for (const Path& p : paths) {
    CHECK(testing::SummarySteps(testing::Events(tmp / p.name + "/eval"), "accuracy") == std::vector<int64_t>{5, 10});
  }
}

TEST_CASE("the gathered path interrupted in its first epoch and resumed ends with the pipeline's weights") {
  TempDir tmp;
  REQUIRE(Train(*Job(TinyOptions(tmp / "pipeline"))).ok());
  MlpJobOptions first = TinyOptions(tmp / "gathered", MlpJobInput::kGatherOnDevice);
  first.settings.max_steps = 4;
  auto interrupted = Job(std::move(first));
  CHECK(interrupted->total_steps() == 4);
  REQUIRE(Train(*interrupted).ok());
  CHECK(std::filesystem::exists(tmp / "gathered/model.ckpt-4.index"));
  auto resumed = Job(TinyOptions(tmp / "gathered", MlpJobInput::kGatherOnDevice));
  REQUIRE(Train(*resumed).ok());
  CHECK(resumed->result().steps_trained == 6);  // restored at 4 (its data position too)
  CHECK(Weights(tmp / "gathered", 10) == Weights(tmp / "pipeline", 10));
}

TEST_CASE("a NaN loss on the gathered path ends the run with NanTensorHook's error; close is clean") {
  TempDir tmp;
  MlpJobOptions o = TinyOptions(tmp / "nan", MlpJobInput::kGatherOnDevice);
  o.settings.optimizer = "sgd";
  o.settings.learning_rate = 1e30;
  auto job = Job(std::move(o));
  Status closed = Train(*job);
  CHECK(IsNanLossDuringTraining(closed));
  CHECK_MESSAGE(absl::StartsWith(closed.message(), "hook NanTensorHook::after_run: NaN loss during training"),
                closed.ToString());
}

TEST_CASE("the learning rate follows TF's exponential_decay at the step's global_step; its underflow is said once") {
  TempDir tmp;
  MlpJobOptions o = TinyOptions(tmp / "decay");
  o.settings.optimizer = "sgd";
  o.settings.learning_rate = 0.5;
  o.settings.learning_rate_decay_steps = 2;
  o.settings.learning_rate_decay_rate = 0.5;
  o.settings.save_summaries_steps = 1;
  o.settings.max_steps = 6;
  REQUIRE(Train(*Job(std::move(o))).ok());
  std::vector<std::pair<int64_t, double>> rates;
  for (const Event& e : testing::Events(tmp / "decay")) {
    for (const SummaryValue& v : e.values) {
      if (v.tag == "learning_rate") rates.emplace_back(e.step, v.scalar);
    }
  }
  REQUIRE(rates.size() == 6);
  for (const auto& [step, rate] : rates) {
    CAPTURE(step);
    // Written at the post-update step: the run's update used the rate at step - 1.
    CHECK(rate == static_cast<float>(0.5 * std::pow(0.5, static_cast<double>(step - 1) / 2.0)));
  }

  MlpJobOptions tiny = TinyOptions(tmp / "underflow");
  tiny.settings.optimizer = "sgd";
  tiny.settings.learning_rate = 1e-30;
  tiny.settings.learning_rate_decay_steps = 1;
  tiny.settings.learning_rate_decay_rate = 1e-10;
  tiny.settings.max_steps = 5;
  auto recorder = std::make_shared<Recorder>();
  tiny.observer = recorder;
  REQUIRE(Train(*Job(std::move(tiny))).ok());
  REQUIRE(recorder->warnings.size() == 1);
  CHECK(recorder->warnings[0] ==
        "the learning rate decayed to 0 at global_step 2 (1e-30 x 1e-10^(global_step / 1) underflows float32): the "
        "following steps leave the weights unchanged; see --learning-rate-decay-steps and --learning-rate-decay-rate");
}

TEST_CASE("evaluations at every multiple of eval_every_steps and at the final step; a finished run started again "
          "reports without writing twice; the observer hears each step") {
  TempDir tmp;
  MlpJobOptions o = TinyOptions(tmp / "eval");
  o.settings.eval_every_steps = 3;
  o.settings.max_steps = 7;
  auto recorder = std::make_shared<Recorder>();
  o.observer = recorder;
  auto job = Job(std::move(o));
  REQUIRE(Train(*job).ok());
  REQUIRE(recorder->steps.size() == 7);
  for (std::size_t i = 0; i < recorder->steps.size(); ++i) {
    CHECK(recorder->steps[i].global_step == static_cast<int64_t>(i) + 1);
    CHECK(recorder->steps[i].total_steps == 7);
    CHECK(std::isfinite(recorder->steps[i].loss));
    CHECK(recorder->steps[i].accuracy >= 0);
    CHECK(recorder->steps[i].accuracy <= 1);
  }
  REQUIRE(recorder->evals.size() == 2);
  CHECK(recorder->evals[0].global_step == 3);
  CHECK(recorder->evals[1].global_step == 6);
  CHECK(recorder->ends == 1);
  const MlpJobResult r = job->result();
  REQUIRE(r.eval.has_value());
  CHECK(r.eval->global_step == 7);
  const auto evals = testing::Events(tmp / "eval/eval");
  CHECK(testing::SummarySteps(evals, "accuracy") == std::vector<int64_t>{3, 6, 7});
  CHECK(testing::SummarySteps(evals, "loss") == std::vector<int64_t>{3, 6, 7});

  // Started again: restored at 7, the last step; nothing trains, the final
  // evaluation is reported but not written again.
  MlpJobOptions again = TinyOptions(tmp / "eval");
  again.settings.eval_every_steps = 3;
  again.settings.max_steps = 7;
  auto finished = Job(std::move(again));
  REQUIRE(Train(*finished).ok());
  CHECK(finished->result().steps_trained == 0);
  REQUIRE(finished->result().eval.has_value());
  CHECK(finished->result().eval->global_step == 7);
  CHECK(finished->result().eval->accuracy == r.eval->accuracy);
  CHECK(testing::SummarySteps(testing::Events(tmp / "eval/eval"), "accuracy") == std::vector<int64_t>{3, 6, 7});

  // eval_every_steps 0: only the final evaluation.
  MlpJobOptions once = TinyOptions(tmp / "once");
  once.settings.eval_every_steps = 0;
  REQUIRE(Train(*Job(std::move(once))).ok());
  CHECK(testing::SummarySteps(testing::Events(tmp / "once/eval"), "accuracy") == std::vector<int64_t>{10});
}

// Issue 30 bug 5 (B154): a run killed after evaluating past its last
// checkpoint, resumed, evaluates those steps again; the resumed run's eval
// writer starts with a SessionLog START at the restored step + 1, so
// TensorBoard shows each evaluation once, as for the training summaries.
TEST_CASE("B154 a resumed run's evaluations purge those the killed run wrote after its restored checkpoint") {
  TempDir tmp;
  const std::string dir = tmp / "resumed";
  MlpJobOptions first = TinyOptions(dir);
  first.settings.eval_every_steps = 3;
  first.settings.max_steps = 7;
  REQUIRE(Train(*Job(std::move(first))).ok());
  // The kill: the state file goes back to the first checkpoint, as if the
  // process died after evaluating at 3 and 6 but before any later save.
  auto state = ReadCheckpointState(Env::Default(), dir);
  REQUIRE(state.ok());
  REQUIRE(state->has_value());
  CheckpointState back = **state;
  const std::string earliest = back.all_model_checkpoint_paths.front();
  REQUIRE(absl::EndsWith(earliest, "model.ckpt-0"));
  back.model_checkpoint_path = earliest;
  back.all_model_checkpoint_paths = {earliest};
  back.all_model_checkpoint_timestamps.clear();
  REQUIRE(WriteCheckpointState(Env::Default(), dir, back).ok());

  MlpJobOptions resumed = TinyOptions(dir);
  resumed.settings.eval_every_steps = 3;
  resumed.settings.max_steps = 7;
  REQUIRE(Train(*Job(std::move(resumed))).ok());
  const auto evals = testing::Events(dir + "/eval");
  // Both runs wrote 3, 6 and 7; TensorBoard keeps the resumed run's only.
  CHECK(testing::SummarySteps(evals, "accuracy") == std::vector<int64_t>{3, 6, 7, 3, 6, 7});
  CHECK(testing::KeptAfterPurge(evals, "accuracy") == std::map<int64_t, int>{{3, 1}, {6, 1}, {7, 1}});
  CHECK(testing::KeptAfterPurge(evals, "loss") == std::map<int64_t, int>{{3, 1}, {6, 1}, {7, 1}});
}

TEST_CASE("Create checks the settings itself: a batch size of 0 or negative threads is INVALID_ARGUMENT naming it") {
  TempDir tmp;
  MlpJobOptions zero = TinyOptions(tmp / "zero");
  zero.settings.batch_size = 0;
  auto refused = MlpJob::Create(std::move(zero));
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK_MESSAGE(absl::StrContains(refused.status().message(), "--batch-size"), refused.status().ToString());
  MlpJobOptions threads = TinyOptions(tmp / "threads");
  threads.settings.threads = -3;
  refused = MlpJob::Create(std::move(threads));
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK_MESSAGE(absl::StrContains(refused.status().message(), "--threads"), refused.status().ToString());
}

TEST_CASE("SessionOptions carry the settings and the hooks in order; the pipeline's input needs StartInput") {
  TempDir tmp;
  MlpJobOptions o = TinyOptions(tmp / "opts");
  o.settings.save_checkpoint_steps = 3;
  o.settings.max_steps = 4;
  o.settings.restart_policy = "one_for_one,max_restarts=2,period_secs=10";
  struct FirstHook : SessionRunHook {
    std::string name() const override { return "FirstHook"; }
  };
  auto first = std::make_shared<FirstHook>();
  o.first_hooks = {first};
  auto job = Job(std::move(o));
  MonitoredTrainingSessionOptions mts = job->SessionOptions();
  CHECK(mts.checkpoint_dir == tmp / "opts");
  CHECK(mts.config.device == "/cpu:0");
  CHECK(mts.config.intra_op_parallelism_threads == 1);
  CHECK(mts.graph == job->graph());
  CHECK(mts.runtime.restart.max_restarts == 2);
  std::vector<std::string> names;
  for (const auto& hook : mts.hooks) names.push_back(hook->name());
  CHECK(names == std::vector<std::string>{"FirstHook", "NanTensorHook", "ProgressHook", "StopAtStepHook", "EvalHook"});

  // Without StartInput the pipeline's first step is FAILED_PRECONDITION.
  auto session = MonitoredTrainingSession(std::move(mts));
  REQUIRE(session.ok());
  auto run = (*session)->run({"train_op"});
  CHECK(absl::IsFailedPrecondition(run.status()));
  CHECK(absl::StrContains(run.status().message(), "call StartInput(session) before the first run"));
  CHECK(absl::IsFailedPrecondition((*session)->close()));

  // The gathered path adds the hook that frees the device's copies at end().
  auto gathered = Job(TinyOptions(tmp / "g", MlpJobInput::kGatherOnDevice));
  names.clear();
  for (const auto& hook : gathered->SessionOptions().hooks) names.push_back(hook->name());
  CHECK(names == std::vector<std::string>{"NanTensorHook", "ProgressHook", "EvalHook", "DeviceExamplesHook"});
  // No directory: no evaluation hook.
  auto nowhere = Job(TinyOptions(""));
  CHECK(nowhere->SessionOptions().checkpoint_dir.empty());
  for (const auto& hook : nowhere->SessionOptions().hooks) CHECK(hook->name() != "EvalHook");
  // A cluster chief whose cluster has an evaluator task: the evaluator is
  // eval/'s one writer, the chief has no evaluation hook (and no result).
  MlpJobOptions with_evaluator = TinyOptions(tmp / "chief");
  with_evaluator.input = MlpJobInput::kOnTrainingThread;
  with_evaluator.cluster = MlpJobClusterTask{0, /*is_chief=*/true, /*has_evaluator=*/true};
  auto chief = Job(std::move(with_evaluator));
  CHECK(chief->SessionOptions().checkpoint_dir == tmp / "chief");
  for (const auto& hook : chief->SessionOptions().hooks) CHECK(hook->name() != "EvalHook");
  CHECK_FALSE(chief->result().eval.has_value());
}

TEST_CASE("wrap_step wraps the job's step: its fetches are answered before the job's; fetched without training "
          "through the raw session") {
  TempDir tmp;
  MlpJobOptions o = TinyOptions(tmp / "wrap", MlpJobInput::kOnTrainingThread);
  auto calls = std::make_shared<int>(0);
  o.wrap_step = [calls](StepFn step) -> StepFn {
    return [calls, step = std::move(step)](StepContext& ctx) -> Status {
      ++*calls;
      if (ctx.requested("probe")) {
        ctx.Set("probe", Tensor::Scalar<int64_t>(42));
        return absl::OkStatus();
      }
      return step(ctx);
    };
  };
  auto job = Job(std::move(o));
  auto session = MonitoredTrainingSession(job->SessionOptions());
  REQUIRE(session.ok());
  // A run without train_op goes through run_step_fn's raw session (no
  // hooks: NanTensorHook and the progress hook read a training run's loss).
  CHECK(absl::IsNotFound((*session)->run({"probe"}).status()));
  CHECK(absl::IsNotFound((*session)->close()));
  auto fresh = MonitoredTrainingSession(job->SessionOptions());
  REQUIRE(fresh.ok());
  session = std::move(fresh);
  int64_t answered = 0;
  REQUIRE((*session)
              ->run_step_fn([&](MonitoredStepContext& step) -> Status {
                FOREMAN_ASSIGN_OR_RETURN(TensorMap out, step.session()->Run({"probe"}));
                answered = out.at("probe").scalar<int64_t>().value();
                return absl::OkStatus();
              })
              .ok());
  CHECK(answered == 42);
  REQUIRE((*session)->run({"train_op"}).ok());
  CHECK(*calls == 3);
  REQUIRE((*session)->close().ok());
}

TEST_CASE("Create refuses data that does not fit and gathering on a cluster task, naming what") {
  MlpJobOptions empty = TinyOptions("");
  empty.data.train = data::LabeledImages{Tensor(DataType::kUInt8, {0, 6, 6}), Tensor(DataType::kUInt8, {0})};
  auto no_data = MlpJob::Create(std::move(empty));
  CHECK(absl::IsInvalidArgument(no_data.status()));
  CHECK_MESSAGE(absl::StartsWith(no_data.status().message(), "bad training data in tiny: "), no_data.status().message());

  MlpJobOptions floats = TinyOptions("");
  floats.data.test.images = Tensor(DataType::kFloat, {120, 6, 6});
  auto bad_test = MlpJob::Create(std::move(floats));
  CHECK(absl::IsInvalidArgument(bad_test.status()));
  CHECK_MESSAGE(absl::StartsWith(bad_test.status().message(), "bad test data in tiny: "), bad_test.status().message());

  MlpJobOptions cluster = TinyOptions("", MlpJobInput::kGatherOnDevice);
  cluster.cluster = MlpJobClusterTask{0, true};
  auto gathered = MlpJob::Create(std::move(cluster));
  CHECK(absl::IsInvalidArgument(gathered.status()));
}

TEST_CASE("ResolveMlpJobDevice: cpu is the CPU; auto says what it chose; a gpu:N that cannot be used is refused") {
  MlpJobSettings s;
  s.device = "cpu";
  auto cpu = ResolveMlpJobDevice(s);
  REQUIRE(cpu.ok());
  CHECK(cpu->device == "/cpu:0");
  CHECK(cpu->note.empty());
  s.device = "auto";
  auto automatic = ResolveMlpJobDevice(s);
  REQUIRE_MESSAGE(automatic.ok(), automatic.status().ToString());
  CHECK(absl::StartsWith(automatic->note, "--device auto: "));
  CHECK((automatic->device == "/cpu:0") == absl::EndsWith(automatic->note, "training on the CPU"));
  s.device = "gpu:1000";  // no machine has it
  auto missing = ResolveMlpJobDevice(s);
  CHECK(absl::IsFailedPrecondition(missing.status()));
  CHECK_MESSAGE(absl::StrContains(missing.status().message(), "SessionConfig.device '/gpu:1000'"),
                missing.status().ToString());
  s.device = "tpu";
  CHECK(absl::IsInvalidArgument(ResolveMlpJobDevice(s).status()));
}

TEST_CASE("a cluster task's step computes gradients and the ps tasks apply them (StepContext::ApplyGradients); "
          "the chief's checkpoints carry its own data position; the chief's end ends a worker's run") {
  TempDir tmp;
  const std::string dir = tmp / "chief";
  MlpJobOptions chief_options = TinyOptions(dir, MlpJobInput::kOnTrainingThread);
  chief_options.cluster = MlpJobClusterTask{0, true};
  MlpJobOptions worker_options = TinyOptions("", MlpJobInput::kOnTrainingThread);
  worker_options.cluster = MlpJobClusterTask{1, false};
  auto chief_job = Job(std::move(chief_options));
  auto worker_job = Job(std::move(worker_options));
  testing::FakeCluster cluster("mlp_job", 2, chief_job->plan().optimizer);
  for (const auto& job : {chief_job.get(), worker_job.get()}) {
    for (const VariableDef& def : job->graph()->variables()) {
      CAPTURE(def.name);
      CHECK(def.device == (absl::StartsWith(def.name, "input_pipeline/") ? "/job:worker" : ""));
    }
  }
  MonitoredTrainingSessionOptions chief_mts = chief_job->SessionOptions();
  chief_mts.master = cluster.target("chief");
  CHECK(chief_mts.is_chief);
  MonitoredTrainingSessionOptions worker_mts = worker_job->SessionOptions();
  worker_mts.master = cluster.target("worker1");
  CHECK_FALSE(worker_mts.is_chief);
  CHECK(worker_mts.checkpoint_dir.empty());
  for (const auto& hook : worker_mts.hooks) CHECK(hook->name() != "EvalHook");
  auto chief = MonitoredTrainingSession(std::move(chief_mts));
  REQUIRE_MESSAGE(chief.ok(), chief.status().ToString());
  auto worker = MonitoredTrainingSession(std::move(worker_mts));
  REQUIRE_MESSAGE(worker.ok(), worker.status().ToString());
  const Tensor initial = cluster.ps().Value("dense/kernel").value();
  for (int i = 0; i < 3; ++i) REQUIRE((*chief)->run({"train_op"}).ok());
  for (int i = 0; i < 2; ++i) REQUIRE((*worker)->run({"train_op"}).ok());
  CHECK(testing::Int(cluster.ps().Value("global_step").value()) == 5);
  CHECK(cluster.ps().applied_at().size() == 5);
  CHECK_FALSE(cluster.ps().Value("dense/kernel")->Equals(initial));
  CHECK(chief_job->result().local_steps == 3);
  CHECK(worker_job->result().local_steps == 2);
  CHECK(worker_job->result().examples == 200);

  cluster.ps().EndTraining();
  auto ended = (*worker)->run({"train_op"});
  CHECK(absl::IsOutOfRange(ended.status()));
  CHECK(worker_job->result().ended_by_chief);
  CHECK((*worker)->close().ok());
  CHECK_FALSE(chief_job->result().ended_by_chief);
  REQUIRE((*chief)->close().ok());  // end(): the final checkpoint and evaluation, read from the ps
  auto latest = LatestCheckpoint(Env::Default(), dir);
  REQUIRE(latest.ok());
  REQUIRE(latest->has_value());
  auto reader = BundleReader::Open(Env::Default(), **latest);
  REQUIRE(reader.ok());
  CHECK(testing::Int((*reader)->Lookup("global_step").value()) == 5);
  CHECK(testing::Int((*reader)->Lookup("input_pipeline/index").value()) == 300);
  CHECK(testing::Int((*reader)->Lookup("input_pipeline/epoch").value()) == 0);
  REQUIRE(chief_job->result().eval.has_value());
  CHECK(chief_job->result().eval->global_step == 5);
}

TEST_CASE("ClusterStepsForEpochs: ceil(epochs x examples / batch) global steps, 0 without a limit") {
  CHECK(ClusterStepsForEpochs(2, 450, 100) == 9);      // one process: 2 x ceil(450 / 100) = 10
  CHECK(ClusterStepsForEpochs(1, 60000, 128) == 469);  // issue 31's "step 800/469"
  CHECK(ClusterStepsForEpochs(3, 60000, 500) == 360);
  CHECK(ClusterStepsForEpochs(1, 1, 100) == 1);
  CHECK(ClusterStepsForEpochs(0, 60000, 128) == 0);
  CHECK(ClusterStepsForEpochs(2, 0, 128) == 0);
  CHECK(ClusterStepsForEpochs(2, 60000, 0) == 0);
  // No overflow of epochs x examples.
  CHECK(ClusterStepsForEpochs(int64_t{1} << 40, int64_t{3} << 20, int64_t{1} << 20) == int64_t{3} << 40);
}

// Issue 31 point 5: the other workers' updates carry global_step past a
// multiple between two of the chief's runs; "(step + 1) % N == 0" then
// skipped it (a cluster's --eval-every-steps 500 evaluated at 1000, 1501,
// 3502, 5002 only).
TEST_CASE("a cluster chief evaluates at its first step at or past each multiple, once for the multiples one step "
          "passed; progress counts the cluster's global_step to the cluster's end of --epochs") {
  TempDir tmp;
  const std::string dir = tmp / "chief";
  MlpJobOptions chief_options = TinyOptions(dir, MlpJobInput::kOnTrainingThread);
  chief_options.cluster = MlpJobClusterTask{0, true};
  chief_options.settings.eval_every_steps = 3;
  chief_options.settings.epochs = 6;  // ClusterStepsForEpochs(6, 450, 100) = 27 global steps
  auto recorder = std::make_shared<Recorder>();
  chief_options.observer = recorder;
  MlpJobOptions worker_options = TinyOptions("", MlpJobInput::kOnTrainingThread);
  worker_options.cluster = MlpJobClusterTask{1, false};
  worker_options.settings.epochs = 6;
  auto chief_job = Job(std::move(chief_options));
  auto worker_job = Job(std::move(worker_options));
  CHECK(chief_job->total_steps() == 27);
  CHECK(worker_job->total_steps() == 27);
  testing::FakeCluster cluster("mlp_job_cadence", 1, chief_job->plan().optimizer);
  MonitoredTrainingSessionOptions chief_mts = chief_job->SessionOptions();
  chief_mts.master = cluster.target("chief");
  MonitoredTrainingSessionOptions worker_mts = worker_job->SessionOptions();
  worker_mts.master = cluster.target("worker1");
  auto chief = MonitoredTrainingSession(std::move(chief_mts));
  REQUIRE_MESSAGE(chief.ok(), chief.status().ToString());
  auto worker = MonitoredTrainingSession(std::move(worker_mts));
  REQUIRE_MESSAGE(worker.ok(), worker.status().ToString());
  // The chief's runs, with the worker's updates between them.
  auto chief_step = [&] { REQUIRE((*chief)->run({"train_op"}).ok()); };
  auto worker_steps = [&](int n) {
    for (int i = 0; i < n; ++i) REQUIRE((*worker)->run({"train_op"}).ok());
  };
  chief_step();      // 1
  worker_steps(2);   // 2, 3
  chief_step();      // 4: passed 3
  worker_steps(3);   // 5, 6, 7
  chief_step();      // 8: passed 6
  chief_step();      // 9: on 9
  worker_steps(4);   // 10 .. 13
  chief_step();      // 14: passed 12
  chief_step();      // 15: on 15
  worker_steps(6);   // 16 .. 21
  chief_step();      // 22: passed 18 and 21, one evaluation
  chief_step();      // 23
  std::vector<int64_t> steps;
  for (const MlpJobProgress& p : recorder->steps) {
    steps.push_back(p.global_step);
    CHECK(p.total_steps == 27);
  }
  CHECK(steps == std::vector<int64_t>{1, 4, 8, 9, 14, 15, 22, 23});
  std::vector<int64_t> evals;
  for (const MlpJobEval& e : recorder->evals) evals.push_back(e.global_step);
  CHECK(evals == std::vector<int64_t>{4, 8, 9, 14, 15, 22});
  // The cluster's end of --epochs: the worker's StopAtStepHook at 27.
  worker_steps(3);  // 24 .. 26
  CHECK_FALSE((*worker)->should_stop());
  worker_steps(1);  // 27
  CHECK((*worker)->should_stop());
  CHECK(testing::Int(cluster.ps().Value("global_step").value()) == 27);
  CHECK((*worker)->close().ok());
  cluster.ps().EndTraining();
  REQUIRE((*chief)->close().ok());  // end(): the final evaluation, at 27
  REQUIRE(chief_job->result().eval.has_value());
  CHECK(chief_job->result().eval->global_step == 27);
  CHECK(testing::SummarySteps(testing::Events(dir + "/eval"), "accuracy") ==
        std::vector<int64_t>{4, 8, 9, 14, 15, 22, 27});
}

}  // namespace
}  // namespace foreman
