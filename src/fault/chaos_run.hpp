// One RunChaos call (foreman/chaos.hpp) as its presets share it: the checked
// options, the work directory, the report's path rules. Internal.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "foreman/chaos.hpp"
#include "foreman/env.hpp"
#include "foreman/status.hpp"
#include "platform/subprocess.hpp"

namespace foreman::internal {

/// How often a job is restarted at most (both supervisors).
inline constexpr int kChaosMaxRestarts = 10;
/// `foreman train`'s exit codes the harness tells apart (docs/train.md).
inline constexpr int kTrainExitOk = 0;
inline constexpr int kTrainExitFailed = 1;
inline constexpr int kTrainExitUsage = 2;

/// The context of one RunChaos call, after its options were checked.
struct ChaosRun {
  ChaosRun(const ChaosOptions& o, ChaosObserver& obs) : options(o), observer(obs) {}
  const ChaosOptions& options;
  ChaosObserver& observer;
  std::string preset;          // "all" by default; "" with a plan file
  std::vector<int64_t> seeds;  // in order
  std::string work;            // the work directory (absolute, made)
  bool temporary = false;      // made by RunChaos: removed when every seed passed
  std::filesystem::path cwd;   // the report's paths are relative to it
  bool changes_training = false;  // declared by the plan file
  nlohmann::json user_plan;       // the plan file's faults
  Env* env = Env::Default();
  bool sim = false;  // --disk sim (power loss): simulated processes over a simulated disk

  /// A path or message without the work directory (the report has no
  /// absolute paths).
  std::string Rel(const std::string& s) const;
};

/// The whole file at `path` ("" when it cannot be read).
std::string ReadWholeFile(const std::string& path);

/// A train flag as the report spells it: a word that is an absolute path, or
/// the value of "--flag=/path", relative to `cwd`.
std::string ReportWord(const std::string& word, const std::filesystem::path& cwd);

/// Writes `report` (dump(2) and a newline) to options.json_path; true when
/// there is none. False when it cannot be written.
bool WriteJsonReport(const ChaosRun& run, const nlohmann::json& report);

/// The end of a run: the temporary work directory removed when every seed
/// passed (and not `keep`), else named in report->work_dir.
void FinishWorkDirectory(const ChaosRun& run, ChaosReport* report);

/// The one-process presets and plan files (chaos_process.cpp), and
/// --preset cluster (chaos_cluster.cpp).
StatusOr<ChaosReport> RunProcessChaos(ChaosRun& run);
StatusOr<ChaosReport> RunClusterChaos(ChaosRun& run);

/// Subprocess::Spawn(o), then observer.OnProcessGroup(slot, pid), with
/// SIGINT, SIGTERM and SIGHUP blocked in the calling thread from before the
/// spawn until the observer knows the group: a handler that kills the
/// observer's groups (the CLI's) and runs on this thread cannot run while the
/// child exists unknown to it (under load the child reached exec, and a
/// test's SIGTERM arrived, before the observer heard of it; the job, which
/// has no death signal, was left running). A signal that came meanwhile is
/// delivered when the mask is restored. RunChaos spawns from the thread that
/// called it, so this holds where that thread is the one the signals reach
/// (the CLI's: single-threaded).
StatusOr<Subprocess> SpawnObserved(const SpawnOptions& o, ChaosObserver& observer, int slot);

}  // namespace foreman::internal
