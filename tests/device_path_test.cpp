// The main job's path on a device without host memory, one source for both
// devices: the fake device (tests/support/fake_device.hpp, the `unit` suite)
// and, with --device=/gpu:0, the CUDA device (the `gpu` suite, one process
// per case; exits 77 where no CUDA device is seen, as every gpu test does).
//
// What runs here is what `foreman train --device gpu:0` runs: the Mlp's
// step by indices (captured once per batch size and replayed), variables
// resident on the device and copied back, checkpoints through
// internal::SnapshotInto (one batched copy into page-locked buffers: the
// CUDA device refuses any other host memory), round trips device -> CPU ->
// device, a recovery onto a new device, and NanTensorHook's stop. Two runs
// on the device with the same seed must be bitwise the same; against the
// CPU device the results agree within float32 rounding (the fake device
// runs the baseline kernels, the CPU job the best this CPU has; the GPU's
// softmax uses CUDA's expf/logf), kTolerance below.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compute/cpu_device.hpp"
#include "compute/device_factory.hpp"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/cuda.hpp"
#include "foreman/dataset.hpp"
#include "foreman/graph.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/nn.hpp"
#include "support/checkpoint_checks.hpp"
#include "support/events.hpp"
#include "support/fake_device.hpp"
#include "support/test_util.hpp"
#include "support/tiny_mnist.hpp"

namespace foreman {
namespace {

using testing::ReadCheckpoint;
using testing::TempDir;

// The device under test: "/fake:0" (the default) or what --device= names.
std::string g_device = "/fake:0";  // NOLINT: set once by main before any test
bool OnGpu() { return absl::StartsWith(g_device, "/gpu:"); }
// Cases that started (main fails a run whose filter matched none).
int g_cases_started = 0;  // NOLINT: the test thread's only

// How far the device's float32 results may be from the CPU device's after
// the steps below: a loss or an accuracy by kTolerance, a variable by
// kTolerance in relative L2 norm (docs/gpu.md's bound: Adam can turn a
// rounding difference in a near-zero gradient into a whole step of one
// weight, so an element-wise bound would be the wrong test).
constexpr float kTolerance = 1e-3f;

template <class T>
T Value(StatusOr<T> v) {
  REQUIRE_MESSAGE(v.ok(), v.status().ToString());
  return *std::move(v);
}

// The fake device runs asynchronously, as CUDA does (work queued until the
// host waits): the job takes its pipelined path on both.
testing::FakeDevice::Options FakeOptions() {
  testing::FakeDevice::Options o;
  o.asynchronous = true;
  return o;
}

std::unique_ptr<compute::Device> NewDevice() {
  if (!OnGpu()) return std::make_unique<testing::FakeDevice>(FakeOptions());
  return Value(compute::CreateDevice(g_device, 1));
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Within kTolerance, or bitwise when `bitwise`.
void CheckClose(float got, float want, bool bitwise, const char* what) {
  if (bitwise) {
    CHECK_MESSAGE(SameBits(got, want), what << ": " << got << ", want bitwise " << want);
  } else {
    CHECK_MESSAGE(std::fabs(got - want) <= kTolerance, what << ": " << got << ", want " << want << " within "
                                                               << kTolerance);
  }
}

// Every variable of `expected` in `actual`: float32 finite and within
// kTolerance in relative L2 norm (or bitwise), anything else bitwise.
void CheckVariables(const std::map<std::string, Tensor>& expected, const std::map<std::string, Tensor>& actual,
                    bool bitwise) {
  REQUIRE(expected.size() == actual.size());
  for (const auto& [name, e] : expected) {
    CAPTURE(name);
    REQUIRE(actual.count(name) == 1);
    const Tensor& a = actual.at(name);
    REQUIRE(a.dtype() == e.dtype());
    REQUIRE(a.shape() == e.shape());
    if (bitwise || e.dtype() != DataType::kFloat) {
      CHECK(std::memcmp(a.raw_data(), e.raw_data(), e.TotalBytes()) == 0);
      continue;
    }
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < e.num_elements(); ++i) {
      REQUIRE(std::isfinite(a.data<float>()[i]));
      const double d = static_cast<double>(a.data<float>()[i]) - e.data<float>()[i];
      diff += d * d;
      norm += static_cast<double>(e.data<float>()[i]) * e.data<float>()[i];
    }
    // Relative to the tensor's norm where it is above 1, else absolute (biases near 0).
    const double relative = std::sqrt(diff) / std::max(std::sqrt(norm), 1.0);
    CHECK_MESSAGE(relative <= kTolerance, "relative L2 difference " << relative);
  }
}

// Every variable's value, a newer device value copied back first.
std::map<std::string, Tensor> Snapshot(const VariableStore& vars) { return Value(vars.SnapshotOrError()); }

// -- The Mlp's step by indices ----------------------------------------------------------

constexpr int kClasses = 3;
const nn::MlpSpec kSpec{16, {8, 6}, kClasses};

std::unique_ptr<VariableStore> NewStore(const nn::OptimizerOptions& opt) {
  Graph graph;
  REQUIRE_OK(nn::AddMlpVariables(graph, kSpec, opt, 3));
  auto vars = std::make_unique<VariableStore>();
  for (const VariableDef& def : graph.variables()) {
    REQUIRE_OK(vars->Create(def.name, Value(def.initializer()), def.trainable));
  }
  return vars;
}

// 100 images of 4x4 pixels, labels in [0, 3), pixels that depend on the label.
data::LabeledImages Images() {
  const int64_t n = 100;
  data::LabeledImages d{Tensor(DataType::kUInt8, TensorShape{n, 4, 4}), Tensor(DataType::kUInt8, TensorShape{n})};
  uint32_t x = 12345;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return x >> 24;
  };
  for (int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<uint8_t>(next() % kClasses);
    d.labels.data<uint8_t>()[i] = label;
    for (int p = 0; p < 16; ++p) {
      d.images.data<uint8_t>()[i * 16 + p] = static_cast<uint8_t>((next() + (p % 3 == label) * 128) & 0xff);
    }
  }
  return d;
}

// Two epochs in batches of 32 (the last of each epoch holds 4: two batch
// sizes, two captured steps), a learning rate that changes every step
// (read at replay); by indices on `examples`, or on the gathered Tensors
// when `examples` is null. `pipelined`: as the job on an asynchronous
// device, each step launched (LaunchTrainStep) and finished only after the
// next step's learning rate is set and its indices are read, just before
// the next launch. The steps' results.
std::vector<nn::StepResult> Train(const nn::OptimizerOptions& opt, VariableStore& vars, compute::Device& device,
                                  const nn::DeviceExamples* examples, const data::Dataset& dataset,
                                  bool pipelined = false) {
  auto mlp = Value(nn::Mlp::Create(kSpec, opt));
  std::vector<nn::StepResult> results;
  data::DatasetPosition pos;
  for (int step = 0; pos.epoch < 2; ++step) {
    REQUIRE_OK(mlp->set_learning_rate(opt.learning_rate * std::pow(0.9f, static_cast<float>(step))));
    data::Batch batch = Value(dataset.GetBatch(pos));
    const int64_t rows = batch.labels.shape().dim(0);
    if (examples == nullptr) {
      results.push_back(Value(mlp->TrainStep(vars, batch.features, batch.labels, device)));
    } else if (!pipelined) {
      const std::vector<int32_t>& order = *dataset.Order(pos.epoch);
      results.push_back(Value(mlp->TrainStep(vars, *examples, order.data() + pos.index, rows, device)));
    } else {
      std::vector<int32_t> indices(*dataset.Order(pos.epoch));  // reused below: the launch copied its rows
      if (mlp->train_step_pending()) results.push_back(Value(mlp->FinishTrainStep()));
      REQUIRE_OK(mlp->LaunchTrainStep(vars, *examples, indices.data() + pos.index, rows, device));
      std::fill(indices.begin(), indices.end(), -1);
      CHECK(mlp->train_step_pending());
      // One step in flight at a time: the buffers hold one step's values.
      // Other indices and another learning rate: a refused launch must not
      // have written them over the pending step's (its results are checked).
      const float rate = opt.learning_rate * std::pow(0.9f, static_cast<float>(step));
      REQUIRE_OK(mlp->set_learning_rate(rate * 3));
      const std::vector<int32_t>& order = *dataset.Order(pos.epoch);
      CHECK(mlp->LaunchTrainStep(vars, *examples, order.data() + (order.size() - rows), rows, device).code() ==
            absl::StatusCode::kFailedPrecondition);
      REQUIRE_OK(mlp->set_learning_rate(rate));
    }
    pos = batch.next;
  }
  if (pipelined) {
    results.push_back(Value(mlp->FinishTrainStep()));
    CHECK_FALSE(mlp->train_step_pending());
    CHECK(mlp->FinishTrainStep().status().code() == absl::StatusCode::kFailedPrecondition);
  }
  mlp->ReleaseDevice(device);
  return results;
}

TEST_CASE("the Mlp's step by indices over two batch sizes: the CPU's results, bitwise the same in two runs, one pipelined" *
          doctest::test_suite("step")) {
  ++g_cases_started;
  const data::LabeledImages images = Images();
  data::DatasetOptions dopt;
  dopt.batch_size = 32;
  dopt.seed = 11;
  auto dataset = Value(data::Dataset::Create(images, dopt));
  for (nn::OptimizerKind kind : {nn::OptimizerKind::kSgd, nn::OptimizerKind::kMomentum, nn::OptimizerKind::kAdam}) {
    nn::OptimizerOptions opt;
    opt.kind = kind;
    opt.learning_rate = kind == nn::OptimizerKind::kAdam ? 0.01f : 0.1f;
    CAPTURE(static_cast<int>(kind));
    compute::CpuDevice cpu(1, compute::CpuIsa::kBaseline);
    auto ref_vars = NewStore(opt);
    const std::vector<nn::StepResult> ref = Train(opt, *ref_vars, cpu, nullptr, *dataset);
    REQUIRE(ref.size() == 8);

    std::vector<nn::StepResult> first;
    std::map<std::string, Tensor> first_vars;
    for (int run = 0; run < 2; ++run) {
      CAPTURE(run);
      auto device = NewDevice();
      auto vars = NewStore(opt);
      std::vector<nn::StepResult> got;
      {
        auto examples = Value(nn::DeviceExamples::Upload(images.images, images.labels, *device));
        // Run 1 pipelines its steps (the job's path on an asynchronous device).
        got = Train(opt, *vars, *device, examples.get(), *dataset, /*pipelined=*/run == 1);
      }
      REQUIRE(got.size() == ref.size());
      // The fake device runs the CPU's baseline kernels: bitwise; the GPU
      // within rounding (an accuracy by at most one example of the batch).
      for (std::size_t i = 0; i < ref.size(); ++i) {
        CAPTURE(i);
        CheckClose(got[i].loss, ref[i].loss, !OnGpu(), "loss");
        if (OnGpu()) {
          const float rows = i % 4 == 3 ? 4.0f : 32.0f;
          CHECK(std::fabs(got[i].accuracy - ref[i].accuracy) <= 1.5f / rows);
        } else {
          CHECK(SameBits(got[i].accuracy, ref[i].accuracy));
        }
      }
      // The device holds the newer values. Run 0 reads them through the
      // store's snapshot (a copy back per variable), then releases the device;
      // run 1 releases first, so that ReleaseDevice's own copy back is
      // what the host then holds.
      std::map<std::string, Tensor> resident;
      if (run == 0) {
        resident = Snapshot(*vars);
        REQUIRE_OK(vars->ReleaseDevice(*device));
        CheckVariables(resident, Snapshot(*vars), /*bitwise=*/true);
      } else {
        REQUIRE_OK(vars->ReleaseDevice(*device));
        resident = Snapshot(*vars);
      }
      CheckVariables(Snapshot(*ref_vars), resident, !OnGpu());
      if (run == 0) {
        first = got;
        first_vars = resident;
      } else {
        for (std::size_t i = 0; i < got.size(); ++i) {
          CAPTURE(i);
          CHECK(SameBits(got[i].loss, first[i].loss));
          CHECK(SameBits(got[i].accuracy, first[i].accuracy));
        }
        CheckVariables(first_vars, resident, /*bitwise=*/true);
      }
    }
  }
}

// -- The job ------------------------------------------------------------------------------

// The fake device's factory for "/fake:N" while a test runs (the GPU needs none).
struct DeviceScope {
  DeviceScope() {
    ++g_cases_started;
    if (!OnGpu()) {
      compute::SetFakeDeviceFactoryForTesting(
          testing::FakeDeviceFactory(nullptr, /*capture=*/true, /*asynchronous=*/true));
    }
  }
  ~DeviceScope() { compute::SetFakeDeviceFactoryForTesting(nullptr); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
};

// 2 epochs of 5 batches of 100 (the last of each a remainder of 50): 10
// steps, a checkpoint every 2, evaluations at 5 and 10.
MlpJobOptions JobOptions(const std::string& dir, const std::string& device) {
  MlpJobOptions o;
  o.settings.checkpoint_dir = dir;
  o.settings.data_dir = "tiny";
  o.settings.hidden = "8";
  o.settings.batch_size = 100;
  o.settings.epochs = 2;
  o.settings.threads = 1;
  o.settings.seed = 5;
  o.settings.eval_every_steps = 5;
  o.settings.save_checkpoint_steps = 2;
  // The flag's value (the fake device has none: the session's device below).
  o.settings.device = absl::StartsWith(device, "/gpu:") ? device.substr(1) : "cpu";
  o.settings.log_step_count_steps = 0;
  o.data = testing::TinyData();
  o.device = device;
  // The CPU job gathers its batches too: the same batches as the device's.
  o.input = MlpJobInput::kGatherOnDevice;
  return o;
}

struct Run {
  Status closed;
  MlpJobResult result;
  int64_t runs_ok = 0;  // runs that returned OK
};

// The job's session from its checkpoint directory to its end, with `listener`
// (when set) among the checkpoint listeners; with max_runs >= 0, close()
// after that many runs, as a stop requested then would.
Run TrainJob(MlpJobOptions options, std::shared_ptr<CheckpointSaverListener> listener = nullptr,
             int64_t max_runs = -1) {
  auto job = Value(MlpJob::Create(std::move(options)));
  MonitoredTrainingSessionOptions mts = job->SessionOptions();
  if (listener != nullptr) mts.checkpoint_listeners.push_back(std::move(listener));
  mts.recovery.initial_backoff = absl::Milliseconds(1);
  mts.recovery.max_backoff = absl::Milliseconds(1);
  auto session = MonitoredTrainingSession(std::move(mts));
  REQUIRE_MESSAGE(session.ok(), session.status().ToString());
  REQUIRE_OK(job->StartInput(**session));
  Run run;
  while (!(*session)->should_stop() && run.runs_ok != max_runs) {
    if (!(*session)->run({"train_op"}).ok()) break;
    ++run.runs_ok;
  }
  run.closed = (*session)->close();
  run.result = job->result();
  return run;
}

std::string Ckpt(const std::string& dir, int64_t step) { return absl::StrCat(dir, "/model.ckpt-", step); }

TEST_CASE("the job on the device: the CPU's weights and evaluation; two runs bitwise the same checkpoints" *
          doctest::test_suite("job")) {
  DeviceScope scope;
  TempDir tmp;
  const Run cpu = TrainJob(JobOptions(tmp / "cpu", "/cpu:0"));
  REQUIRE_OK(cpu.closed);
  std::vector<Run> runs;
  for (const char* name : {"a", "b"}) {
    runs.push_back(TrainJob(JobOptions(tmp / name, g_device)));
    REQUIRE_OK(runs.back().closed);
    CHECK(runs.back().result.local_steps == 10);
    CHECK(runs.back().result.examples == 900);
    REQUIRE(runs.back().result.eval.has_value());
    CHECK(runs.back().result.eval->global_step == 10);
  }
  // Every checkpoint (saved through SnapshotInto from the device) is the
  // CPU's within rounding, and the two device runs' are bitwise equal.
  for (int64_t step = 2; step <= 10; step += 2) {
    CAPTURE(step);
    const auto a = ReadCheckpoint(Ckpt(tmp / "a", step));
    CHECK(a.at(kGlobalStepName).scalar<int64_t>().value() == step);
    CheckVariables(ReadCheckpoint(Ckpt(tmp / "cpu", step)), a, /*bitwise=*/false);
    CheckVariables(a, ReadCheckpoint(Ckpt(tmp / "b", step)), /*bitwise=*/true);
  }
  REQUIRE(cpu.result.eval.has_value());
  // At most one of the 120 test examples classified otherwise.
  CHECK(std::fabs(runs[0].result.eval->accuracy - cpu.result.eval->accuracy) <= 1.5f / 120);
  CheckClose(runs[0].result.eval->loss, cpu.result.eval->loss, false, "eval loss");
  CHECK(SameBits(runs[0].result.eval->accuracy, runs[1].result.eval->accuracy));
  CHECK(SameBits(runs[0].result.eval->loss, runs[1].result.eval->loss));
}

TEST_CASE("device -> CPU -> device: each leg restores the last one's checkpoint bitwise and goes on from its step" *
          doctest::test_suite("moves")) {
  DeviceScope scope;
  TempDir tmp;
  const Run whole = TrainJob(JobOptions(tmp / "whole", g_device));
  REQUIRE_OK(whole.closed);
  const std::string dir = tmp / "legs";
  const struct {
    const char* device;
    int64_t last_step;
  } legs[] = {{g_device.c_str(), 4}, {"/cpu:0", 7}, {g_device.c_str(), 10}};
  int64_t from = 0;
  for (const auto& leg : legs) {
    CAPTURE(leg.device);
    MlpJobOptions o = JobOptions(dir, leg.device);
    o.settings.max_steps = leg.last_step;
    // What the leg restores, read before it runs (its own saves come after).
    std::map<std::string, Tensor> restored;
    if (from > 0) restored = ReadCheckpoint(Ckpt(dir, from));
    const Run run = TrainJob(std::move(o));
    REQUIRE_OK(run.closed);
    CHECK(run.result.steps_trained == leg.last_step - from);
    const auto saved = ReadCheckpoint(Ckpt(dir, leg.last_step));
    CHECK(saved.at(kGlobalStepName).scalar<int64_t>().value() == leg.last_step);
    if (from > 0) {
      // The restored checkpoint is still there, untouched, and the leg's
      // first step trained from it: its next save differs from it.
      CheckVariables(restored, ReadCheckpoint(Ckpt(dir, from)), /*bitwise=*/true);
      CHECK(std::memcmp(saved.at("dense/kernel").raw_data(), restored.at("dense/kernel").raw_data(),
                        restored.at("dense/kernel").TotalBytes()) != 0);
    }
    from = leg.last_step;
  }
  // The first leg ran on the device as the whole run did: bitwise its step 4.
  CheckVariables(ReadCheckpoint(Ckpt(tmp / "whole", 4)), ReadCheckpoint(Ckpt(dir, 4)), /*bitwise=*/true);
  // Where the CPU leg trained, the result is the whole run's within rounding.
  CheckVariables(ReadCheckpoint(Ckpt(tmp / "whole", 10)), ReadCheckpoint(Ckpt(dir, 10)), /*bitwise=*/false);
}

TEST_CASE("a recovery on the device restores the checkpoint on a new device and ends bitwise with an unbroken run" *
          doctest::test_suite("recovery")) {
  DeviceScope scope;
  TempDir tmp;
  const Run whole = TrainJob(JobOptions(tmp / "whole", g_device));
  REQUIRE_OK(whole.closed);
  MlpJobOptions o = JobOptions(tmp / "recovered", g_device);
  auto failed = std::make_shared<bool>(false);
  o.wrap_step = [failed](StepFn step) -> StepFn {
    return [failed, step = std::move(step)](StepContext& ctx) -> Status {
      if (ctx.requested("train_op") && !*failed) {
        FOREMAN_ASSIGN_OR_RETURN(int64_t global_step, GetGlobalStep(ctx.variables()));
        if (global_step == 5) {  // past the checkpoint of step 4
          *failed = true;
          return absl::UnavailableError("injected preemption at global_step 5");
        }
      }
      return step(ctx);
    };
  };
  const Run run = TrainJob(std::move(o));
  REQUIRE_OK(run.closed);
  CHECK(*failed);
  // Restored at 4 (the step to 5 lost): 5 runs, then 6 from the checkpoint.
  CHECK(run.result.local_steps == 11);
  CHECK(run.result.steps_trained == 10);
  for (int64_t step : {4, 6, 10}) {
    CAPTURE(step);
    CheckVariables(ReadCheckpoint(Ckpt(tmp / "whole", step)), ReadCheckpoint(Ckpt(tmp / "recovered", step)),
                   /*bitwise=*/true);
  }
}

// Hears every step's progress (the batch's loss before its update).
struct Losses : MlpJobObserver {
  std::vector<MlpJobProgress> steps;
  void OnStep(const MlpJobProgress& p) override { steps.push_back(p); }
};

// The global_step of every save CheckpointSaverHook starts.
struct Saves : CheckpointSaverListener {
  std::vector<int64_t> steps;
  Status before_save(Session* /*session*/, int64_t global_step) override {
    steps.push_back(global_step);
    return absl::OkStatus();
  }
};

// The job of JobOptions with a learning rate that makes a step's loss NaN
// within a few steps (plain SGD: no Adam normalisation to tame it).
MlpJobOptions DivergingJobOptions(const std::string& dir) {
  MlpJobOptions o = JobOptions(dir, g_device);
  o.settings.optimizer = "sgd";
  o.settings.learning_rate = 1e30;
  return o;
}

TEST_CASE("a NaN loss on the device ends the run at the step that produced it; no checkpoint after it" *
          doctest::test_suite("nan")) {
  DeviceScope scope;
  TempDir tmp;
  MlpJobOptions o = DivergingJobOptions(tmp / "nan");
  o.settings.save_checkpoint_steps = 1;
  auto losses = std::make_shared<Losses>();
  o.observer = losses;
  auto saves = std::make_shared<Saves>();
  const Run run = TrainJob(std::move(o), saves);
  CHECK_MESSAGE(IsNanLossDuringTraining(run.closed), run.closed.ToString());
  // Step N, whose batch loss (computed on step N - 1's weights) is NaN, is
  // the last that ran. Pipelined (docs/gpu.md "Statistics one step late"),
  // run N reports step N - 1's statistics while step N runs, and run N + 1
  // finds step N's NaN before it launches anything: the session ends at
  // global_step N, as NanTensorHook's after_run of run N does on the CPU.
  // So every run up to N reported a loss that is not NaN (run N's being
  // step N - 1's), and none after it trained.
  const int64_t nan_step = run.result.local_steps;
  REQUIRE(nan_step >= 2);
  CHECK(nan_step < 10);
  CHECK(run.runs_ok == nan_step);
  REQUIRE(losses->steps.size() == static_cast<std::size_t>(nan_step));
  for (std::size_t i = 0; i < losses->steps.size(); ++i) {
    CHECK(losses->steps[i].global_step == static_cast<int64_t>(i) + 1);
    CHECK_FALSE(std::isnan(losses->steps[i].loss));
  }
  // CheckpointSaverHook's after_run of run N, due every step here, saved
  // step N before the NaN was seen, as on the CPU (the chief's hook order,
  // B12, puts it before NanTensorHook); nothing after it, and no final save
  // at close (a failed run's close runs no end(), B39).
  std::vector<int64_t> want;
  for (int64_t step = 0; step <= nan_step; ++step) want.push_back(step);
  CHECK(saves->steps == want);
  auto latest = Value(LatestCheckpoint(Env::Default(), tmp / "nan"));
  REQUIRE(latest.has_value());
  CHECK(*latest == Ckpt(tmp / "nan", nan_step));
  // The weights that produced the NaN (step N - 1's) hold no NaN themselves.
  for (const auto& [name, t] : ReadCheckpoint(Ckpt(tmp / "nan", nan_step - 1))) {
    CAPTURE(name);
    if (t.dtype() != DataType::kFloat) continue;
    for (int64_t i = 0; i < t.num_elements(); ++i) REQUIRE(!std::isnan(t.data<float>()[i]));
  }

  // With an evaluation due at every step, the run that would evaluate the
  // diverged weights of step N fails first, as NanTensorHook's after_run
  // does before EvalHook's on the CPU: <dir>/eval holds steps before N only.
  MlpJobOptions every = DivergingJobOptions(tmp / "eval");
  every.settings.eval_every_steps = 1;
  const Run evaluated = TrainJob(std::move(every));
  CHECK_MESSAGE(IsNanLossDuringTraining(evaluated.closed), evaluated.closed.ToString());
  CHECK(evaluated.result.local_steps == nan_step);
  std::vector<int64_t> eval_steps;
  for (const Event& e : testing::Events(std::string(tmp / "eval") + "/eval")) {
    if (e.kind == Event::Kind::kSummary) eval_steps.push_back(e.step);
  }
  CHECK_FALSE(eval_steps.empty());
  for (int64_t step : eval_steps) CHECK(step < nan_step);
}

// The steps' statistics of the same job on a device that reads every step's
// own: the fake device run eagerly (bitwise the pipelined fake device's
// math), or on a GPU the CPU device (within rounding).
std::vector<MlpJobProgress> OwnStatistics(MlpJobOptions o) {
  auto losses = std::make_shared<Losses>();
  o.observer = losses;
  if (OnGpu()) {
    o.device = "/cpu:0";
    o.settings.device = "cpu";
  } else {
    compute::SetFakeDeviceFactoryForTesting(testing::FakeDeviceFactory(nullptr, true, /*asynchronous=*/false));
  }
  const Run run = TrainJob(std::move(o));
  if (!OnGpu()) {
    compute::SetFakeDeviceFactoryForTesting(testing::FakeDeviceFactory(nullptr, true, /*asynchronous=*/true));
  }
  REQUIRE_OK(run.closed);
  return losses->steps;
}

TEST_CASE("pipelined, run N reports step N - 1's loss and accuracy; the first run and the last step their own" *
          doctest::test_suite("pipeline")) {
  DeviceScope scope;
  TempDir tmp;
  // The last step: the last batch of the last epoch (10), or StopAtStepHook's (7).
  for (int64_t max_steps : {0, 7}) {
    CAPTURE(max_steps);
    const int64_t last = max_steps > 0 ? max_steps : 10;
    MlpJobOptions o = JobOptions(tmp / absl::StrCat("own", max_steps), g_device);
    o.settings.max_steps = max_steps;
    o.settings.eval_every_steps = 0;  // a run that evaluates reads its own too (the `nan` case)
    const std::vector<MlpJobProgress> own = OwnStatistics(o);
    REQUIRE(own.size() == static_cast<std::size_t>(last));

    o.settings.checkpoint_dir = tmp / absl::StrCat("pipelined", max_steps);
    auto losses = std::make_shared<Losses>();
    o.observer = losses;
    const Run run = TrainJob(std::move(o));
    REQUIRE_OK(run.closed);
    const std::vector<MlpJobProgress>& got = losses->steps;
    REQUIRE(got.size() == own.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i].global_step == static_cast<int64_t>(i) + 1);
      // Run i + 1 reports step i's, but run 1 has no step before it, and the
      // last run waits for its own (the job's final loss is the last step's).
      const std::size_t from = i == 0 || i + 1 == got.size() ? i : i - 1;
      CheckClose(got[i].loss, own[from].loss, !OnGpu(), "loss");
      if (OnGpu()) {
        CHECK(std::fabs(got[i].accuracy - own[from].accuracy) <= 1.5f / 50);
      } else {
        CHECK(SameBits(got[i].accuracy, own[from].accuracy));
      }
    }
    if (!OnGpu()) {
      // Pipelining changes when the host reads, not what the device computes.
      CheckVariables(ReadCheckpoint(Ckpt(tmp / absl::StrCat("own", max_steps), last)),
                     ReadCheckpoint(Ckpt(tmp / absl::StrCat("pipelined", max_steps), last)), /*bitwise=*/true);
    }
  }
}

TEST_CASE("pipelined, a NaN in the step a stop leaves in flight fails close() before the final checkpoint" *
          doctest::test_suite("nan_at_close")) {
  DeviceScope scope;
  TempDir tmp;
  MlpJobOptions o = DivergingJobOptions(tmp / "whole");
  o.settings.save_checkpoint_steps = 1000;  // the first save and the final one only
  // Where the NaN comes (step N), from a run to its end.
  const Run whole = TrainJob(o);
  REQUIRE(IsNanLossDuringTraining(whole.closed));
  const int64_t nan_step = whole.result.local_steps;
  REQUIRE(nan_step >= 2);

  // Run N reports step N - 1's statistics, so it succeeds; a stop then (N
  // runs, then close()) leaves step N's NaN to the job's end() hook, which
  // runs before CheckpointSaverHook's end(): close() fails as NanTensorHook
  // would, and the diverged weights are never saved (B39, B119).
  o.settings.checkpoint_dir = tmp / "stopped";
  auto saves = std::make_shared<Saves>();
  const Run run = TrainJob(o, saves, /*max_runs=*/nan_step);
  CHECK(run.runs_ok == nan_step);
  CHECK_MESSAGE(IsNanLossDuringTraining(run.closed), run.closed.ToString());
  CHECK(saves->steps == std::vector<int64_t>{0});
  auto latest = Value(LatestCheckpoint(Env::Default(), tmp / "stopped"));
  REQUIRE(latest.has_value());
  CHECK(*latest == Ckpt(tmp / "stopped", 0));

  // One run fewer: step N - 1 is finite, the final checkpoint is taken at N - 1.
  o.settings.checkpoint_dir = tmp / "before";
  saves->steps.clear();
  const Run before = TrainJob(o, saves, /*max_runs=*/nan_step - 1);
  REQUIRE_OK(before.closed);
  CHECK(saves->steps == std::vector<int64_t>{0, nan_step - 1});
}

TEST_CASE("the weights' histograms come from the device in one page-locked batch and hold the step's values" *
          doctest::test_suite("histograms")) {
  DeviceScope scope;
  testing::FakeDevice* fake = nullptr;
  if (!OnGpu()) {
    compute::SetFakeDeviceFactoryForTesting(testing::FakeDeviceFactory(&fake, /*capture=*/true, /*asynchronous=*/true));
  }
  TempDir tmp;
  MlpJobOptions o = JobOptions(tmp / "h", g_device);
  o.settings.save_summaries_steps = 2;  // at global_step 1, 3, ..., 9
  o.settings.eval_every_steps = 0;
  // Each run that wrote summaries: the fake device's copies during it, and
  // then the variables as the store reads them back (its own copy per
  // variable), by global_step.
  struct Seen {
    int64_t pageable = 0, batches = 0, runs = 0;
    std::map<int64_t, std::map<std::string, Tensor>> variables;
  };
  auto seen = std::make_shared<Seen>();
  o.wrap_step = [seen, &fake](StepFn step) -> StepFn {
    return [seen, &fake, step = std::move(step)](StepContext& ctx) -> Status {
      if (!ctx.requested("summaries")) return step(ctx);
      const int64_t pageable = fake != nullptr ? fake->copies_to_host() : 0;
      const int64_t batches = fake != nullptr ? fake->host_batches() : 0;
      FOREMAN_RETURN_IF_ERROR(step(ctx));  // the run that ends the data fails OUT_OF_RANGE
      if (fake != nullptr) {
        seen->pageable += fake->copies_to_host() - pageable;
        seen->batches += fake->host_batches() - batches;
      }
      ++seen->runs;
      FOREMAN_ASSIGN_OR_RETURN(int64_t global_step, GetGlobalStep(ctx.variables()));
      FOREMAN_ASSIGN_OR_RETURN(seen->variables[global_step], ctx.variables().SnapshotOrError());
      return absl::OkStatus();
    };
  };
  const Run run = TrainJob(std::move(o));
  REQUIRE_OK(run.closed);
  CHECK(seen->runs == 5);
  if (!OnGpu()) {
    // Not one synchronous copy into pageable memory per variable
    // (VariableStore::Get's): one CopyToHostBatch per summary.
    CHECK(seen->pageable == 0);
    CHECK(seen->batches == seen->runs);
  }
  // Each histogram is of the variable's value after that step.
  int checked = 0;
  for (const Event& e : testing::Events(tmp / "h")) {
    if (e.kind != Event::Kind::kSummary) continue;
    CAPTURE(e.step);
    for (const SummaryValue& v : e.values) {
      if (v.kind != SummaryValue::Kind::kHistogram) continue;
      CAPTURE(v.tag);
      REQUIRE(seen->variables.count(e.step) == 1);
      REQUIRE(seen->variables[e.step].count(v.tag) == 1);
      const Tensor& t = seen->variables[e.step].at(v.tag);
      double lo = t.data<float>()[0], hi = lo, sum = 0;
      for (int64_t i = 0; i < t.num_elements(); ++i) {
        const double x = t.data<float>()[i];
        lo = std::min(lo, x);
        hi = std::max(hi, x);
        sum += x;
      }
      CHECK(v.histogram.num == static_cast<double>(t.num_elements()));
      CHECK(v.histogram.min == lo);
      CHECK(v.histogram.max == hi);
      CHECK(v.histogram.sum == doctest::Approx(sum).epsilon(1e-9));
      ++checked;
    }
  }
  CHECK(checked == 5 * 4);  // steps 1, 3, ..., 9; two kernels and two biases
}

}  // namespace
}  // namespace foreman

// --device=/gpu:N runs the cases on that CUDA device; the default is the
// fake device. Each case is in a doctest suite of its own (step, job, moves,
// recovery, nan, pipeline, nan_at_close, histograms: --test-suite=NAME), so that the gpu suite runs each in its
// own process: a CUDA fault is sticky for its process and would fail every
// later case. The other arguments are doctest's. Exit 77 (skipped) where no
// CUDA device can be seen: a build without CUDA, no plug-in or runtime, no
// driver, fewer devices than N + 1. A device that is there but cannot be
// made (a driver error, its memory) fails the test instead of hiding.
int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strncmp(argv[i], "--device=", 9) == 0) {
      foreman::g_device = argv[i] + 9;
    } else {
      args.push_back(argv[i]);
    }
  }
  if (foreman::g_device != "/fake:0") {
    if (!foreman::OnGpu()) {
      std::fprintf(stderr, "device_path_test: --device=%s: want /gpu:N (or no --device for /fake:0)\n",
                   foreman::g_device.c_str());
      return 2;
    }
    namespace cuda = foreman::cuda;
    const int index = std::atoi(foreman::g_device.c_str() + 5);
    auto count = cuda::DeviceCount();
    if (!cuda::BuiltWithCuda() || !count.ok() || *count <= index) {
      std::printf("skipped: %s\n", !count.ok() ? std::string(count.status().message()).c_str()
                                                : absl::StrCat(*count, " CUDA device(s)").c_str());
      return 77;
    }
    auto device = foreman::compute::CreateDevice(foreman::g_device, 1);
    if (!device.ok()) {
      std::fprintf(stderr, "device_path_test: %s is there but cannot be used: %s\n", foreman::g_device.c_str(),
                   device.status().ToString().c_str());
      return 1;
    }
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  const int rc = context.run();
  if (rc == 0 && foreman::g_cases_started == 0 && !context.shouldExit()) {
    std::fprintf(stderr, "device_path_test: no test case matched the arguments\n");
    return 1;
  }
  return rc;
}
