// `foreman train`'s flags, their checks, and the run's settings file
// (<checkpoint-dir>/train_settings.txt), which lets the same command resume a
// run: flags not given on the command line take the stored values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "foreman/dataset.hpp"
#include "foreman/env.hpp"
#include "foreman/nn.hpp"
#include "foreman/restart_policy.hpp"
#include "foreman/status.hpp"

namespace foreman::cli {

inline constexpr char kTrainSettingsFile[] = "train_settings.txt";

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
  // A ps task's bound on its wait for the chief to end training (Server::Join).
  int64_t ps_join_timeout_secs = 86400;
  // Synchronous training (TF's SyncReplicasOptimizer): 0 = asynchronous.
  int64_t replicas_to_aggregate = 0;  // --replicas-to-aggregate N
  int64_t total_num_replicas = 0;     // --total-num-replicas M (0: the number of workers)
  // A worker's bound on one read or update of a ps task (ServerOptions::request_timeout_ms).
  int64_t operation_timeout_ms = 10'000;
};

struct TrainFlags {
  std::string checkpoint_dir = "foreman-train";
  std::string data_dir = data::kFashionMnistDir;
  // MonitoredTrainingSession's schedules: unset means TF's default.
  std::optional<double> save_checkpoint_secs;
  std::optional<int64_t> save_checkpoint_steps;
  std::optional<int64_t> save_summaries_steps;
  std::optional<double> save_summaries_secs;
  int64_t log_step_count_steps = 100;
  double stop_grace_period_secs = 120;
  int64_t max_steps = 0;
  int64_t epochs = 15;
  int64_t batch_size = 128;
  std::optional<double> learning_rate;  // unset: the optimizer's default
  int64_t learning_rate_decay_steps = 1000;
  double learning_rate_decay_rate = 0.8;
  std::string optimizer = "adam";
  std::string hidden = "256";
  int64_t seed = 0;
  int64_t threads = 0;  // 0: one per CPU this process may run on
  // --device cpu | gpu:N | auto (docs/train.md "Devices"). Stored as given
  // (like --threads, not model-defining: a resume may change it, with a
  // note). auto: GPU 0 when a session can be made there, else the CPU.
  std::string device = "auto";
  // --device-memory-limit-mb: SessionConfig.device_memory_limit_bytes in MiB
  // (0: the device's own limit). Ignored on the CPU.
  int64_t device_memory_limit_mb = 0;
  int64_t eval_every_steps = 500;
  int64_t prefetch_batches = 4;
  // --fault-plan: a FaultPlan JSON file (foreman/fault.hpp). Not a setting of
  // the run: never stored, so a resume without the flag injects nothing.
  std::string fault_plan;
  // --restart-policy: the session's RestartPolicy (foreman/restart_policy.hpp)
  // in ParseRestartPolicy's syntax; empty: TF's default. Not a setting of
  // the run either (how to survive a failing service, not what is trained):
  // never stored or compared, so a resume takes any policy.
  std::string restart_policy;
  // The cluster flags: never stored or compared (see ClusterFlags).
  ClusterFlags cluster;
};

/// Registers every flag of `foreman train` on `cmd`, bound to `flags`.
void AddTrainFlags(CLI::App& cmd, TrainFlags& flags);

/// Checks the flags on their own. INVALID_ARGUMENT naming the flag and value.
Status ValidateTrainFlags(const TrainFlags& flags);

/// --device's text: "cpu" -> "/cpu:0", "gpu:N" -> "/gpu:N" (N decimal
/// digits, < 2^31), "auto" -> "" (resolved by `foreman train` at start).
/// INVALID_ARGUMENT naming --device and the text otherwise.
StatusOr<std::string> ParseDeviceFlag(const std::string& text);

/// "256,128" -> {256, 128}; "none" -> {} (softmax regression). INVALID_ARGUMENT
/// naming the text, and for an empty (or blank) text: softmax regression is
/// asked for by name, an empty value is more likely an unset variable.
StatusOr<std::vector<int64_t>> ParseHidden(const std::string& text);

/// The learning rate of `--optimizer` when --learning-rate is not given.
double DefaultLearningRate(nn::OptimizerKind kind);

/// The settings of the run stored in `dir`, key -> value; nullopt when the
/// file does not exist. INVALID_ARGUMENT naming the file and line for a
/// malformed line or a missing model-defining key.
StatusOr<std::optional<std::map<std::string, std::string>>> ReadTrainSettings(Env* env, const std::string& dir);

/// Resolves the flags against the stored settings of a resumed run: a flag
/// not given on the command line takes the stored value (schedules in pairs:
/// giving either of --save-checkpoint-secs / --save-checkpoint-steps drops
/// both stored ones, and the same for the summary pair). --hidden,
/// --optimizer and --seed define the model and its data order: a given value
/// that differs from the stored one is FAILED_PRECONDITION naming the flag,
/// both values and the file. A stored value that does not parse is
/// INVALID_ARGUMENT naming the file and key. `notes` gets one line per given
/// flag whose value replaces a different stored one.
Status ResolveTrainFlags(const std::map<std::string, std::string>& stored, const CLI::App& cmd,
                         const std::string& dir, TrainFlags& flags, std::vector<std::string>* notes);

/// The settings to store for `flags` (after resolution; `threads` resolved).
std::map<std::string, std::string> TrainSettings(const TrainFlags& flags);

/// Writes the settings file like a checkpoint: a temporary file, synced,
/// renamed, the directory synced. The temporary file is removed on failure.
Status WriteTrainSettings(Env* env, const std::string& dir, const std::map<std::string, std::string>& settings);

}  // namespace foreman::cli
