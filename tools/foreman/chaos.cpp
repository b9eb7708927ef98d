// `foreman chaos`: runs a small `foreman train` job under seeded fault plans,
// restarts it after each process-level fault as a supervisor would, and
// checks invariants after every run (docs/fault-injection.md, "foreman
// chaos", is the user's guide).
//
// Per invocation, one fault-free baseline run (the same train flags); then
// per seed K, in <work>/seed-K/:
//   plan.json     the seed's plan (replay: foreman train --fault-plan plan.json)
//   run/          the job's --checkpoint-dir
//   run-<n>.log   stdout and stderr of the nth process (0: the first start)
// Each process is a child (fork/exec of /proc/self/exe) in its own process
// group, bounded by --timeout-secs (then the group is killed: a hang). The
// job is restarted after every exit other than 0 and 2, and after an exit 0
// that was a signal's graceful stop (a preemption: the job is rescheduled),
// at most kMaxRestarts times.
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
//   bounded             every process ended within --timeout-secs and left
//                       no process in its group
//   finished            the job exited 0 at its end within kMaxRestarts
//                       restarts
//
// --preset cluster is another supervisor (chaos_cluster.hpp): per seed a
// ps, the chief and worker 1 as separate processes, killed and restarted.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "chaos_checks.hpp"
#include "chaos_cluster.hpp"
#include "chaos_plan.hpp"
#include "command.hpp"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/env.hpp"
#include "foreman/fault.hpp"
#include "foreman/logging.hpp"

namespace foreman::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kMaxRestarts = 10;
constexpr char kWorkDirMarker[] = ".foreman-chaos";

// The default job: about a second in the release build, fully deterministic
// (one intra-op thread), a checkpoint every 20 steps, summaries every 10.
const std::vector<std::string>& DefaultTrainFlags() {
  static const std::vector<std::string> flags = {
      "--max-steps", "200", "--hidden", "32", "--batch-size", "32", "--save-checkpoint-steps", "20",
      "--save-summaries-steps", "10", "--threads", "1", "--eval-every-steps", "0"};
  return flags;
}

struct ChaosFlags {
  std::string preset;
  std::string plan_file;
  int64_t seeds = 10;
  int64_t first_seed = 0;
  std::optional<int64_t> seed;
  std::string json_path;
  std::string work_dir;
  bool keep = false;
  double timeout_secs = 60;
  std::vector<std::string> train_flags;
};

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last `n` non-empty lines of a process's log, the first after ": " and
// the others each on a line of its own, indented ("" for an empty log): what
// foreman train said last (an error and CLI11's "Run 'foreman --help'").
std::string LastLines(const std::string& log, std::size_t n) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    line = absl::StripTrailingAsciiWhitespace(line);
    if (!line.empty()) lines.emplace_back(line);
  }
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<std::ptrdiff_t>(n));
  return lines.empty() ? "" : absl::StrCat(": ", absl::StrJoin(lines, "\n  "));
}

// `path` as the report spells it: an absolute path relative to `cwd` (the
// report holds no absolute path), any other as given.
std::string ReportPath(const std::string& path, const fs::path& cwd) {
  if (path.empty() || path[0] != '/') return path;
  const fs::path rel = fs::path(path).lexically_normal().lexically_relative(cwd);
  return rel.empty() ? fs::path(path).filename().string() : rel.string();
}

// A train flag as the report spells it: a word that is an absolute path, or
// the value of "--flag=/path", relative to `cwd` (ReportPath).
std::string ReportWord(const std::string& word, const fs::path& cwd) {
  if (absl::StartsWith(word, "--")) {
    const std::size_t eq = word.find('=');
    if (eq != std::string::npos) return absl::StrCat(word.substr(0, eq + 1), ReportPath(word.substr(eq + 1), cwd));
    return word;
  }
  return ReportPath(word, cwd);
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

// -- the child process ------------------------------------------------------------

// The process group of the running child, for the signal handler: a
// SIGINT / SIGTERM / SIGHUP to `foreman chaos` kills it before exiting (it
// is in its own group, so a terminal's ^C does not reach it).
volatile sig_atomic_t g_child_pgid = 0;
// "foreman chaos: work directory kept: <dir>\n", written by the handler
// (set once, before the first child starts; empty before).
char g_work_dir_line[PATH_MAX + 64] = {};
std::size_t g_work_dir_line_size = 0;

// Exits as a shell reports a death by `sig` (130 for SIGINT, 143 for
// SIGTERM, 129 for SIGHUP), saying where the work directory is: what the
// interrupted seed wrote is kept for a look (remove it when done).
void OnSignal(int sig) {
  const pid_t pgid = g_child_pgid;
  if (pgid > 0) kill(-pgid, SIGKILL);
  static const char kMessage[] = "\nforeman chaos: interrupted; the running job was killed\n";
  ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  if (g_work_dir_line_size > 0) ignored = write(STDERR_FILENO, g_work_dir_line, g_work_dir_line_size);
  (void)ignored;
  _exit(128 + sig);
}

// Sets what OnSignal prints about `dir` (called before the handlers can run
// a child; a path too long for the buffer is left out).
void NoteWorkDirForSignals(const std::string& dir) {
  const std::string line = absl::StrCat("foreman chaos: work directory kept: ", dir, "\n");
  if (line.size() > sizeof g_work_dir_line) return;
  std::memcpy(g_work_dir_line, line.data(), line.size());
  g_work_dir_line_size = line.size();
}

void InstallSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

struct ChildResult {
  int exit_code = 0;     // as a shell reports it: 128 + signal when killed
  bool timed_out = false;
  bool left_processes = false;  // its process group outlived it (killed)
  int64_t elapsed_ms = 0;
};

// Waits for `pid` at most `timeout_ms`; true when it exited (*status set).
bool WaitFor(pid_t pid, int64_t timeout_ms, int* status) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  while (true) {
    const pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) {
      if (pidfd >= 0) close(pidfd);
      return true;
    }
    const int64_t left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      if (pidfd >= 0) close(pidfd);
      return false;
    }
    if (pidfd >= 0) {
      struct pollfd p {pidfd, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    } else {
      usleep(static_cast<useconds_t>(std::min<int64_t>(left, 5) * 1000));  // no pidfd: a bounded poll
    }
  }
}

// Runs /proc/self/exe with `args` (argv[1...]) in its own process group,
// stdin from /dev/null, stdout and stderr into `log_path`.
StatusOr<ChildResult> RunChild(const std::vector<std::string>& args, const std::string& log_path,
                               double timeout_secs) {
  std::vector<std::string> words = {"foreman"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot create ", log_path, ": ", std::strerror(errno)));
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    if (null_fd >= 0) close(null_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also here: no race with the kill below
  g_child_pgid = pid;
  close(log_fd);
  if (null_fd >= 0) close(null_fd);
  ChildResult result;
  int status = 0;
  const int64_t timeout_ms = static_cast<int64_t>(std::ceil(timeout_secs * 1000));
  if (!WaitFor(pid, timeout_ms, &status)) {
    result.timed_out = true;
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  result.elapsed_ms = MillisSince(start);
  // Anything left in the group (a grandchild) is a leak: kill it.
  if (kill(-pid, 0) == 0) {
    result.left_processes = true;
    kill(-pid, SIGKILL);
  }
  g_child_pgid = 0;
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  return result;
}

// -- per seed ----------------------------------------------------------------------

struct RunRecord {
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

struct SeedReport {
  int64_t seed = 0;
  json plan;
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
  std::vector<RunRecord> runs;
  std::map<std::string, Invariant> invariants;
  std::string replay;
  std::string replay_report;  // the replay with no absolute path (the JSON report's)
  // foreman train refused the seed's first process (exit 2); what it said
  // last (LastLines), the seed's plan.json named as the user's --plan.
  bool refused = false;
  std::string refused_lines;
  int64_t elapsed_ms = 0;
  bool ok() const {
    for (const auto& [name, inv] : invariants) {
      if (!inv.ok) return false;
    }
    return true;
  }
};

// The context of one invocation.
struct Chaos {
  ChaosFlags flags;
  std::string work;                      // the work directory
  std::vector<std::string> train_flags;  // as run (defaults or the user's, plus the forced ones)
  std::string baseline_dir;
  int64_t baseline_step = -1;
  bool changes_training = false;  // declared by a --plan file
  json user_plan;                 // --plan's faults
  Env* env = Env::Default();
  fs::path cwd;  // where foreman chaos runs: the report's paths are relative to it

  // A path or message without the work directory (the report has no
  // absolute paths).
  std::string Rel(const std::string& s) const { return absl::StrReplaceAll(s, {{work + "/", ""}, {work, "."}}); }
};

// The test-only knob FOREMAN_CHAOS_TEST_CORRUPT_CHECKPOINT (any non-empty
// value): after a seed's first process exits, one byte in the middle of its
// latest checkpoint's data file is flipped, so that checkpoints_verify must
// fail (tests/chaos_cli_test.sh). Never set it otherwise.
void MaybeCorruptForTest(Env* env, const std::string& run_dir) {
  const char* knob = std::getenv("FOREMAN_CHAOS_TEST_CORRUPT_CHECKPOINT");
  if (knob == nullptr || *knob == '\0') return;
  auto latest = LatestCheckpoint(env, run_dir);
  if (!latest.ok() || !latest->has_value()) return;
  const std::string data = BundleDataPath(**latest);
  std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (size <= 0) return;
  f.seekg(size / 2);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(size / 2);
  f.write(&c, 1);
}

std::string EndedBy(const ChildResult& child, const TrainLog& log) {
  if (child.timed_out) return "timeout (killed)";
  if (!log.stopped_by_fault.empty()) return absl::StrCat("injected fault ", log.stopped_by_fault);
  if (child.exit_code == 0) return log.stopped_by_signal ? "signal (graceful stop)" : "done";
  if (child.exit_code == 128 + SIGKILL) return "SIGKILL";
  if (child.exit_code > 128) return absl::StrCat("signal ", child.exit_code - 128);
  if (child.exit_code == kExitUsage) return "refused (exit 2)";
  return absl::StrCat("exit ", child.exit_code);
}

// The command that replays `seed`; with `for_report`, absolute paths made
// relative to the working directory (ReportWord).
std::string ReplayCommand(const Chaos& c, int64_t seed, bool for_report) {
  auto word = [&](const std::string& w) { return ShellQuote(for_report ? ReportWord(w, c.cwd) : w); };
  std::string cmd = "foreman chaos";
  if (!c.flags.plan_file.empty()) {
    absl::StrAppend(&cmd, " --plan ", word(c.flags.plan_file));
  } else {
    absl::StrAppend(&cmd, " --preset ", c.flags.preset);
  }
  absl::StrAppend(&cmd, " --seed ", seed);
  if (c.flags.timeout_secs != 60) absl::StrAppend(&cmd, " --timeout-secs ", c.flags.timeout_secs);
  if (!c.flags.train_flags.empty()) {
    absl::StrAppend(&cmd, " --");
    for (const std::string& f : c.flags.train_flags) absl::StrAppend(&cmd, " ", word(f));
  }
  return cmd;
}

// The seed's plan as JSON (its "seed" is the seed).
StatusOr<json> SeedPlan(const Chaos& c, int64_t seed) {
  if (!c.flags.plan_file.empty()) {
    json plan = c.user_plan;
    plan["seed"] = seed;
    return plan;
  }
  return ChaosPresetPlan(c.flags.preset, static_cast<uint64_t>(seed));
}

StatusOr<SeedReport> RunSeed(Chaos& c, int64_t seed) {
  const auto start = std::chrono::steady_clock::now();
  SeedReport r;
  r.seed = seed;
  r.replay = ReplayCommand(c, seed, /*for_report=*/false);
  r.replay_report = ReplayCommand(c, seed, /*for_report=*/true);
  for (const std::string& name : InvariantNames()) r.invariants[name] = Invariant();
  const std::string seed_dir = absl::StrCat(c.work, "/seed-", seed);
  std::error_code ec;
  fs::remove_all(seed_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot clear ", seed_dir, ": ", ec.message()));
  fs::create_directories(seed_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", seed_dir, ": ", ec.message()));
  FOREMAN_ASSIGN_OR_RETURN(r.plan, SeedPlan(c, seed));
  r.faults_planned = static_cast<int64_t>(r.plan["faults"].size());
  const std::string plan_path = seed_dir + "/plan.json";
  {
    std::ofstream out(plan_path);
    out << r.plan.dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", plan_path));
  }
  // The plan must be one foreman train accepts (a preset's always is).
  if (auto parsed = ParseFaultPlan(r.plan.dump(), "plan.json"); !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("seed ", seed, ": ", parsed.status().message()));
  }
  const std::string run_dir = seed_dir + "/run";
  std::vector<std::string> args = {"train", "--checkpoint-dir", run_dir};
  // An empty plan needs no --fault-plan: the seed is the fault-free job.
  if (r.faults_planned > 0) {
    args.push_back("--fault-plan");
    args.push_back(plan_path);
  }
  args.insert(args.end(), c.train_flags.begin(), c.train_flags.end());

  Invariant& verify = r.invariants["checkpoints_verify"];
  Invariant& steps = r.invariants["global_step"];
  Invariant& bounded = r.invariants["bounded"];
  Invariant& finished = r.invariants["finished"];
  bool done = false;
  for (int n = 0; n <= kMaxRestarts; ++n) {
    const std::string log_path = absl::StrCat(seed_dir, "/run-", n, ".log");
    FOREMAN_ASSIGN_OR_RETURN(ChildResult child, RunChild(args, log_path, c.flags.timeout_secs));
    const TrainLog log = ParseTrainLog(ReadWholeFile(log_path));
    if (n == 0) MaybeCorruptForTest(c.env, run_dir);
    if (n == 0 && child.exit_code == kExitUsage && !child.timed_out) {
      r.refused = true;
      r.refused_lines = absl::StrReplaceAll(LastLines(ReadWholeFile(log_path), 4),
                                      {{plan_path, c.flags.plan_file.empty() ? "plan.json" : c.flags.plan_file}});
    }
    RunRecord run;
    run.exit_code = child.exit_code;
    run.ended_by = EndedBy(child, log);
    run.timed_out = child.timed_out;
    run.left_processes = child.left_processes;
    run.elapsed_ms = child.elapsed_ms;
    run.recoveries = log.recoveries;
    run.recovery_steps_lost = log.recovery_steps_lost;
    for (const std::string& t : log.service_restarts) run.service_restarts.push_back(c.Rel(t));
    run.summary_steps_lost = log.summary_steps_lost;
    r.service_restarts += static_cast<int64_t>(log.service_restarts.size());
    r.summary_steps_lost.insert(r.summary_steps_lost.end(), log.summary_steps_lost.begin(),
                                log.summary_steps_lost.end());
    run.start_step = log.restored_step ? *log.restored_step : (log.last_step >= 0 ? 0 : -1);
    // 1. After every exit: the listed checkpoints verify, one restores.
    if (Status s = VerifyListedCheckpoints(c.env, run_dir); !s.ok()) {
      verify.Fail(absl::StrCat("after run ", n, ": ", c.Rel(std::string(s.message()))));
    }
    auto ckpt = LatestCheckpointStep(c.env, run_dir);
    run.checkpoint_step = ckpt.ok() ? *ckpt : -1;
    run.last_step = std::max(log.last_step, run.checkpoint_step);
    // 2. The step: +1 at a time within the process, and it starts where the
    //    one before left its latest checkpoint.
    for (const std::string& e : log.step_errors) steps.Fail(absl::StrCat("run ", n, ": ", e));
    if (n > 0 && run.start_step >= 0) {
      const RunRecord& before = r.runs.back();
      const int64_t expected = std::max<int64_t>(before.checkpoint_step, 0);
      if (run.start_step != expected) {
        steps.Fail(absl::StrCat("run ", n, " started at step ", run.start_step, ", but the latest checkpoint run ",
                                n - 1, " left is step ", expected));
      }
      r.steps_lost += std::max<int64_t>(0, before.last_step - run.start_step);
    }
    r.recoveries += log.recoveries;
    r.recovery_steps_lost += log.recovery_steps_lost;
    // 5. Bounded.
    if (child.timed_out) {
      bounded.Fail(absl::StrCat("run ", n, " did not end within --timeout-secs ", c.flags.timeout_secs,
                                " (its process group was killed)"));
    }
    if (child.left_processes) bounded.Fail(absl::StrCat("run ", n, " left processes in its group (killed)"));
    r.runs.push_back(run);
    if (child.exit_code == kExitOk && !log.stopped_by_signal && !child.timed_out) {
      done = true;
      break;
    }
    if (child.timed_out || child.exit_code == kExitUsage) break;  // a hang, or a refusal: no restart helps
    if (n < kMaxRestarts) ++r.restarts;
  }
  if (!done) {
    const RunRecord& last = r.runs.back();
    finished.Fail(last.timed_out || last.exit_code == kExitUsage
                      ? absl::StrCat("run ", r.runs.size() - 1, " ended by ", last.ended_by, ": not restarted")
                      : absl::StrCat("not done after ", kMaxRestarts, " restarts"));
  } else if (!c.changes_training && r.runs.back().last_step != c.baseline_step) {
    finished.Fail(absl::StrCat("ended at step ", r.runs.back().last_step, ", the fault-free run at step ",
                               c.baseline_step));
  }
  // 3. The final weights.
  Invariant& weights = r.invariants["final_weights"];
  if (c.changes_training) {
    weights.checked = false;
    weights.details.push_back("not checked: the plan declares that it changes training");
  } else if (!done) {
    weights.checked = false;
    weights.details.push_back("not checked: the job did not finish");
  } else if (Status s = CompareFinalWeights(c.env, c.baseline_dir, run_dir); !s.ok()) {
    weights.Fail(c.Rel(std::string(s.message())));
  }
  // 4. Scalars once under the purge rule.
  if (Status s = CheckScalarsOnce(c.env, run_dir); !s.ok()) {
    r.invariants["scalars_once"].Fail(c.Rel(std::string(s.message())));
  }
  if (auto metrics = ReadRecoveryMetrics(c.env, run_dir); metrics.ok()) r.recovery_metrics = *std::move(metrics);
  auto fired = ReadFiredFaults(c.env, run_dir);
  if (fired.ok()) {
    for (const FiredFault& f : *fired) r.faults_fired.push_back(f.id);
  }
  r.elapsed_ms = MillisSince(start);
  return r;
}

// -- the report ------------------------------------------------------------------

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

json RunJson(const RunRecord& run) {
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

json SeedJson(const SeedReport& r) {
  json j;
  j["seed"] = r.seed;
  j["ok"] = r.ok();
  j["plan"] = r.plan;
  j["faults_planned"] = r.faults_planned;
  j["faults_fired"] = r.faults_fired;
  j["restarts"] = r.restarts;
  j["steps_lost"] = r.steps_lost;
  j["in_process_recoveries"] = r.recoveries;
  j["in_process_steps_lost"] = r.recovery_steps_lost;
  j["service_restarts"] = r.service_restarts;
  j["summary_steps_lost"] = r.summary_steps_lost;
  json metrics = json::array();
  for (const RecoveryMetrics& m : r.recovery_metrics) {
    metrics.push_back({{"global_step", m.step},
                       {"recoveries", m.recoveries},
                       {"steps_lost", m.steps_lost},
                       {"detect_ms", m.detect_ms},
                       {"restore_ms", m.restore_ms},
                       {"next_good_step_ms", m.next_good_step_ms}});
  }
  j["recovery_metrics"] = metrics;
  json runs = json::array();
  for (const RunRecord& run : r.runs) runs.push_back(RunJson(run));
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

void PrintHeader() {
  std::printf("%6s %7s %7s %8s %10s %11s %11s %13s %12s %7s %8s\n", "seed", "faults", "firings", "restarts",
              "steps_lost", "checkpoints", "global_step", "final_weights", "scalars_once", "bounded", "finished");
  std::fflush(stdout);
}

void PrintRow(const SeedReport& r) {
  const auto& i = r.invariants;
  // faults: the plan's faults that fired / its faults; firings: how often
  // they fired (a "repeat" fault fires in every process, and a repeating
  // step fault again after every in-process recovery).
  const std::set<std::string> fired(r.faults_fired.begin(), r.faults_fired.end());
  std::printf("%6lld %7s %7zu %8lld %10lld %11s %11s %13s %12s %7s %8s\n", static_cast<long long>(r.seed),
              absl::StrCat(fired.size(), "/", r.faults_planned).c_str(), r.faults_fired.size(),
              static_cast<long long>(r.restarts), static_cast<long long>(r.steps_lost),
              InvariantCell(i.at("checkpoints_verify")).c_str(), InvariantCell(i.at("global_step")).c_str(),
              InvariantCell(i.at("final_weights")).c_str(), InvariantCell(i.at("scalars_once")).c_str(),
              InvariantCell(i.at("bounded")).c_str(), InvariantCell(i.at("finished")).c_str());
  std::fflush(stdout);
}

// -- the command -------------------------------------------------------------------

int Usage(const std::string& message) {
  std::fprintf(stderr, "foreman chaos: %s\n", message.c_str());
  return kExitUsage;
}

// The work directory: --work-dir (created; refused when it holds anything but
// an earlier `foreman chaos` run), or a new temporary one.
StatusOr<std::string> PrepareWorkDir(const ChaosFlags& f, bool* temporary) {
  std::error_code ec;
  std::string dir;
  if (f.work_dir.empty()) {
    const char* tmpdir = std::getenv("TMPDIR");
    std::string templ = absl::StrCat(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp", "/foreman-chaos-XXXXXX");
    if (mkdtemp(templ.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("cannot create ", templ, ": ", std::strerror(errno)));
    }
    dir = templ;
    *temporary = true;
  } else {
    dir = fs::absolute(f.work_dir, ec).lexically_normal().string();
    if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    if (fs::exists(dir, ec) && !fs::is_empty(dir, ec) && !fs::exists(fs::path(dir) / kWorkDirMarker, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--work-dir ", f.work_dir, " is not empty and was not made by foreman chaos (no ", kWorkDirMarker,
          "): give a new or empty directory"));
    }
    fs::create_directories(dir, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("--work-dir ", f.work_dir, ": ", ec.message()));
    *temporary = false;
  }
  std::ofstream marker(fs::path(dir) / kWorkDirMarker);
  marker << "made by foreman chaos: the seeds' runs are replaced by the next run in this directory\n";
  if (!marker) return absl::InternalError(absl::StrCat("cannot write to ", dir));
  return dir;
}

int RunChaos(const CLI::App& cmd, ChaosFlags f) {
  Chaos c;
  // -- flags.
  if (!f.preset.empty() && !f.plan_file.empty()) return Usage("give --preset or --plan, not both");
  if (f.preset.empty() && f.plan_file.empty()) f.preset = "all";
  const bool cluster = f.preset == "cluster";
  if (!f.preset.empty() && !cluster && !ChaosPresetPlan(f.preset, 0).ok()) {
    return Usage(
        absl::StrCat("--preset: unknown preset '", f.preset, "' (disk, steps, actors, signals, all or cluster)"));
  }
  if (f.seed.has_value() && (cmd.count("--seeds") > 0 || cmd.count("--first-seed") > 0)) {
    return Usage("give --seed K (one seed) or --seeds N [--first-seed K], not both");
  }
  if (f.seeds < 1 || f.seeds > 1000000) return Usage(absl::StrCat("--seeds must be in [1, 1000000], got ", f.seeds));
  if (f.first_seed < 0) return Usage(absl::StrCat("--first-seed must be >= 0, got ", f.first_seed));
  if (f.seed.has_value() && *f.seed < 0) return Usage(absl::StrCat("--seed must be >= 0, got ", *f.seed));
  if (!(f.timeout_secs > 0 && f.timeout_secs <= 86400)) {
    return Usage(absl::StrCat("--timeout-secs must be in (0, 86400], got ", f.timeout_secs));
  }
  for (const char* owned : {"--checkpoint-dir", "--fault-plan"}) {
    if (HasFlag(f.train_flags, owned)) {
      return Usage(absl::StrCat("the train flags after -- may not set ", owned, ": foreman chaos sets it per seed"));
    }
  }
  if (!f.plan_file.empty()) {
    const std::string text = ReadWholeFile(f.plan_file);
    if (text.empty() && !fs::exists(f.plan_file)) return Usage(absl::StrCat("--plan ", f.plan_file, ": no such file"));
    json plan = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (plan.is_object() && plan.contains("changes_training")) {
      if (!plan["changes_training"].is_boolean()) {
        return Usage(absl::StrCat(f.plan_file, ": \"changes_training\" must be true or false, got ",
                                  plan["changes_training"].dump()));
      }
      c.changes_training = plan["changes_training"].get<bool>();
      plan.erase("changes_training");
    }
    // The plan file's own errors, with its name.
    auto parsed = ParseFaultPlan(plan.is_discarded() ? text : plan.dump(), f.plan_file);
    if (!parsed.ok()) return Usage(std::string(parsed.status().message()));
    if (!plan.contains("faults")) plan["faults"] = json::array();
    c.user_plan = plan;
  }
  if (!f.json_path.empty()) {
    if (Status s = CheckWritable(f.json_path); !s.ok()) return Usage(std::string(s.message()));
  }
  if (cluster) {
    // Its own supervisor of three tasks per seed (chaos_cluster.hpp).
    if (const std::string e = ClusterTrainFlagsError(f.train_flags); !e.empty()) return Usage(e);
    ClusterChaosOptions o;
    auto work = PrepareWorkDir(f, &o.temporary);
    if (!work.ok()) return Usage(std::string(work.status().message()));
    o.work = *work;
    o.keep = f.keep;
    if (f.seed.has_value()) {
      o.seeds.push_back(*f.seed);
    } else {
      for (int64_t i = 0; i < f.seeds; ++i) o.seeds.push_back(f.first_seed + i);
    }
    o.json_path = f.json_path;
    o.timeout_secs = f.timeout_secs;
    o.train_flags = f.train_flags;
    std::error_code cwd_ec;
    const fs::path cwd = fs::current_path(cwd_ec);
    for (const std::string& w : f.train_flags) o.report_train_flags.push_back(ReportWord(w, cwd));
    LogOptions quiet;
    quiet.level = LogLevel::kOff;
    ConfigureLogging(quiet).IgnoreError();
    return RunClusterChaos(o);
  }
  c.train_flags = f.train_flags.empty() ? DefaultTrainFlags() : f.train_flags;
  // Forced: a fixed thread count (bit-for-bit results) and a progress line
  // after every step (the global_step invariant reads them).
  if (!HasFlag(c.train_flags, "--threads")) {
    c.train_flags.push_back("--threads");
    c.train_flags.push_back("1");
  }
  c.train_flags.push_back("--log-step-count-steps");
  c.train_flags.push_back("1");
  c.flags = f;
  // The checks' findings go into the report; the library's warnings about
  // them (a checkpoint that does not verify) would only repeat them.
  LogOptions quiet;
  quiet.level = LogLevel::kOff;
  ConfigureLogging(quiet).IgnoreError();

  // -- the work directory.
  bool temporary = false;
  auto work = PrepareWorkDir(f, &temporary);
  if (!work.ok()) return Usage(std::string(work.status().message()));
  c.work = *work;
  std::error_code cwd_ec;
  c.cwd = fs::current_path(cwd_ec);
  NoteWorkDirForSignals(c.work);
  InstallSignalHandlers();
  const auto started = std::chrono::steady_clock::now();

  // -- the fault-free baseline.
  const std::string baseline = c.work + "/baseline";
  std::error_code ec;
  fs::remove_all(baseline, ec);
  fs::create_directories(baseline, ec);
  c.baseline_dir = baseline + "/run";
  std::vector<std::string> args = {"train", "--checkpoint-dir", c.baseline_dir};
  args.insert(args.end(), c.train_flags.begin(), c.train_flags.end());
  auto base = RunChild(args, baseline + "/run-0.log", f.timeout_secs);
  if (!base.ok()) {
    std::fprintf(stderr, "foreman chaos: %s\n", std::string(base.status().message()).c_str());
    return kExitFailed;
  }
  auto base_step = LatestCheckpointStep(c.env, c.baseline_dir);
  if (base->exit_code != kExitOk || !base_step.ok() || *base_step < 0) {
    // foreman train's last lines: its error, and CLI11's usage hint.
    const std::string said = LastLines(ReadWholeFile(baseline + "/run-0.log"), 4);
    const std::string how =
        base->timed_out
            ? absl::StrCat("did not end within --timeout-secs ", f.timeout_secs,
                           " (allowed: (0, 86400]; give more than the job needs)")
            : absl::StrCat("exited ", base->exit_code);
    std::fprintf(stderr, "foreman chaos: the fault-free run (foreman train %s) %s%s\n",
                 absl::StrJoin(c.train_flags, " ").c_str(), how.c_str(), said.c_str());
    if (temporary && !f.keep) fs::remove_all(c.work, ec);
    return base->exit_code == kExitUsage ? kExitUsage : kExitFailed;
  }
  c.baseline_step = *base_step;
  const int64_t baseline_ms = base->elapsed_ms;
  std::printf("foreman chaos: %s, train flags: %s\n",
              f.plan_file.empty() ? absl::StrCat("preset ", f.preset).c_str()
                                  : absl::StrCat("plan ", f.plan_file).c_str(),
              absl::StrJoin(c.train_flags, " ").c_str());
  std::printf("fault-free run: global_step %lld in %.1f s\n", static_cast<long long>(c.baseline_step),
              static_cast<double>(baseline_ms) / 1000);
  PrintHeader();

  // -- the seeds.
  std::vector<int64_t> seeds;
  if (f.seed.has_value()) {
    seeds.push_back(*f.seed);
  } else {
    for (int64_t i = 0; i < f.seeds; ++i) seeds.push_back(f.first_seed + i);
  }
  std::vector<SeedReport> reports;
  for (int64_t seed : seeds) {
    auto r = RunSeed(c, seed);
    if (!r.ok()) {
      std::fprintf(stderr, "foreman chaos: seed %lld: %s\n", static_cast<long long>(seed),
                   std::string(r.status().message()).c_str());
      return absl::IsInvalidArgument(r.status()) ? kExitUsage : kExitFailed;
    }
    if (r->refused) {
      // A refused plan or flags: every seed would be refused the same way.
      std::fprintf(stderr,
                   "foreman chaos: seed %lld: foreman train refused the job's first run (exit 2: the same command "
                   "fails the same way); stopped before any further seed%s\n",
                   static_cast<long long>(seed), r->refused_lines.c_str());
      if (temporary && !f.keep) fs::remove_all(c.work, ec);
      return kExitUsage;
    }
    PrintRow(*r);
    // A temporary work directory keeps only what a failure needs (a soak of
    // thousands of seeds would otherwise fill the disk).
    if (temporary && !f.keep && r->ok()) fs::remove_all(absl::StrCat(c.work, "/seed-", seed), ec);
    reports.push_back(std::move(*r));
  }
  int64_t failed = 0;
  for (const SeedReport& r : reports) {
    if (r.ok()) continue;
    ++failed;
    std::printf("\nseed %lld FAILED:\n", static_cast<long long>(r.seed));
    for (const std::string& name : InvariantNames()) {
      const Invariant& i = r.invariants.at(name);
      if (i.ok) continue;
      for (const std::string& d : i.details) std::printf("  %s: %s\n", name.c_str(), d.c_str());
    }
    std::printf("  runs:");
    for (const RunRecord& run : r.runs) std::printf(" [%s, steps %lld..%lld]", run.ended_by.c_str(),
                                                    static_cast<long long>(run.start_step),
                                                    static_cast<long long>(run.last_step));
    std::printf("\n  logs: %s/seed-%lld\n  replay: %s\n", c.work.c_str(), static_cast<long long>(r.seed),
                r.replay.c_str());
  }
  // Under --restart-policy: what the session's supervisor restarted in
  // process (the job did not exit for it), and the summary steps lost.
  bool restarts_title = false;
  for (const SeedReport& r : reports) {
    if (r.service_restarts == 0) continue;
    if (!restarts_title) std::printf("\nservice restarts (in process, --restart-policy):\n");
    restarts_title = true;
    std::printf("  seed %lld: %lld service restart(s); summary steps lost: [%s]\n", static_cast<long long>(r.seed),
                static_cast<long long>(r.service_restarts), absl::StrJoin(r.summary_steps_lost, ", ").c_str());
    for (const RunRecord& run : r.runs) {
      for (const std::string& t : run.service_restarts) std::printf("    %s\n", t.c_str());
    }
  }
  const int64_t total_ms = MillisSince(started);
  std::printf("\n%zu seeds, %lld failed, %.1f s\n", reports.size(), static_cast<long long>(failed),
              static_cast<double>(total_ms) / 1000);

  int code = failed == 0 ? kExitOk : kExitFailed;
  if (!f.json_path.empty()) {
    json report;
    if (f.plan_file.empty()) {
      report["preset"] = f.preset;
    } else {
      report["plan"] = fs::path(f.plan_file).filename().string();
      report["changes_training"] = c.changes_training;
    }
    json flags_json = json::array();
    for (const std::string& w : c.train_flags) flags_json.push_back(ReportWord(w, c.cwd));
    report["train_flags"] = flags_json;
    report["timeout_secs"] = f.timeout_secs;
    report["max_restarts"] = kMaxRestarts;
    report["baseline"] = {{"global_step", c.baseline_step}, {"elapsed_ms", baseline_ms}};
    json seeds_json = json::array();
    for (const SeedReport& r : reports) seeds_json.push_back(SeedJson(r));
    report["seeds"] = seeds_json;
    report["failed"] = failed;
    report["ok"] = failed == 0;
    report["elapsed_ms"] = total_ms;
    std::ofstream out(f.json_path);
    out << report.dump(2) << "\n";
    out.close();
    if (!out) {
      std::fprintf(stderr, "foreman chaos: cannot write --json %s\n", f.json_path.c_str());
      code = kExitFailed;
    }
  }
  if (temporary && !f.keep && failed == 0) {
    fs::remove_all(c.work, ec);
  } else {
    std::printf("work directory: %s\n", c.work.c_str());
  }
  return code;
}

}  // namespace

void AddChaosCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<ChaosFlags>();
  CLI::App* cmd = app.add_subcommand(
      "chaos",
      "Run a small foreman train job under seeded fault plans, restart it after each process-level fault as a "
      "supervisor would, and check invariants (checkpoints verify, global_step, final weights equal a fault-free "
      "run's, scalars once, bounded, finished). Train flags go after --. --preset cluster instead kills and restarts "
      "the tasks of a local cluster (a ps, the chief, worker 1; docs/fault-injection.md).\n"
      "Exit codes: 0 every invariant held for every seed, 1 one failed, 2 bad flags or plan (also a plan or train "
      "flags foreman train refuses, or a --json path that cannot be written), 128 + the signal when interrupted "
      "(the running job is killed; the work directory is kept and named).");
  cmd->add_option("--preset", flags->preset, "disk | steps | actors | signals | all | cluster (default: all, unless --plan)");
  cmd->add_option("--plan", flags->plan_file, "A JSON fault plan (docs/fault-injection.md); its seed is replaced")
      ->check(NonEmpty());
  cmd->add_option("--seeds", flags->seeds, "Seeds first-seed .. first-seed+N-1")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd->add_option("--first-seed", flags->first_seed, "The first of --seeds")
      ->transform(DecimalInt64())
      ->capture_default_str();
  cmd->add_option("--seed", flags->seed, "One seed (a replay)")->transform(DecimalInt64());
  cmd->add_option("--json", flags->json_path, "Write the report as JSON (no absolute paths; timings in *_ms)")
      ->check(NonEmpty());
  cmd->add_option("--work-dir", flags->work_dir,
                  "Where the runs go (kept); default a new temporary directory, removed when every seed passed")
      ->check(NonEmpty());
  cmd->add_flag("--keep", flags->keep, "Keep the temporary work directory");
  cmd->add_option("--timeout-secs", flags->timeout_secs, "Limit per foreman train process (then: a hang)")
      ->capture_default_str();
  cmd->add_option("train_flags", flags->train_flags, "foreman train flags, after --")->take_all();
  cmd->callback([cmd, flags, exit_code] { *exit_code = RunChaos(*cmd, *flags); });
}

}  // namespace foreman::cli
