// `foreman chaos`'s invariant checks, each on what a `foreman train` run left
// in its checkpoint directory or its run record (docs/fault-injection.md,
// "foreman chaos", lists the invariants and what a failure means).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "foreman/env.hpp"
#include "foreman/status.hpp"

namespace foreman::internal {

/// Every checkpoint the state file of `dir` lists (and its latest) opens and
/// verifies (the CRC32C of every tensor, BundleReader::VerifyAll), and
/// LatestCheckpoint finds one to restore when checkpoints exist. No state
/// file and no checkpoint: OK. DATA_LOSS naming each bad checkpoint and why.
Status VerifyListedCheckpoints(Env* env, const std::string& dir);

/// The global_step of the checkpoint LatestCheckpoint picks in `dir` (what a
/// restart restores); -1 when there is none. Errors: LatestCheckpoint's, or
/// INVALID_ARGUMENT for a prefix without a "-<step>" suffix.
StatusOr<int64_t> LatestCheckpointStep(Env* env, const std::string& dir);

/// The latest checkpoints of `expected_dir` and `actual_dir` hold the same
/// tensors bit for bit (names, dtypes, shapes, bytes; optimizer slots,
/// global_step and the input position included). FAILED_PRECONDITION naming
/// the differing tensors (at most 5, then a count) or the missing ones.
Status CompareFinalWeights(Env* env, const std::string& expected_dir, const std::string& actual_dir);

/// TensorBoard's view of the runs in `dir` and `dir`/eval: each directory's
/// event files read in name order (= creation order), then TensorBoard's
/// purge rule (EventsKeptAfterPurge: a SessionLog START at step s purges the
/// earlier events with step >= s); in what stays each (tag, step) scalar may
/// appear at most once. A cut last record (SIGKILL while writing) is not an
/// error. FAILED_PRECONDITION naming the duplicates (at most 5, then a
/// count); a file that does not read: its error.
Status CheckScalarsOnce(Env* env, const std::string& dir);

/// One in-process recovery as the run's event file records it (the
/// `recovery/...` summary MonitoredTrainingSession writes, RecoveryOptions::
/// summary_dir): at `step` (the first good step after it), its detect,
/// restore and next-good-step times in milliseconds (-1: not measured) and
/// the steps it lost.
struct RecoveryMetrics {
  int64_t step = 0;
  int64_t recoveries = 0;
  int64_t steps_lost = 0;
  int64_t detect_ms = 0;
  int64_t restore_ms = 0;
  int64_t next_good_step_ms = -1;
};

/// The recoveries TensorBoard shows in `dir`'s event files (after its purge
/// rule, EventsKeptAfterPurge: a recovery a later one abandoned with its
/// steps is not shown; of two at one step, the later), in
/// step order. A cut last record is not an error; a file that does not read:
/// its error.
StatusOr<std::vector<RecoveryMetrics>> ReadRecoveryMetrics(Env* env, const std::string& dir);

/// What one `foreman train` process did: its run record's events
/// (foreman/fault.hpp's RunRecordWriter; the events of that process only)
/// and, under --restart-policy, its report's "service restart" lines.
struct TrainLog {
  /// The step the process restored at its start (a "restore" event),
  /// nullopt when it started fresh (or never got there).
  std::optional<int64_t> restored_step;
  /// The last global_step the process completed (its "step" events); the
  /// start step when it completed none; -1 when it did not start.
  int64_t last_step = -1;
  /// In-process recoveries ("recovery" events) and the steps they lost.
  int64_t recoveries = 0;
  int64_t recovery_steps_lost = 0;
  /// Under `foreman train --restart-policy`: the service restarts (and
  /// removals) the process printed ("service restart <n>: <service>
  /// restarted|removed; ..."), one text per line after "service restart
  /// <n>: ", and the summary steps the restarted writers lost ("summary
  /// steps lost: [...]"), in order.
  std::vector<std::string> service_restarts;
  std::vector<int64_t> summary_steps_lost;
  /// The id of the injected fault that ended the process (an
  /// "injected_stop" event), empty when none did.
  std::string stopped_by_fault;
  /// The job stopped after a signal with its final checkpoint (an "exit"
  /// event with "stopped_by_signal").
  bool stopped_by_signal = false;
  /// Each place where global_step moved other than +1 per step, or back to a
  /// checkpoint an in-process recovery restored, and each recovery that
  /// restored another checkpoint than the latest durable one (empty: none).
  std::vector<std::string> step_errors;
};

/// `record`: the process's run-record events, in order; `log_text`: its
/// stdout and stderr (only the "service restart" lines are read).
TrainLog ParseTrainLog(const std::vector<nlohmann::json>& record, const std::string& log_text);

// -- shared by `foreman chaos`'s presets (chaos.cpp, chaos_cluster.cpp) --------------

/// One invariant's result for a seed: failed (with what failed), held, or
/// not checked (its reason in `details`).
struct Invariant {
  bool ok = true;
  bool checked = true;
  std::vector<std::string> details;
  void Fail(std::string detail) {
    ok = false;
    details.push_back(std::move(detail));
  }
};

/// The invariants' names, in the report's column order.
const std::vector<std::string>& InvariantNames();

/// The report's cell for `i`: "FAIL", "ok" or "-" (not checked).
std::string InvariantCell(const Invariant& i);

/// A failed seed's block of the report, for every preset: "seed N FAILED:",
/// each failed invariant's details (in InvariantNames() order), `runs_line`
/// (as given, without its newline), where the seed's logs are under
/// `work_dir`, and the replay command.
std::string FailedSeedText(int64_t seed, const std::map<std::string, Invariant>& invariants,
                           const std::string& runs_line, const std::string& work_dir, const std::string& replay);

/// Whether `flags` has `--name` or `--name=V`.
bool HasFlag(const std::vector<std::string>& flags, const std::string& name);

/// A word the shell reads back unchanged (for a replay command).
std::string ShellQuote(const std::string& s);

/// Milliseconds since `start` on the steady clock.
int64_t MillisSince(std::chrono::steady_clock::time_point start);

}  // namespace foreman::internal
