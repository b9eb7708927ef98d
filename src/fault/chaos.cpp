// RunChaos (foreman/chaos.hpp): checks the options, makes the work
// directory, and hands the run to its supervisor: the one-process presets
// and plan files (chaos_process.cpp) or --preset cluster (chaos_cluster.cpp).
// docs/fault-injection.md, "foreman chaos", is the user's guide.
//
// Work directory layout, per seed K: <work>/seed-K/ with plan.json (the
// seed's plan), run/ (the job's --checkpoint-dir) and one log per process;
// <work>/.foreman-chaos marks a directory RunChaos made (a later run may
// replace its seeds; any other non-empty directory is refused).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "fault/chaos_checks.hpp"
#include "fault/chaos_cluster.hpp"
#include "fault/chaos_plan.hpp"
#include "fault/chaos_run.hpp"
#include "foreman/chaos.hpp"
#include "foreman/fault.hpp"

namespace foreman {
namespace internal {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kWorkDirMarker[] = ".foreman-chaos";

// `path` as the report spells it: an absolute path relative to `cwd` (the
// report holds no absolute path), any other as given.
std::string ReportPath(const std::string& path, const fs::path& cwd) {
  if (path.empty() || path[0] != '/') return path;
  const fs::path rel = fs::path(path).lexically_normal().lexically_relative(cwd);
  return rel.empty() ? fs::path(path).filename().string() : rel.string();
}

// The --json path can be written: opened for writing (not truncated), and
// removed again when it did not exist. Refused up front, before any run.
Status CheckWritable(const std::string& path) {
  struct stat st {};
  const bool existed = lstat(path.c_str(), &st) == 0;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("--json ", path, ": ", std::strerror(errno)));
  close(fd);
  if (!existed) unlink(path.c_str());
  return absl::OkStatus();
}

// The flags that need no file: the preset, the seeds, the timeout, the
// train flags chaos owns.
Status CheckFlags(const ChaosOptions& o, ChaosRun& run) {
  if (!o.preset.empty() && !o.plan_file.empty()) return absl::InvalidArgumentError("give --preset or --plan, not both");
  run.preset = o.preset.empty() && o.plan_file.empty() ? "all" : o.preset;
  const bool cluster = run.preset == "cluster";
  if (!run.preset.empty() && !cluster && !ChaosPresetPlan(run.preset, 0).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--preset: unknown preset '", run.preset,
                                                   "' (disk, steps, actors, signals, all, power or cluster)"));
  }
  if (!o.disk.empty() && o.disk != "real" && o.disk != "sim") {
    return absl::InvalidArgumentError(absl::StrCat("--disk: '", o.disk, "' is not real or sim"));
  }
  run.sim = o.disk == "sim" || run.preset == "power";
  if (run.preset == "power" && o.disk == "real") {
    return absl::InvalidArgumentError("--preset power cuts the power of a simulated disk: not with --disk real");
  }
  if (run.sim && cluster) {
    return absl::InvalidArgumentError("--disk sim runs one simulated process at a time: not with --preset cluster");
  }
  if (run.sim && !o.train_in_process) {
    return absl::InvalidArgumentError("--disk sim: ChaosOptions::train_in_process is not set");
  }
  if (o.shrink && (!o.seed.has_value() || o.seeds.has_value() || o.first_seed.has_value())) {
    return absl::InvalidArgumentError("--shrink SEED shrinks one seed's plan: not with --seed, --seeds or --first-seed");
  }
  if (o.shrink && cluster) return absl::InvalidArgumentError("--shrink: not with --preset cluster");
  if (o.shrink && !o.json_path.empty()) {
    return absl::InvalidArgumentError("--shrink writes the shrunk plan (shrunk-seed-K.json), not a report: not with --json");
  }
  if (o.shrink && *o.seed < 0) return absl::InvalidArgumentError(absl::StrCat("--shrink must be >= 0, got ", *o.seed));
  if (o.seed.has_value() && (o.seeds.has_value() || o.first_seed.has_value())) {
    return absl::InvalidArgumentError("give --seed K (one seed) or --seeds N [--first-seed K], not both");
  }
  const int64_t seeds = o.seeds.value_or(10);
  const int64_t first_seed = o.first_seed.value_or(0);
  if (seeds < 1 || seeds > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat("--seeds must be in [1, 1000000], got ", seeds));
  }
  if (first_seed < 0) return absl::InvalidArgumentError(absl::StrCat("--first-seed must be >= 0, got ", first_seed));
  if (o.seed.has_value() && *o.seed < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--seed must be >= 0, got ", *o.seed));
  }
  if (!(o.timeout_secs > 0 && o.timeout_secs <= 86400)) {
    return absl::InvalidArgumentError(absl::StrCat("--timeout-secs must be in (0, 86400], got ", o.timeout_secs));
  }
  for (const char* owned : {"--checkpoint-dir", "--fault-plan", "--run-record"}) {
    if (HasFlag(o.train_flags, owned)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the train flags after -- may not set ", owned, ": foreman chaos sets it per seed"));
    }
  }
  if (o.seed.has_value()) {
    run.seeds.push_back(*o.seed);
  } else {
    for (int64_t i = 0; i < seeds; ++i) run.seeds.push_back(first_seed + i);
  }
  return absl::OkStatus();
}

// The plan file: its "changes_training" declaration taken out, the rest a
// plan foreman train accepts (its errors name the file).
Status ReadPlanFile(const std::string& plan_file, ChaosRun& run) {
  const std::string text = ReadWholeFile(plan_file);
  if (text.empty() && !fs::exists(plan_file)) {
    return absl::InvalidArgumentError(absl::StrCat("--plan ", plan_file, ": no such file"));
  }
  json plan = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (plan.is_object() && plan.contains("changes_training")) {
    if (!plan["changes_training"].is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(
          plan_file, ": \"changes_training\" must be true or false, got ", plan["changes_training"].dump()));
    }
    run.changes_training = plan["changes_training"].get<bool>();
    plan.erase("changes_training");
  }
  auto parsed = ParseFaultPlan(plan.is_discarded() ? text : plan.dump(), plan_file);
  if (!parsed.ok()) return absl::InvalidArgumentError(parsed.status().message());
  if (!plan.contains("faults")) plan["faults"] = json::array();
  run.user_plan = plan;
  return absl::OkStatus();
}

// A new temporary work directory under $TMPDIR (or /tmp).
StatusOr<std::string> MakeTemporaryWorkDir() {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp", "/foreman-chaos-XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create ", templ, ": ", std::strerror(errno)));
  }
  return templ;
}

// The work directory: --work-dir (created; refused when it holds anything but
// an earlier `foreman chaos` run), or a new temporary one.
Status PrepareWorkDir(const ChaosOptions& o, ChaosRun& run) {
  std::error_code ec;
  std::string dir;
  if (o.work_dir.empty()) {
    FOREMAN_ASSIGN_OR_RETURN(dir, MakeTemporaryWorkDir());
    run.temporary = true;
  } else {
    dir = fs::absolute(o.work_dir, ec).lexically_normal().string();
    if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    if (fs::exists(dir, ec) && !fs::is_empty(dir, ec) && !fs::exists(fs::path(dir) / kWorkDirMarker, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--work-dir ", o.work_dir, " is not empty and was not made by foreman chaos (no ", kWorkDirMarker,
          "): give a new or empty directory"));
    }
    fs::create_directories(dir, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("--work-dir ", o.work_dir, ": ", ec.message()));
    run.temporary = false;
  }
  std::ofstream marker(fs::path(dir) / kWorkDirMarker);
  marker << "made by foreman chaos: the seeds' runs are replaced by the next run in this directory\n";
  if (!marker) return absl::InvalidArgumentError(absl::StrCat("cannot write to ", dir));
  run.work = dir;
  return absl::OkStatus();
}

}  // namespace

std::string ChaosRun::Rel(const std::string& s) const {
  return absl::StrReplaceAll(s, {{work + "/", ""}, {work, "."}});
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ReportWord(const std::string& word, const fs::path& cwd) {
  if (absl::StartsWith(word, "--")) {
    const std::size_t eq = word.find('=');
    if (eq != std::string::npos) return absl::StrCat(word.substr(0, eq + 1), ReportPath(word.substr(eq + 1), cwd));
    return word;
  }
  return ReportPath(word, cwd);
}

bool WriteJsonReport(const ChaosRun& run, const json& report) {
  if (run.options.json_path.empty()) return true;
  std::ofstream out(run.options.json_path);
  out << report.dump(2) << "\n";
  out.close();
  return static_cast<bool>(out);
}

void FinishWorkDirectory(const ChaosRun& run, ChaosReport* report) {
  std::error_code ec;
  if (run.temporary && !run.options.keep && report->failed == 0) {
    fs::remove_all(run.work, ec);
    report->work_dir.clear();
  } else {
    report->work_dir = run.work;
  }
}

}  // namespace internal

StatusOr<ChaosReport> RunChaos(const ChaosOptions& options, ChaosObserver* observer) {
  ChaosObserver silent;
  internal::ChaosRun run(options, observer != nullptr ? *observer : silent);
  FOREMAN_RETURN_IF_ERROR(internal::CheckFlags(options, run));
  if (!run.sim && options.foreman_program.empty()) {
    return absl::InvalidArgumentError("ChaosOptions::foreman_program is empty: give the foreman executable");
  }
  // Run by execve (no PATH search): a path that is not an executable file
  // would fail every seed as an exit 127.
  struct stat st {};
  if (!run.sim && (::stat(options.foreman_program.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
                   ::access(options.foreman_program.c_str(), X_OK) != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("ChaosOptions::foreman_program: ", options.foreman_program,
                                                   " is not an executable file (a path: no PATH search)"));
  }
  if (!options.plan_file.empty()) FOREMAN_RETURN_IF_ERROR(internal::ReadPlanFile(options.plan_file, run));
  if (!options.json_path.empty()) FOREMAN_RETURN_IF_ERROR(internal::CheckWritable(options.json_path));
  if (run.preset == "cluster") {
    if (const std::string e = internal::ClusterTrainFlagsError(options.train_flags); !e.empty()) {
      return absl::InvalidArgumentError(e);
    }
  }
  FOREMAN_RETURN_IF_ERROR(internal::PrepareWorkDir(options, run));
  std::error_code cwd_ec;
  run.cwd = std::filesystem::current_path(cwd_ec);
  run.observer.OnWorkDirectory(run.work);
  return run.preset == "cluster" ? internal::RunClusterChaos(run) : internal::RunProcessChaos(run);
}

}  // namespace foreman
