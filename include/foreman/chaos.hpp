// The chaos harness: runs a small `foreman train` job under seeded fault
// plans, restarts it after each process-level fault as a supervisor would,
// and checks invariants after every run: the checkpoints verify, global_step
// only moves as it should, the final weights equal a fault-free run's, each
// scalar is written once, every process ends in time, the job finishes
// (Foreman's fault-injection guide details each). `foreman chaos` is a thin
// command line over RunChaos; a program of your own can run the same soak.
//
// The job runs as child processes: `ChaosOptions::foreman_program train ...`
// (each in its own process group, bounded by timeout_secs), so the harness
// needs the `foreman` binary. The library prints nothing: the table's lines
// come to a ChaosObserver as each seed ends, the rest is in the ChaosReport.
//
// A soak of your own: options.foreman_program = "/usr/bin/foreman",
// options.preset = "steps", options.seeds = 100, then RunChaos(options) and
// report->failed. Options are checked before anything runs:
// ```cpp
// #include "foreman/chaos.hpp"
// foreman::ChaosOptions options;
// options.foreman_program = "/proc/self/exe";
// options.preset = "steps";
// options.seeds = 0;  // outside [1, 1000000]
// foreman::StatusOr<foreman::ChaosReport> report = foreman::RunChaos(options);
// // INVALID_ARGUMENT "--seeds must be in [1, 1000000], got 0"; nothing ran
// if (report.ok() || !absl::IsInvalidArgument(report.status())) return absl::InternalError("not refused");
// ```
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "foreman/env.hpp"
#include "foreman/status.hpp"

namespace foreman {

/// What `disk` "sim" gives each simulated process of the job: the
/// process's whole world apart from memory.
struct SimulatedProcess {
  /// The file system: --checkpoint-dir on the simulated disk (a MemEnv,
  /// foreman/mem_env.hpp's crash model), every other path the real one,
  /// read-only. Not owned; valid during the call.
  Env* env = nullptr;
  /// The log's file, on the real disk, instead of <checkpoint-dir>/train.log.
  std::string log_file;
  /// Called on the training thread, from the checkpoint saver hook's
  /// listener (CheckpointSaverListener::after_save), when a checkpoint save
  /// is reported durable and before training goes on, with its global_step
  /// and prefix: the harness checks it there. The save itself ran on the
  /// checkpoint saver's own thread.
  std::function<void(int64_t global_step, const std::string& prefix)> on_durable_save;
};

/// What to run. The fields mirror `foreman chaos`'s flags, and RunChaos's
/// INVALID_ARGUMENT messages name them by those flags ("--seeds must be in
/// [1, 1000000], got 0").
struct ChaosOptions {
  /// The `foreman` executable whose `train` subcommand is the job (the CLI
  /// passes "/proc/self/exe": itself): a path, run without a PATH search.
  /// Empty, or not an executable file: INVALID_ARGUMENT naming it.
  std::string foreman_program;
  /// "disk", "steps", "actors", "signals", "all", "cluster" (the tasks of
  /// a local cluster killed and restarted) or "power" (power cuts and torn
  /// writes over the simulated disk: disk "sim"); "" with no plan_file:
  /// "all".
  std::string preset;
  /// A JSON fault plan (FaultPlan's file format, foreman/fault.hpp), used
  /// for every seed (its seed replaced); may hold "changes_training": true
  /// (the final weights are then not compared). Not with a preset.
  std::string plan_file;
  /// The seeds: `seed` alone, or `seeds` (default 10, in [1, 1000000])
  /// seeds from `first_seed` (default 0, >= 0). Not both.
  std::optional<int64_t> seed;
  std::optional<int64_t> seeds;
  std::optional<int64_t> first_seed;
  /// Where the report goes as JSON (no absolute paths; timings in *_ms):
  /// checked writable before any run, written when every seed has run. ""
  /// = none.
  std::string json_path;
  /// Where the runs go (kept); "" = a new temporary directory under
  /// $TMPDIR (or /tmp), removed when every seed passed unless `keep`.
  std::string work_dir;
  bool keep = false;
  /// The limit of each `foreman train` process in seconds, in (0, 86400]
  /// (past it the process group is killed: a hang).
  double timeout_secs = 60;
  /// "real" (or ""): each process of the job is a `foreman_program train`
  /// child on the real disk. "sim": power loss -- each process is
  /// `train_in_process` over a simulated disk that a crash fault cuts the
  /// power of (what was not made durable by the Env's sync rules is lost or
  /// torn), restarted over what survived; checkpoints are checked when
  /// their save is reported durable, against an image of the disk after a
  /// power cut at that instant. Not with --preset cluster, nor with a plan's
  /// process faults (a signal would end the harness). Preset "power" is
  /// this mode's (and implies it).
  std::string disk;
  /// With disk "sim": runs `foreman train` with `args` (args[0] == "train")
  /// in this process over `process` and returns its exit code; called from
  /// the thread that called RunChaos, one call at a time, each one a whole
  /// process's life (everything it started ended when it returns). The CLI
  /// passes its own train command. Unset under "sim": INVALID_ARGUMENT.
  std::function<int(const std::vector<std::string>& args, const SimulatedProcess& process)> train_in_process;
  /// `foreman chaos --shrink SEED`: instead of a soak, reduce the failing
  /// plan of `seed` (required) to a smaller one that still fails one of the
  /// invariants it failed -- drop each fault that is not needed, then move
  /// the rest earlier (the smallest `nth` and `at_step` that still fail, a
  /// probabilistic fault at the first operation it matches) -- and write it
  /// as a plan file in the work directory, named with its replay command in
  /// the summary. At most 80 runs of the seed. Not under --preset cluster.
  bool shrink = false;
  /// `foreman train` flags; empty: the preset's default job. May not set
  /// --checkpoint-dir, --fault-plan or --run-record (set per seed), nor,
  /// under the cluster preset, the cluster flags it sets.
  std::vector<std::string> train_flags;
};

/// What RunChaos tells as it goes. Each callback runs on the thread that
/// called RunChaos; the default ones do nothing.
class ChaosObserver {
 public:
  virtual ~ChaosObserver() = default;
  /// The work directory, once made and before any child starts.
  virtual void OnWorkDirectory(const std::string& dir) { (void)dir; }
  /// Process group `pgid` of a child now runs in `slot` (0-4: the train
  /// job, or a cluster's ps, chief, worker 1 and two network-namespace
  /// holders); `pgid` 0: the slot's child is gone. For a signal handler that
  /// must kill them (kill(-pgid, SIGKILL)) before the process exits.
  virtual void OnProcessGroup(int slot, int pgid) {
    (void)slot;
    (void)pgid;
  }
  /// Text of the report's table, whole lines ending in '\n': the header
  /// lines before the first seed, then one row as each seed ends.
  virtual void OnTable(const std::string& lines) { (void)lines; }
  /// A seed's process `n` (0: the first start; not under the cluster
  /// preset) has exited, before its run directory `run_dir` is checked.
  virtual void OnProcessExit(int64_t seed, int n, const std::string& run_dir) {
    (void)seed;
    (void)n;
    (void)run_dir;
  }
};

/// RunChaos's result once every seed ran.
struct ChaosReport {
  int64_t seeds = 0;
  /// Seeds where an invariant failed.
  int64_t failed = 0;
  /// What follows the table: each failed seed's invariants, runs, logs and
  /// replay command, the service restarts, and the "N seeds, F failed, T s"
  /// line; whole lines ending in '\n'.
  std::string summary;
  /// False when json_path was given and could not be written.
  bool json_written = true;
  /// The work directory when kept (a failure, `keep`, or a given
  /// work_dir); "" when it was removed.
  std::string work_dir;
};

/// Runs every seed (ChaosOptions) and checks the invariants. Errors:
/// INVALID_ARGUMENT for bad options, a plan file that does not parse, a
/// fault-free run that `foreman train` refused (exit 2), or a seed whose
/// first run it refused (the message names the seed and quotes train's last
/// lines); INTERNAL or FAILED_PRECONDITION when the fault-free run fails or
/// hangs, or a child cannot be started or a file written (the message says
/// which). A failed invariant is no error: see ChaosReport::failed. Takes
/// minutes for the default seeds; each child is bounded by timeout_secs.
/// Not thread-safe: one RunChaos per process at a time (it owns the child
/// processes and the work directory).
StatusOr<ChaosReport> RunChaos(const ChaosOptions& options, ChaosObserver* observer = nullptr);

}  // namespace foreman
