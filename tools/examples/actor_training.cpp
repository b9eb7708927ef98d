// Example: the actor API (design.md §4 b). The application owns its
// caf::actor_system; Foreman's training job and all of its service actors are
// spawned into it. The application subscribes to the job's progress (typed
// messages: ProgressStep, CheckpointSaved, Recovered, JobFinished), asks for
// its status while it trains, and learns the outcome from the down message's
// exit reason.
//
//   actor_training CHECKPOINT_DIR [LAST_STEP]
#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "foreman/actor_api.hpp"
#include "foreman/hooks.hpp"
#include "linear_model.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s CHECKPOINT_DIR [LAST_STEP]\n", argv[0]);
    return 2;
  }
  const int64_t last_step = argc == 3 ? std::atoll(argv[2]) : 300;

  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  foreman::ConfigureActorSystem(cfg);
  caf::actor_system system{cfg};

  foreman::TrainingJob job;
  job.options.graph = foreman_examples::LinearModel();
  job.options.checkpoint_dir = argv[1];
  job.options.save_checkpoint_steps = 100;
  job.options.config.intra_op_parallelism_threads = 1;
  foreman::StopAtStepHook::Options stop;
  stop.last_step = last_step;
  job.options.hooks = {foreman::StopAtStepHook::Create(stop).value()};
  job.fetches = {"train_op", "loss"};
  job.progress_every_steps = 100;

  foreman::Status outcome;
  {
    caf::scoped_actor self{system};
    caf::actor trainer = foreman::SpawnTrainingJob(system, std::move(job));
    self->monitor(trainer);
    self->send(trainer, foreman::subscribe_atom::value);  // this actor gets the progress messages
    self->send(trainer, foreman::start_atom::value);

    // Ask how it is going (the job answers between steps of its own thread).
    self->request(trainer, std::chrono::seconds(10), foreman::job_status_atom::value)
        .receive(
            [](const foreman::JobStatus& s) {
              std::printf("job state: %s (global_step %lld)\n", s.state.c_str(),
                          static_cast<long long>(s.global_step));
            },
            [&](caf::error& err) { std::printf("status request failed: %s\n", system.render(err).c_str()); });

    bool down = false;
    self->receive_while([&] { return !down; })(
        [](const foreman::ProgressStep& p) {
          auto loss = p.values.find("loss");
          std::printf("progress: global_step %lld loss %g\n", static_cast<long long>(p.global_step),
                      loss != p.values.end() ? loss->second : -1.0);
        },
        [](const foreman::CheckpointSaved& c) {
          std::printf("checkpoint saved: global_step %lld %s\n", static_cast<long long>(c.global_step),
                      c.path.c_str());
        },
        [](const foreman::Recovered& r) {
          std::printf("recovered: %s, %lld steps lost\n", r.status().ToString().c_str(),
                      static_cast<long long>(r.steps_lost));
        },
        [](const foreman::JobFinished& f) {
          std::printf("job finished at global_step %lld\n", static_cast<long long>(f.global_step));
        },
        [&](caf::down_msg& dm) {
          outcome = foreman::StatusFromExitReason(dm.reason);
          down = true;
        },
        caf::after(std::chrono::minutes(5)) >> [&] {
          outcome = absl::DeadlineExceededError("training job did not finish within 5 minutes");
          self->send_exit(trainer, caf::exit_reason::user_shutdown);
          down = true;
        });
  }
  system.await_all_actors_done();
  std::printf("training job finished: %s\n", outcome.ok() ? "OK" : outcome.ToString().c_str());
  return outcome.ok() ? 0 : 1;
}
