// A cluster's shape and settings, as TF1's between-graph replication names
// them: the ClusterSpec (tf.train.ClusterSpec: job name -> "host:port" per
// task), the task a process runs (--job-name, --task-index; worker 0 is the
// chief), where each variable lives (tf.train.replica_device_setter's
// round-robin over the ps tasks), the network settings every node shares,
// and a check of the TLS files before anything listens.
//
// Everything here is a pure function or value type: no network, no threads.
// CheckTlsFiles reads files; the rest touches nothing outside its arguments.
//
//   ```cpp
//   #include "foreman/cluster.hpp"
//   FOREMAN_ASSIGN_OR_RETURN(foreman::ClusterSpec cluster,
//                            foreman::ClusterSpec::FromFlags("127.0.0.1:2222", "127.0.0.1:2223,127.0.0.1:2224"));
//   foreman::ClusterTask task{"worker", 0};  // worker 0: the chief
//   foreman::ClusterOptions options;         // heartbeat 200 ms, timeout 1000 ms, no TLS: loopback only
//   FOREMAN_RETURN_IF_ERROR(foreman::ValidateClusterOptions(cluster, task, options));
//   // global_step and the variables in creation order -> their ps task (one ps: all on task 0)
//   FOREMAN_ASSIGN_OR_RETURN(std::vector<int> ps_task,
//                            foreman::PlaceVariablesOnPs({"global_step", "dense/kernel", "dense/bias"},
//                                                        cluster.num_tasks("ps")));
//   if (!task.is_chief() || ps_task[2] != 0) return absl::InternalError("unexpected");
//   ```
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "foreman/status.hpp"

namespace foreman {

/// One task's address. `host` is a host name, an IPv4 address or an IPv6
/// address without its brackets ("::1"); `port` is in [1, 65535].
struct TaskAddress {
  std::string host;
  int port = 0;
};

/// TF's tf.train.ClusterSpec: job name -> the ordered "host:port" of its
/// tasks (task_index = position). A value type; a valid ClusterSpec is only
/// made by Create or FromFlags, and is immutable (thread-safe to share).
class ClusterSpec {
 public:
  /// Checks and keeps `jobs`. Rules: at least one job; job names match
  /// [a-z][a-z0-9_]*; each job has at least one task; each entry is
  /// "host:port" with host a host name (letters, digits, '-', '.'), a dotted
  /// IPv4 address or a bracketed IPv6 address ("[::1]:2222"), and port a
  /// decimal in [1, 65535]; no "host:port" appears twice anywhere in the spec
  /// (hosts compared without case, addresses as written: "localhost:1" and
  /// "127.0.0.1:1" are different entries).
  /// Errors: INVALID_ARGUMENT naming the job, the entry, its 1-based position
  /// and task index, e.g. "job 'worker' entry 2 (task 1) '127.0.0.1:99999':
  /// port must be in [1, 65535]".
  static StatusOr<ClusterSpec> Create(std::map<std::string, std::vector<std::string>> jobs);

  /// The spec of TF1's example programs' flags: `ps_hosts` and
  /// `worker_hosts` are comma-separated "host:port" lists (no spaces) for
  /// the jobs "ps" and "worker"; both must name at least one task. The same
  /// rules and errors as Create, naming the flag instead of the job:
  /// "--worker-hosts entry 2 (task 1) '127.0.0.1:99999': port must be in
  /// [1, 65535]", "--ps-hosts is empty: a cluster needs at least one ps task".
  static StatusOr<ClusterSpec> FromFlags(const std::string& ps_hosts, const std::string& worker_hosts);

  /// Every job's entries as given, by job name.
  const std::map<std::string, std::vector<std::string>>& jobs() const { return jobs_; }
  /// The number of tasks of `job`; 0 for a job the spec does not have.
  int num_tasks(const std::string& job) const;
  /// The address of task `task_index` of `job`. INVALID_ARGUMENT for an
  /// unknown job or an index outside [0, num_tasks(job)), naming the range.
  StatusOr<TaskAddress> task_address(const std::string& job, int task_index) const;
  /// The spec in flag form, jobs by name, each as "--<job>-hosts H:P[,H:P...]"
  /// ('_' in a job name becomes '-'), separated by spaces:
  /// "--ps-hosts 127.0.0.1:2222 --worker-hosts 127.0.0.1:2223,127.0.0.1:2224".
  std::string ToString() const;

 private:
  friend class ClusterSpecBuilder;
  ClusterSpec() = default;
  std::map<std::string, std::vector<std::string>> jobs_;
  std::map<std::string, std::vector<TaskAddress>> addresses_;
};

/// The task a process runs: TF1's --job-name and --task-index.
struct ClusterTask {
  std::string job_name;
  int task_index = 0;

  /// TF1's convention: the chief is worker task 0 (it initialises or
  /// restores the variables and writes checkpoints and summaries).
  bool is_chief() const { return job_name == "worker" && task_index == 0; }
};

/// OK when `task` names a job of `spec` and an index in range. Errors:
/// INVALID_ARGUMENT "--job-name 'evaluator' is not a job of the cluster
/// (jobs: ps, worker)" or "--task-index 3 is out of range for job 'worker':
/// it has 2 tasks, valid indices are 0..1".
Status ValidateClusterTask(const ClusterSpec& spec, const ClusterTask& task);

/// A cluster and this process's task as a launcher's environment describes
/// them (ClusterFromTfConfig, ClusterFromSlurm, ClusterFromEnvironment).
struct ClusterLaunch {
  /// The cluster in Foreman's terms: jobs "ps" and "worker" (worker 0 is
  /// the chief).
  ClusterSpec spec;
  /// This process's task in `spec`; for TF's evaluator task {"evaluator",
  /// 0}, which is not in `spec` (it is no task of the training cluster).
  ClusterTask task;
  /// The task in the launcher's terms, for logs: "TF_CONFIG task chief 0",
  /// "TF_CONFIG task worker 1", "SLURM_PROCID 2 of SLURM_NTASKS 4".
  std::string described_as;
  /// The launcher's cluster has an evaluator task (TF_CONFIG's "evaluator"
  /// job): it evaluates the checkpoints, and the chief does not.
  bool has_evaluator = false;
};

/// The cluster of TF's TF_CONFIG, the JSON object Kubeflow's TFJob operator,
/// SageMaker and Vertex AI give each task (TF's TFConfigClusterResolver
/// reads the same): {"cluster": {"chief": [H:P], "worker": [H:P, ...],
/// "ps": [H:P, ...], "evaluator": [H:P]}, "task": {"type": T, "index": I}}.
/// Mapping onto Foreman's jobs: TF's "chief" task becomes worker 0 (the
/// chief) and TF's worker i becomes worker i + 1; without a "chief" job,
/// TF's worker 0 is the chief and worker i stays worker i (TF1's
/// convention). TF's ps i is ps i. "evaluator" (at most one task) is checked
/// and left out of the spec, as TF leaves it out of the training cluster;
/// has_evaluator says it is there, and task.type "evaluator" gives the task
/// {"evaluator", 0} (not in the spec: it connects to no task).
/// Other top-level keys ("environment", "rpc_layer") are ignored.
/// `tf_config` is the variable's text. Errors, each starting "TF_CONFIG: "
/// and naming the field and position: INVALID_ARGUMENT for text that is not
/// JSON (with the byte offset), a missing or mistyped "cluster" or "task",
/// a job other than chief, worker, ps and evaluator, more than one chief or
/// evaluator, no ps, no chief and no worker, an entry that is not a
/// "host:port" string ("TF_CONFIG: cluster.worker[1]: expected \"host:port\",
/// found 5"), an address given twice, a task index that is not a whole
/// number or is out of range, a task type the cluster lacks. A pure
/// function; thread-safe.
///   ```cpp
///   #include "foreman/cluster.hpp"
///   // TF's worker 0 of a cluster with a chief: Foreman's worker 1.
///   FOREMAN_ASSIGN_OR_RETURN(foreman::ClusterLaunch launch, foreman::ClusterFromTfConfig(R"({
///       "cluster": {"chief": ["127.0.0.1:2223"], "worker": ["127.0.0.1:2224"], "ps": ["127.0.0.1:2222"]},
///       "task": {"type": "worker", "index": 0}})"));
///   if (launch.task.job_name != "worker" || launch.task.task_index != 1 ||
///       launch.spec.num_tasks("worker") != 2) {
///     return absl::InternalError("unexpected");
///   }
///   ```
StatusOr<ClusterLaunch> ClusterFromTfConfig(const std::string& tf_config);

/// The host names of a Slurm host list as `scontrol show hostnames` expands
/// it: commas outside brackets separate entries; a bracket group holds
/// comma-separated numbers and ranges "lo-hi" (lo <= hi), each number
/// written with the digits of the text it came from, zero-padded to the
/// width of lo ("node[08-10]" -> node08, node09, node10); several groups
/// in one entry expand to every combination, the first group varying
/// slowest ("rack[1-2]-n[1-2]" -> rack1-n1, rack1-n2, rack2-n1, rack2-n2).
/// Duplicates are kept, in order. Errors: INVALID_ARGUMENT naming
/// `variable` and the 1-based character position, e.g.
/// "SLURM_JOB_NODELIST: position 7: unclosed '['" (also: an empty entry, a
/// stray ']', a nested '[', an empty or non-numeric range, lo > hi, more
/// than 65536 hosts). A pure function; thread-safe.
StatusOr<std::vector<std::string>> ExpandSlurmHostList(const std::string& host_list,
                                                       const std::string& variable = "SLURM_JOB_NODELIST");

/// What ClusterFromSlurm reads: the variables' texts (empty: not set) and
/// the rule's two settings.
struct SlurmLaunch {
  /// SLURM_PROCID: this task's rank in [0, ntasks).
  std::string procid;
  /// SLURM_NTASKS: the number of tasks of the step.
  std::string ntasks;
  /// The nodes, as a host list, and the name of the variable it came from
  /// (SLURM_STEP_NODELIST when srun set it, else SLURM_JOB_NODELIST).
  std::string nodelist;
  std::string nodelist_variable = "SLURM_JOB_NODELIST";
  /// Tasks per node, in Slurm's form "2(x3),1" (2 tasks on each of 3
  /// nodes, then 1), and its variable (SLURM_STEP_TASKS_PER_NODE, else
  /// SLURM_TASKS_PER_NODE). May be empty when every node runs one task or
  /// there is one node.
  std::string tasks_per_node;
  std::string tasks_per_node_variable = "SLURM_TASKS_PER_NODE";
  /// Task p listens on base_port + p, in [1, 65535] for every task.
  int base_port = 2222;
  /// The first num_ps_tasks ranks are the ps tasks, >= 1.
  int num_ps_tasks = 1;
};

/// The cluster of a Slurm step: ranks 0 .. num_ps_tasks - 1 are ps tasks
/// 0 .. num_ps_tasks - 1, rank num_ps_tasks is worker 0 (the chief) and
/// rank num_ps_tasks + k is worker k. Rank p runs on the node Slurm's block
/// distribution (its default) puts it on: the first tasks_per_node[0]
/// ranks on the first node of the list, and so on; it listens on
/// base_port + p. Needs ntasks >= num_ps_tasks + 1. Errors: INVALID_ARGUMENT
/// naming the variable (ExpandSlurmHostList's messages for the node list;
/// "SLURM_PROCID: '' is not set", a rank outside [0, ntasks), tasks per node
/// that do not add up to SLURM_NTASKS or do not match the number of nodes,
/// a port past 65535, a host that is not a valid host name). A pure
/// function; thread-safe.
StatusOr<ClusterLaunch> ClusterFromSlurm(const SlurmLaunch& slurm);

/// Which environment ClusterFromEnvironment reads.
enum class ClusterEnvironment {
  /// TF_CONFIG when set and not empty; else Slurm inside an srun step
  /// (SLURM_STEP_NODELIST set, with SLURM_PROCID and SLURM_NTASKS) of more
  /// than one task; else none. A batch script itself (SLURM_PROCID and
  /// SLURM_NTASKS but no SLURM_STEP_NODELIST) is not a cluster.
  kAuto,
  /// TF_CONFIG only; FAILED_PRECONDITION when it is not set.
  kTfConfig,
  /// The SLURM_* variables only (SLURM_JOB_NODELIST when there is no step
  /// node list); FAILED_PRECONDITION when they are not set.
  kSlurm,
  /// None: a single-process run.
  kNone,
};

/// The cluster this process's environment describes, nullopt when it
/// describes none. Reads the variables (getenv) once; `slurm` gives the
/// Slurm rule's base_port and num_ps_tasks (its texts are ignored and read
/// from the environment). Under kAuto a single-task Slurm step
/// (SLURM_NTASKS=1) and a batch script outside srun are not clusters. Errors: those of ClusterFromTfConfig
/// and ClusterFromSlurm; FAILED_PRECONDITION naming the missing variables
/// for kTfConfig and kSlurm. Thread-safe as long as nothing sets the
/// environment meanwhile.
StatusOr<std::optional<ClusterLaunch>> ClusterFromEnvironment(ClusterEnvironment which, const SlurmLaunch& slurm);

/// Where each variable lives, as TF1's tf.train.replica_device_setter(
/// ps_tasks=N) places it with its default round-robin strategy: `names` are
/// the variables in creation order; the result has one ps task index in
/// [0, num_ps_tasks) per name, in the same order.
///   - Primary variables take ps tasks round-robin in creation order
///     (i-th primary -> task i mod N), after "global_step" is moved to the
///     front if present: it is always on task 0, and the result equals TF's
///     whenever global_step is created first (the usual case).
///   - Slot variables "<var>/Momentum", "<var>/Adam", "<var>/Adam_1" go to
///     <var>'s task and take no turn (TF creates slots colocated with their
///     variable, and colocation bypasses the device function).
///   - "beta1_power" and "beta2_power" (AdamOptimizer's non-slot variables)
///     go with the first primary variable by name other than global_step
///     (TF colocates them with min(var_list, key=name)), and take no turn.
/// Every primary other than "global_step" counts as trainable here.
/// Errors: INVALID_ARGUMENT for num_ps_tasks < 1, an empty or duplicate name,
/// a slot whose variable is not in `names`, a slot of a slot or of a beta
/// power ("a/Adam/Adam", "beta1_power/Adam": TF creates none), or beta
/// powers with no trainable variable (each message names the variable).
StatusOr<std::vector<int>> PlaceVariablesOnPs(const std::vector<std::string>& names, int num_ps_tasks);

/// The network settings every node of a cluster shares (give every process
/// the same values).
struct ClusterOptions {
  /// How often a node sends a heartbeat to each peer (--heartbeat-ms), in
  /// (0, 86400000] (a day).
  int64_t heartbeat_ms = 200;
  /// A peer not heard from for this long is dropped as down
  /// (--connection-timeout-ms); at least 3 x heartbeat_ms, or a node drops
  /// healthy peers whose heartbeats arrive a little late.
  int64_t connection_timeout_ms = 1000;
  /// How long a recovery keeps reconnecting to a ps that is down before the
  /// run fails (--ps-wait-secs), > 0. While a ps task is unreachable
  /// (UNAVAILABLE), MonitoredSession's recovery of a session on this
  /// cluster's target re-creates the session every heartbeat_ms as ONE
  /// recovery, not spending RecoveryOptions::max_recoveries or its back-off;
  /// past this wait the run fails with UNAVAILABLE naming the ps task and
  /// the wait. When the ps is back (restarted, uninitialized) the chief
  /// restores every ps task from its latest checkpoint and logs the global
  /// steps lost (MonitoredSession::steps_lost, RecoveryReport::steps_lost).
  int64_t ps_wait_secs = 300;
  /// PEM files for mutual TLS (--tls-cert, --tls-key, --tls-ca): TLS is on
  /// when all three are given; any other non-empty combination is an error.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  /// Without TLS every address of the spec must be loopback unless this is
  /// set (--insecure).
  bool insecure = false;
  /// The cluster job this task belongs to (--cluster-job-id): 1 to 64 of
  /// [A-Za-z0-9._-]. Empty: DefaultClusterJobId(spec), so tasks started
  /// from the same spec agree without configuration. A ps task accepts the
  /// chief's init (or restore) and end of training and the workers' applies
  /// only from its own job: another job's are FAILED_PRECONDITION naming
  /// both ids, and change nothing (a copy-pasted spec cannot take over a
  /// running job's ps). `foreman cluster status` shows each task's id.
  std::string job_id;

  /// True when all three TLS paths are given.
  bool tls_enabled() const { return !tls_cert.empty() && !tls_key.empty() && !tls_ca.empty(); }
};

/// The job id tasks started from `spec` get when ClusterOptions::job_id is
/// empty: "spec-" and 12 hex digits of a 64-bit FNV-1a hash of
/// spec.ToString() (the jobs by name, each job's addresses in task order),
/// e.g. "spec-3f2a9c0d11b4". The same on every platform; a pure function,
/// thread-safe. Not a security measure: a job id is not a secret (TLS
/// authenticates peers), it keeps two jobs' tasks from mixing by mistake.
/// TF: none (TF1's tasks carry no job identity; a second chief on a ps
/// re-initialises it). Within a job, a ps task once initialized is never
/// initialized again, only restored (SessionManager::prepare_session).
std::string DefaultClusterJobId(const ClusterSpec& spec);

/// Checks `task` against `spec` (ValidateClusterTask) and `options`:
/// heartbeat_ms in (0, 1 day], connection_timeout_ms >= 3 x heartbeat_ms,
/// ps_wait_secs > 0; job_id empty or 1 to 64 of [A-Za-z0-9._-]
/// ("--cluster-job-id 'a b': ..."); TLS paths all given or none ("TLS needs all three of
/// --tls-cert, --tls-key and --tls-ca; missing: --tls-key"); without TLS and
/// without `insecure`, every address of the spec must be loopback
/// (127.0.0.0/8, ::1, "localhost"), since plain connections have no
/// authentication: anyone who reaches a port can message the cluster's
/// actors. All errors INVALID_ARGUMENT naming the flag or task and what to
/// pass. Reads no file: CheckTlsFiles checks the TLS files themselves.
Status ValidateClusterOptions(const ClusterSpec& spec, const ClusterTask& task, const ClusterOptions& options);

/// True for 127.0.0.0/8, ::1 (and IPv4-mapped ::ffff:127.x.y.z) and the
/// name "localhost" (any case). `host` as in TaskAddress (no brackets).
bool IsLoopbackHost(const std::string& host);

/// The TLS preflight, run before anything listens: `cert_path` (--tls-cert,
/// a PEM certificate, optionally followed by its intermediate CAs),
/// `key_path` (--tls-key, an unencrypted PEM private key) and `ca_path`
/// (--tls-ca, PEM CA certificates that peers' certificates must chain to)
/// must each be a readable regular file (not a pipe or device: CAF's TLS
/// module reads them again on every connection); the key must match the
/// certificate; the certificate must be valid now and verify against the CA
/// file. Errors, all INVALID_ARGUMENT naming the flag and the path: a file
/// that cannot be read (with the system's reason) or is not a regular file,
/// one without the expected PEM block, an
/// encrypted key (passphrases are not supported yet), a key that does not
/// match the certificate, a certificate not yet valid or expired (with the
/// date), one that does not verify against the CA (with libssl's reason).
/// Thread-safe; leaves libssl's per-thread error queue empty.
Status CheckTlsFiles(const std::string& cert_path, const std::string& key_path, const std::string& ca_path);

}  // namespace foreman
