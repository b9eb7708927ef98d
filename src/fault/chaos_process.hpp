// The one-process presets and plan files of RunChaos (foreman/chaos.hpp):
// what one seed's runs recorded, and the report made of them
// (chaos_process.cpp runs the seeds, chaos_process_report.cpp words the
// report). Internal.
//
// Per invocation, one fault-free baseline run (the same train flags); then
// per seed K, in <work>/seed-K/:
//   plan.json     the seed's plan (replay: foreman train --fault-plan plan.json)
//   run/          the job's --checkpoint-dir (its run_record.jsonl: what
//                 each process did, read by the invariants)
//   run-<n>.log   stdout and stderr of the nth process (0: the first start)
// Each process is a child (internal::Subprocess of ChaosOptions::
// foreman_program) in its own process group, bounded by timeout_secs (then
// the group is killed: a hang). The job is restarted after every exit other
// than 0 and 2, and after an exit 0 that was a signal's graceful stop (a
// preemption: the job is rescheduled), at most kChaosMaxRestarts times.
//
// Invariants (the report names each):
//   checkpoints_verify  after every exit, every checkpoint the state file
//                       lists verifies (CRC32C of every tensor) and one can
//                       be restored
//   global_step         each process starts at the latest checkpoint the one
//                       before it left (or 0), and within a process the step
//                       only goes +1, or back to a restored checkpoint
//   final_weights       the final checkpoint equals the baseline's bit for
//                       bit (every tensor: weights, optimizer slots,
//                       global_step, the input position)
//   scalars_once        under TensorBoard's purge rule, each (tag, step)
//                       scalar appears at most once
//   bounded             every process ended within timeout_secs and left
//                       no process in its group
//   finished            the job exited 0 at its end within kChaosMaxRestarts
//                       restarts
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fault/chaos_checks.hpp"
#include "fault/chaos_run.hpp"

namespace foreman::internal {

/// One process of a seed's job.
struct ProcessRun {
  int exit_code = 0;
  std::string ended_by;
  int64_t start_step = -1;       // the step it started at (restored, or 0); -1: it did not start training
  int64_t last_step = -1;        // the last step it reported (or checkpointed)
  int64_t checkpoint_step = -1;  // the latest checkpoint it left (-1: none)
  int64_t recoveries = 0;        // in-process
  int64_t recovery_steps_lost = 0;
  bool timed_out = false;
  bool left_processes = false;
  int64_t elapsed_ms = 0;
  // Under --restart-policy: in-process service restarts, as printed.
  std::vector<std::string> service_restarts;
  std::vector<int64_t> summary_steps_lost;
};

/// One seed: its plan, its processes, its invariants.
struct ProcessSeedReport {
  int64_t seed = 0;
  nlohmann::json plan;
  int64_t faults_planned = 0;
  std::vector<std::string> faults_fired;
  int64_t restarts = 0;
  int64_t steps_lost = 0;
  int64_t recoveries = 0;
  int64_t recovery_steps_lost = 0;
  // Under --restart-policy: service restarts (and removals) of every run,
  // and the summary steps the restarted writers lost.
  int64_t service_restarts = 0;
  std::vector<int64_t> summary_steps_lost;
  // The in-process recoveries TensorBoard shows in the run's event files.
  std::vector<RecoveryMetrics> recovery_metrics;
  std::vector<ProcessRun> runs;
  std::map<std::string, Invariant> invariants;
  std::string replay;
  std::string replay_report;  // the replay with no absolute path (the JSON report's)
  // foreman train refused the seed's first process (exit 2); what it said
  // last (LastLines), the seed's plan.json named as the user's plan file.
  // Planned faults that did not fire although the fault-free run reaches
  // what they wait for (its step, or -- a dry run of the plan's file-system
  // faults as zero-latency faults -- their operation): "<id>: <why>".
  std::vector<std::string> unfired;
  // --disk sim: the saves checked when they were reported durable.
  int64_t durable_saves_checked = 0;
  bool refused = false;
  std::string refused_lines;
  int64_t elapsed_ms = 0;
  bool ok() const;
};

/// The table's header, and a seed's row.
std::string ProcessTableHeader();
std::string ProcessTableRow(const ProcessSeedReport& r);

/// What follows the table (ChaosReport::summary) for `reports`, which took
/// `total_ms`.
std::string ProcessSummary(const ChaosRun& run, const std::vector<ProcessSeedReport>& reports, int64_t total_ms);

/// The --json document.
nlohmann::json ProcessReportJson(const ChaosRun& run, const std::vector<std::string>& train_flags,
                                 int64_t baseline_step, int64_t baseline_ms,
                                 const std::vector<ProcessSeedReport>& reports, int64_t failed, int64_t total_ms);

}  // namespace foreman::internal
