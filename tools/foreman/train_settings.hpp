// `foreman train`'s flags: CLI11's registration of the MLP job's settings
// (foreman/mlp_job_settings.hpp, which also holds their checks and the run's
// settings file), --fault-plan and the cluster flags.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include <CLI/CLI.hpp>

#include "foreman/mlp_job_settings.hpp"
#include "foreman/status.hpp"

namespace foreman::cli {

// The cluster flags (TF1's example programs' --ps_hosts, --worker_hosts,
// --job_name, --task_index, dash style; docs/train.md "Clusters"). Not
// settings of the run: never stored in train_settings.txt, so a
// single-process resume of a cluster checkpoint stays single-process.
// Checked by CheckClusterFlags (cluster_task.hpp).
struct ClusterFlags {
  std::string ps_hosts;      // --ps-hosts H:P[,H:P...]
  std::string worker_hosts;  // --worker-hosts H:P[,H:P...]
  std::string job_name;      // --job-name ps|worker
  int64_t task_index = 0;    // --task-index N (required with the others)
  int64_t heartbeat_ms = 200;            // ClusterOptions' defaults (loopback)
  int64_t connection_timeout_ms = 1000;
  int64_t ps_wait_secs = 300;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  bool insecure = false;
  // --cluster-job-id ID (ClusterOptions::job_id): "" = derived from the spec.
  std::string cluster_job_id;
  // A ps task's bound on its wait for the chief to end training (Server::Join).
  int64_t ps_join_timeout_secs = 86400;
  // The evaluator task's bound on its wait for a new checkpoint (TF: checkpoints_iterator's timeout).
  int64_t eval_timeout_secs = 600;
  // A ps task's bound on its wait, once evicted (a SIGTERM), for the
  // chief's checkpoint before it exits 75 (Server::Evict).
  int64_t ps_eviction_grace_secs = 5;
  // Synchronous training (TF's SyncReplicasOptimizer): 0 = asynchronous.
  int64_t replicas_to_aggregate = 0;  // --replicas-to-aggregate N
  int64_t total_num_replicas = 0;     // --total-num-replicas M (0: the number of workers)
  // A worker's bound on one read or update of a ps task (ServerOptions::request_timeout_ms).
  int64_t operation_timeout_ms = 10'000;
  // The chief's: a signal ends training on the ps tasks (the whole job)
  // instead of preempting only the chief (EndTrainingHookOptions).
  bool signal_ends_training = false;
  // Where the cluster comes from without --ps-hosts/--worker-hosts/--job-name/
  // --task-index (ClusterFromEnvironment): auto | tf_config | slurm | none.
  std::string cluster_env = "auto";
  // The Slurm rule (SlurmLaunch): rank p listens on --slurm-base-port + p;
  // the first --slurm-ps-tasks ranks are the ps tasks.
  int64_t slurm_base_port = 2222;
  int64_t slurm_ps_tasks = 1;
};

/// `foreman train`'s flags: the MLP job's settings (foreman/mlp_job_settings.hpp:
/// each field is the flag of the same name), --fault-plan and the cluster
/// flags.
struct TrainFlags : MlpJobSettings {
  // --fault-plan: a FaultPlan JSON file (foreman/fault.hpp). Not a setting of
  // the run: never stored, so a resume without the flag injects nothing.
  std::string fault_plan;
  // --run-record FILE: what this process did, as JSON lines (RunRecordWriter
  // in foreman/fault.hpp), appended to FILE. Never stored.
  std::string run_record;
  // The cluster flags: never stored or compared (see ClusterFlags).
  ClusterFlags cluster;
};

/// Registers every flag of `foreman train` on `cmd`, bound to `flags`.
void AddTrainFlags(CLI::App& cmd, TrainFlags& flags);

/// Checks the flags on their own: --checkpoint-dir must not be empty, then
/// ValidateMlpJobSettings. INVALID_ARGUMENT naming the flag and value.
Status ValidateTrainFlags(const TrainFlags& flags);

/// The flags given on `cmd`'s command line ("--hidden", ...), for
/// ResolveMlpJobSettings.
std::set<std::string> GivenFlags(const CLI::App& cmd);

}  // namespace foreman::cli
