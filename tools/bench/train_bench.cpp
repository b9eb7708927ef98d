// Training throughput (issue 6, part 1), Foreman's side: foreman train's MLP
// job (foreman/mlp_job.hpp) with the MLP 784-256-10, batch 128, Adam at a
// constant learning rate, on Fashion-MNIST, trained through a
// MonitoredTrainingSession (no checkpoint directory and no step logging: the
// figure is the training loop's, not the disk's) with `--threads` intra-op
// threads, its batches from Dataset::GetBatch on the training thread
// (MlpJobInput::kOnTrainingThread, as PyTorch's loop gathers them). After
// --warmup untimed steps, times --steps steps and prints
//   RUN train.foreman.t<threads>.samples_per_s <v> samples/s isa=<isa>
// (with --batch B other than 128: train.foreman.b<B>.t<threads>...)
// (isa: the CPU kernels' instruction set, compute::CpuInstructionSet();
// FOREMAN_MAX_ISA=baseline|avx2|avx512 caps it).
// run.sh alternates these runs with tools/bench/train_torch.py's.
//
// With --device gpu:N (issue 15) the same job runs on CUDA device N: the
// training set copied to the device once (nn::DeviceExamples, uint8), each
// step's batch gathered there from Dataset::Order (Mlp::TrainStep by
// indices; MlpJobInput::kGatherOnDevice), for each batch size of --batches:
//   RUN train.foreman.gpu.b<B>.samples_per_s <v> samples/s device=/gpu:N
// then the checkpoint stall (batch 128, a save every --save-every steps into
// a scratch directory): the training loop's delay per save (the median run()
// of a step that started a save minus the median of the others) and the
// device->host copy of the variables (CopyToHostBatch of every variable of
// the model into page-locked host tensors, as a save's snapshot does):
//   RUN train.foreman.gpu.ckpt_stall_s <v> s
//   RUN train.foreman.gpu.ckpt_d2h_copy_s <v> s
//   RUN train.foreman.gpu.ckpt_stall_over_copy <v> x
// Without a usable device it prints "SKIP ..." and exits 77. --device
// cpu-gathered runs the same loop on the CPU device (the smoke test's way to
// run this code without a GPU); its lines say train.foreman.cpu_gathered.
//
//   train_bench [--data DIR] [--threads 1] [--batch 128] [--steps 400] [--warmup 50] [--seed 1]
//               [--device cpu|gpu:N|cpu-gathered] [--batches 128,1024,8192] [--save-every 50] [--saves 10]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench_util.hpp"
#include "foreman/compute.hpp"
#include "foreman/dataset.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/nn.hpp"
#include "foreman/session.hpp"

namespace {

// The benchmark's settings of the job: 784-256-10, Adam (TF1's defaults) at
// a constant rate, shuffled batches of `batch`, no end within the run, no
// evaluation, step logging or summaries (the summary hook writes only with
// a checkpoint directory; the stall run's fires at its first step).
foreman::MlpJobSettings BenchSettings(int64_t batch, uint64_t seed, int threads) {
  foreman::MlpJobSettings s;
  s.checkpoint_dir.clear();
  s.hidden = "256";
  s.optimizer = "adam";
  s.batch_size = batch;
  s.seed = static_cast<int64_t>(seed);
  s.threads = threads;
  s.epochs = 0;
  s.max_steps = int64_t{1} << 62;
  s.learning_rate_decay_steps = 0;
  s.log_step_count_steps = 0;
  s.eval_every_steps = 0;
  s.save_summaries_steps = int64_t{1} << 62;
  return s;
}

std::unique_ptr<foreman::MlpJob> BenchJob(foreman::MlpJobOptions options) {
  if (foreman::Status s = foreman::ValidateMlpJobSettings(options.settings); !s.ok()) {
    foreman_bench::DieOn("settings", s);
  }
  auto job = foreman::MlpJob::Create(std::move(options));
  if (!job.ok()) foreman_bench::DieOn("MlpJob", job.status());
  return std::move(*job);
}

// The "copy_probe" fetch: a save's device->host copy of the variables
// (CopyToHostBatch into page-locked host tensors, as a save's snapshot does),
// answered by a wrapper of the job's step.
struct CopyProbe {
  std::vector<std::string> names;
  std::vector<foreman::Tensor> host;
  std::vector<double> copy_s;

  foreman::Status Run(foreman::StepContext& ctx) {
    foreman::compute::Device& device = ctx.compute();
    const foreman::VariableStore& vars = ctx.variables();
    if (host.empty()) {
      for (const std::string& name : names) {
        FOREMAN_ASSIGN_OR_RETURN(const foreman::Tensor* t, vars.Get(name));
        FOREMAN_ASSIGN_OR_RETURN(foreman::Tensor h, device.AllocateHostTensor(t->dtype(), t->shape()));
        host.push_back(std::move(h));
      }
    }
    std::vector<foreman::compute::HostCopy> copies;
    for (std::size_t i = 0; i < names.size(); ++i) {
      FOREMAN_ASSIGN_OR_RETURN(const void* src, vars.DeviceData(names[i], device));
      copies.push_back({host[i].raw_data(), src, static_cast<int64_t>(host[i].TotalBytes())});
    }
    FOREMAN_RETURN_IF_ERROR(device.Synchronize());
    const double start = foreman_bench::NowSeconds();
    FOREMAN_RETURN_IF_ERROR(device.CopyToHostBatch(copies.data(), static_cast<int64_t>(copies.size())));
    copy_s.push_back(foreman_bench::NowSeconds() - start);
    ctx.Set("copy_probe", foreman::Tensor::Scalar<int64_t>(1));  // an unanswered fetch is NOT_FOUND
    return absl::OkStatus();
  }
};

// Samples/s at each batch size, then the checkpoint stall. Returns main's exit code.
int RunGpu(const std::string& device, const std::string& data, const std::vector<int64_t>& batches, int64_t steps,
           int64_t warmup, uint64_t seed, int64_t save_every, int64_t saves) {
  const std::string tag = device == "/cpu:0" ? "cpu_gathered" : "gpu";
  if (device != "/cpu:0") {
    // Whether a session can use the device at all (FAILED_PRECONDITION: no
    // CUDA in this build, no driver, no such device).
    foreman::MlpJobSettings probe = BenchSettings(128, seed, 1);
    probe.device = device.substr(1);
    if (auto usable = foreman::ResolveMlpJobDevice(probe); !usable.ok()) {
      std::printf("SKIP train_bench --device %s: %s\n", device.substr(1).c_str(), std::string(usable.status().message()).c_str());
      return 77;
    }
  }
  auto mnist = foreman::data::LoadFashionMnist(foreman::Env::Default(), data);
  if (!mnist.ok()) foreman_bench::DieOn("loading Fashion-MNIST from " + data, mnist.status());
  auto probe = std::make_shared<CopyProbe>();
  auto make = [&](int64_t batch, const std::string& dir) {
    foreman::MlpJobOptions options;
    options.settings = BenchSettings(batch, seed, 1);
    options.settings.checkpoint_dir = dir;
    if (!dir.empty()) options.settings.save_checkpoint_steps = save_every;
    options.data = *mnist;
    options.device = device;
    options.input = foreman::MlpJobInput::kGatherOnDevice;
    options.wrap_step = [probe](foreman::StepFn step) -> foreman::StepFn {
      return [probe, step = std::move(step)](foreman::StepContext& ctx) {
        return ctx.requested("copy_probe") ? probe->Run(ctx) : step(ctx);
      };
    };
    return BenchJob(std::move(options));
  };
  auto open = [&](const foreman::MlpJob& job) {
    auto session = foreman::MonitoredTrainingSession(job.SessionOptions());
    if (!session.ok()) foreman_bench::DieOn("MonitoredTrainingSession on " + device, session.status());
    return std::move(*session);
  };
  const std::vector<std::string> fetches = {"train_op", "loss"};
  for (int64_t batch : batches) {
    auto job = make(batch, "");
    auto session = open(*job);
    float loss = 0;
    auto run = [&]() {
      auto out = session->run(fetches);
      if (!out.ok()) foreman_bench::DieOn("run", out.status());
      loss = out->at("loss").scalar<float>().value();
    };
    for (int64_t i = 0; i < warmup; ++i) run();
    const int64_t samples_before = job->result().examples;
    const double start = foreman_bench::NowSeconds();
    for (int64_t i = 0; i < steps; ++i) run();
    const double took = foreman_bench::NowSeconds() - start;
    const int64_t samples = job->result().examples - samples_before;
    // The device's copies of the data go at the session's end (the job's hook).
    if (foreman::Status s = session->close(); !s.ok()) foreman_bench::DieOn("close", s);
    std::printf("loss %.4f (batch %lld)\n", loss, static_cast<long long>(batch));
    std::printf("RUN train.foreman.%s.b%lld.samples_per_s %.6g samples/s device=%s\n", tag.c_str(),
                static_cast<long long>(batch), static_cast<double>(samples) / took, device.c_str());
    std::fflush(stdout);
  }
  if (saves > 0) {
    // The checkpoint stall: run() of the steps whose CheckpointSaverHook
    // started a save (global_step a multiple of save_every after the step)
    // against the others.
    foreman_bench::ScratchDir dir;
    auto job = make(128, dir.path());
    probe->names = foreman::nn::MlpVariableNames(job->plan().spec, job->plan().optimizer);
    auto session = open(*job);
    std::vector<double> save_steps, plain_steps;
    const int64_t total = warmup + save_every * saves;
    for (int64_t i = 0; i < total; ++i) {
      const double start = foreman_bench::NowSeconds();
      auto out = session->run({"train_op", "global_step"});
      const double took = foreman_bench::NowSeconds() - start;
      if (!out.ok()) foreman_bench::DieOn("run", out.status());
      if (i < warmup) continue;
      const int64_t step = out->at("global_step").scalar<int64_t>().value() + 1;  // after this run's update
      (step % save_every == 0 ? save_steps : plain_steps).push_back(took);
    }
    // The probe trains nothing: it runs on the raw session (no hooks).
    for (int i = 0; i < 20; ++i) {
      foreman::Status probed = session->run_step_fn([](foreman::MonitoredStepContext& step) {
        return step.session()->Run({"copy_probe"}).status();
      });
      if (!probed.ok()) foreman_bench::DieOn("copy probe", probed);
    }
    probe->host.clear();  // page-locked by the device
    if (foreman::Status s = session->close(); !s.ok()) foreman_bench::DieOn("close", s);
    const double stall = foreman_bench::Summarize(save_steps).median - foreman_bench::Summarize(plain_steps).median;
    const double copy = foreman_bench::Summarize(probe->copy_s).median;
    std::printf("RUN train.foreman.%s.ckpt_stall_s %.6g s saves=%zu device=%s\n", tag.c_str(), stall,
                save_steps.size(), device.c_str());
    std::printf("RUN train.foreman.%s.ckpt_d2h_copy_s %.6g s copies=%zu\n", tag.c_str(), copy, probe->copy_s.size());
    std::printf("RUN train.foreman.%s.ckpt_stall_over_copy %.6g x\n", tag.c_str(), copy > 0 ? stall / copy : 0.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = foreman::data::kFashionMnistDir;
  int threads = 1;
  int64_t batch = 128;  // the CPU run's
  int64_t steps = 400;
  int64_t warmup = 50;
  uint64_t seed = 1;
  std::string device = "cpu";
  std::vector<int64_t> batches = {128, 1024, 8192};
  int64_t save_every = 50;
  int64_t saves = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr,
                   "usage: %s [--data DIR] [--threads N] [--batch B] [--steps N] [--warmup N] [--seed N] [--device cpu|gpu:N] "
                   "[--batches B,B...] [--save-every N] [--saves N]\n",
                   argv[0]);
      return 2;
    }
    const std::string value = argv[++i];
    if (arg == "--data") {
      data = value;
    } else if (arg == "--threads") {
      threads = std::atoi(value.c_str());
    } else if (arg == "--batch") {
      batch = std::atoll(value.c_str());
    } else if (arg == "--steps") {
      steps = std::atoll(value.c_str());
    } else if (arg == "--warmup") {
      warmup = std::atoll(value.c_str());
    } else if (arg == "--seed") {
      seed = std::strtoull(value.c_str(), nullptr, 10);
    } else if (arg == "--device") {
      device = value;
    } else if (arg == "--batches") {
      batches.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        int64_t b = 0;
        if (!absl::SimpleAtoi(part, &b) || b < 1) {
          std::fprintf(stderr, "train_bench: --batches wants batch sizes >= 1 separated by commas, not '%s'\n",
                       value.c_str());
          return 2;
        }
        batches.push_back(b);
      }
    } else if (arg == "--save-every") {
      save_every = std::atoll(value.c_str());
    } else if (arg == "--saves") {
      saves = std::atoll(value.c_str());
    } else {
      std::fprintf(stderr, "train_bench: unknown option %s\n", arg.c_str());
      return 2;
    }
  }
  if (threads < 1 || batch < 1 || steps < 1 || warmup < 0 || save_every < 1 || saves < 0) {
    std::fprintf(stderr,
                 "train_bench: --threads, --batch, --steps and --save-every must be >= 1, --warmup and --saves >= 0\n");
    return 2;
  }
  if (device == "cpu-gathered") return RunGpu("/cpu:0", data, batches, steps, warmup, seed, save_every, saves);
  if (device != "cpu") {
    if (device.rfind("gpu:", 0) != 0) {
      std::fprintf(stderr, "train_bench: --device wants cpu, gpu:N or cpu-gathered, not '%s'\n", device.c_str());
      return 2;
    }
    return RunGpu("/" + device, data, batches, steps, warmup, seed, save_every, saves);
  }

  auto mnist = foreman::data::LoadFashionMnist(foreman::Env::Default(), data);
  if (!mnist.ok()) foreman_bench::DieOn("loading Fashion-MNIST from " + data, mnist.status());
  foreman::MlpJobOptions options;
  options.settings = BenchSettings(batch, seed, threads);
  options.data = *std::move(mnist);
  options.input = foreman::MlpJobInput::kOnTrainingThread;
  auto job = BenchJob(std::move(options));
  auto session = foreman::MonitoredTrainingSession(job->SessionOptions());
  if (!session.ok()) foreman_bench::DieOn("MonitoredTrainingSession", session.status());

  const std::vector<std::string> fetches = {"train_op", "loss"};
  float loss = 0;
  auto run = [&]() {
    auto out = (*session)->run(fetches);
    if (!out.ok()) foreman_bench::DieOn("run", out.status());
    loss = out->at("loss").scalar<float>().value();
  };
  for (int64_t i = 0; i < warmup; ++i) run();
  const int64_t samples_before = job->result().examples;
  const double start = foreman_bench::NowSeconds();
  for (int64_t i = 0; i < steps; ++i) run();
  const double took = foreman_bench::NowSeconds() - start;
  const int64_t samples = job->result().examples - samples_before;
  if (foreman::Status s = (*session)->close(); !s.ok()) foreman_bench::DieOn("close", s);
  std::printf("loss %.4f\n", loss);
  foreman::StatusOr<std::string> isa = foreman::compute::CpuInstructionSet();
  if (!isa.ok()) foreman_bench::DieOn("CpuInstructionSet", isa.status());
  const std::string batch_part = batch == 128 ? "" : absl::StrCat("b", batch, ".");
  std::printf("RUN train.foreman.%st%d.samples_per_s %.6g samples/s isa=%s\n", batch_part.c_str(), threads,
              static_cast<double>(samples) / took, isa->c_str());
  return 0;
}
