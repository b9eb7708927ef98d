// `foreman chaos`: the command line of foreman::RunChaos (foreman/chaos.hpp;
// docs/fault-injection.md, "foreman chaos"). Parses the flags, prints the
// table as the seeds end and the summary after them, and kills the running
// children when it is interrupted (SIGINT, SIGTERM, SIGHUP).
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "command.hpp"
#include "foreman/chaos.hpp"
#include "foreman/env.hpp"
#include "foreman/logging.hpp"

namespace foreman::cli {
namespace {

// The running children's process groups (RunChaos's observer slots), and
// what the handler says: "the running job was killed" or "the running
// cluster's tasks were killed", then "foreman chaos: work directory kept:
// <dir>" (set before the first child starts).
volatile sig_atomic_t g_pgids[5] = {0, 0, 0, 0, 0};
const char* g_killed = "";
char g_kept_line[PATH_MAX + 64] = {};
std::size_t g_kept_line_size = 0;

// Exits as a shell reports a death by `sig` (130 for SIGINT, 143 for
// SIGTERM, 129 for SIGHUP), saying where the work directory is.
void OnSignal(int sig) {
  for (int i = 0; i < 5; ++i) {
    const pid_t pgid = g_pgids[i];
    if (pgid > 0) kill(-pgid, SIGKILL);
  }
  ssize_t ignored = write(STDERR_FILENO, g_killed, std::strlen(g_killed));
  if (g_kept_line_size > 0) ignored = write(STDERR_FILENO, g_kept_line, g_kept_line_size);
  (void)ignored;
  _exit(128 + sig);
}

ChaosFirstExitHook g_first_exit_hook = nullptr;  // set only by a test build of the program
SimulatedDiskWrapper g_disk_wrapper = nullptr;   // likewise

class Printer : public ChaosObserver {
 public:
  void OnWorkDirectory(const std::string& dir) override {
    const std::string line = absl::StrCat("foreman chaos: work directory kept: ", dir, "\n");
    if (line.size() <= sizeof g_kept_line) {
      std::memcpy(g_kept_line, line.data(), line.size());
      g_kept_line_size = line.size();
    }
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  }
  void OnProcessGroup(int slot, int pgid) override {
    if (slot >= 0 && slot < 5) g_pgids[slot] = pgid;
  }
  void OnTable(const std::string& lines) override {
    std::fputs(lines.c_str(), stdout);
    std::fflush(stdout);
  }
  void OnProcessExit(int64_t /*seed*/, int n, const std::string& run_dir) override {
    if (n == 0 && g_first_exit_hook != nullptr) g_first_exit_hook(run_dir);
  }
};

int RunChaosCommand(ChaosOptions o) {
  g_killed = o.preset == "cluster" ? "\nforeman chaos: interrupted; the running cluster's tasks were killed\n"
                                   : "\nforeman chaos: interrupted; the running job was killed\n";
  o.foreman_program = "/proc/self/exe";
  // --disk sim: this program's own train command, in this process; its log
  // configuration is put back after each simulated process.
  o.train_in_process = [](const std::vector<std::string>& args, const SimulatedProcess& process) {
    std::unique_ptr<Env> wrapped = g_disk_wrapper != nullptr ? g_disk_wrapper(process.env) : nullptr;
    SimulatedProcess p = process;
    if (wrapped != nullptr) p.env = wrapped.get();
    const int code = RunTrainInProcess(args, p);
    LogOptions quiet;
    quiet.level = LogLevel::kOff;
    ConfigureLogging(quiet).IgnoreError();
    return code;
  };
  // The checks' findings go into the report; the library's warnings about
  // them (a checkpoint that does not verify) would only repeat them.
  LogOptions quiet;
  quiet.level = LogLevel::kOff;
  ConfigureLogging(quiet).IgnoreError();
  Printer printer;
  auto report = RunChaos(o, &printer);
  if (!report.ok()) {
    // Bad flags or plan (exit 2) are INVALID_ARGUMENT; the rest failed work.
    std::fprintf(stderr, "foreman chaos: %s\n", EscapeForTerminal(report.status().message()).c_str());
    return absl::IsInvalidArgument(report.status()) ? kExitUsage : kExitFailed;
  }
  std::fputs(report->summary.c_str(), stdout);
  std::fflush(stdout);
  int code = report->failed == 0 ? kExitOk : kExitFailed;
  if (!report->json_written) {
    std::fprintf(stderr, "foreman chaos: cannot write --json %s\n", o.json_path.c_str());
    code = kExitFailed;
  }
  if (!report->work_dir.empty()) std::printf("work directory: %s\n", report->work_dir.c_str());
  return code;
}

}  // namespace

void SetChaosFirstExitHookForTest(ChaosFirstExitHook hook) { g_first_exit_hook = hook; }
void SetSimulatedDiskWrapperForTest(SimulatedDiskWrapper wrap) { g_disk_wrapper = wrap; }

void AddChaosCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<ChaosOptions>();
  CLI::App* cmd = app.add_subcommand(
      "chaos",
      "Run a small foreman train job under seeded fault plans, restart it after each process-level fault as a "
      "supervisor would, and check invariants (checkpoints verify, global_step, final weights equal a fault-free "
      "run's, scalars once, bounded, finished). Train flags go after --. --preset cluster instead kills and restarts "
      "the tasks of a local cluster (a ps, the chief, worker 1; docs/fault-injection.md).\n"
      "Exit codes: 0 every invariant held for every seed, 1 one failed, 2 bad flags or plan (also a plan or train "
      "flags foreman train refuses, or a --json path that cannot be written), 128 + the signal when interrupted "
      "(the running job is killed; the work directory is kept and named).");
  cmd->add_option("--preset", o->preset,
                  "disk | steps | actors | signals | all | power | cluster (default: all, unless --plan)");
  cmd->add_option("--disk", o->disk,
                  "real: each process a foreman train child on the real disk (default); sim: power loss, each "
                  "process simulated in this one over a disk whose power is cut (--preset power implies it)");
  cmd->add_option("--plan", o->plan_file, "A JSON fault plan (docs/fault-injection.md); its seed is replaced")
      ->check(NonEmpty());
  auto seeds = std::make_shared<int64_t>(10);
  auto first_seed = std::make_shared<int64_t>(0);
  cmd->add_option("--seeds", *seeds, "Seeds first-seed .. first-seed+N-1")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd->add_option("--first-seed", *first_seed, "The first of --seeds")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "One seed (a replay)")->transform(DecimalInt64());
  auto shrink_seed = std::make_shared<std::optional<int64_t>>();
  cmd->add_option("--shrink", *shrink_seed,
                  "Shrink the failing plan of this seed to a smaller one that still fails; print it and its replay")
      ->transform(DecimalInt64());
  cmd->add_option("--json", o->json_path, "Write the report as JSON (no absolute paths; timings in *_ms)")
      ->check(NonEmpty());
  cmd->add_option("--work-dir", o->work_dir,
                  "Where the runs go (kept); default a new temporary directory, removed when every seed passed")
      ->check(NonEmpty());
  cmd->add_flag("--keep", o->keep, "Keep the temporary work directory");
  cmd->add_option("--timeout-secs", o->timeout_secs, "Limit per foreman train process (then: a hang)")
      ->capture_default_str();
  cmd->add_option("train_flags", o->train_flags, "foreman train flags, after --")->take_all();
  cmd->callback([cmd, o, seeds, first_seed, shrink_seed, exit_code] {
    ChaosOptions options = *o;
    if (shrink_seed->has_value()) {
      if (options.seed.has_value() || cmd->count("--seeds") > 0 || cmd->count("--first-seed") > 0) {
        std::fprintf(stderr, "foreman chaos: --shrink SEED shrinks one seed's plan: not with --seed, --seeds or "
                             "--first-seed\n");
        *exit_code = kExitUsage;
        return;
      }
      options.shrink = true;
      options.seed = **shrink_seed;
    }
    // With --seed, only the --seeds / --first-seed given (RunChaos refuses
    // them together); else their values or defaults.
    if (cmd->count("--seeds") > 0 || !options.seed.has_value()) options.seeds = *seeds;
    if (cmd->count("--first-seed") > 0 || !options.seed.has_value()) options.first_seed = *first_seed;
    *exit_code = RunChaosCommand(std::move(options));
  });
}

}  // namespace foreman::cli
