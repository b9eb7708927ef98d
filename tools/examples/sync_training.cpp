// Example: the synchronous API (design.md §4 a). Trains a linear model under
// a MonitoredTrainingSession on the caller's thread, with checkpoints every
// 50 steps, summaries and step counting into CHECKPOINT_DIR, and a
// StopAtStepHook. Run it twice on the same directory: the second run restores
// the last checkpoint and stops at once (spec decision 9), or continues when
// --last-step is raised.
//
//   sync_training CHECKPOINT_DIR [LAST_STEP]
#include <cstdio>
#include <cstdlib>
#include <string>

#include "foreman/hooks.hpp"
#include "foreman/monitored_session.hpp"
#include "linear_model.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s CHECKPOINT_DIR [LAST_STEP]\n", argv[0]);
    return 2;
  }
  const int64_t last_step = argc == 3 ? std::atoll(argv[2]) : 200;

  foreman::StopAtStepHook::Options stop_options;
  stop_options.last_step = last_step;
  auto stop = foreman::StopAtStepHook::Create(stop_options);
  if (!stop.ok()) {
    std::fprintf(stderr, "error: %s\n", stop.status().ToString().c_str());
    return 2;
  }
  foreman::MonitoredTrainingSessionOptions options;
  options.graph = foreman_examples::LinearModel();
  options.checkpoint_dir = argv[1];
  options.save_checkpoint_steps = 50;
  options.save_summaries_steps = 25;
  options.log_step_count_steps = 100;
  options.hooks = {*stop};
  options.config.intra_op_parallelism_threads = 1;

  auto session = foreman::MonitoredTrainingSession(std::move(options));
  if (!session.ok()) {
    std::fprintf(stderr, "error: %s\n", session.status().ToString().c_str());
    return 1;
  }
  float loss = -1;
  int64_t runs = 0;
  while (!(*session)->should_stop()) {
    auto out = (*session)->run({"train_op", "loss"});
    if (!out.ok()) break;  // close() returns the error
    loss = out->at("loss").scalar<float>().value();
    ++runs;
  }
  foreman::Status closed = (*session)->close();
  if (!closed.ok()) {
    std::fprintf(stderr, "training failed: %s\n", closed.ToString().c_str());
    return 1;
  }
  std::printf("runs: %lld\n", static_cast<long long>(runs));
  if (runs > 0) std::printf("final loss: %.6f\n", loss);
  std::printf("checkpoints and events in %s\n", argv[1]);
  return 0;
}
