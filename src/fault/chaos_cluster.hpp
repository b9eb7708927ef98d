// `foreman chaos --preset cluster`: seeded kills of the tasks of a small
// local cluster (one ps, the chief, worker 1, each a `foreman train` child
// on 127.0.0.1), restarts after a drawn delay, silent network partitions of
// worker 1 or the ps where network namespaces can be made (then in two
// namespaces joined by a veth pair), and the invariants that carry
// over from the one-process presets (docs/fault-injection.md, "--preset
// cluster").
// Internal.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fault/chaos_checks.hpp"
#include "fault/chaos_run.hpp"
#include "foreman/status.hpp"

namespace foreman::internal {

/// The plan of `--preset cluster` for `seed` and the job's `max_steps`, a
/// pure function of them (SplitMix64): {"preset": "cluster", "seed": K,
/// "max_steps": M, "events": [...]}, 1-3 events in the order they fire,
/// each {"id": "e<i>", "kill": "ps" | "chief" | "worker 1", "signal":
/// "SIGKILL", "at_chief_step": S (the chief's reported global_step, in
/// [30, max(32, 2M/5)], strictly increasing), "restart_after_ms": D (in
/// [200, 2000])}. With `partitions` (the run can make network namespaces),
/// each event independently becomes, with probability 1/3 (a second
/// SplitMix64 stream, so the steps and the kills left are those of the plan
/// without), {"id", "partition": T, "at_chief_step": S, "heal_after_ms": D
/// (in [1000, 3000])}: a silent cut of T's network, healed after D; T is
/// "worker 1" or "ps", one per seed. Thread-safe.
nlohmann::json ClusterChaosPlan(uint64_t seed, int64_t max_steps, bool partitions = false);

/// Why `train_flags` (the user's, after --) cannot run under --preset
/// cluster: a flag it sets per task (--ps-hosts, --worker-hosts,
/// --job-name, --task-index, --checkpoint-dir, --fault-plan, --insecure,
/// --ps-wait-secs, --ps-join-timeout-secs, --save-checkpoint-steps,
/// --log-step-count-steps), or no --max-steps N (the chief's end); "" when
/// they can (also when empty: the default job). Thread-safe.
std::string ClusterTrainFlagsError(const std::vector<std::string>& train_flags);

/// Tasks of the cluster (indices into kClusterTaskNames, kClusterTaskFiles).
inline constexpr int kPs = 0, kChief = 1, kWorker1 = 2;
inline constexpr const char* kClusterTaskNames[3] = {"ps", "chief", "worker 1"};
inline constexpr const char* kClusterTaskFiles[3] = {"ps", "chief", "worker1"};

/// One start of one task.
struct ClusterTaskRun {
  int task = 0;
  int n = 0;  // its nth start
  int exit_code = -1;
  std::string ended_by;
  bool killed_by_plan = false;
  bool timed_out = false;
  bool left_processes = false;
  bool cut_at_end = false;           // its network was cut when the chief ended training
  int64_t checkpoint_at_start = -1;  // the chief's latest checkpoint when it started (-1: none)
  int64_t first_step = -1;           // the first / last step its run record reported (-1: none)
  int64_t last_step = -1;
  int64_t steps_lost = 0;            // its run record's recoveries' steps lost
  std::string failed;                // its run record's "failed" event: "CODE: message" ("" none)
  std::string failed_code;           // that event's code ("UNAVAILABLE")
  int64_t elapsed_ms = 0;
};

/// One seed of --preset cluster.
struct ClusterSeedReport {
  int64_t seed = 0;
  nlohmann::json plan;
  std::vector<std::string> fired;
  int64_t restarts = 0;
  int64_t partitions = 0;  // partitions fired (each healed)
  int64_t steps_lost = 0;
  std::vector<ClusterTaskRun> runs;
  std::map<std::string, Invariant> invariants;
  std::string replay;
  std::string replay_report;  // with the report's paths (no absolute path)
  int64_t elapsed_ms = 0;
  bool ok() const {
    for (const auto& [n, i] : invariants) {
      if (!i.ok) return false;
    }
    return true;
  }
};

/// What every seed of one RunChaos --preset cluster shares.
struct ClusterJob {
  ChaosRun& run;
  std::string partition_unavailable;  // "" = partitions are drawn
  std::vector<std::string> train_flags;
  std::vector<std::string> report_train_flags;  // the user's, as the JSON report spells them
  int64_t max_steps = 0;
};

/// A new seed's report: its plan, its replay commands, its invariants (two
/// not applicable to a cluster).
ClusterSeedReport NewClusterSeedReport(const ClusterJob& job, int64_t seed);

/// The invariants checked when every task of the seed in `dir` has ended:
/// each task's end, the chief's resumes, the chief's final checkpoint.
void CheckClusterEnds(const ClusterJob& job, const std::string& dir, bool chief_done, int64_t last_ckpt,
                      ClusterSeedReport& r);

/// The bytes of the task log at `path` from `offset` ("" when unreadable).
std::string ReadClusterLog(const std::string& path, std::size_t offset);

/// Runs one seed (chaos_cluster.cpp); errors: a task or helper that could
/// not be started, a file that could not be written, a cut or heal that
/// failed (no task is left running then).
StatusOr<ClusterSeedReport> RunClusterSeed(const ClusterJob& job, int64_t seed);

}  // namespace foreman::internal
