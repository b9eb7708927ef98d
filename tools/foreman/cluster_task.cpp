// `foreman train` as one task of a cluster: cluster_task.hpp.
#include "cluster_task.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "command.hpp"
#include "foreman/logging.hpp"

namespace foreman::cli {
namespace {

constexpr const char* kCoreFlags[] = {"--ps-hosts", "--worker-hosts", "--job-name", "--task-index"};
constexpr const char* kOtherFlags[] = {"--heartbeat-ms", "--connection-timeout-ms", "--ps-wait-secs",
                                       "--ps-join-timeout-secs", "--ps-eviction-grace-secs", "--tls-cert", "--tls-key", "--tls-ca",
                                       "--insecure", "--replicas-to-aggregate", "--total-num-replicas",
                                       "--operation-timeout-ms", "--signal-ends-training",
                                       "--cluster-job-id", "--eval-timeout-secs"};

// --replicas-to-aggregate / --total-num-replicas (TF's
// SyncReplicasOptimizer(replicas_to_aggregate, total_num_replicas)) into
// `run`.
Status CheckSyncFlags(const CLI::App& cmd, const ClusterFlags& c, ClusterRun& run) {
  const int64_t workers = run.spec.num_tasks("worker");
  const bool has_n = cmd.count("--replicas-to-aggregate") > 0;
  const bool has_m = cmd.count("--total-num-replicas") > 0;
  if (has_n && (c.replicas_to_aggregate < 1 || c.replicas_to_aggregate > INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replicas-to-aggregate must be >= 1 (leave it out for asynchronous training), got ", c.replicas_to_aggregate));
  }
  if (has_m && !has_n) {
    return absl::InvalidArgumentError(
        "--total-num-replicas is for synchronous training: give it with --replicas-to-aggregate");
  }
  if (!has_n) return absl::OkStatus();
  if (has_m && (c.total_num_replicas < 1 || c.total_num_replicas > INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--total-num-replicas must be >= 1, got ", c.total_num_replicas));
  }
  const int64_t m = has_m ? c.total_num_replicas : workers;
  if (m > workers) {
    return absl::InvalidArgumentError(absl::StrCat("--total-num-replicas=", m, " is more than the ", workers,
                                                   " workers of --worker-hosts"));
  }
  if (c.replicas_to_aggregate > m) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replicas-to-aggregate=", c.replicas_to_aggregate, " is more than ",
        has_m ? absl::StrCat("--total-num-replicas=", m) : absl::StrCat("the ", workers, " workers of --worker-hosts"),
        " (an update could never gather that many gradients)"));
  }
  run.replicas_to_aggregate = static_cast<int>(c.replicas_to_aggregate);
  run.total_num_replicas = static_cast<int>(m);
  return absl::OkStatus();
}

ClusterEnvironment EnvironmentOf(const std::string& flag) {
  if (flag == "tf_config") return ClusterEnvironment::kTfConfig;
  if (flag == "slurm") return ClusterEnvironment::kSlurm;
  if (flag == "none") return ClusterEnvironment::kNone;
  return ClusterEnvironment::kAuto;
}

// Without the four core flags: the launcher's environment (TF_CONFIG, then
// Slurm), unless --cluster-env none. nullopt: no cluster.
StatusOr<std::optional<ClusterLaunch>> LaunchFromEnvironment(const CLI::App& cmd, const ClusterFlags& c) {
  if (c.slurm_base_port < 1 || c.slurm_base_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slurm-base-port must be in [1, 65535], got ", c.slurm_base_port));
  }
  if (c.slurm_ps_tasks < 1 || c.slurm_ps_tasks > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--slurm-ps-tasks must be >= 1, got ", c.slurm_ps_tasks));
  }
  SlurmLaunch slurm;
  slurm.base_port = static_cast<int>(c.slurm_base_port);
  slurm.num_ps_tasks = static_cast<int>(c.slurm_ps_tasks);
  FOREMAN_ASSIGN_OR_RETURN(std::optional<ClusterLaunch> launch,
                           ClusterFromEnvironment(EnvironmentOf(c.cluster_env), slurm));
  const bool from_slurm = launch.has_value() && absl::StartsWith(launch->described_as, "SLURM_");
  for (const char* flag : {"--slurm-base-port", "--slurm-ps-tasks"}) {
    if (cmd.count(flag) > 0 && !from_slurm) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " is for a cluster read from Slurm's SLURM_* variables, and this process's cluster is ",
          launch.has_value() ? absl::StrCat("read from ", launch->described_as) : std::string("not from Slurm")));
    }
  }
  return launch;
}

}  // namespace

StatusOr<std::optional<ClusterRun>> CheckClusterFlags(const CLI::App& cmd, const TrainFlags& f) {
  const ClusterFlags& c = f.cluster;
  std::vector<std::string> given;
  std::vector<std::string> missing;
  for (const char* flag : kCoreFlags) (cmd.count(flag) > 0 ? given : missing).push_back(flag);
  std::optional<ClusterLaunch> launch;
  if (given.empty()) {
    FOREMAN_ASSIGN_OR_RETURN(launch, LaunchFromEnvironment(cmd, c));
  }
  if (given.empty() && !launch.has_value()) {
    for (const char* flag : kOtherFlags) {
      if (cmd.count(flag) > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, " is a cluster flag: give it with --ps-hosts, --worker-hosts, --job-name and --task-index "
                  "or with a cluster in TF_CONFIG or Slurm's variables (or drop it for a single-process run)"));
      }
    }
    return std::optional<ClusterRun>();
  }
  if (!given.empty()) {
    if (!missing.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a cluster needs all of --ps-hosts, --worker-hosts, --job-name and --task-index (given: ",
          absl::StrJoin(given, ", "), "); missing: ", absl::StrJoin(missing, ", ")));
    }
    if (c.cluster_env == "tf_config" || c.cluster_env == "slurm") {
      return absl::InvalidArgumentError(absl::StrCat("--cluster-env ", c.cluster_env,
                                                     " reads the cluster from the environment: give it without "
                                                     "--ps-hosts, --worker-hosts, --job-name and --task-index"));
    }
    for (const char* flag : {"--slurm-base-port", "--slurm-ps-tasks"}) {
      if (cmd.count(flag) > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, " is for a cluster read from Slurm's SLURM_* variables, not with --ps-hosts and --worker-hosts"));
      }
    }
    // The flags win; say so when a launcher's variables are there too.
    if (c.cluster_env == "auto") {
      for (const char* variable : {"TF_CONFIG", "SLURM_PROCID"}) {
        const char* value = std::getenv(variable);
        if (value != nullptr && *value != '\0') {
          std::fprintf(stderr, "foreman train: %s is set but ignored: the cluster flags (--job-name ...) win\n",
                       variable);
        }
      }
    }
  }
  if (!f.fault_plan.empty()) {
    return absl::InvalidArgumentError(
        "--fault-plan is for a single-process run; it cannot be given with the cluster flags (--job-name)");
  }
  if (!launch.has_value() && (c.task_index < 0 || c.task_index > INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("--task-index must be >= 0, got ", c.task_index));
  }
  if (c.operation_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--operation-timeout-ms must be > 0, got ", c.operation_timeout_ms));
  }
  if (c.ps_join_timeout_secs <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ps-join-timeout-secs must be > 0, got ", c.ps_join_timeout_secs));
  }
  if (c.ps_eviction_grace_secs < 0 || c.ps_eviction_grace_secs > 3600) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ps-eviction-grace-secs must be in [0, 3600], got ", c.ps_eviction_grace_secs));
  }
  const std::string job_name = launch.has_value() ? launch->task.job_name : c.job_name;
  if (!f.run_record.empty() && (job_name == "ps" || job_name == "evaluator")) {
    return absl::InvalidArgumentError(absl::StrCat("--run-record is for a training task; ",
                                                   job_name == "ps" ? "a ps task" : "the evaluator",
                                                   " trains nothing (give it to the workers only)"));
  }
  if (cmd.count("--eval-timeout-secs") > 0 && job_name != "evaluator") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--eval-timeout-secs is the evaluator task's (TF_CONFIG task.type evaluator); this process is ", job_name,
        " task ", launch.has_value() ? launch->task.task_index : c.task_index));
  }
  if (c.eval_timeout_secs <= 0 || c.eval_timeout_secs > 86400 * 365) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval-timeout-secs must be in [1, 31536000], got ", c.eval_timeout_secs));
  }
  const int64_t task_index = launch.has_value() ? launch->task.task_index : c.task_index;
  if (c.signal_ends_training && !(job_name == "worker" && task_index == 0)) {
    return absl::InvalidArgumentError(
        "--signal-ends-training is the chief's (--job-name worker --task-index 0): a signal to another task stops "
        "only that task");
  }
  std::optional<ClusterRun> built;
  if (launch.has_value()) {
    built.emplace(ClusterRun{launch->spec, launch->task, ClusterOptions{}});
    built->has_evaluator = launch->has_evaluator;
    std::fprintf(stderr, "foreman train: the cluster from %s: %s task %d of %s\n", launch->described_as.c_str(),
                 launch->task.job_name.c_str(), launch->task.task_index, launch->spec.ToString().c_str());
    // TF's evaluator is outside the training cluster: no server, no dial,
    // so none of the network checks apply.
    if (built->is_evaluator()) return built;
  } else {
    FOREMAN_ASSIGN_OR_RETURN(ClusterSpec spec, ClusterSpec::FromFlags(c.ps_hosts, c.worker_hosts));
    built.emplace(ClusterRun{std::move(spec), ClusterTask{c.job_name, static_cast<int>(c.task_index)},
                             ClusterOptions{}});
  }
  ClusterRun& run = *built;
  run.options.heartbeat_ms = c.heartbeat_ms;
  run.options.connection_timeout_ms = c.connection_timeout_ms;
  run.options.ps_wait_secs = c.ps_wait_secs;
  run.options.tls_cert = c.tls_cert;
  run.options.tls_key = c.tls_key;
  run.options.tls_ca = c.tls_ca;
  run.options.insecure = c.insecure;
  run.options.job_id = c.cluster_job_id;
  run.operation_timeout_ms = c.operation_timeout_ms;
  FOREMAN_RETURN_IF_ERROR(ValidateClusterOptions(run.spec, run.task, run.options));
  FOREMAN_RETURN_IF_ERROR(CheckSyncFlags(cmd, c, run));
  if (run.options.tls_enabled()) {
    FOREMAN_RETURN_IF_ERROR(CheckTlsFiles(run.options.tls_cert, run.options.tls_key, run.options.tls_ca));
  }
  return built;
}

int RunEvaluatorTask(const MlpJobSettings& settings, data::FashionMnist data,
                     int64_t eval_timeout_secs, std::shared_ptr<StopRequest> stop) {
  const std::string& dir = settings.checkpoint_dir;
  // The training's last global_step: --max-steps, or the cluster's steps for
  // --epochs (ClusterStepsForEpochs, as every worker stops there).
  int64_t last_step = ClusterStepsForEpochs(settings.epochs, data.train.labels.num_elements(), settings.batch_size);
  if (settings.max_steps > 0) last_step = last_step > 0 ? std::min(last_step, settings.max_steps) : settings.max_steps;
  MlpEvaluatorOptions options;
  options.settings = settings;
  options.data = std::move(data);
  options.last_step = last_step;
  options.poll_interval_ms = 500;
  options.timeout_ms = eval_timeout_secs * 1000;
  options.stop = std::move(stop);
  options.on_eval = [](const std::string& prefix, const MlpJobEval& eval) {
    const std::size_t slash = prefix.rfind('/');
    const std::string name = slash == std::string::npos ? prefix : prefix.substr(slash + 1);
    std::printf("evaluated %s at global_step %lld: accuracy %.4f loss %.4f\n", EscapeForTerminal(name).c_str(),
                static_cast<long long>(eval.global_step), eval.accuracy, eval.loss);
    std::fflush(stdout);
  };
  options.on_warning = [](const std::string& warning) {
    std::fprintf(stderr, "foreman train: evaluator: %s\n", EscapeForTerminal(warning).c_str());
  };
  std::fprintf(stderr,
               "foreman train: the evaluator: evaluating each new checkpoint of %s on the test set into %s/eval "
               "until global_step %lld (waiting at most --eval-timeout-secs=%lld for each)\n",
               dir.c_str(), dir.c_str(), static_cast<long long>(last_step), static_cast<long long>(eval_timeout_secs));
  std::fflush(stderr);
  StopRequest* raw_stop = options.stop.get();
  auto result = RunMlpEvaluator(std::move(options));
  raw_stop->Complete();
  if (!result.ok()) {
    std::fprintf(stderr, "foreman train: evaluator: %s%s\n", EscapeForTerminal(result.status().message()).c_str(),
                 absl::IsDeadlineExceeded(result.status())
                     ? absl::StrCat(" (--eval-timeout-secs=", eval_timeout_secs, ")").c_str()
                     : "");
    return absl::IsInvalidArgument(result.status()) ? kExitUsage : kExitFailed;
  }
  if (result->stopped) {
    std::printf("evaluator: stopped by a signal after %zu evaluations, not finished (exit %d); started again, it "
                "evaluates the latest checkpoint\n",
                result->evals.size(), kExitStopped);
    std::fflush(stdout);
    return kExitStopped;
  }
  std::printf("evaluator: evaluated %zu checkpoints (%lld skipped); the last at global_step %lld, the training's "
              "last step: exiting\n",
              result->evals.size(), static_cast<long long>(result->skipped),
              static_cast<long long>(result->evals.empty() ? 0 : result->evals.back().global_step));
  std::fflush(stdout);
  return kExitOk;
}

int RunParameterServer(const ClusterRun& cluster, const ServerOptions& options, absl::Duration join_timeout,
                       absl::Duration eviction_grace, StopRequest& stop) {
  const std::string who = absl::StrCat("ps task ", cluster.task.task_index);
  auto server = Server::Create(cluster.spec, cluster.task, options);
  if (!server.ok()) {
    std::fprintf(stderr, "foreman train: %s: cannot start: %s\n", who.c_str(),
                 EscapeForTerminal(server.status().message()).c_str());
    return absl::IsInvalidArgument(server.status()) ? kExitUsage : kExitFailed;
  }
  std::fprintf(stderr,
               "foreman train: %s serving at %s (%s); waiting for the chief to end training "
               "(at most --ps-join-timeout-secs=%lld)\n",
               who.c_str(), (*server)->target().c_str(), cluster.spec.ToString().c_str(),
               static_cast<long long>(absl::ToInt64Seconds(join_timeout)));
  std::fflush(stderr);
  Server* raw = server->get();
  // An eviction: refuse updates, let the chief take its checkpoint (at most
  // eviction_grace), then exit 75.
  const int64_t listener = stop.Listen([raw, eviction_grace](const Status&) { raw->Evict(eviction_grace); });
  const Status joined = (*server)->Join(join_timeout);
  stop.Unlisten(listener);
  const bool signalled = stop.stop_requested();
  server->reset();  // stops serving
  stop.Complete();
  if (signalled) {
    std::printf("%s: stopped by a signal before training ended, not finished (exit %d); started again, the chief "
                "restores it\n",
                who.c_str(), kExitStopped);
    std::fflush(stdout);
    return kExitStopped;
  }
  if (!joined.ok()) {
    std::fprintf(stderr, "foreman train: %s: %s\n", who.c_str(),
                 absl::IsDeadlineExceeded(joined)
                     ? absl::StrCat("the chief did not end training within --ps-join-timeout-secs=",
                                    absl::ToInt64Seconds(join_timeout), " (", EscapeForTerminal(joined.message()), ")")
                           .c_str()
                     : EscapeForTerminal(joined.message()).c_str());
    return kExitFailed;
  }
  std::printf("%s: training ended; exiting\n", who.c_str());
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace foreman::cli
