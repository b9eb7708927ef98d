// `foreman train`'s flags (train_settings.hpp).
#include "train_settings.hpp"

#include <set>
#include <string>

#include "command.hpp"
#include "foreman/mlp_job_settings.hpp"

namespace foreman::cli {

Status ValidateTrainFlags(const TrainFlags& f) {
  if (f.checkpoint_dir.empty()) return absl::InvalidArgumentError("--checkpoint-dir must not be empty");
  return ValidateMlpJobSettings(f);
}

std::set<std::string> GivenFlags(const CLI::App& cmd) {
  std::set<std::string> given;
  for (const CLI::Option* option : cmd.get_options()) {
    if (option->count() == 0) continue;
    for (const std::string& name : option->get_lnames()) given.insert("--" + name);
  }
  return given;
}

void AddTrainFlags(CLI::App& cmd, TrainFlags& f) {
  // MonitoredTrainingSession's arguments (TF's names and defaults).
  cmd.add_option("--checkpoint-dir", f.checkpoint_dir, "Checkpoints, events, the run's settings and log")
      ->capture_default_str();
  cmd.add_option("--save-checkpoint-secs", f.save_checkpoint_secs,
                 "Save every N seconds (TF's default 600 when neither this nor --save-checkpoint-steps is set)");
  cmd.add_option("--save-checkpoint-steps", f.save_checkpoint_steps, "Save every N global steps")
      ->transform(DecimalInt64());
  cmd.add_option("--save-summaries-steps", f.save_summaries_steps,
                 "Write summaries every N global steps (TF's default 100)")
      ->transform(DecimalInt64());
  cmd.add_option("--save-summaries-secs", f.save_summaries_secs, "Write summaries every N seconds");
  cmd.add_option("--log-step-count-steps", f.log_step_count_steps,
                 "global_step/sec every N steps; also the interval of plain progress lines (0: no step counter)")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--stop-grace-period-secs", f.stop_grace_period_secs,
                 "After a signal, how long the final checkpoint may take")
      ->capture_default_str();
  // The job's own.
  cmd.add_option("--max-steps", f.max_steps, "Stop at this global_step (0: no limit)")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--epochs", f.epochs, "Passes over the training data (0: no limit); in a cluster, ceil(epochs x examples / batch) "
                 "global steps shared by the workers")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--batch-size", f.batch_size, "Examples per step")->transform(DecimalInt64())->capture_default_str();
  cmd.add_option("--learning-rate", f.learning_rate, "Default: 0.001 for adam, 0.01 for momentum (0.9), 0.1 for sgd");
  cmd.add_option("--learning-rate-decay-steps", f.learning_rate_decay_steps,
                 "TF's exponential_decay: the rate is multiplied by --learning-rate-decay-rate every this many "
                 "steps, continuously (0: a constant rate)")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--learning-rate-decay-rate", f.learning_rate_decay_rate, "In (0, 1]")->capture_default_str();
  cmd.add_option("--optimizer", f.optimizer, "sgd | momentum | adam")->capture_default_str();
  cmd.add_option("--hidden", f.hidden, "Hidden layer sizes, comma-separated ('none': softmax regression)")
      ->capture_default_str();
  cmd.add_option("--seed", f.seed, "Initial weights and data order")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--threads", f.threads, "Intra-op threads (0: one per CPU this process may use)")
      ->transform(DecimalInt64())->capture_default_str();
  cmd.add_option("--device", f.device,
                 "Where the step runs: cpu, gpu:N (CUDA device N; exit 2 when it cannot be used) or auto (GPU 0 "
                 "when a session can be made there, else the CPU; said on stderr). Not model-defining: a run may "
                 "resume on another device")
      ->capture_default_str();
  cmd.add_option("--device-memory-limit-mb", f.device_memory_limit_mb,
                 "At most this many MiB of GPU memory (0: the device's own limit); running out is exit 2 naming "
                 "the device and the size. Ignored on the CPU")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd.add_option("--data-dir", f.data_dir, "Fashion-MNIST's gzip IDX files (Debian: dataset-fashion-mnist)")
      ->capture_default_str();
  cmd.add_option("--eval-every-steps", f.eval_every_steps,
                 "Test-set accuracy at every multiple of N global steps (in a cluster: the chief's first step at or past "
                 "each) into <checkpoint-dir>/eval (0: only at the end)")
      ->transform(DecimalInt64())->capture_default_str();
  cmd.add_option("--prefetch-batches", f.prefetch_batches, "Batches the input pipeline prepares ahead")
      ->transform(DecimalInt64())->capture_default_str();
  cmd.add_option("--fault-plan", f.fault_plan,
                 "Inject the faults of this JSON plan (docs/fault-injection.md): env faults into the job's file "
                 "system, step, hook and process (SIGKILL/SIGTERM) faults into training; those that fire are "
                 "recorded in <checkpoint-dir>/fault_record.json and, unless marked repeat, do not fire again "
                 "when the run is restarted. Not stored in the run's settings")
      ->check(NonEmpty());
  cmd.add_option("--run-record", f.run_record,
                 "Append what this process does (restores, steps, recoveries, its end; durable saves with --fault-plan) to this file "
                 "as JSON lines (docs/fault-injection.md, \"The run record\"); also on a cluster's workers, not "
                 "on a ps task. With --fault-plan the default is <checkpoint-dir>/run_record.jsonl. Not stored in "
                 "the run's settings")
      ->check(NonEmpty());
  cmd.add_option("--restart-policy", f.restart_policy,
                 "Restart failing service actors (summary writer, checkpoint saver, step counter, input pipeline) "
                 "instead of "
                 "ending the run, in Erlang/OTP's terms, e.g. \"one_for_one,max_restarts=3,period_secs=60,"
                 "summary_writer=permanent,checkpoint_saver=permanent\" (docs/train.md). Default: TF's (a "
                 "failing service ends the run). Not stored in the run's settings")
      ->check(NonEmpty());
  // A cluster (cluster_task.hpp): all of the first four or none; never stored.
  const char* kCluster = "Cluster (TF1 between-graph replication; not stored in the run's settings)";
  cmd.add_option("--ps-hosts", f.cluster.ps_hosts, "The ps tasks: host:port[,host:port...]")->group(kCluster);
  cmd.add_option("--worker-hosts", f.cluster.worker_hosts,
                 "The worker tasks: host:port[,host:port...]; worker 0 is the chief")
      ->group(kCluster);
  cmd.add_option("--job-name", f.cluster.job_name,
                 "This process's job: ps (serves its share of the variables, needs the optimizer flags but no "
                 "data or checkpoint directory) or worker (trains; worker k shuffles the data with --seed + k, so "
                 "each worker reads its own order and worker 0's is --seed's)")
      ->group(kCluster);
  cmd.add_option("--task-index", f.cluster.task_index, "This process's task in its job (0-based)")
      ->transform(DecimalInt64())
      ->group(kCluster);
  cmd.add_option("--heartbeat-ms", f.cluster.heartbeat_ms,
                 "Heartbeat interval between the tasks (give every task the same); also a worker's poll interval "
                 "while it waits for the chief")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--connection-timeout-ms", f.cluster.connection_timeout_ms,
                 "A peer not heard from for this long is down (at least 3 x --heartbeat-ms)")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--ps-wait-secs", f.cluster.ps_wait_secs,
                 "How long a recovery waits for a ps task that is down; also how long a worker waits for the "
                 "chief to prepare the session")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--cluster-job-id", f.cluster.cluster_job_id,
                 "The cluster job this task belongs to (1 to 64 letters, digits, '.', '_', '-'; give every task of a "
                 "job the same). Left out: one derived from --ps-hosts and --worker-hosts (\"spec-\" and a hash), "
                 "so tasks started from the same spec agree. A ps task refuses another job's chief (exit 2) and "
                 "its workers' updates; `foreman cluster status` shows each task's id")
      ->check(NonEmpty())
      ->group(kCluster);
  cmd.add_option("--ps-join-timeout-secs", f.cluster.ps_join_timeout_secs,
                 "A ps task's bound on its wait for the chief to end training; past it the ps exits 1")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--eval-timeout-secs", f.cluster.eval_timeout_secs,
                 "The evaluator task's (TF_CONFIG task.type evaluator) bound on its wait for a new checkpoint in "
                 "--checkpoint-dir; past it the evaluator exits 1")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--ps-eviction-grace-secs", f.cluster.ps_eviction_grace_secs,
                 "A ps task's bound, once evicted (SIGTERM, SIGINT), on its wait for the chief's checkpoint: it "
                 "refuses updates, serves the chief's checkpoint read, then exits 75 (at once when no chief is "
                 "applying); keep it under the cluster manager's grace period (Kubernetes: 30 s)")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--replicas-to-aggregate", f.cluster.replicas_to_aggregate,
                 "Synchronous training (TF's SyncReplicasOptimizer): each update averages the gradients of this "
                 "many workers computed at one global_step; stale ones are dropped (>= 1; left out: asynchronous "
                 "training, TF1's default)")
      ->transform(DecimalInt64())
      ->group(kCluster);
  cmd.add_option("--total-num-replicas", f.cluster.total_num_replicas,
                 "Synchronous training: how many workers send gradients (>= --replicas-to-aggregate; more are "
                 "backup workers whose late gradients are dropped; left out: the number of workers)")
      ->transform(DecimalInt64())
      ->group(kCluster);
  cmd.add_option("--operation-timeout-ms", f.cluster.operation_timeout_ms,
                 "A worker's bound on one read or update of a ps task (TF's operation_timeout_in_ms); in "
                 "synchronous training also how long an update waits for the other workers' gradients")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--tls-cert", f.cluster.tls_cert, "Mutual TLS: this task's PEM certificate (with --tls-key, --tls-ca)")
      ->check(NonEmpty())
      ->group(kCluster);
  cmd.add_option("--tls-key", f.cluster.tls_key, "Mutual TLS: the certificate's unencrypted PEM key")
      ->check(NonEmpty())
      ->group(kCluster);
  cmd.add_option("--tls-ca", f.cluster.tls_ca, "Mutual TLS: the PEM CA certificates peers must chain to")
      ->check(NonEmpty())
      ->group(kCluster);
  cmd.add_flag("--signal-ends-training", f.cluster.signal_ends_training,
               "The chief's: a SIGINT/SIGTERM/SIGHUP ends training on the ps tasks (the whole job ends: the "
               "workers exit 0) after the final checkpoint; without it a signal stops only the chief (an "
               "eviction: exit 75, training goes on, a restarted chief re-attaches). `foreman cluster local` "
               "gives it")
      ->group(kCluster);
  cmd.add_option("--cluster-env", f.cluster.cluster_env,
                 "Without --ps-hosts, --worker-hosts, --job-name and --task-index, where the cluster comes from: "
                 "auto (TF_CONFIG when set, else an srun step of more than one task: SLURM_PROCID, SLURM_NTASKS, "
                 "SLURM_STEP_NODELIST), tf_config, slurm, or none (a single-process run). Those four flags, when "
                 "given, win: the environment is not read (docs/cluster.md)")
      ->check(CLI::IsMember({"auto", "tf_config", "slurm", "none"}))
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--slurm-base-port", f.cluster.slurm_base_port,
                 "A Slurm cluster: rank SLURM_PROCID listens on this port + SLURM_PROCID")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_option("--slurm-ps-tasks", f.cluster.slurm_ps_tasks,
                 "A Slurm cluster: ranks 0 .. N-1 are the ps tasks, rank N the chief (worker 0), rank N+k worker k")
      ->transform(DecimalInt64())
      ->capture_default_str()
      ->group(kCluster);
  cmd.add_flag("--insecure", f.cluster.insecure,
               "Allow non-loopback addresses without TLS (plain connections have no authentication)")
      ->group(kCluster);
  // A flag given twice takes its last value (a script's defaults, then the user's).
  for (CLI::Option* option : cmd.get_options()) option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

}  // namespace foreman::cli
