// foreman::RunChaos (foreman/chaos.hpp) from a library program: public
// headers only, the `foreman` binary named by $FOREMAN_CLI (meson sets it).
// Each run is one seed of a 40-step job (a baseline and the seed's runs,
// about a second).
#include "foreman/chaos.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/env.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using testing::TempDir;

// Records what RunChaos told; optionally corrupts the first process's
// latest checkpoint (as a disk that flips a bit would).
class Recorder : public ChaosObserver {
 public:
  void OnWorkDirectory(const std::string& dir) override { work_dir = dir; }
  void OnProcessGroup(int slot, int pgid) override {
    if (pgid > 0) ++groups;
    last_slot = slot;
  }
  void OnTable(const std::string& lines) override { table += lines; }
  void OnProcessExit(int64_t seed, int n, const std::string& run_dir) override {
    exits.push_back(n);
    CHECK(seed == 3);
    if (!corrupt || n != 0) return;
    auto latest = LatestCheckpoint(Env::Default(), run_dir);
    REQUIRE(latest.ok());
    REQUIRE(latest->has_value());
    std::fstream f(BundleDataPath(**latest), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff middle = f.tellg() / 2;
    char c = 0;
    f.seekg(middle);
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(middle);
    f.write(&c, 1);
  }

  bool corrupt = false;
  std::string work_dir;
  std::string table;
  std::vector<int> exits;
  int groups = 0;
  int last_slot = -1;
};

ChaosOptions SmallJob(const TempDir& dir) {
  const char* cli = std::getenv("FOREMAN_CLI");
  REQUIRE_MESSAGE(cli != nullptr, "FOREMAN_CLI names the foreman binary (set by meson)");
  ChaosOptions o;
  o.foreman_program = cli;
  o.seed = 3;
  o.work_dir = dir / "work";
  o.json_path = dir / "report.json";
  o.timeout_secs = 60;
  o.train_flags = {"--max-steps", "40",   "--hidden",    "8", "--batch-size",        "32",
                   "--threads",   "1",    "--save-checkpoint-steps", "20", "--eval-every-steps", "0"};
  return o;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
}

TEST_CASE("RunChaos runs a seed of a preset and reports that every invariant held") {
  TempDir dir("chaos_test");
  ChaosOptions o = SmallJob(dir);
  o.preset = "steps";
  Recorder rec;
  StatusOr<ChaosReport> report = RunChaos(o, &rec);
  REQUIRE_MESSAGE(report.ok(), report.status().ToString());
  CHECK(report->seeds == 1);
  CHECK(report->failed == 0);
  CHECK(report->json_written);
  CHECK(report->work_dir == dir / "work");  // a given work directory is kept
  CHECK(rec.work_dir == dir / "work");
  CHECK(rec.groups >= 2);  // the baseline and at least one run of the seed
  CHECK(rec.last_slot == 0);
  REQUIRE(!rec.exits.empty());
  CHECK(rec.exits.front() == 0);
  CHECK(rec.table.find("foreman chaos: preset steps, train flags: --max-steps 40 ") == 0);
  CHECK(rec.table.find("\n  seed  faults firings restarts") != std::string::npos);
  CHECK(rec.table.find("\n     3 ") != std::string::npos);
  CHECK(report->summary.find("\n1 seeds, 0 failed, ") == 0);

  const nlohmann::json j = ReadJson(o.json_path);
  REQUIRE(j.is_object());
  CHECK(j["ok"] == true);
  CHECK(j["preset"] == "steps");
  REQUIRE(j["seeds"].size() == 1);
  const nlohmann::json& seed = j["seeds"][0];
  CHECK(seed["seed"] == 3);
  CHECK(seed["replay"] == "foreman chaos --preset steps --seed 3 -- --max-steps 40 --hidden 8 --batch-size 32 "
                         "--threads 1 --save-checkpoint-steps 20 --eval-every-steps 0");
  CHECK(seed["invariants"].size() == 6);
  for (const auto& [name, inv] : seed["invariants"].items()) {
    CHECK_MESSAGE(inv["ok"] == true, name);
  }
  CHECK(seed["runs"].back()["ended_by"] == "done");
  CHECK(seed["runs"].back()["last_step"] == 40);
}

TEST_CASE("A failed invariant is in the report, not an error: a corrupted checkpoint fails checkpoints_verify") {
  TempDir dir("chaos_test");
  const std::string plan = dir / "empty.json";
  std::ofstream(plan) << "{\"faults\": []}\n";
  ChaosOptions o = SmallJob(dir);
  o.plan_file = plan;
  Recorder rec;
  rec.corrupt = true;
  StatusOr<ChaosReport> report = RunChaos(o, &rec);
  REQUIRE_MESSAGE(report.ok(), report.status().ToString());
  CHECK(report->failed == 1);
  CHECK(report->summary.find("\nseed 3 FAILED:\n  checkpoints_verify: after run 0: model.ckpt-40: ") == 0);
  CHECK(report->summary.find("crc32c mismatch") != std::string::npos);
  CHECK(report->summary.find("\n1 seeds, 1 failed, ") != std::string::npos);
  const nlohmann::json j = ReadJson(o.json_path);
  REQUIRE(j.is_object());
  CHECK(j["ok"] == false);
  CHECK(j["plan"] == "empty.json");
  CHECK(j["seeds"][0]["invariants"]["checkpoints_verify"]["ok"] == false);
  CHECK(j["seeds"][0]["invariants"]["bounded"]["ok"] == true);
}

// Rewrites every process's log as it exits: the lines a reader of log text
// would look for ("Restoring parameters from", "Recovered from a preemption
// error", "Saving checkpoints for", "stopped by ...") are reworded.
class Rewording : public ChaosObserver {
 public:
  void OnProcessExit(int64_t /*seed*/, int n, const std::string& run_dir) override {
    const std::string log = (std::filesystem::path(run_dir).parent_path() / ("run-" + std::to_string(n) + ".log"));
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    for (const std::string from : {"Restoring parameters from", "Recovered from a preemption error",
                                   "Saving checkpoints for", "stopped by", "step "}) {
      for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
        text.replace(at, from.size(), "(reworded)");
        ++reworded;
      }
    }
    std::ofstream(log, std::ios::trunc) << text;
    ++exits;
  }
  int exits = 0;
  int reworded = 0;
};

TEST_CASE("The invariants read the run record, not the log: with every log line they knew reworded they still hold") {
  TempDir dir("chaos_test");
  const std::string plan = dir / "plan.json";
  // An in-process recovery at step 10, then a graceful stop (SIGTERM) at
  // step 25 (its final checkpoint is step 26): the job is restarted from it.
  std::ofstream(plan) << R"({"faults": [
    {"id": "preempt", "type": "step", "status": "UNAVAILABLE", "message": "parameter server lost", "at_step": 10},
    {"id": "term", "type": "process", "signal": "SIGTERM", "at_step": 25}]})"
                      << "\n";
  ChaosOptions o = SmallJob(dir);
  o.plan_file = plan;
  Rewording rec;
  StatusOr<ChaosReport> report = RunChaos(o, &rec);
  REQUIRE_MESSAGE(report.ok(), report.status().ToString());
  CHECK(rec.exits == 2);
  CHECK(rec.reworded > 40);  // every progress line at least
  CHECK_MESSAGE(report->failed == 0, report->summary);
  const nlohmann::json j = ReadJson(o.json_path);
  REQUIRE(j.is_object());
  const nlohmann::json& seed = j["seeds"][0];
  for (const auto& [name, inv] : seed["invariants"].items()) CHECK_MESSAGE(inv["ok"] == true, name);
  // What only the record told: the recovery, the graceful stop, the restore.
  REQUIRE(seed["runs"].size() == 2);
  CHECK(seed["runs"][0]["recoveries"] == 1);
  CHECK(seed["runs"][0]["ended_by"] == "signal (graceful stop)");
  CHECK(seed["runs"][0]["last_step"] == 26);  // the fault fires in the run of step 25
  CHECK(seed["runs"][1]["start_step"] == 26);
  CHECK(seed["runs"][1]["last_step"] == 40);
  CHECK(seed["runs"][1]["ended_by"] == "done");
}

// The seed's report without its times (which differ from run to run).
nlohmann::json WithoutTimes(nlohmann::json seed) {
  seed.erase("elapsed_ms");
  seed.erase("recovery_metrics");
  seed.erase("replay");
  for (nlohmann::json& run : seed["runs"]) run.erase("elapsed_ms");
  return seed;
}

TEST_CASE("A plan of probabilistic env faults takes the same course in two work directories (draws keyed under the "
          "run directory)") {
  TempDir dir("chaos_test");
  const std::string plan = dir / "flaky.json";
  // Every append may fail (EIO, once); which one does is the seed's draw.
  std::ofstream(plan) << R"({"seed": 11, "faults": [
    {"id": "flaky", "type": "env", "op": "append", "path": "*", "error": "EIO", "probability": 0.05}]})"
                      << "\n";
  nlohmann::json seeds[2];
  std::string records[2];
  for (int i = 0; i < 2; ++i) {
    ChaosOptions o = SmallJob(dir);
    o.plan_file = plan;
    o.keep = true;
    o.work_dir = dir / (i == 0 ? "work-a" : "elsewhere/work-b");
    o.json_path = dir / (i == 0 ? "a.json" : "b.json");
    StatusOr<ChaosReport> report = RunChaos(o);
    REQUIRE_MESSAGE(report.ok(), report.status().ToString());
    const nlohmann::json j = ReadJson(o.json_path);
    REQUIRE(j.is_object());
    seeds[i] = WithoutTimes(j["seeds"][0]);
    std::ifstream in(o.work_dir + "/seed-3/run/fault_record.json");
    std::stringstream ss;
    ss << in.rdbuf();
    records[i] = ss.str();
  }
  CHECK_MESSAGE(seeds[0]["faults_fired"] == nlohmann::json::array({"flaky"}), seeds[0].dump());
  CHECK(records[0].find("\"flaky\"") != std::string::npos);
  CHECK(records[0].find("work-a") == std::string::npos);  // keyed under the run directory
  CHECK(records[0] == records[1]);
  CHECK(seeds[0].dump() == seeds[1].dump());
}

TEST_CASE("RunChaos refuses bad options before it starts anything") {
  TempDir dir("chaos_test");
  ChaosOptions o = SmallJob(dir);
  Recorder rec;

  o.seeds = 5;  // with o.seed
  StatusOr<ChaosReport> both = RunChaos(o, &rec);
  REQUIRE(!both.ok());
  CHECK(absl::IsInvalidArgument(both.status()));
  CHECK(both.status().message() == "give --seed K (one seed) or --seeds N [--first-seed K], not both");

  o = SmallJob(dir);
  o.preset = "nope";
  StatusOr<ChaosReport> unknown = RunChaos(o, &rec);
  REQUIRE(!unknown.ok());
  CHECK(unknown.status().message() ==
        "--preset: unknown preset 'nope' (disk, steps, actors, signals, all, power or cluster)");

  o = SmallJob(dir);
  o.train_flags.push_back("--checkpoint-dir");
  o.train_flags.push_back(dir / "x");
  StatusOr<ChaosReport> owned = RunChaos(o, &rec);
  REQUIRE(!owned.ok());
  CHECK(owned.status().message() ==
        "the train flags after -- may not set --checkpoint-dir: foreman chaos sets it per seed");

  o = SmallJob(dir);
  o.foreman_program.clear();
  CHECK(absl::IsInvalidArgument(RunChaos(o).status()));

  o = SmallJob(dir);
  o.foreman_program = dir / "no-such-foreman";
  StatusOr<ChaosReport> missing = RunChaos(o, &rec);
  REQUIRE(!missing.ok());
  CHECK(absl::IsInvalidArgument(missing.status()));
  CHECK(missing.status().message() == absl::StrCat("ChaosOptions::foreman_program: ", o.foreman_program,
                                                   " is not an executable file (a path: no PATH search)"));

  CHECK(rec.work_dir.empty());  // nothing was made
  CHECK(rec.groups == 0);
  std::error_code ec;
  CHECK(!std::filesystem::exists(dir / "work", ec));
}

}  // namespace
}  // namespace foreman
