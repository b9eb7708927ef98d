// `foreman train`'s job, step by step (train_job.hpp).
#include "train_job.hpp"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "command.hpp"
#include "foreman/logging.hpp"
#include "foreman/restart_policy.hpp"

namespace foreman::cli {
namespace {

std::string Architecture(const nn::MlpSpec& spec) {
  std::vector<int64_t> dims = {spec.input_dim};
  dims.insert(dims.end(), spec.hidden.begin(), spec.hidden.end());
  dims.push_back(spec.num_classes);
  return absl::StrJoin(dims, "-");
}

// --run-record FILE: the run record, opened before anything trains (a
// cluster's non-chief worker too). Without it, --fault-plan's default
// (<checkpoint-dir>/run_record.jsonl) is opened by LoadFaultRecord.
ExitCode OpenRunRecord(TrainJob& job) {
  if (job.f.run_record.empty()) return std::nullopt;
  auto record = RunRecordWriter::OpenFile(job.f.run_record);
  if (!record.ok()) return Fail(kExitUsage, "cannot open the run record", record.status());
  job.faults.record = *std::move(record);
  return std::nullopt;
}

}  // namespace

// 1-2. Flags, the directory's lock (a second `foreman train` is refused
//      before it reads or writes anything, and the lock is held until the
//      run ends), the directory's stored settings, and the checkpoint to
//      restore (found once, before the data loads: each warning about a bad
//      checkpoint is printed once).
ExitCode OpenDirectory(const CLI::App& cmd, TrainJob& job) {
  TrainFlags& f = job.f;
  const std::string& dir = f.checkpoint_dir;
  if (Status s = ValidateTrainFlags(f); !s.ok()) return job.Exit(kExitUsage, "bad flags", s);
  // A cluster's non-chief worker: the chief's directory is not its own (no
  // lock, no settings, no restore: the chief initialises or restores the ps).
  if (!job.owns_directory()) return OpenRunRecord(job);
  if (ExitCode code = PrepareFaults(f.fault_plan, dir, job.stop, job.base_env, job.sim != nullptr, job.faults)) {
    return code;
  }
  job.phase->SetDir(dir);
  RunDirectoryOptions dir_options;
  dir_options.env = job.base_env;
  auto opened = OpenRunDirectory(dir, dir_options);
  if (!opened.ok()) {
    // The lock's contract: FAILED_PRECONDITION means another holder.
    return job.Exit(kExitUsage,
                    absl::IsFailedPrecondition(opened.status()) ? "checkpoint directory in use"
                                                                : "cannot use the checkpoint directory",
                    opened.status());
  }
  job.dir = std::move(*opened);
  job.phase->SetRunDirectory(job.dir);
  if (ExitCode code = OpenRunRecord(job)) return code;  // before LoadFaultRecord's default
  if (ExitCode code = LoadFaultRecord(dir, job.base_env, job.faults)) return code;
  job.env = job.faults.active() ? job.faults.faulty.get() : job.base_env;
  job.dir->set_env(job.env);

  auto stored = job.dir->ReadSettings(MlpJobModelKeys());
  if (!stored.ok()) return job.Exit(kExitUsage, "cannot resume", stored.status());
  if (stored->has_value()) {
    std::vector<std::string> notes;
    if (Status s = ResolveMlpJobSettings(*job.dir, **stored, GivenFlags(cmd), f, &notes); !s.ok()) {
      return job.Exit(kExitUsage, "cannot resume", s);
    }
    if (Status s = ValidateTrainFlags(f); !s.ok()) {
      return job.Exit(kExitUsage, absl::StrCat("bad settings (flags and ", dir, "/", kRunSettingsFile, ")"), s);
    }
    for (const std::string& note : notes) std::fprintf(stderr, "foreman train: note: %s\n", EscapeForTerminal(note).c_str());
  }
  // A run with a state file but no checkpoint left to restore is refused
  // rather than trained again from step 0 (spec decision 7), and so is
  // another program's directory.
  bool refused = false;
  auto restore = job.dir->CheckpointToRestore(&refused);
  if (!restore.ok()) {
    return job.Exit(kExitUsage,
                    job.dir->resuming() || refused ? "cannot resume" : "cannot use the checkpoint directory",
                    restore.status());
  }
  job.restore_from = *restore;
  return std::nullopt;
}

// 3. The model's shape and the session's schedules, checked before the data
//    loads; --threads 0 resolved.
ExitCode PlanModel(TrainJob& job) {
  auto plan = PlanMlpJob(job.f);
  if (!plan.ok()) return job.Exit(kExitUsage, "bad flags", plan.status());
  job.plan = *std::move(plan);
  return std::nullopt;
}

// 3b. --device, resolved before the data loads: gpu:N that cannot be used is
//     exit 2 with the session's error, and nothing is left in the directory;
//     auto says what it chose on stderr. A cluster task trains on the CPU
//     (only a local session may use a GPU).
ExitCode ResolveDevice(TrainJob& job) {
  const TrainFlags& f = job.f;
  const std::string parsed = *ParseDeviceSetting(f.device);  // validated
  if (job.cluster && parsed != "/cpu:0") {
    if (!parsed.empty()) {
      return job.Exit(kExitUsage, "bad flags",
                      absl::InvalidArgumentError(absl::StrCat("--device ", f.device,
                                                              ": a cluster task trains on the CPU (only a "
                                                              "single-process run may use a GPU)")));
    }
    job.device = "/cpu:0";
    return std::nullopt;
  }
  auto device = ResolveMlpJobDevice(f, job.env);
  if (!device.ok()) return job.Exit(kExitUsage, absl::StrCat("cannot use --device ", f.device), device.status());
  if (!device->note.empty()) std::fprintf(stderr, "foreman train: %s\n", device->note.c_str());
  job.device = device->device;
  return std::nullopt;
}

// 4. The data.
ExitCode LoadData(TrainJob& job) {
  auto mnist = data::LoadFashionMnist(job.env, job.f.data_dir);
  if (!mnist.ok()) return job.Exit(kExitUsage, "cannot load the data", mnist.status());
  job.data = *std::move(mnist);
  return std::nullopt;
}

// 5. The job (data sets, model, graph, hooks); a resumed run's checkpoint
//    must fit it. The cluster's and the fault plan's pieces go in through
//    the job's seams.
ExitCode BuildModel(TrainJob& job) {
  const TrainFlags& f = job.f;
  MlpJobOptions options;
  options.settings = f;
  options.data = std::move(job.data);
  options.device = job.device;
  options.env = job.env;
  job.tty = isatty(STDERR_FILENO) != 0;
  options.observer = RecordingObserver(
      job.faults.record,
      std::make_shared<ProgressPrinter>(job.tty, f.log_step_count_steps > 0 ? f.log_step_count_steps : 100));
  if (job.cluster) {
    options.cluster = MlpJobClusterTask{job.cluster->task.task_index, job.cluster->task.is_chief(),
                                        job.cluster->has_evaluator};
    if (job.cluster->task.is_chief() && job.cluster->has_evaluator) {
      std::fprintf(stderr, "foreman train: the cluster has an evaluator task: the chief does not evaluate (the "
                           "evaluator writes %s/eval)\n", f.checkpoint_dir.c_str());
    }
    if (job.cluster->task.is_chief()) {
      options.extra_summaries = [&job]() {
        return job.worker_rates ? job.worker_rates() : std::vector<std::string>{};
      };
    }
  }
  if (job.faults.active()) {
    // First among the job's hooks: a step or process fault fires before the
    // others run; NaN-loss faults act on the step's "loss".
    options.first_hooks = {job.faults.hook};
    options.wrap_step = [hook = job.faults.hook](StepFn step) { return hook->WrapStep(std::move(step)); };
  }
  auto mlp = MlpJob::Create(std::move(options));
  if (!mlp.ok()) return Fail(absl::IsInvalidArgument(mlp.status()) ? kExitUsage : kExitFailed, mlp.status());
  job.mlp = *std::move(mlp);
  if (job.restore_from.has_value()) {
    if (Status s = job.dir->CheckCheckpointMatches(*job.restore_from, *job.mlp->graph()); !s.ok()) {
      return job.Exit(kExitUsage, "cannot resume", s);
    }
  }
  return std::nullopt;
}

// 6. The session's options: the job's, then the run's stop request, the
//    held lock, the durable saves of a fault plan and a cluster worker's
//    waits.
ExitCode SessionOptions(TrainJob& job) {
  MonitoredTrainingSessionOptions& mts = job.mts;
  mts = job.mlp->SessionOptions();
  if (job.faults.active()) {
    mts.checkpoint_listeners.push_back(NewDurableSavesListener(
        job.faults.record, job.f.checkpoint_dir,
        job.sim != nullptr ? job.sim->on_durable_save : std::function<void(int64_t, const std::string&)>()));
  }
  RecordRecoveries(job.faults.record, mts.recovery);  // with a run record
  // The run's one grace period is its StopRequest's (RunTrain set it from
  // --stop-grace-period-secs): the session's own setting stays unset.
  mts.runtime.stop = job.stop;
  mts.stop_grace_period_secs.reset();
  if (job.dir != nullptr) job.dir->AttachTo(mts);
  if (job.cluster && !job.cluster->task.is_chief()) {
    // WorkerSessionCreator: polls for the chief's session every heartbeat,
    // for at most --ps-wait-secs. No directory: it writes nothing.
    mts.recovery_wait_secs = static_cast<double>(job.cluster->options.heartbeat_ms) / 1000.0;
    mts.max_wait_secs = static_cast<double>(job.cluster->options.ps_wait_secs);
  }
  // mts.master and the chief's EndTrainingHook come with the Server (StartServer).
  return std::nullopt;
}

// 6b. A cluster worker: its Server (tf.train.Server), whose target is the
//     session's master; the chief ends training from a hook placed first
//     among its chief-only hooks (their end() runs before the
//     CheckpointSaverHook's final save), except at a signal without
//     --signal-ends-training (an eviction: training goes on).
ExitCode StartServer(TrainJob& job) {
  if (!job.cluster) return std::nullopt;
  ServerOptions options;
  options.cluster = job.cluster->options;
  options.optimizer = job.plan.optimizer;
  options.replicas_to_aggregate = job.cluster->replicas_to_aggregate;
  options.request_timeout_ms = job.cluster->operation_timeout_ms;
  auto server = Server::Create(job.cluster->spec, job.cluster->task, options);
  if (!server.ok()) {
    return job.Exit(absl::IsInvalidArgument(server.status()) ? kExitUsage : kExitFailed, "cannot start the worker",
                    server.status());
  }
  job.server = *std::move(server);
  job.mts.master = job.server->target();
  if (job.cluster->task.is_chief()) {
    // A signal is an eviction of the chief unless its user asked for the
    // whole job to end (--signal-ends-training): EndTrainingHookOptions.
    EndTrainingHookOptions end_options;
    end_options.stop = job.stop;
    end_options.end_training_on_stop_request = job.f.cluster.signal_ends_training;
    job.end_training = std::make_shared<EndTrainingHook>(job.server.get(), std::move(end_options));
    job.mts.chief_only_hooks.insert(job.mts.chief_only_hooks.begin(), job.end_training);
    job.worker_rates = WorkerStepRateSummaries(job.server.get(), job.cluster->spec.num_tasks("worker"));
  }
  return std::nullopt;
}

// 7. The settings go into the directory before the first checkpoint; the
//    whole log into <dir>/train.log (on a terminal the progress bar owns
//    stderr, so only warnings and errors are printed there).
ExitCode WriteRunFiles(TrainJob& job) {
  const TrainFlags& f = job.f;
  const std::string& dir = f.checkpoint_dir;
  const nn::MlpSpec& spec = job.mlp->plan().spec;
  const std::string optimizer = nn::OptimizerKindName(job.plan.optimizer.kind);
  LogOptions log;
  log.stderr_level = job.tty ? LogLevel::kWarning : LogLevel::kInfo;
  if (!job.owns_directory()) {
    // A cluster's other workers: the log on stderr only, nothing in the chief's directory.
    if (Status s = ConfigureLogging(log); !s.ok()) return job.Exit(kExitUsage, "cannot configure the log", s);
    std::fprintf(stderr,
                 "foreman train: worker %d of %d (%s): MLP %s, %s (learning rate %g), batch %lld, data seed %lld, "
                 "%lld threads; the chief (worker 0) writes the checkpoints\n",
                 job.cluster->task.task_index, job.cluster->spec.num_tasks("worker"), job.server->target().c_str(),
                 Architecture(spec).c_str(), optimizer.c_str(), job.plan.learning_rate, static_cast<long long>(f.batch_size),
                 static_cast<long long>(f.seed + job.cluster->task.task_index), static_cast<long long>(f.threads));
    return std::nullopt;
  }
  if (Status s = job.dir->WriteSettings(ToRunSettings(f), kMlpJobSettingsComment); !s.ok()) {
    return job.Exit(kExitUsage, "cannot write to the checkpoint directory", s);
  }
  // A simulated process (foreman chaos --disk sim) logs to the real disk.
  log.file_path = job.sim != nullptr ? job.sim->log_file : dir + "/train.log";
  if (Status s = ConfigureLogging(log); !s.ok()) return job.Exit(kExitUsage, "cannot write the log", s);
  const int64_t total = job.mlp->total_steps();
  std::fprintf(stderr, "foreman train: MLP %s, %s (learning rate %g), batch %lld, %s, seed %lld, %s; checkpoints in %s\n",
               Architecture(spec).c_str(), optimizer.c_str(), job.plan.learning_rate, static_cast<long long>(f.batch_size),
               total > 0 ? absl::StrCat(total, " steps").c_str() : "until stopped", static_cast<long long>(f.seed),
               job.on_gpu() ? job.device.c_str() : absl::StrCat(f.threads, " threads").c_str(), dir.c_str());
  if (job.cluster) {
    std::fprintf(stderr, "foreman train: the chief (worker 0 of %d, %s) of the cluster %s\n",
                 job.cluster->spec.num_tasks("worker"), job.server->target().c_str(),
                 job.cluster->spec.ToString().c_str());
    if (job.cluster->replicas_to_aggregate > 0) {
      std::fprintf(stderr,
                   "foreman train: synchronous training: each update averages %d of the %d workers' gradients of "
                   "one global_step (--replicas-to-aggregate, --total-num-replicas); stale ones are dropped\n",
                   job.cluster->replicas_to_aggregate, job.cluster->total_num_replicas);
    }
  }
  if (!f.restart_policy.empty()) {
    std::fprintf(stderr, "foreman train: restart policy %s\n",
                 RestartPolicyText(*ParseRestartPolicy(f.restart_policy)).c_str());
  }
  return std::nullopt;
}

}  // namespace foreman::cli
