// `foreman chaos --preset cluster`: seeded kills of the tasks of a small
// local cluster (one ps, the chief, worker 1, each a `foreman train` child
// on 127.0.0.1), restarts after a drawn delay, silent network partitions of
// worker 1 or the ps where network namespaces can be made (then in two
// namespaces joined by a veth pair), and the invariants that carry
// over from the one-process presets (docs/fault-injection.md, "--preset
// cluster").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace foreman::cli {

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

/// What `foreman chaos` already checked and prepared for a cluster run.
struct ClusterChaosOptions {
  std::string work;                      // the work directory (absolute, made)
  bool temporary = false;                // made by foreman chaos: removed when every seed passed
  bool keep = false;                     // --keep
  std::vector<int64_t> seeds;            // in order
  std::string json_path;                 // --json ("" = none)
  double timeout_secs = 60;              // per task process
  std::vector<std::string> train_flags;  // the user's, after -- (empty: the default job)
  std::vector<std::string> report_train_flags;  // the same as the JSON report spells them (no absolute path)
};

/// Runs every seed and prints the report (and writes --json). Exit codes as
/// `foreman chaos`'s: 0 every invariant held, 1 one failed (or a run could
/// not be made). The train flags must have passed ClusterTrainFlagsError.
/// Installs its own SIGINT/SIGTERM/SIGHUP handlers (they kill every task's
/// process group). Not thread-safe (one per process).
int RunClusterChaos(const ClusterChaosOptions& options);

}  // namespace foreman::cli
