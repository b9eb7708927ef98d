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

  /// True when all three TLS paths are given.
  bool tls_enabled() const { return !tls_cert.empty() && !tls_key.empty() && !tls_ca.empty(); }
};

/// Checks `task` against `spec` (ValidateClusterTask) and `options`:
/// heartbeat_ms in (0, 1 day], connection_timeout_ms >= 3 x heartbeat_ms,
/// ps_wait_secs > 0; TLS paths all given or none ("TLS needs all three of
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
