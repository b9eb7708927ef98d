// Recovery (issue 6, part 5): the time from an injected ABORTED to the next
// successful step, for foreman train's MLP job (foreman/mlp_job.hpp;
// 784-256-10, Adam, batch 128, batches from Dataset::GetBatch on the
// training thread) under a MonitoredTrainingSession with a checkpoint
// directory (checkpoints every 10 steps). A wrapper of the job's step
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
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.hpp"
#include "foreman/dataset.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/variable_store.hpp"

namespace {

struct Measured {
  double recovery_s = 0;
  double step_s = 0;
};

Measured MeasureOnce(const foreman::data::FashionMnist& mnist, const std::string& parent, int64_t abort_at,
                     bool backoff) {
  foreman_bench::ScratchDir dir(parent, "foreman_recovery");
  foreman::MlpJobOptions options;
  foreman::MlpJobSettings& s = options.settings;
  s.checkpoint_dir = dir.path();
  s.save_checkpoint_steps = 10;
  s.hidden = "256";
  s.seed = 1;
  s.threads = 1;
  s.epochs = 0;
  s.max_steps = int64_t{1} << 62;
  s.learning_rate_decay_steps = 0;
  s.log_step_count_steps = 0;
  s.eval_every_steps = 0;
  s.save_summaries_steps = int64_t{1} << 62;
  if (foreman::Status valid = foreman::ValidateMlpJobSettings(s); !valid.ok()) foreman_bench::DieOn("settings", valid);
  options.data = mnist;
  options.input = foreman::MlpJobInput::kOnTrainingThread;
  auto aborted_at = std::make_shared<double>(-1);
  options.wrap_step = [aborted_at, abort_at](foreman::StepFn step) -> foreman::StepFn {
    return [aborted_at, abort_at, step = std::move(step)](foreman::StepContext& ctx) -> foreman::Status {
      if (ctx.requested("train_op") && *aborted_at < 0) {
        FOREMAN_ASSIGN_OR_RETURN(int64_t global_step, foreman::GetGlobalStep(ctx.variables()));
        if (global_step == abort_at) {
          *aborted_at = foreman_bench::NowSeconds();
          return absl::AbortedError("recovery_bench: injected preemption");
        }
      }
      return step(ctx);
    };
  };
  auto job = foreman::MlpJob::Create(std::move(options));
  if (!job.ok()) foreman_bench::DieOn("MlpJob", job.status());
  foreman::MonitoredTrainingSessionOptions session_options = (*job)->SessionOptions();
  if (!backoff) session_options.recovery.initial_backoff = absl::ZeroDuration();
  auto session = foreman::MonitoredTrainingSession(std::move(session_options));
  if (!session.ok()) foreman_bench::DieOn("MonitoredTrainingSession", session.status());

  const std::vector<std::string> fetches = {"train_op"};
  std::vector<double> steps;
  Measured m;
  for (;;) {
    const double start = foreman_bench::NowSeconds();
    auto out = (*session)->run(fetches);
    const double end = foreman_bench::NowSeconds();
    if (!out.ok()) foreman_bench::DieOn("run", out.status());
    if (*aborted_at >= 0) {
      m.recovery_s = end - *aborted_at;
      break;
    }
    steps.push_back(end - start);
  }
  if ((*session)->recoveries() != 1) {
    std::fprintf(stderr, "recovery_bench: expected 1 recovery, got %lld\n",
                 static_cast<long long>((*session)->recoveries()));
    std::exit(1);
  }
  if (foreman::Status closed = (*session)->close(); !closed.ok()) foreman_bench::DieOn("close", closed);
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
  auto mnist = foreman::data::LoadFashionMnist(foreman::Env::Default(), data);
  if (!mnist.ok()) foreman_bench::DieOn("loading Fashion-MNIST from " + data, mnist.status());
  for (int r = 0; r < reps; ++r) {
    for (const bool backoff : {true, false}) {
      const Measured m = MeasureOnce(*mnist, parent, abort_at, backoff);
      std::printf("RUN recovery.%s_s %.6g s\n", backoff ? "default_backoff" : "no_backoff", m.recovery_s);
      std::printf("RUN recovery.step_s %.6g s\n", m.step_s);
      std::fflush(stdout);
    }
  }
  return 0;
}
