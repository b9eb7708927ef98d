// The one-process presets' report (chaos_process.hpp): the table, the
// summary after it, the --json document.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "fault/chaos_process.hpp"

namespace foreman::internal {
namespace {

using json = nlohmann::json;

// A service restart as the JSON report keeps it: the text up to "; after: "
// and the reason's status code only ("...; after: INTERNAL", or "a normal
// exit"). The reason's message may name temporary files whose names differ
// from replay to replay (".tempstate<n>"), and the report of one seed must
// compare equal across replays; the printed report keeps the whole text.
std::string ReplayableRestart(const std::string& text) {
  static const std::string kAfter = "; after: ";
  const std::size_t at = text.find(kAfter);
  if (at == std::string::npos) return text;
  const std::string reason = text.substr(at + kAfter.size());
  return text.substr(0, at + kAfter.size()) + reason.substr(0, reason.find(':'));
}

json RunJson(const ProcessRun& run) {
  json j;
  j["exit_code"] = run.exit_code;
  j["ended_by"] = run.ended_by;
  j["start_step"] = run.start_step;
  j["last_step"] = run.last_step;
  j["checkpoint_step"] = run.checkpoint_step;
  j["recoveries"] = run.recoveries;
  j["recovery_steps_lost"] = run.recovery_steps_lost;
  json restarts = json::array();  // without the work directory or the reasons' messages
  for (const std::string& t : run.service_restarts) restarts.push_back(ReplayableRestart(t));
  j["service_restarts"] = restarts;
  j["summary_steps_lost"] = run.summary_steps_lost;
  j["elapsed_ms"] = run.elapsed_ms;
  return j;
}

json MetricsJson(const std::vector<RecoveryMetrics>& recovery_metrics) {
  json metrics = json::array();
  for (const RecoveryMetrics& m : recovery_metrics) {
    metrics.push_back({{"global_step", m.step},
                       {"recoveries", m.recoveries},
                       {"steps_lost", m.steps_lost},
                       {"detect_ms", m.detect_ms},
                       {"restore_ms", m.restore_ms},
                       {"next_good_step_ms", m.next_good_step_ms}});
  }
  return metrics;
}

json SeedJson(const ProcessSeedReport& r) {
  json j;
  j["seed"] = r.seed;
  j["ok"] = r.ok();
  j["plan"] = r.plan;
  j["faults_planned"] = r.faults_planned;
  j["faults_fired"] = r.faults_fired;
  j["restarts"] = r.restarts;
  if (r.durable_saves_checked > 0) j["durable_saves_checked"] = r.durable_saves_checked;
  j["unfired_faults"] = r.unfired;
  j["steps_lost"] = r.steps_lost;
  j["in_process_recoveries"] = r.recoveries;
  j["in_process_steps_lost"] = r.recovery_steps_lost;
  j["service_restarts"] = r.service_restarts;
  j["summary_steps_lost"] = r.summary_steps_lost;
  j["recovery_metrics"] = MetricsJson(r.recovery_metrics);
  json runs = json::array();
  for (const ProcessRun& run : r.runs) runs.push_back(RunJson(run));
  j["runs"] = runs;
  json inv = json::object();
  for (const auto& [name, i] : r.invariants) {
    inv[name] = {{"ok", i.ok}, {"checked", i.checked}, {"details", i.details}};
  }
  j["invariants"] = inv;
  j["replay"] = r.replay_report;
  j["elapsed_ms"] = r.elapsed_ms;
  return j;
}

// A failed seed: each failed invariant's details, its runs, where its logs
// are, how to replay it.
std::string FailedSeed(const ChaosRun& run, const ProcessSeedReport& r) {
  std::string runs = "  runs:";
  for (const ProcessRun& p : r.runs) {
    absl::StrAppendFormat(&runs, " [%s, steps %lld..%lld]", p.ended_by, static_cast<long long>(p.start_step),
                          static_cast<long long>(p.last_step));
  }
  return FailedSeedText(r.seed, r.invariants, runs, run.work, r.replay);
}

// Under --restart-policy: what the session's supervisor restarted in
// process (the job did not exit for it), and the summary steps lost.
std::string ServiceRestarts(const std::vector<ProcessSeedReport>& reports) {
  std::string out;
  for (const ProcessSeedReport& r : reports) {
    if (r.service_restarts == 0) continue;
    if (out.empty()) out = "\nservice restarts (in process, --restart-policy):\n";
    absl::StrAppendFormat(&out, "  seed %lld: %lld service restart(s); summary steps lost: [%s]\n",
                          static_cast<long long>(r.seed), static_cast<long long>(r.service_restarts),
                          absl::StrJoin(r.summary_steps_lost, ", "));
    for (const ProcessRun& run : r.runs) {
      for (const std::string& t : run.service_restarts) absl::StrAppendFormat(&out, "    %s\n", t);
    }
  }
  return out;
}

}  // namespace

bool ProcessSeedReport::ok() const {
  for (const auto& [name, inv] : invariants) {
    if (!inv.ok) return false;
  }
  return true;
}

std::string ProcessTableHeader() {
  return absl::StrFormat("%6s %7s %7s %8s %10s %11s %11s %13s %12s %7s %8s\n", "seed", "faults", "firings",
                         "restarts", "steps_lost", "checkpoints", "global_step", "final_weights", "scalars_once",
                         "bounded", "finished");
}

std::string ProcessTableRow(const ProcessSeedReport& r) {
  const auto& i = r.invariants;
  // faults: the plan's faults that fired / its faults; firings: how often
  // they fired (a "repeat" fault fires in every process, and a repeating
  // step fault again after every in-process recovery).
  const std::set<std::string> fired(r.faults_fired.begin(), r.faults_fired.end());
  return absl::StrFormat("%6lld %7s %7zu %8lld %10lld %11s %11s %13s %12s %7s %8s\n", static_cast<long long>(r.seed),
                         absl::StrCat(fired.size(), "/", r.faults_planned, r.unfired.empty() ? "" : "!"),
                         r.faults_fired.size(),
                         static_cast<long long>(r.restarts), static_cast<long long>(r.steps_lost),
                         InvariantCell(i.at("checkpoints_verify")), InvariantCell(i.at("global_step")),
                         InvariantCell(i.at("final_weights")), InvariantCell(i.at("scalars_once")),
                         InvariantCell(i.at("bounded")), InvariantCell(i.at("finished")));
}

std::string ProcessSummary(const ChaosRun& run, const std::vector<ProcessSeedReport>& reports, int64_t total_ms) {
  std::string out;
  int64_t failed = 0;
  for (const ProcessSeedReport& r : reports) {
    if (r.ok()) continue;
    ++failed;
    out += FailedSeed(run, r);
  }
  out += ServiceRestarts(reports);
  // Faults that should have fired: the code under test no longer does what
  // they wait for (a finding, not a failed invariant: "!" in the table).
  std::string unfired;
  for (const ProcessSeedReport& r : reports) {
    for (const std::string& u : r.unfired) {
      absl::StrAppendFormat(&unfired, "  seed %lld: %s\n", static_cast<long long>(r.seed), u);
    }
  }
  if (!unfired.empty()) {
    out += "\nplanned faults that did not fire, though the fault-free run reaches what they wait for ('!'):\n";
    out += unfired;
  }
  absl::StrAppendFormat(&out, "\n%zu seeds, %lld failed, %.1f s\n", reports.size(), static_cast<long long>(failed),
                        static_cast<double>(total_ms) / 1000);
  return out;
}

json ProcessReportJson(const ChaosRun& run, const std::vector<std::string>& train_flags, int64_t baseline_step,
                       int64_t baseline_ms, const std::vector<ProcessSeedReport>& reports, int64_t failed,
                       int64_t total_ms) {
  json report;
  if (run.options.plan_file.empty()) {
    report["preset"] = run.preset;
  } else {
    report["plan"] = std::filesystem::path(run.options.plan_file).filename().string();
    report["changes_training"] = run.changes_training;
  }
  json flags_json = json::array();
  for (const std::string& w : train_flags) {
    // A path in the work directory (the power preset's data subset) as the
    // report's other paths are: relative to it, so that one plan's reports
    // from two work directories are byte-equal.
    flags_json.push_back(absl::StartsWith(w, run.work + "/") ? run.Rel(w) : ReportWord(w, run.cwd));
  }
  report["train_flags"] = flags_json;
  report["timeout_secs"] = run.options.timeout_secs;
  report["max_restarts"] = kChaosMaxRestarts;
  report["baseline"] = {{"global_step", baseline_step}, {"elapsed_ms", baseline_ms}};
  json seeds_json = json::array();
  for (const ProcessSeedReport& r : reports) seeds_json.push_back(SeedJson(r));
  report["seeds"] = seeds_json;
  report["failed"] = failed;
  report["ok"] = failed == 0;
  report["elapsed_ms"] = total_ms;
  return report;
}

}  // namespace foreman::internal
