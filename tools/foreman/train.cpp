// `foreman train`: the main job. Flags -> the library's run directory
// (foreman/run_directory.hpp) and MLP job (foreman/mlp_job.hpp) -> a
// MonitoredTrainingSession, with an input-pipeline actor prefetching
// batches, resume from the checkpoint directory, and graceful stop on
// SIGINT / SIGTERM / SIGHUP. docs/train.md is the user's guide. The pieces:
//   train_job.{hpp,cpp}       the job, step by step (the library calls)
//   train_settings.{hpp,cpp}  the flags
//   train_signals.{hpp,cpp}   the signal watcher and the grace period
//   train_faults.{hpp,cpp}    --fault-plan
//   train_report.{hpp,cpp}    errors, progress and service restarts
//   cluster_task.{hpp,cpp}    a cluster task's checks, a ps task, the chief's hooks
//
// What a run leaves in --checkpoint-dir:
//   checkpoint, model.ckpt-<step>.{index,data-00000-of-00001}   TF V2 checkpoints
//   events.out.tfevents.*        loss, accuracy, learning_rate, histograms,
//                                global_step/sec, SessionLog START/CHECKPOINT
//   eval/events.out.tfevents.*   test-set loss and accuracy (TF Estimator's layout)
//   train_settings.txt           the settings of the run, for resuming it
//   train.log                    the log
//   fault_record.json            with --fault-plan: the injected faults that fired
//   run_record.jsonl             with --fault-plan (or --run-record FILE): what each process did (RunRecordWriter)
//
// Resume: the data position (input_pipeline/epoch, input_pipeline/index) and
// the optimizer's slots are variables, so they are checkpointed with the
// weights; shuffling is a pure function of (seed, epoch). A run interrupted
// and resumed therefore ends with the same weights as an uninterrupted one
// (same seed, --threads and --device; docs/train.md "Devices").
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "command.hpp"
#include "train_job.hpp"
#include "foreman/chaos.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/logging.hpp"

namespace foreman::cli {
namespace {

// 9. The report on stdout.
// `signal`: the signal that stopped the run (0: none).
int Report(const TrainJob& job, int signal, double wall) {
  const TrainFlags& f = job.f;
  const std::string& dir = f.checkpoint_dir;
  const MlpJobResult result = job.mlp->result();
  if (const auto& eval = result.eval) {
    std::printf("test accuracy: %.4f (test loss %.4f, %lld examples, global_step %lld)\n", eval->accuracy,
                eval->loss, static_cast<long long>(result.test_examples), static_cast<long long>(eval->global_step));
  }
  // In a cluster global_step counts every worker's updates: a worker
  // reports its own steps, and its rate from its first step (not from the
  // wait for the chief).
  const int64_t trained = job.cluster ? result.local_steps : result.steps_trained;
  const double rate = job.cluster ? result.local_steps_per_sec : result.steps_per_sec;
  if (trained > 0) {
    std::printf("%strained %lld steps in %.1f s (%.1f steps/s, %.0f examples/s)\n", job.task_prefix().c_str(),
                static_cast<long long>(trained), wall, rate,
                wall > 0 ? static_cast<double>(result.examples) / wall : 0.0);
  } else if (job.cluster) {
    std::printf("%strained no step\n", job.task_prefix().c_str());
  } else if (signal == 0) {
    std::printf("nothing to train: the restored run already reached its end (--max-steps %lld, --epochs %lld)\n",
                static_cast<long long>(f.max_steps), static_cast<long long>(f.epochs));
  }
  if (result.pipeline_batches > 0) {
    std::printf("input pipeline: %lld batches, the step waited for %lld of them\n",
                static_cast<long long>(result.pipeline_batches), static_cast<long long>(result.pipeline_waits));
  }
  if (job.end_training != nullptr && job.end_training->final_step()) {
    std::printf("training ended at global_step %lld\n", static_cast<long long>(*job.end_training->final_step()));
  }
  if (result.ended_by_chief) {
    const bool stopped = absl::StrContains(result.end_of_training, "`foreman cluster stop`");
    std::printf("%s%s ended training (its update was refused: OUT_OF_RANGE); exiting\n", job.task_prefix().c_str(),
                stopped ? "`foreman cluster stop`" : "the chief");
  }
  if (job.owns_directory()) {
    auto latest = LatestCheckpoint(job.env, dir);
    const std::string latest_text = latest.ok() && latest->has_value() ? **latest : "(none)";
    std::printf("checkpoints: %s (latest: %s)\n", dir.c_str(), EscapeForTerminal(latest_text).c_str());
    std::printf("events: %s (training), %s/eval (test set)\n", dir.c_str(), dir.c_str());
  }
  // A cluster task stopped by a signal, the job not ended: "stopped, not
  // finished" (kExitStopped), so that a supervisor restarts it.
  int code = kExitOk;
  if (signal != 0 && !job.cluster) {
    std::printf("stopped by %s after its final checkpoint\n", SignalName(signal));
  } else if (signal != 0 && !job.cluster->task.is_chief() && !result.ended_by_chief) {
    std::printf("%sstopped by %s, not finished (exit %d): it writes no checkpoint; started again, it rejoins\n",
                job.task_prefix().c_str(), SignalName(signal), kExitStopped);
    code = kExitStopped;
  } else if (signal != 0 && job.end_training != nullptr && job.end_training->left_training_running()) {
    auto latest = LatestCheckpoint(job.env, dir);
    std::string step = "?";
    if (latest.ok() && latest->has_value()) {
      if (const std::size_t dash = (*latest)->rfind('-'); dash != std::string::npos) step = (*latest)->substr(dash + 1);
    }
    std::printf("stopped by %s after its final checkpoint at global_step %s; training goes on on the ps tasks (not "
                "ended): start the chief again with the same flags to resume it (exit %d)\n",
                SignalName(signal), EscapeForTerminal(step).c_str(), kExitStopped);
    code = kExitStopped;
  } else if (signal != 0 && job.cluster->task.is_chief()) {
    std::printf("stopped by %s after its final checkpoint\n", SignalName(signal));
  }
  if (job.faults.record != nullptr) {
    job.faults.record->Exit(signal != 0 ? SignalName(signal) : "");
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "foreman train: cannot write the report to stdout: %s\n", std::strerror(errno));
    return kExitFailed;
  }
  return code;
}

int RunTrain(const CLI::App& cmd, TrainFlags f, const SimulatedProcess* sim) {
  if (sim == nullptr) SignalWatcher::BlockSignals();
  TrainJob job;
  job.f = std::move(f);
  if (sim != nullptr) {
    job.sim = sim;
    job.base_env = job.env = sim->env;
  }
  // The run's one stop: signals (from now on, also while the data loads)
  // and the session both use it; it also enforces the grace period.
  StopRequestOptions stop_options;
  stop_options.grace_period = absl::Seconds(job.f.stop_grace_period_secs);
  job.phase = std::make_shared<RunPhase>();
  // GraceExpired exits the process: not a simulated one's (the harness's).
  if (sim == nullptr) {
    stop_options.on_grace_expired = [phase = job.phase](absl::Duration grace) { GraceExpired(grace, *phase); };
  }
  job.stop = std::make_shared<StopRequest>(std::move(stop_options));
  std::unique_ptr<SignalWatcher> watcher;
  if (sim == nullptr) watcher = std::make_unique<SignalWatcher>(job.stop, job.phase);
  auto stopped_early = [&]() -> ExitCode {
    if (!job.stop->stop_requested()) return std::nullopt;
    std::printf("stopped by %s before training started; nothing was changed in %s\n",
                SignalName(watcher != nullptr ? watcher->signal_number() : 0), job.f.checkpoint_dir.c_str());
    job.stop->Complete();
    return job.cluster ? kExitStopped : kExitOk;  // a cluster task: not finished
  };

  // 0. The cluster flags, checked before anything starts. A ps task only
  //    serves: the optimizer flags, then Server::Create and a bounded Join.
  auto cluster = CheckClusterFlags(cmd, job.f);
  if (!cluster.ok()) return Fail(kExitUsage, "bad cluster settings", cluster.status());
  job.cluster = *std::move(cluster);
  if (job.cluster && sim != nullptr) {
    return Fail(kExitUsage, "bad cluster flags",
                absl::InvalidArgumentError("a simulated process (foreman chaos --disk sim) runs no cluster task"));
  }
  if (job.cluster && job.cluster->task.job_name == "worker") {
    using Role = RunPhase::TrainingRole;
    const ClusterTask& task = job.cluster->task;
    job.phase->SetTrainingRole(!task.is_chief()                     ? Role::kWorker
                               : job.f.cluster.signal_ends_training ? Role::kChiefEndsTraining
                                                                    : Role::kChief,
                               absl::StrCat("worker ", task.task_index));
  }
  if (job.cluster && job.cluster->task.job_name == "ps") {
    if (Status s = ValidateTrainFlags(job.f); !s.ok()) return Fail(kExitUsage, "bad flags", s);
    if (ExitCode code = PlanModel(job)) return *code;
    ServerOptions options;
    options.cluster = job.cluster->options;
    options.optimizer = job.plan.optimizer;
    options.replicas_to_aggregate = job.cluster->replicas_to_aggregate;
    job.phase->ServeAsPs(absl::StrCat("ps task ", job.cluster->task.task_index));
    return RunParameterServer(*job.cluster, options, absl::Seconds(job.f.cluster.ps_join_timeout_secs),
                              absl::Seconds(job.f.cluster.ps_eviction_grace_secs), *job.stop);
  }

  // TF's evaluator task: outside the training cluster, it reads the chief's
  // checkpoints from --checkpoint-dir (no lock: the chief owns it) and
  // writes only <dir>/eval.
  if (job.cluster && job.cluster->is_evaluator()) {
    if (Status s = ValidateTrainFlags(job.f); !s.ok()) return Fail(kExitUsage, "bad flags", s);
    if (ExitCode code = PlanModel(job)) return *code;
    if (ExitCode code = ResolveDevice(job)) return *code;
    if (ExitCode code = LoadData(job)) return *code;
    job.phase->SetTrainingRole(RunPhase::TrainingRole::kWorker, "the evaluator");
    if (!job.phase->StartTraining(*job.stop)) {
      job.stop->Complete();
      return kExitStopped;
    }
    return RunEvaluatorTask(job.f, std::move(job.data), job.f.cluster.eval_timeout_secs, job.stop);
  }

  // Until training starts, a refusal (or a signal) leaves nothing behind:
  // RunPhase::Undo, while the lock is still held.
  ExitCode refused = OpenDirectory(cmd, job);
  if (!refused) refused = PlanModel(job);
  if (!refused) refused = ResolveDevice(job);
  if (!refused) refused = LoadData(job);
  if (!refused) refused = stopped_early();
  if (!refused) refused = BuildModel(job);
  if (!refused) refused = SessionOptions(job);
  if (!refused) refused = StartServer(job);
  if (!refused && !job.phase->StartTraining(*job.stop)) refused = stopped_early();
  if (refused) {
    job.phase->Undo();
    return *refused;
  }
  if (ExitCode code = WriteRunFiles(job)) return *code;

  // 8. Train. The directory stays locked (the session's checkpoint saver
  //    uses the lock taken in step 1).
  const auto started = std::chrono::steady_clock::now();
  auto session = MonitoredTrainingSession(std::move(job.mts));
  if (!session.ok()) {
    const auto code = session.status().code();
    const bool bad_input = code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
                           code == absl::StatusCode::kFailedPrecondition ||
                           (job.on_gpu() && code == absl::StatusCode::kResourceExhausted);
    return job.Exit(bad_input ? kExitUsage : kExitFailed, "cannot start training", session.status());
  }
  if (job.faults.record != nullptr && job.restore_from.has_value()) {
    // The session restored it (the run directory's choice, RunDirectory::AttachTo).
    const std::string& prefix = *job.restore_from;
    int64_t step = -1;
    if (const std::size_t dash = prefix.rfind('-'); dash != std::string::npos) {
      step = std::strtoll(prefix.c_str() + dash + 1, nullptr, 10);
    }
    job.faults.record->Restore(prefix, step);
  }
  // The input pipeline is one of the session's services (its producer actor
  // inherits the blocked signals): the session's restart policy and actor
  // faults ("input_pipeline") cover it. It starts before the first step.
  // A GPU session gathers its batches on the device: no pipeline.
  if (Status s = job.mlp->StartInput(**session); !s.ok()) {
    (*session)->request_stop(s);
    (*session)->close().IgnoreError();
    return job.Exit(kExitFailed, "input pipeline", s);
  }
  const std::vector<std::string> fetches = {"train_op"};
  while (!(*session)->should_stop()) {
    if (!(*session)->run(fetches).ok()) break;  // close() returns the error (OK after a clean stop)
  }
  const Status closed = (*session)->close();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  PrintServiceRestarts((*session)->service_restarts());
  if (const int64_t n = (*session)->recoveries(); n > 0) {
    // A lost ps task (or another preemption): what MonitoredSession recovered.
    std::fprintf(stderr, "recoveries: %lld (global steps lost: %lld)\n", static_cast<long long>(n),
                 static_cast<long long>((*session)->steps_lost()));
  }
  if (!closed.ok()) {
    // Out of device memory (the data's upload or the first step, under
    // --device-memory-limit-mb) is a setting to change, not a failure to retry.
    if (job.on_gpu() && absl::IsResourceExhausted(closed)) {
      return job.Exit(kExitUsage, absl::StrCat("out of memory on ", job.device), closed);
    }
    return job.Exit(kExitFailed, "training failed", closed);
  }
  // A simulated process has no watcher: never signalled.
  return Report(job, watcher != nullptr && watcher->signalled() ? watcher->signal_number() : 0, wall);
}

void AddTrainCommandTo(CLI::App& app, int* exit_code, const SimulatedProcess* sim) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train an MLP on Fashion-MNIST under a MonitoredTrainingSession: checkpoints, TensorBoard summaries, "
      "resume from --checkpoint-dir (flags not given take the run's stored values), graceful stop on "
      "SIGINT/SIGTERM/SIGHUP.\n"
      "Exit codes: 0 done (or, in one process, stopped by a signal after the final checkpoint), 1 training "
      "failed, 2 bad flags/data/fault plan or an incompatible or busy --checkpoint-dir (do not restart), "
      "3 an injected fault (--fault-plan) ended the run, 75 a cluster task stopped by a signal, not finished "
      "(restart it; docs/cluster.md), 130 a second signal.");
  AddTrainFlags(*cmd, *flags);
  cmd->callback([cmd, flags, exit_code, sim] {
    try {
      *exit_code = RunTrain(*cmd, *flags, sim);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "foreman train: out of memory (try a smaller --hidden or --batch-size)\n");
      *exit_code = kExitFailed;
    }
  });
}

}  // namespace

void AddTrainCommand(CLI::App& app, int* exit_code) { AddTrainCommandTo(app, exit_code, nullptr); }

int RunTrainInProcess(const std::vector<std::string>& args, const SimulatedProcess& process) {
  CLI::App app{"foreman train in a simulated process", "foreman"};
  app.require_subcommand(1, 1);
  int exit_code = kExitOk;
  AddTrainCommandTo(app, &exit_code, &process);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 reads the vector from its end
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "foreman: error: %s\n", e.what());
    return kExitUsage;
  }
  return exit_code;
}

}  // namespace foreman::cli
