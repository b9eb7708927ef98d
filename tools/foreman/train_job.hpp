// `foreman train`'s job, step by step: what the steps build (TrainJob) and
// the steps RunTrain (train.cpp) runs in order, each a call of the library's
// run directory (foreman/run_directory.hpp) or MLP job (foreman/mlp_job.hpp)
// with the command's messages and exit codes.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "cluster_task.hpp"
#include "train_faults.hpp"
#include "train_report.hpp"
#include "train_settings.hpp"
#include "train_signals.hpp"
#include "foreman/chaos.hpp"
#include "foreman/dataset.hpp"
#include "foreman/env.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/run_directory.hpp"
#include "foreman/server.hpp"
#include "foreman/stop.hpp"

namespace foreman::cli {

// RunTrain runs the steps below in order; each returns the exit code when
// the job ends there (std::nullopt: go on).
using ExitCode = std::optional<int>;

// What the steps build, in their order.
struct TrainJob {
  TrainFlags f;
  // Under foreman chaos --disk sim: the simulated process (null: a process of its own).
  const SimulatedProcess* sim = nullptr;
  Env* base_env = Env::Default();  // the file system: the simulated disk under --disk sim
  Env* env = Env::Default();  // the FaultyEnv with --fault-plan (once the record is read), else base_env
  TrainFaults faults;
  std::shared_ptr<StopRequest> stop;
  std::shared_ptr<RunPhase> phase;
  std::shared_ptr<RunDirectory> dir;        // held from the first check to the end of the run
  std::optional<std::string> restore_from;  // the checkpoint a resumed run restores
  MlpJobPlan plan;
  std::string device = "/cpu:0";  // the session's: "/cpu:0" or "/gpu:N"
  bool on_gpu() const { return device != "/cpu:0"; }
  data::FashionMnist data;
  bool tty = false;
  std::unique_ptr<MlpJob> mlp;
  MonitoredTrainingSessionOptions mts;
  // A cluster task (--job-name ...); nullopt for a single-process run.
  std::optional<ClusterRun> cluster;
  std::unique_ptr<Server> server;                  // a worker's, from StartServer to the end
  std::shared_ptr<EndTrainingHook> end_training;   // the chief's
  std::function<std::vector<std::string>()> worker_rates;  // the chief's, from StartServer

  // The chief or a single process: owns --checkpoint-dir. A cluster's other
  // workers never take its lock or write there.
  bool owns_directory() const { return !cluster || cluster->task.is_chief(); }
  // "worker 1: " in a cluster, "" otherwise (for the report's lines).
  std::string task_prefix() const {
    return cluster ? absl::StrCat(cluster->task.job_name, " ", cluster->task.task_index, ": ") : "";
  }
  // Fail(), unless `s` reports a fault injected in this process (exit 3).
  // With a run record, a "failed" event.
  int Exit(int code, const std::string& what, const Status& s) const {
    if (ExitCode injected = InjectedFaultExit(faults, what, s)) return *injected;
    if (faults.record != nullptr) faults.record->Failed(what, s);
    return Fail(code, what, s);
  }
};

// 1-2. Flags, the directory's lock (a second `foreman train` is refused
//      before it reads or writes anything, and the lock is held until the
//      run ends), the directory's stored settings, and the checkpoint to
//      restore.
ExitCode OpenDirectory(const CLI::App& cmd, TrainJob& job);
// 3. The model's shape and the session's schedules; --threads 0 resolved.
ExitCode PlanModel(TrainJob& job);
// 3b. --device.
ExitCode ResolveDevice(TrainJob& job);
// 4. The data.
ExitCode LoadData(TrainJob& job);
// 5. The MLP job; a resumed run's checkpoint must fit it.
ExitCode BuildModel(TrainJob& job);
// 6. The session's options.
ExitCode SessionOptions(TrainJob& job);
// 6b. A cluster worker's Server.
ExitCode StartServer(TrainJob& job);
// 7. The settings file, the log and the run's header lines.
ExitCode WriteRunFiles(TrainJob& job);

}  // namespace foreman::cli
