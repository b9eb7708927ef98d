// `foreman train` as one task of a cluster (TF1's between-graph replication,
// docs/train.md "Clusters"): the cluster flags' checks, a ps task's run
// (tf.train.Server(...).join(), bounded). The chief's hook that ends
// training on the ps tasks is the library's EndTrainingHook
// (foreman/server.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "train_settings.hpp"
#include "foreman/cluster.hpp"
#include "foreman/dataset.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/server.hpp"
#include "foreman/status.hpp"
#include "foreman/stop.hpp"

namespace foreman::cli {

/// A checked cluster: the spec, this process's task and the network settings.
struct ClusterRun {
  ClusterSpec spec;
  ClusterTask task;
  ClusterOptions options;
  /// --replicas-to-aggregate N (0: asynchronous) and --total-num-replicas M
  /// (M defaults to the number of workers; 0 when asynchronous):
  /// ServerOptions::replicas_to_aggregate on every task.
  int replicas_to_aggregate = 0;
  int total_num_replicas = 0;
  /// --operation-timeout-ms (> 0): ServerOptions::request_timeout_ms.
  int64_t operation_timeout_ms = 10'000;
  /// TF_CONFIG lists an evaluator task (ClusterLaunch::has_evaluator): the
  /// chief does not evaluate. This process is that task when task.job_name
  /// is "evaluator": it is in no job of `spec` and connects to none.
  bool has_evaluator = false;
  bool is_evaluator() const { return task.job_name == "evaluator"; }
};

/// The cluster of `f.cluster`, checked before anything starts; nullopt when
/// no cluster flag is given and the environment describes no cluster (a
/// single-process run). A cluster needs all of --ps-hosts, --worker-hosts,
/// --job-name and --task-index; given, they win and the environment is not
/// read (a note on stderr when TF_CONFIG or SLURM_PROCID is set). Without
/// them, ClusterFromEnvironment(--cluster-env, --slurm-base-port,
/// --slurm-ps-tasks) may give the spec and the task (said on stderr); its
/// errors (TF_CONFIG or SLURM_* malformed) are returned
/// as they are. The other cluster flags (--heartbeat-ms, --tls-*, ...) only
/// with a cluster, the --slurm-* ones only with a Slurm one, and
/// --fault-plan not with one. An evaluator task (TF_CONFIG only) skips the
/// network checks (it serves and dials nothing); --eval-timeout-secs (> 0)
/// is its flag only. --replicas-to-aggregate N and
/// --total-num-replicas M (TF's SyncReplicasOptimizer): both >= 1 when
/// given, N <= M <= the number of workers, M only with N. Then
/// ClusterSpec::FromFlags,
/// ValidateClusterOptions (the task, heartbeats, TLS flags, loopback unless
/// --insecure) and, with TLS, CheckTlsFiles. INVALID_ARGUMENT naming the
/// flags (and what is missing), or the environment's errors; the caller
/// exits 2 for every error.
StatusOr<std::optional<ClusterRun>> CheckClusterFlags(const CLI::App& cmd, const TrainFlags& f);

/// A ps task: Server::Create, then Join until the chief ends training, at
/// most `join_timeout`. A stop request on `stop` (a signal) evicts it
/// (Server::Evict: it refuses updates and waits at most `eviction_grace`
/// for the chief's checkpoint), then stops the server.
/// Prints what it does on stderr; returns the exit code: 0 once training
/// ended, 2 for options Server::Create refuses, 75 (kExitStopped) stopped by
/// a signal, 1 otherwise (the address cannot be bound, the bound passed).
/// The evaluator task (RunMlpEvaluator on --checkpoint-dir): prints each
/// evaluation on stdout ("evaluated model.ckpt-300 at global_step 300:
/// accuracy 0.8100 loss 0.5200") and returns the exit code: 0 after
/// evaluating the training's last step (--max-steps, or the cluster's
/// steps for --epochs), 1 no new checkpoint within --eval-timeout-secs or
/// an error, 2 a checkpoint that does not fit the model flags, 75
/// (kExitStopped) stopped by a signal. `settings` must be validated and
/// planned (threads resolved); `data` is moved in.
int RunEvaluatorTask(const MlpJobSettings& settings, data::FashionMnist data,
                     int64_t eval_timeout_secs, std::shared_ptr<StopRequest> stop);

int RunParameterServer(const ClusterRun& cluster, const ServerOptions& options, absl::Duration join_timeout,
                       absl::Duration eviction_grace, StopRequest& stop);


}  // namespace foreman::cli
