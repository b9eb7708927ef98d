// `foreman chaos --preset cluster` (chaos_cluster.hpp): the plan, the train
// flags it refuses, the seeds, the table and the report.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "fault/chaos_cluster.hpp"
#include "fault/chaos_cluster_net.hpp"
#include "platform/hash.hpp"

namespace foreman::internal {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kFirstEventStep = 30;  // past the first checkpoint (step 20)
constexpr int64_t kMaxSteps = 3000;
// The streams' keys: each draws its own SplitMix64 stream.
constexpr uint64_t kClusterKey = 0x636c7573746572ULL;  // "cluster"
constexpr uint64_t kNetcutKey = 0x6e6574637574ULL;     // "netcut"

// The default job: about 7 s a seed on two cores, steps slow enough (a
// 784-64-10 MLP, batch 100) that a worker alone does not finish the job
// during a killed chief's 0.2-2 s restart delay; a checkpoint every 20
// steps (the events fire on the chief's run record's step events).
const std::vector<std::string>& DefaultClusterTrainFlags() {
  static const std::vector<std::string> flags = {"--max-steps", "3000", "--hidden", "64", "--batch-size", "100",
                                                 "--threads", "1", "--eval-every-steps", "0"};
  return flags;
}

// Set by --preset cluster itself: refused after --.
constexpr const char* kOwnFlags[] = {"--ps-hosts", "--worker-hosts", "--job-name", "--task-index",
                                     "--checkpoint-dir", "--fault-plan", "--insecure", "--ps-wait-secs",
                                     "--ps-join-timeout-secs", "--save-checkpoint-steps", "--run-record"};

// The value of `--name V` or `--name=V` as an integer; nullopt when absent.
std::optional<int64_t> IntFlag(const std::vector<std::string>& flags, const std::string& name) {
  for (std::size_t i = 0; i < flags.size(); ++i) {
    std::string v;
    if (flags[i] == name && i + 1 < flags.size()) {
      v = flags[i + 1];
    } else if (absl::StartsWith(flags[i], name + "=")) {
      v = flags[i].substr(name.size() + 1);
    } else {
      continue;
    }
    int64_t n = 0;
    if (absl::SimpleAtoi(v, &n)) return n;
  }
  return std::nullopt;
}

std::string QuotedWords(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) absl::StrAppend(&out, out.empty() ? "" : " ", ShellQuote(w));
  return out;
}

// The ends docs/cluster.md's failure table gives: the chief 0 at
// --max-steps, the others 0 after the chief ended training, a planned kill
// 137.
void CheckTaskEnds(int t, ClusterSeedReport& r) {
  Invariant& finished = r.invariants["finished"];
  const ClusterTaskRun* last = nullptr;
  for (const ClusterTaskRun& run : r.runs) {
    if (run.task != t) continue;
    if (run.killed_by_plan) {
      if (run.exit_code != 128 + SIGKILL) {
        finished.Fail(
            absl::StrCat(kClusterTaskNames[t], " run ", run.n, " exited ", run.exit_code, " before its kill"));
      }
      continue;
    }
    last = &run;
  }
  if (last == nullptr) return;  // killed last, after training ended
  // A worker whose ps is gone past --ps-wait-secs exits 1; cut off when the
  // chief ended training, it never learnt of the end, and the ps was gone
  // when it was healed (its run record's failure is UNAVAILABLE; any other
  // exit 1 fails).
  const bool missed_end = t == kWorker1 && last->exit_code == 1 && last->cut_at_end &&
                          last->failed_code == "UNAVAILABLE";
  if (last->exit_code != 0 && !missed_end) {
    finished.Fail(absl::StrCat(kClusterTaskNames[t], " run ", last->n, " ended by ", last->ended_by,
                               last->exit_code == 1 && t != kChief ? " (1: the ps was gone past --ps-wait-secs?)" : "",
                               "; see ", kClusterTaskFiles[t], "-", last->n, ".log"));
  }
}

json SeedJson(const ClusterSeedReport& r) {
  json j;
  j["seed"] = r.seed;
  j["ok"] = r.ok();
  j["plan"] = r.plan;
  j["faults_planned"] = r.plan["events"].size();
  j["faults_fired"] = r.fired;
  j["restarts"] = r.restarts;
  j["partitions"] = r.partitions;
  j["steps_lost"] = r.steps_lost;
  json runs = json::array();
  for (const ClusterTaskRun& run : r.runs) {
    runs.push_back({{"task", kClusterTaskNames[run.task]},
                    {"n", run.n},
                    {"exit_code", run.exit_code},
                    {"ended_by", run.ended_by},
                    {"checkpoint_at_start", run.checkpoint_at_start},
                    {"first_step", run.first_step},
                    {"last_step", run.last_step},
                    {"steps_lost", run.steps_lost},
                    {"failed", run.failed.empty() ? json(nullptr) : json(run.failed)},
                    {"elapsed_ms", run.elapsed_ms}});
  }
  j["runs"] = runs;
  json inv = json::object();
  for (const auto& [name, i] : r.invariants) inv[name] = {{"ok", i.ok}, {"checked", i.checked}, {"details", i.details}};
  j["invariants"] = inv;
  j["replay"] = r.replay_report;
  j["elapsed_ms"] = r.elapsed_ms;
  return j;
}

std::string TableRow(const ClusterSeedReport& r) {
  const auto& i = r.invariants;
  return absl::StrFormat("%6lld %7s %8lld %10lld %11s %11s %13s %12s %7s %8s\n", static_cast<long long>(r.seed),
                         absl::StrCat(r.fired.size(), "/", r.plan["events"].size()),
                         static_cast<long long>(r.restarts), static_cast<long long>(r.steps_lost),
                         InvariantCell(i.at("checkpoints_verify")), InvariantCell(i.at("global_step")),
                         InvariantCell(i.at("final_weights")), InvariantCell(i.at("scalars_once")),
                         InvariantCell(i.at("bounded")), InvariantCell(i.at("finished")));
}

std::string FailedSeed(const ChaosRun& run, const ClusterSeedReport& r) {
  std::string runs = "  runs:";
  for (const ClusterTaskRun& t : r.runs) {
    absl::StrAppendFormat(&runs, " [%s %d: %s, steps %lld..%lld]", kClusterTaskNames[t.task], t.n, t.ended_by,
                          static_cast<long long>(t.first_step), static_cast<long long>(t.last_step));
  }
  return FailedSeedText(r.seed, r.invariants, runs, run.work, r.replay);
}

json ReportJson(const ClusterJob& job, const std::string& partition, const std::vector<ClusterSeedReport>& reports,
                int64_t failed, int64_t total_ms) {
  json report;
  report["preset"] = "cluster";
  report["train_flags"] = job.run.options.train_flags.empty() ? job.train_flags : job.report_train_flags;
  report["timeout_secs"] = job.run.options.timeout_secs;
  report["max_restarts"] = kChaosMaxRestarts;
  report["partition"] = partition;
  json seeds = json::array();
  for (const ClusterSeedReport& r : reports) seeds.push_back(SeedJson(r));
  report["seeds"] = seeds;
  report["failed"] = failed;
  report["ok"] = failed == 0;
  report["elapsed_ms"] = total_ms;
  return report;
}

}  // namespace

ClusterSeedReport NewClusterSeedReport(const ClusterJob& job, int64_t seed) {
  const ChaosOptions& o = job.run.options;
  ClusterSeedReport r;
  r.seed = seed;
  r.plan = ClusterChaosPlan(static_cast<uint64_t>(seed), job.max_steps, job.partition_unavailable.empty());
  r.replay = absl::StrCat("foreman chaos --preset cluster --seed ", seed);
  if (o.timeout_secs != 60) absl::StrAppend(&r.replay, " --timeout-secs ", o.timeout_secs);
  r.replay_report = r.replay;
  if (!o.train_flags.empty()) {
    absl::StrAppend(&r.replay, " -- ", QuotedWords(o.train_flags));
    absl::StrAppend(&r.replay_report, " -- ", QuotedWords(job.report_train_flags));
  }
  for (const std::string& name : InvariantNames()) r.invariants[name] = Invariant();
  r.invariants["final_weights"].checked = false;
  r.invariants["final_weights"].details.push_back(
      "not applicable: asynchronous training with two workers is not bit-for-bit reproducible");
  r.invariants["scalars_once"].checked = false;
  r.invariants["scalars_once"].details.push_back("not applicable: two writers share no event file");
  return r;
}

void CheckClusterEnds(const ClusterJob& job, const std::string& dir, bool chief_done, int64_t last_ckpt,
                      ClusterSeedReport& r) {
  for (int t = 0; t < 3; ++t) CheckTaskEnds(t, r);
  // A restarted chief resumes past the checkpoint it started with (it
  // re-attaches to the ps, or restores that checkpoint and its first step
  // is the one after it): never at or before it.
  for (const ClusterTaskRun& run : r.runs) {
    if (run.task == kChief && run.n > 0 && run.first_step >= 0 && run.first_step <= run.checkpoint_at_start) {
      r.invariants["global_step"].Fail(absl::StrCat("chief run ", run.n, " reported step ", run.first_step,
                                                    " first, not past the latest checkpoint (step ",
                                                    run.checkpoint_at_start, ") when it started"));
    }
  }
  Invariant& finished = r.invariants["finished"];
  if (!chief_done) {
    finished.Fail("the chief did not end training (exit 0)");
  } else if (last_ckpt < job.max_steps) {
    finished.Fail(
        absl::StrCat("the chief's final checkpoint is at step ", last_ckpt, ", --max-steps ", job.max_steps));
  }
  if (Status s = VerifyListedCheckpoints(job.run.env, dir + "/run"); !s.ok()) {
    r.invariants["checkpoints_verify"].Fail(absl::StrCat("at the end: ", job.run.Rel(std::string(s.message()))));
  }
}

json ClusterChaosPlan(uint64_t seed, int64_t max_steps, bool partitions) {
  SplitMix64Stream d(seed ^ kClusterKey);
  SplitMix64Stream p(seed ^ kNetcutKey ^ kClusterKey);
  const char* partitioned = p.Uniform(0, 1) == 0 ? "worker 1" : "ps";
  const int64_t n = d.Uniform(1, 3);
  const int64_t last = std::max<int64_t>(kFirstEventStep + 2, max_steps * 2 / 5);
  std::set<int64_t> at;
  while (static_cast<int64_t>(at.size()) < n) at.insert(d.Uniform(kFirstEventStep, last));
  json events = json::array();
  int64_t i = 0;
  for (int64_t step : at) {
    const bool cut = p.Uniform(0, 2) == 0;
    const int64_t heal_after_ms = p.Uniform(1000, 3000);
    const char* kill = kClusterTaskNames[d.Uniform(0, 2)];
    const int64_t restart_after_ms = d.Uniform(200, 2000);
    if (partitions && cut) {
      events.push_back({{"id", absl::StrCat("e", i++)},
                        {"partition", partitioned},
                        {"at_chief_step", step},
                        {"heal_after_ms", heal_after_ms}});
      continue;
    }
    events.push_back({{"id", absl::StrCat("e", i++)},
                      {"kill", kill},
                      {"signal", "SIGKILL"},
                      {"at_chief_step", step},
                      {"restart_after_ms", restart_after_ms}});
  }
  return {{"preset", "cluster"}, {"seed", seed}, {"max_steps", max_steps}, {"events", events}};
}

std::string ClusterTrainFlagsError(const std::vector<std::string>& train_flags) {
  for (const char* own : kOwnFlags) {
    if (HasFlag(train_flags, own)) {
      return absl::StrCat("the train flags after -- may not set ", own, ": --preset cluster sets it per task");
    }
  }
  if (!train_flags.empty() && !IntFlag(train_flags, "--max-steps").has_value()) {
    return "--preset cluster needs --max-steps N among the train flags after -- (the chief's end)";
  }
  return "";
}

StatusOr<ChaosReport> RunClusterChaos(ChaosRun& run) {
  const ChaosOptions& o = run.options;
  ClusterJob job{run};
  job.train_flags = o.train_flags.empty() ? DefaultClusterTrainFlags() : o.train_flags;
  for (const std::string& w : o.train_flags) job.report_train_flags.push_back(ReportWord(w, run.cwd));
  job.max_steps = IntFlag(job.train_flags, "--max-steps").value_or(kMaxSteps);
  job.partition_unavailable = PartitionUnavailable(job.train_flags);
  const std::string partition = job.partition_unavailable.empty()
                                    ? "available"
                                    : absl::StrCat("not available here (", job.partition_unavailable, ")");
  const auto started = std::chrono::steady_clock::now();
  run.observer.OnTable(absl::StrCat(
      "foreman chaos: preset cluster (1 ps, the chief, worker 1), train flags: ", absl::StrJoin(job.train_flags, " "),
      "\npartition: ", partition, "\n",
      absl::StrFormat("%6s %7s %8s %10s %11s %11s %13s %12s %7s %8s\n", "seed", "faults", "restarts", "steps_lost",
                      "checkpoints", "global_step", "final_weights", "scalars_once", "bounded", "finished")));
  std::vector<ClusterSeedReport> reports;
  std::error_code ec;
  for (int64_t seed : run.seeds) {
    auto r = RunClusterSeed(job, seed);
    if (!r.ok()) {
      // Not a bad option: the run could not be made (exit 1).
      const absl::StatusCode code =
          absl::IsInvalidArgument(r.status()) ? absl::StatusCode::kInternal : r.status().code();
      return Status(code, absl::StrCat("seed ", seed, ": ", r.status().message()));
    }
    run.observer.OnTable(TableRow(*r));
    if (run.temporary && !o.keep && r->ok()) fs::remove_all(absl::StrCat(run.work, "/seed-", seed), ec);
    reports.push_back(std::move(*r));
  }
  ChaosReport report;
  report.seeds = static_cast<int64_t>(reports.size());
  int64_t partitions = 0;
  for (const ClusterSeedReport& r : reports) {
    if (!r.ok()) {
      ++report.failed;
      report.summary += FailedSeed(run, r);
    }
    partitions += r.partitions;
  }
  const int64_t total_ms = MillisSince(started);
  absl::StrAppendFormat(&report.summary, "\n%zu seeds, %lld failed, %.1f s (partition: %s)\n", reports.size(),
                        static_cast<long long>(report.failed), static_cast<double>(total_ms) / 1000,
                        job.partition_unavailable.empty() ? absl::StrCat(partitions, " fired") : partition);
  report.json_written = WriteJsonReport(run, ReportJson(job, partition, reports, report.failed, total_ms));
  FinishWorkDirectory(run, &report);
  return report;
}

}  // namespace foreman::internal
