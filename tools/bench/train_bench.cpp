// Training throughput (issue 6, part 1), Foreman's side: the MLP 784-256-10,
// batch 128, Adam, on Fashion-MNIST, trained through a
// MonitoredTrainingSession (no checkpoint directory and no step logging: the
// figure is the training loop's, not the disk's) with `--threads` intra-op
// threads. After --warmup untimed steps, times --steps steps and prints
//   RUN train.foreman.t<threads>.samples_per_s <v> samples/s isa=<isa>
// (isa: the CPU kernels' instruction set, compute::CpuInstructionSet();
// FOREMAN_MAX_ISA=baseline|avx2|avx512 caps it).
// run.sh alternates these runs with tools/bench/train_torch.py's.
//
//   train_bench [--data DIR] [--threads 1] [--steps 400] [--warmup 50] [--seed 1]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "foreman/compute.hpp"
#include "foreman/monitored_session.hpp"
#include "mlp_model.hpp"

int main(int argc, char** argv) {
  std::string data = foreman::data::kFashionMnistDir;
  int threads = 1;
  int64_t steps = 400;
  int64_t warmup = 50;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--data DIR] [--threads N] [--steps N] [--warmup N] [--seed N]\n", argv[0]);
      return 2;
    }
    const std::string value = argv[++i];
    if (arg == "--data") {
      data = value;
    } else if (arg == "--threads") {
      threads = std::atoi(value.c_str());
    } else if (arg == "--steps") {
      steps = std::atoll(value.c_str());
    } else if (arg == "--warmup") {
      warmup = std::atoll(value.c_str());
    } else if (arg == "--seed") {
      seed = std::strtoull(value.c_str(), nullptr, 10);
    } else {
      std::fprintf(stderr, "train_bench: unknown option %s\n", arg.c_str());
      return 2;
    }
  }
  if (threads < 1 || steps < 1 || warmup < 0) {
    std::fprintf(stderr, "train_bench: --threads and --steps must be >= 1, --warmup >= 0\n");
    return 2;
  }

  auto model = foreman_bench::LoadMlpModel(data, seed);
  foreman::MonitoredTrainingSessionOptions options;
  options.graph = foreman_bench::MlpGraph(model, seed);
  options.config.intra_op_parallelism_threads = threads;
  options.log_step_count_steps = std::nullopt;
  auto session = foreman::MonitoredTrainingSession(std::move(options));
  if (!session.ok()) foreman_bench::DieOn("MonitoredTrainingSession", session.status());

  const std::vector<std::string> fetches = {"train_op", "loss"};
  float loss = 0;
  auto run = [&]() {
    auto out = (*session)->run(fetches);
    if (!out.ok()) foreman_bench::DieOn("run", out.status());
    loss = out->at("loss").scalar<float>().value();
  };
  for (int64_t i = 0; i < warmup; ++i) run();
  const int64_t samples_before = model->samples;
  const double start = foreman_bench::NowSeconds();
  for (int64_t i = 0; i < steps; ++i) run();
  const double took = foreman_bench::NowSeconds() - start;
  const int64_t samples = model->samples - samples_before;
  if (foreman::Status s = (*session)->close(); !s.ok()) foreman_bench::DieOn("close", s);
  std::printf("loss %.4f\n", loss);
  foreman::StatusOr<std::string> isa = foreman::compute::CpuInstructionSet();
  if (!isa.ok()) foreman_bench::DieOn("CpuInstructionSet", isa.status());
  std::printf("RUN train.foreman.t%d.samples_per_s %.6g samples/s isa=%s\n", threads,
              static_cast<double>(samples) / took, isa->c_str());
  return 0;
}
