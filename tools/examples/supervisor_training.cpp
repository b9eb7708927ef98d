// Example: the older TF 1.x API (design.md §4 c). A chief and a worker train
// one linear model together, each under its own Supervisor.managed_session,
// sharing the variables through an inproc:// target (the in-process analogue
// of a TF server: `master`). The chief initialises the variables, writes a
// checkpoint and summaries to LOGDIR; the worker (started once the chief's
// session is ready) waits for the model to be ready, then trains. Both stop
// once global_step reaches LAST_STEP.
//
//   supervisor_training LOGDIR [LAST_STEP]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "foreman/supervisor.hpp"
#include "linear_model.hpp"

namespace {

// One task's training loop: TF's `while not sv.should_stop(): sess.run(train_op)`,
// ending at `last_step`. Counts the updates this task made.
foreman::Status TrainUntil(foreman::Supervisor& sv, foreman::Session& sess, int64_t last_step, int64_t* updates,
                           float* loss) {
  while (!sv.should_stop()) {
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, sess.GlobalStep());
    if (step >= last_step) break;
    FOREMAN_ASSIGN_OR_RETURN(foreman::TensorMap out, sess.Run({"train_op", "loss"}));
    FOREMAN_ASSIGN_OR_RETURN(*loss, out.at("loss").scalar<float>());
    ++*updates;
  }
  return foreman::Status();
}

foreman::StatusOr<std::unique_ptr<foreman::Supervisor>> MakeSupervisor(bool is_chief, const std::string& logdir) {
  foreman::SupervisorOptions options;
  options.graph = foreman_examples::LinearModel();
  options.is_chief = is_chief;
  options.logdir = logdir;              // a worker ignores it (TF)
  options.save_summaries_secs = 1;
  options.recovery_wait_secs = 0.05;    // how often the worker polls for the chief's session
  options.config.intra_op_parallelism_threads = 1;
  return foreman::Supervisor::Create(std::move(options));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s LOGDIR [LAST_STEP]\n", argv[0]);
    return 2;
  }
  const std::string logdir = argv[1];
  const int64_t last_step = argc == 3 ? std::atoll(argv[2]) : 2000;
  const std::string master = "inproc://supervisor_example";

  auto chief = MakeSupervisor(true, logdir);
  auto worker = MakeSupervisor(false, "");
  if (!chief.ok() || !worker.ok()) {
    std::fprintf(stderr, "error: %s\n", (chief.ok() ? worker.status() : chief.status()).ToString().c_str());
    return 2;
  }
  int64_t chief_updates = 0, worker_updates = 0;
  float chief_loss = -1, worker_loss = -1;
  foreman::Status worker_status;
  // Only for the example, whose model is tiny: each task waits (up to 30 s)
  // until both have a ready session, or one would finish every step before
  // the other's first poll. A TF chief does not wait for its workers.
  std::atomic<int> ready{0};
  auto wait_for_both = [&ready] {
    ++ready;
    for (int i = 0; i < 30000 && ready < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  std::thread worker_thread;
  auto run_worker = [&] {
    worker_status = (*worker)->managed_session(master, std::nullopt, [&](foreman::Session& sess) {
      wait_for_both();
      return TrainUntil(**worker, sess, last_step, &worker_updates, &worker_loss);
    });
    if (!worker_status.ok()) ready = 2;  // the chief need not wait for a worker that gave up
  };
  int64_t final_step = -1;
  foreman::Status chief_status = (*chief)->managed_session(master, std::nullopt, [&](foreman::Session& sess) {
    // The worker starts once the chief's session is ready (its poll then
    // finds it at once): a chief that fails to start (a busy LOGDIR, say)
    // leaves no worker waiting for it.
    worker_thread = std::thread(run_worker);
    wait_for_both();
    FOREMAN_RETURN_IF_ERROR(TrainUntil(**chief, sess, last_step, &chief_updates, &chief_loss));
    worker_thread.join();  // every update is in before the final read
    FOREMAN_ASSIGN_OR_RETURN(final_step, sess.GlobalStep());
    return foreman::Status();
  });
  if (worker_thread.joinable()) worker_thread.join();
  if (!chief_status.ok() || !worker_status.ok()) {
    std::fprintf(stderr, "training failed: chief %s, worker %s\n", chief_status.ToString().c_str(),
                 worker_status.ToString().c_str());
    return 1;
  }
  std::printf("chief updates: %lld\n", static_cast<long long>(chief_updates));
  std::printf("worker updates: %lld\n", static_cast<long long>(worker_updates));
  std::printf("global_step: %lld\n", static_cast<long long>(final_step));  // = chief + worker updates
  std::printf("final loss: %.6f\n", chief_loss);
  std::printf("checkpoint and events in %s\n", logdir.c_str());
  return 0;
}
