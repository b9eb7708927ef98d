// foreman::RunChaos's cluster preset (foreman/chaos.hpp) reads its tasks'
// run records (`foreman train --run-record`), not their logs: with every
// task's log unlinked the moment the task starts (the task keeps writing to
// the unlinked file; nothing is left to read by its name), seed 165 of a
// 2000-step job still fires both of its events at the chief's steps
// (SIGKILL the ps at step 75, worker 1 at step 234), holds every invariant,
// and reports the steps lost its chief's records hold. Public headers only;
// the `foreman` binary named by $FOREMAN_CLI (meson sets it). Release only
// (about 10 s; a cluster of three processes under a sanitizer takes minutes).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "foreman/chaos.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::TempDir;

// Unlinks every task log of the seed's directory as each task starts (its
// log is opened, by the harness, before the task's process group exists).
class LogUnlinker : public ChaosObserver {
 public:
  void OnWorkDirectory(const std::string& dir) override { work_dir = dir; }
  void OnProcessGroup(int /*slot*/, int pgid) override {
    if (pgid <= 0) return;
    ++starts;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(fs::path(work_dir) / "seed-165", ec)) {
      if (e.path().extension() == ".log" && fs::remove(e.path(), ec)) ++unlinked;
    }
  }
  std::string work_dir;
  int starts = 0;
  int unlinked = 0;
};

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_CASE("--preset cluster reads the run records, not the logs: with every task log unlinked it still holds") {
  const char* cli = std::getenv("FOREMAN_CLI");
  REQUIRE_MESSAGE(cli != nullptr, "FOREMAN_CLI names the foreman binary (set by meson)");
  TempDir dir("chaos_cluster_lib_test");
  ChaosOptions o;
  o.foreman_program = cli;
  o.preset = "cluster";
  o.seed = 165;
  o.work_dir = dir / "work";
  o.json_path = dir / "report.json";
  o.timeout_secs = 60;
  o.train_flags = {"--max-steps", "2000", "--hidden", "16", "--batch-size", "50", "--threads", "1",
                   "--eval-every-steps", "0"};
  LogUnlinker unlinker;
  StatusOr<ChaosReport> report = RunChaos(o, &unlinker);
  REQUIRE_MESSAGE(report.ok(), report.status().ToString());
  CHECK_MESSAGE(report->failed == 0, report->summary);
  // ps, worker 1, chief, then the two restarted tasks: five logs, none left.
  CHECK(unlinker.starts == 5);
  CHECK(unlinker.unlinked == 5);
  const fs::path seed_dir = fs::path(o.work_dir) / "seed-165";
  int logs_left = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(seed_dir)) logs_left += e.path().extension() == ".log";
  CHECK(logs_left == 0);

  std::ifstream in(o.json_path);
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  REQUIRE(j.is_object());
  const json& seed = j["seeds"][0];
  // Both events fired: each waited for a step the chief's record reported.
  CHECK(seed["faults_fired"] == json::array({"e0", "e1"}));
  CHECK(seed["restarts"] == 2);
  for (const char* name : {"checkpoints_verify", "global_step", "bounded", "finished"}) {
    CHECK_MESSAGE(seed["invariants"][name]["ok"] == true, name);
    CHECK_MESSAGE(seed["invariants"][name]["checked"] == true, name);
  }
  // The chief's steps and steps lost are its record's.
  int64_t record_steps_lost = 0;
  int64_t record_last_step = -1;
  for (const fs::directory_entry& e : fs::directory_iterator(seed_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("chief-", 0) != 0 || e.path().extension() != ".jsonl") continue;
    std::istringstream lines(ReadText(e.path()));
    for (std::string line; std::getline(lines, line);) {
      const json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (event.is_discarded()) continue;  // a torn last line
      if (event["event"] == "recovery") record_steps_lost += event["steps_lost"].get<int64_t>();
      if (event["event"] == "step") record_last_step = event["global_step"].get<int64_t>();
    }
  }
  CHECK(record_last_step >= 2000);
  CHECK(seed["steps_lost"] == record_steps_lost);
  bool chief_seen = false;
  for (const json& run : seed["runs"]) {
    if (run["task"] != "chief") continue;
    chief_seen = true;
    CHECK(run["last_step"] == record_last_step);
    CHECK(run["exit_code"] == 0);
  }
  CHECK(chief_seen);
}

}  // namespace
}  // namespace foreman
