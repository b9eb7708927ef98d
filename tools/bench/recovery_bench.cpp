// Recovery (issue 6, part 5): the time from an injected ABORTED to the next
// successful step, for the MLP under a MonitoredTrainingSession with a
// checkpoint directory (checkpoints every 10 steps). The step function
// returns ABORTED once, at global step --abort-at; the session then waits for
// pending saves, closes the raw session, backs off, creates a new session,
// restores the latest checkpoint, runs the hooks' after_create_session (a
// checkpoint of the restored step, B103) and re-runs the call. Measured from
// the moment the step returns ABORTED until that re-run returns OK.
// Each run uses a fresh session and directory, alternating
//   RUN recovery.default_backoff_s   RecoveryOptions as they come (100 ms x jitter)
//   RUN recovery.no_backoff_s        initial_backoff = 0: the runtime's own cost
// and prints the median training step of each run as RUN recovery.step_s.
//
//   recovery_bench [--data DIR] [--reps 5] [--dir PARENT] [--abort-at 25]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "foreman/monitored_session.hpp"
#include "mlp_model.hpp"

namespace {

struct Measured {
  double recovery_s = 0;
  double step_s = 0;
};

Measured MeasureOnce(const std::string& data, const std::string& parent, int64_t abort_at, bool backoff) {
  foreman_bench::ScratchDir dir(parent, "foreman_recovery");
  auto model = foreman_bench::LoadMlpModel(data, 1);
  double aborted_at = -1;
  model->before_step = [&](int64_t step) -> foreman::Status {
    if (step == abort_at && aborted_at < 0) {
      aborted_at = foreman_bench::NowSeconds();
      return absl::AbortedError("recovery_bench: injected preemption");
    }
    return absl::OkStatus();
  };
  foreman::MonitoredTrainingSessionOptions options;
  options.graph = foreman_bench::MlpGraph(model, 1);
  options.checkpoint_dir = dir.path();
  options.save_checkpoint_steps = 10;
  options.log_step_count_steps = std::nullopt;
  options.config.intra_op_parallelism_threads = 1;
  if (!backoff) options.recovery.initial_backoff = absl::ZeroDuration();
  auto session = foreman::MonitoredTrainingSession(std::move(options));
  if (!session.ok()) foreman_bench::DieOn("MonitoredTrainingSession", session.status());

  const std::vector<std::string> fetches = {"train_op"};
  std::vector<double> steps;
  Measured m;
  for (;;) {
    const double start = foreman_bench::NowSeconds();
    auto out = (*session)->run(fetches);
    const double end = foreman_bench::NowSeconds();
    if (!out.ok()) foreman_bench::DieOn("run", out.status());
    if (aborted_at >= 0) {
      m.recovery_s = end - aborted_at;
      break;
    }
    steps.push_back(end - start);
  }
  if ((*session)->recoveries() != 1) {
    std::fprintf(stderr, "recovery_bench: expected 1 recovery, got %lld\n",
                 static_cast<long long>((*session)->recoveries()));
    std::exit(1);
  }
  if (foreman::Status s = (*session)->close(); !s.ok()) foreman_bench::DieOn("close", s);
  m.step_s = foreman_bench::Summarize(steps).median;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = foreman::data::kFashionMnistDir;
  std::string parent;
  int reps = 5;
  int64_t abort_at = 25;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--data DIR] [--reps N] [--dir PARENT] [--abort-at STEP]\n", argv[0]);
      return 2;
    }
    const std::string value = argv[++i];
    if (arg == "--data") {
      data = value;
    } else if (arg == "--reps") {
      reps = std::atoi(value.c_str());
    } else if (arg == "--dir") {
      parent = value;
    } else if (arg == "--abort-at") {
      abort_at = std::atoll(value.c_str());
    } else {
      std::fprintf(stderr, "recovery_bench: unknown option %s\n", arg.c_str());
      return 2;
    }
  }
  if (reps < 1 || abort_at < 1) {
    std::fprintf(stderr, "recovery_bench: --reps and --abort-at must be >= 1\n");
    return 2;
  }
  for (int r = 0; r < reps; ++r) {
    for (const bool backoff : {true, false}) {
      const Measured m = MeasureOnce(data, parent, abort_at, backoff);
      std::printf("RUN recovery.%s_s %.6g s\n", backoff ? "default_backoff" : "no_backoff", m.recovery_s);
      std::printf("RUN recovery.step_s %.6g s\n", m.step_s);
      std::fflush(stdout);
    }
  }
  return 0;
}
