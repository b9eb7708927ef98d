// Built by install_test.sh against the *installed* headers and foreman.pc
// alone: what `foreman train` does, as a library program -- open a run
// directory, resolve the settings against the stored ones, build the MLP
// job, train it under a MonitoredTrainingSession, report. Run it again on
// the same directory and it resumes; on a directory whose checkpoints do not
// verify it is refused, with foreman train's message.
//
//   installed_mlp_job RUN_DIR DATA_DIR MAX_STEPS
// Exit 0 trained (or nothing left to train), 1 training failed, 2 refused.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "foreman/dataset.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/run_directory.hpp"

namespace {

int Fail(int code, const std::string& what, const foreman::Status& s) {
  std::fprintf(stderr, "installed_mlp_job: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s RUN_DIR DATA_DIR MAX_STEPS\n", argv[0]);
    return 2;
  }
  foreman::MlpJobSettings settings;  // foreman train's defaults, then this job's
  settings.checkpoint_dir = argv[1];
  settings.data_dir = argv[2];
  settings.max_steps = std::atoll(argv[3]);
  settings.hidden = "4";
  settings.batch_size = 256;
  settings.epochs = 1;
  settings.threads = 1;
  settings.device = "cpu";
  settings.eval_every_steps = 0;
  if (auto s = foreman::ValidateMlpJobSettings(settings); !s.ok()) return Fail(2, "bad settings", s);

  // The run directory: its lock, its stored settings, what it restores.
  auto dir = foreman::OpenRunDirectory(settings.checkpoint_dir);
  if (!dir.ok()) return Fail(2, "cannot use the checkpoint directory", dir.status());
  auto stored = (*dir)->ReadSettings(foreman::MlpJobModelKeys());
  if (!stored.ok()) return Fail(2, "cannot resume", stored.status());
  if (stored->has_value()) {  // a resume: only MAX_STEPS is given here
    std::vector<std::string> notes;
    auto s = foreman::ResolveMlpJobSettings(**dir, **stored, {"--max-steps"}, settings, &notes);
    if (!s.ok()) return Fail(2, "cannot resume", s);
  }
  auto restore = (*dir)->CheckpointToRestore();
  if (!restore.ok()) return Fail(2, "cannot resume", restore.status());

  // The job.
  if (auto plan = foreman::PlanMlpJob(settings); !plan.ok()) return Fail(2, "bad settings", plan.status());
  auto data = foreman::data::LoadFashionMnist(nullptr, settings.data_dir);
  if (!data.ok()) return Fail(2, "cannot load the data", data.status());
  foreman::MlpJobOptions options;
  options.settings = settings;
  options.data = std::move(*data);
  auto job = foreman::MlpJob::Create(std::move(options));
  if (!job.ok()) return Fail(2, "bad job", job.status());
  if (*restore) {
    if (auto s = (*dir)->CheckCheckpointMatches(**restore, *(*job)->graph()); !s.ok()) return Fail(2, "cannot resume", s);
    std::printf("resuming from %s\n", restore->value().c_str());
  }
  if (!(*dir)->Commit()) return 2;
  if (auto s = (*dir)->WriteSettings(foreman::ToRunSettings(settings), foreman::kMlpJobSettingsComment); !s.ok()) {
    return Fail(2, "cannot write the settings", s);
  }

  // Train under a MonitoredTrainingSession holding the directory's lock.
  foreman::MonitoredTrainingSessionOptions session_options = (*job)->SessionOptions();
  (*dir)->AttachTo(session_options);
  auto session = foreman::MonitoredTrainingSession(std::move(session_options));
  if (!session.ok()) return Fail(1, "cannot start training", session.status());
  if (auto s = (*job)->StartInput(**session); !s.ok()) return Fail(1, "input pipeline", s);
  while (!(*session)->should_stop()) {
    if (!(*session)->run({"train_op"}).ok()) break;  // close() returns the error
  }
  if (auto s = (*session)->close(); !s.ok()) return Fail(1, "training failed", s);
  const foreman::MlpJobResult result = (*job)->result();
  std::printf("trained %lld steps\n", static_cast<long long>(result.steps_trained));
  if (result.eval) {
    std::printf("test accuracy %.4f at global_step %lld\n", result.eval->accuracy,
                static_cast<long long>(result.eval->global_step));
  }
  return 0;
}
