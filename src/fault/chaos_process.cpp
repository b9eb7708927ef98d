// The one-process presets and plan files of RunChaos (chaos_process.hpp has
// the layout of a seed's directory and the invariants).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "fault/chaos_oracle.hpp"
#include "fault/chaos_plan.hpp"
#include "fault/chaos_process.hpp"
#include "fault/run_record.hpp"
#include "fault/sim_disk.hpp"
#include "foreman/dataset.hpp"
#include "foreman/fault.hpp"
#include "foreman/mem_env.hpp"
#include "platform/subprocess.hpp"

namespace foreman::internal {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The power preset's data: the first examples of Fashion-MNIST's sets.
constexpr int64_t kSimTrainExamples = 2048;
constexpr int64_t kSimTestExamples = 512;

// The default job: about a second in the release build, fully deterministic
// (one intra-op thread), a checkpoint every 20 steps, summaries every 10.
const std::vector<std::string>& DefaultTrainFlags() {
  static const std::vector<std::string> flags = {
      "--max-steps", "200", "--hidden", "32", "--batch-size", "32", "--save-checkpoint-steps", "20",
      "--save-summaries-steps", "10", "--threads", "1", "--eval-every-steps", "0"};
  return flags;
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

struct ChildResult {
  int exit_code = 0;  // as a shell reports it: 128 + signal when killed
  bool timed_out = false;
  bool left_processes = false;  // its process group outlived it (killed)
  bool power_cut = false;       // --disk sim: the disk crashed during it
  int64_t elapsed_ms = 0;
};

// Runs `foreman_program train ...` (`args`: argv[1...]) in its own process
// group, stdin from /dev/null, stdout and stderr into `log_path`, bounded by
// timeout_secs. No death signal: a killed RunChaos leaves the job running
// (as it always did; the CLI's signal handler kills it).
StatusOr<ChildResult> RunChild(const ChaosRun& run, const std::vector<std::string>& args,
                               const std::string& log_path) {
  SpawnOptions o;
  o.program = run.options.foreman_program;
  o.argv = {"foreman"};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.stdout_to = ChildOutput::File(log_path);
  o.parent_death_signal = 0;
  const auto start = std::chrono::steady_clock::now();
  FOREMAN_ASSIGN_OR_RETURN(Subprocess child, SpawnObserved(o, run.observer, 0));
  const int64_t timeout_ms = static_cast<int64_t>(std::ceil(run.options.timeout_secs * 1000));
  StatusOr<FinishResult> finished = child.Finish(timeout_ms);
  run.observer.OnProcessGroup(0, 0);
  FOREMAN_RETURN_IF_ERROR(finished.status());
  ChildResult result;
  result.exit_code = finished->exit.exit_code;
  result.timed_out = finished->timed_out;
  result.left_processes = finished->exit.left_processes;
  result.elapsed_ms = MillisSince(start);
  return result;
}

// -- the simulated disk (--disk sim) ---------------------------------------------

// One seed's simulated disk (or the baseline's), and what was checked as
// its processes ran: each durable save against the disk a power cut at that
// instant would leave.
struct SimSeed {
  SimSeed(const std::string& run_dir, Env* outside)
      : disk(std::make_unique<MemEnv>()), env(std::make_unique<SimDisk>(disk.get(), run_dir, outside)) {}
  std::unique_ptr<MemEnv> disk;
  std::unique_ptr<SimDisk> env;
  std::mutex mu;
  // Findings of the checks made at durable saves, by invariant (at most
  // kMaxDurableFindings each; the rest counted).
  std::map<std::string, std::vector<std::string>> findings;
  std::map<std::string, int64_t> findings_dropped;
  int64_t last_durable_step = -1;  // of every process so far
  int64_t durable_saves = 0;
};

constexpr std::size_t kMaxDurableFindings = 3;

// Adds findings by invariant, keeping the first kMaxDurableFindings.
class FindingsSink {
 public:
  FindingsSink(std::map<std::string, std::vector<std::string>>& kept, std::map<std::string, int64_t>& dropped)
      : kept_(kept), dropped_(dropped) {}
  struct Adder {
    FindingsSink& sink;
    std::string name;
    void push_back(std::string finding) {
      std::vector<std::string>& k = sink.kept_[name];
      if (k.size() < kMaxDurableFindings) {
        k.push_back(std::move(finding));
      } else {
        ++sink.dropped_[name];
      }
    }
  };
  Adder operator[](const std::string& name) { return Adder{*this, name}; }

 private:
  std::map<std::string, std::vector<std::string>>& kept_;
  std::map<std::string, int64_t>& dropped_;
};

// What is wrong with the durable state file of `image` for a save of `step`
// ("" when it names that step as its latest): it must exist, parse and name
// the saved checkpoint as model_checkpoint_path. Without this, a state file
// whose sync (or its directory's) was lost passes: the oracle then falls
// back to the newest bundle, which is the saved one.
std::string DurableStateFileFault(Env* image, const std::string& run_dir, int64_t step) {
  auto d = OracleReadDirectory(image, run_dir);
  if (!d.ok()) return absl::StrCat("the directory does not read: ", d.status().message());
  if (!d->has_state) return "has no state file";
  if (!d->state_error.empty()) return absl::StrCat("has a state file that does not parse (", d->state_error, ")");
  const std::string want = absl::StrCat("model.ckpt-", step);
  const std::string latest = d->latest.substr(d->latest.rfind('/') + 1);
  if (latest != want) {
    return absl::StrCat("has a state file whose model_checkpoint_path is ", latest, ", not ", want);
  }
  return "";
}

// The check at a save reported durable (on the training thread, in the
// saver listener's after_save): a power cut now must leave that checkpoint
// whole and be what a restart restores, and leave a state file that names
// it as the latest; the state file lists only whole checkpoints; the event
// files read.
void CheckDurableSave(SimSeed& sim, const std::string& run_dir, int n, int64_t step) {
  const std::unique_ptr<MemEnv> image = sim.disk->DurableImage();
  std::vector<std::string> notes;
  auto restore = OracleRestoreStep(image.get(), run_dir, &notes);
  const std::string state_fault = DurableStateFileFault(image.get(), run_dir, step);
  std::vector<std::string> bad = OracleBadListedCheckpoints(image.get(), run_dir);
  const Status events = CheckScalarsOnce(image.get(), run_dir);
  std::lock_guard<std::mutex> lock(sim.mu);
  ++sim.durable_saves;
  sim.last_durable_step = std::max(sim.last_durable_step, step);
  // The first findings of each invariant in full, then a count (a lie of
  // the disk fails every save alike).
  FindingsSink f(sim.findings, sim.findings_dropped);
  if (!restore.ok()) {
    f["checkpoints_verify"].push_back(absl::StrCat("run ", n, ": the save of step ", step,
                                                   " was reported durable; the disk a power cut then leaves does "
                                                   "not read: ", restore.status().message()));
  } else if (!restore->has_value() || **restore != step) {
    f["checkpoints_verify"].push_back(absl::StrCat(
        "run ", n, ": the save of step ", step, " was reported durable, but a power cut then leaves ",
        restore->has_value() && **restore >= 0 ? absl::StrCat("step ", **restore, " as the checkpoint to restore")
                                               : std::string("no whole checkpoint"),
        notes.empty() ? "" : absl::StrCat(" (", absl::StrJoin(notes, "; "), ")")));
  }
  if (!state_fault.empty()) {
    f["checkpoints_verify"].push_back(absl::StrCat("run ", n, ": the save of step ", step,
                                                   " was reported durable, but the disk a power cut then leaves ",
                                                   state_fault));
  }
  for (const std::string& b : bad) {
    f["checkpoints_verify"].push_back(absl::StrCat("run ", n, ", at the durable save of step ", step,
                                                   ": the state file after a power cut lists ", b));
  }
  if (!events.ok() && !absl::IsNotFound(events)) {
    f["scalars_once"].push_back(
        absl::StrCat("run ", n, ", at the durable save of step ", step, ", after a power cut: ", events.message()));
  }
}

// Runs one simulated process: options.train_in_process over the seed's
// disk, stdout and stderr into `log_path`, bounded by timeout_secs (past it
// the harness exits: an in-process hang cannot be killed alone).
StatusOr<ChildResult> RunSimulated(const ChaosRun& run, const std::vector<std::string>& args,
                                   const std::string& log_path, SimSeed& sim, const std::string& run_dir, int n) {
  SimulatedProcess process;
  process.env = sim.env.get();
  process.log_file = absl::StrCat(log_path, ".train.log");
  process.on_durable_save = [&sim, run_dir, n](int64_t step, const std::string&) {
    CheckDurableSave(sim, run_dir, n, step);
  };
  std::fflush(stdout);
  std::fflush(stderr);
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", log_path, ": ", std::strerror(errno)));
  const int saved_out = ::dup(1);
  const int saved_err = ::dup(2);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  ::close(fd);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  const double timeout_secs = run.options.timeout_secs;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, std::chrono::duration<double>(timeout_secs), [&] { return done; })) return;
    const std::string said = absl::StrCat("foreman chaos: a simulated process did not end within --timeout-secs ",
                                          timeout_secs, " (", log_path, "); exiting, as its threads cannot be "
                                          "killed alone\n");
    if (::write(saved_err, said.data(), said.size()) < 0) {
    }
    std::_Exit(kTrainExitFailed);
  });
  const auto start = std::chrono::steady_clock::now();
  const int64_t crashes_before = sim.disk->crashes();
  ChildResult result;
  result.exit_code = run.options.train_in_process(args, process);
  result.elapsed_ms = MillisSince(start);
  result.power_cut = sim.disk->crashes() > crashes_before;
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
  std::fflush(stdout);
  std::fflush(stderr);
  ::dup2(saved_out, 1);
  ::dup2(saved_err, 2);
  ::close(saved_out);
  ::close(saved_err);
  return result;
}

// The first `train`/`test` examples of the Fashion-MNIST files in `from`,
// written as gzip IDX files into `to` (the power preset's job reads them:
// the same job in a fraction of the load time).
Status WriteDataSubset(const std::string& from, const std::string& to, int64_t train, int64_t test) {
  std::error_code ec;
  fs::create_directories(to, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", to, ": ", ec.message()));
  struct File {
    const char* name;
    int64_t keep;
  };
  const File files[] = {{"train-images-idx3-ubyte.gz", train},
                        {"train-labels-idx1-ubyte.gz", train},
                        {"t10k-images-idx3-ubyte.gz", test},
                        {"t10k-labels-idx1-ubyte.gz", test}};
  for (const File& f : files) {
    const std::string in_path = absl::StrCat(from, "/", f.name);
    gzFile in = gzopen(in_path.c_str(), "rb");
    if (in == nullptr) return absl::NotFoundError(absl::StrCat("cannot read ", in_path));
    std::string bytes;
    char buf[1 << 16];
    int got = 0;
    while ((got = gzread(in, buf, sizeof(buf))) > 0) bytes.append(buf, static_cast<std::size_t>(got));
    gzclose(in);
    if (bytes.size() < 8) return absl::InvalidArgumentError(absl::StrCat(in_path, ": not an IDX file"));
    const int dims = static_cast<unsigned char>(bytes[3]);
    const std::size_t header = 4 + 4 * static_cast<std::size_t>(dims);
    int64_t per_example = 1;
    for (int d = 1; d < dims; ++d) {
      const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + 4 + 4 * d);
      per_example *= (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | p[3];
    }
    const std::size_t keep_bytes = header + static_cast<std::size_t>(per_example * f.keep);
    if (bytes.size() < keep_bytes) return absl::InvalidArgumentError(absl::StrCat(in_path, ": too few examples"));
    bytes.resize(keep_bytes);
    for (int i = 0; i < 4; ++i) bytes[4 + i] = static_cast<char>((f.keep >> (24 - 8 * i)) & 0xff);
    const std::string out_path = absl::StrCat(to, "/", f.name);
    gzFile out = gzopen(out_path.c_str(), "wb1");
    if (out == nullptr || gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())) !=
                              static_cast<int>(bytes.size())) {
      if (out != nullptr) gzclose(out);
      return absl::InternalError(absl::StrCat("cannot write ", out_path));
    }
    if (gzclose(out) != Z_OK) return absl::InternalError(absl::StrCat("cannot write ", out_path));
  }
  return absl::OkStatus();
}

std::string EndedBy(const ChildResult& child, const TrainLog& log) {
  if (child.timed_out) return "timeout (killed)";
  if (child.power_cut) {
    return log.stopped_by_fault.empty() ? "power cut" : absl::StrCat("power cut (", log.stopped_by_fault, ")");
  }
  if (!log.stopped_by_fault.empty()) return absl::StrCat("injected fault ", log.stopped_by_fault);
  if (child.exit_code == 0) return log.stopped_by_signal ? "signal (graceful stop)" : "done";
  if (child.exit_code == 128 + SIGKILL) return "SIGKILL";
  if (child.exit_code > 128) return absl::StrCat("signal ", child.exit_code - 128);
  if (child.exit_code == kTrainExitUsage) return "refused (exit 2)";
  return absl::StrCat("exit ", child.exit_code);
}

// The one-process run: the train flags as run, the baseline.
struct Job {
  ChaosRun& run;
  std::vector<std::string> train_flags;  // as run (defaults or the user's, plus the forced ones)
  std::string baseline_dir;
  int64_t baseline_step = -1;
  int64_t baseline_ms = 0;
  // --disk sim: the baseline's disk, kept for the soak (each seed's disk
  // reads it as its "outside": the final weights are compared there).
  std::unique_ptr<SimSeed> baseline_sim;
  // --shrink: the plan each seed runs instead of its own (null: its own).
  const json* plan_override = nullptr;
};

// A process of the job: a child, or (--disk sim) a simulated process over
// `sim`.
StatusOr<ChildResult> RunJobProcess(const Job& job, const std::vector<std::string>& args, const std::string& log_path,
                                    SimSeed* sim, const std::string& run_dir, int n) {
  if (sim != nullptr) return RunSimulated(job.run, args, log_path, *sim, run_dir, n);
  return RunChild(job.run, args, log_path);
}

// The command that replays `seed`; with `for_report`, absolute paths made
// relative to the working directory (ReportWord).
std::string ReplayCommand(const Job& job, int64_t seed, bool for_report) {
  const ChaosOptions& o = job.run.options;
  auto word = [&](const std::string& w) { return ShellQuote(for_report ? ReportWord(w, job.run.cwd) : w); };
  std::string cmd = "foreman chaos";
  if (!o.plan_file.empty()) {
    absl::StrAppend(&cmd, " --plan ", word(o.plan_file));
  } else {
    absl::StrAppend(&cmd, " --preset ", job.run.preset);
  }
  if (o.disk == "sim" && job.run.preset != "power") absl::StrAppend(&cmd, " --disk sim");
  absl::StrAppend(&cmd, " --seed ", seed);
  if (o.timeout_secs != 60) absl::StrAppend(&cmd, " --timeout-secs ", o.timeout_secs);
  if (!o.train_flags.empty()) {
    absl::StrAppend(&cmd, " --");
    for (const std::string& f : o.train_flags) absl::StrAppend(&cmd, " ", word(f));
  }
  return cmd;
}

// The seed's plan as JSON (its "seed" is the seed).
StatusOr<json> SeedPlan(const ChaosRun& run, int64_t seed) {
  if (!run.options.plan_file.empty()) {
    json plan = run.user_plan;
    plan["seed"] = seed;
    return plan;
  }
  return ChaosPresetPlan(run.preset, static_cast<uint64_t>(seed));
}

// Makes the seed's directory and plan.json; returns the train command.
StatusOr<std::vector<std::string>> PrepareSeed(const Job& job, const std::string& seed_dir, ProcessSeedReport& r) {
  std::error_code ec;
  fs::remove_all(seed_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot clear ", seed_dir, ": ", ec.message()));
  fs::create_directories(seed_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", seed_dir, ": ", ec.message()));
  if (job.plan_override != nullptr) {
    r.plan = *job.plan_override;
  } else {
    FOREMAN_ASSIGN_OR_RETURN(r.plan, SeedPlan(job.run, r.seed));
  }
  r.faults_planned = static_cast<int64_t>(r.plan["faults"].size());
  const std::string plan_path = seed_dir + "/plan.json";
  {
    std::ofstream out(plan_path);
    out << r.plan.dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", plan_path));
  }
  // The plan must be one foreman train accepts (a preset's always is).
  if (auto parsed = ParseFaultPlan(r.plan.dump(), "plan.json"); !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("seed ", r.seed, ": ", parsed.status().message()));
  }
  // Always with --fault-plan (an empty plan injects nothing): foreman train
  // then writes the run record the invariants read.
  std::vector<std::string> args = {"train", "--checkpoint-dir", seed_dir + "/run", "--fault-plan", plan_path};
  // A simulated process's record stays on the real disk: the harness's
  // notes, which no power cut takes.
  if (job.run.sim) args.insert(args.end(), {"--run-record", seed_dir + "/run_record.jsonl"});
  args.insert(args.end(), job.train_flags.begin(), job.train_flags.end());
  return args;
}

// Process `n`'s record from its exit and its log; the invariants checked
// after every exit (1. checkpoints verify, 2. the step, 5. bounded).
ProcessRun RecordProcess(const Job& job, const std::string& run_dir, int n, const ChildResult& child,
                         const TrainLog& log, ProcessSeedReport& r) {
  ProcessRun p;
  p.exit_code = child.exit_code;
  p.ended_by = EndedBy(child, log);
  p.timed_out = child.timed_out;
  p.left_processes = child.left_processes;
  p.elapsed_ms = child.elapsed_ms;
  p.recoveries = log.recoveries;
  p.recovery_steps_lost = log.recovery_steps_lost;
  for (const std::string& t : log.service_restarts) p.service_restarts.push_back(job.run.Rel(t));
  p.summary_steps_lost = log.summary_steps_lost;
  r.service_restarts += static_cast<int64_t>(log.service_restarts.size());
  r.summary_steps_lost.insert(r.summary_steps_lost.end(), log.summary_steps_lost.begin(),
                              log.summary_steps_lost.end());
  p.start_step = log.restored_step ? *log.restored_step : (log.last_step >= 0 ? 0 : -1);
  if (Status s = VerifyListedCheckpoints(job.run.env, run_dir); !s.ok()) {
    r.invariants["checkpoints_verify"].Fail(absl::StrCat("after run ", n, ": ", job.run.Rel(std::string(s.message()))));
  }
  auto ckpt = LatestCheckpointStep(job.run.env, run_dir);
  p.checkpoint_step = ckpt.ok() ? *ckpt : -1;
  p.last_step = std::max(log.last_step, p.checkpoint_step);
  // The step: +1 at a time within the process, and it starts where the one
  // before left its latest checkpoint.
  Invariant& steps = r.invariants["global_step"];
  for (const std::string& e : log.step_errors) steps.Fail(absl::StrCat("run ", n, ": ", e));
  if (n > 0 && p.start_step >= 0) {
    const ProcessRun& before = r.runs.back();
    const int64_t expected = std::max<int64_t>(before.checkpoint_step, 0);
    if (p.start_step != expected) {
      steps.Fail(absl::StrCat("run ", n, " started at step ", p.start_step, ", but the latest checkpoint run ", n - 1,
                              " left is step ", expected));
    }
    r.steps_lost += std::max<int64_t>(0, before.last_step - p.start_step);
  }
  r.recoveries += log.recoveries;
  r.recovery_steps_lost += log.recovery_steps_lost;
  Invariant& bounded = r.invariants["bounded"];
  if (child.timed_out) {
    bounded.Fail(absl::StrCat("run ", n, " did not end within --timeout-secs ", job.run.options.timeout_secs,
                              " (its process group was killed)"));
  }
  if (child.left_processes) bounded.Fail(absl::StrCat("run ", n, " left processes in its group (killed)"));
  return p;
}

// The job's processes until it is done, refused, hung or out of restarts;
// true when it was done.
StatusOr<bool> RunProcesses(const Job& job, const std::string& seed_dir, const std::vector<std::string>& args,
                            SimSeed* sim, ProcessSeedReport& r) {
  const std::string run_dir = seed_dir + "/run";
  const std::string plan_path = seed_dir + "/plan.json";
  const std::string& plan_file = job.run.options.plan_file;
  std::size_t recorded = 0;  // the run record's events of the processes before
  for (int n = 0; n <= kChaosMaxRestarts; ++n) {
    const std::string log_path = absl::StrCat(seed_dir, "/run-", n, ".log");
    // --disk sim: what the oracle says this process must restore (the disk
    // as the power cuts before left it).
    std::optional<int64_t> oracle_restore;  // -1: nothing to restore; unset: the oracle could not say
    std::vector<std::string> oracle_notes;
    if (sim != nullptr && n > 0) {
      auto step = OracleRestoreStep(sim->disk.get(), run_dir, &oracle_notes);
      if (step.ok()) {
        oracle_restore = step->value_or(-1);
      } else if (absl::IsNotFound(step.status()) && !sim->disk->FileExists(run_dir).ok()) {
        oracle_restore = -1;  // the power cut took the directory itself: nothing to restore
      } else {
        r.invariants["checkpoints_verify"].Fail(absl::StrCat("before run ", n, ": the oracle cannot read the run "
                                                             "directory the power cut left: ",
                                                             job.run.Rel(std::string(step.status().message()))));
      }
      for (const std::string& b : OracleBadListedCheckpoints(sim->disk.get(), run_dir)) {
        r.invariants["checkpoints_verify"].Fail(
            absl::StrCat("before run ", n, ": after the power cut the state file lists ", job.run.Rel(b)));
      }
      if (oracle_restore && *oracle_restore < sim->last_durable_step) {
        r.invariants["checkpoints_verify"].Fail(absl::StrCat(
            "before run ", n, ": the save of step ", sim->last_durable_step,
            " was reported durable, but after the power cut the checkpoint to restore (the oracle's: the state "
            "file's latest if whole, else the newest whole bundle) is ",
            *oracle_restore >= 0 ? absl::StrCat("step ", *oracle_restore) : std::string("none"),
            oracle_notes.empty() ? "" : absl::StrCat(" (", absl::StrJoin(oracle_notes, "; "), ")")));
      }
    }
    FOREMAN_ASSIGN_OR_RETURN(ChildResult child, RunJobProcess(job, args, log_path, sim, run_dir, n));
    job.run.observer.OnProcessExit(r.seed, n, run_dir);
    // What the process did: its events in the run record (the log's text
    // is read only for --restart-policy's service restart lines).
    std::vector<nlohmann::json> events;
    auto record = sim != nullptr ? ReadRunRecordFile(Env::Default(), seed_dir + "/run_record.jsonl")
                                 : ReadRunRecord(job.run.env, run_dir);
    if (!record.ok()) {
      r.invariants["global_step"].Fail(
          absl::StrCat("after run ", n, ": ", job.run.Rel(std::string(record.status().message()))));
    } else if (record->size() > recorded) {
      events.assign(record->begin() + static_cast<std::ptrdiff_t>(recorded), record->end());
      recorded = record->size();
    }
    const TrainLog log = ParseTrainLog(events, ReadWholeFile(log_path));
    if (n == 0 && child.exit_code == kTrainExitUsage && !child.timed_out) {
      r.refused = true;
      r.refused_lines = absl::StrReplaceAll(LastLines(ReadWholeFile(log_path), 4),
                                            {{plan_path, plan_file.empty() ? "plan.json" : plan_file}});
    }
    r.runs.push_back(RecordProcess(job, run_dir, n, child, log, r));
    if (sim != nullptr) {
      // Every process that trained (or restored) must have restored the
      // oracle's step, nothing when the oracle has none (-1 both).
      const bool trained = log.restored_step.has_value() || log.last_step >= 0;
      if (oracle_restore && trained && log.restored_step.value_or(-1) != *oracle_restore) {
        auto said = [](int64_t step) { return step >= 0 ? absl::StrCat("step ", step) : std::string("nothing"); };
        r.invariants["global_step"].Fail(absl::StrCat("run ", n, " restored ", said(log.restored_step.value_or(-1)),
                                                      ", but the checkpoint to restore (the oracle's) is ",
                                                      *oracle_restore >= 0 ? said(*oracle_restore) : "none"));
      }
      for (const std::string& v : sim->env->TakeLockViolations()) {
        r.invariants["checkpoints_verify"].Fail(absl::StrCat("run ", n, ": ", job.run.Rel(v)));
      }
      for (const std::string& v : sim->env->TakeRecordViolations()) {
        r.invariants["scalars_once"].Fail(absl::StrCat("run ", n, ": event file ", job.run.Rel(v)));
      }
    }
    if (child.exit_code == kTrainExitOk && !log.stopped_by_signal && !child.timed_out) return true;
    if (child.timed_out || child.exit_code == kTrainExitUsage) break;  // a hang, or a refusal: no restart helps
    if (n < kChaosMaxRestarts) ++r.restarts;
  }
  return false;
}

// The invariants checked at the seed's end: 6. finished, 3. the final
// weights, 4. scalars once; and what the run directory recorded.
void FinishSeed(const Job& job, const std::string& run_dir, bool done, ProcessSeedReport& r) {
  const ChaosRun& run = job.run;
  Invariant& finished = r.invariants["finished"];
  if (!done) {
    const ProcessRun& last = r.runs.back();
    finished.Fail(last.timed_out || last.exit_code == kTrainExitUsage
                      ? absl::StrCat("run ", r.runs.size() - 1, " ended by ", last.ended_by, ": not restarted")
                      : absl::StrCat("not done after ", kChaosMaxRestarts, " restarts"));
  } else if (!run.changes_training && r.runs.back().last_step != job.baseline_step) {
    finished.Fail(absl::StrCat("ended at step ", r.runs.back().last_step, ", the fault-free run at step ",
                               job.baseline_step));
  }
  Invariant& weights = r.invariants["final_weights"];
  if (run.changes_training) {
    weights.checked = false;
    weights.details.push_back("not checked: the plan declares that it changes training");
  } else if (!done) {
    weights.checked = false;
    weights.details.push_back("not checked: the job did not finish");
  } else if (Status s = CompareFinalWeights(run.env, job.baseline_dir, run_dir); !s.ok()) {
    weights.Fail(run.Rel(std::string(s.message())));
  }
  if (Status s = CheckScalarsOnce(run.env, run_dir); !s.ok()) {
    r.invariants["scalars_once"].Fail(run.Rel(std::string(s.message())));
  }
  if (auto metrics = ReadRecoveryMetrics(run.env, run_dir); metrics.ok()) r.recovery_metrics = *std::move(metrics);
  if (auto fired = ReadFiredFaults(run.env, run_dir); fired.ok()) {
    for (const FiredFault& f : *fired) r.faults_fired.push_back(f.id);
  }
}

// Issue 28's "faults that did not fire are findings": each planned fault
// that did not fire although the fault-free run reaches what it waits for.
// A step, process, actor or hook fault at a step the baseline reached; a
// file-system fault whose operation a dry run -- the fault-free job with the
// plan's file-system faults turned into zero-latency ones, which fire and
// change nothing -- performs. Nothing for a job that did not finish or a
// plan that changes training (neither can say what should have happened).
Status FindUnfiredFaults(const Job& job, const std::string& seed_dir, bool done, ProcessSeedReport& r) {
  if (!done || job.run.changes_training) return absl::OkStatus();
  const std::set<std::string> fired(r.faults_fired.begin(), r.faults_fired.end());
  json dry_faults = json::array();
  for (const json& f : r.plan["faults"]) {
    const std::string id = f.value("id", "");
    if (fired.count(id) > 0) continue;
    if (f.value("type", "") == "env") {
      json d = f;
      d["kind"] = "latency";
      d["latency_ms"] = 0;
      d.erase("error");
      d.erase("prefix_bytes");
      dry_faults.push_back(std::move(d));
    } else if (f.contains("at_step") && f["at_step"].is_number_integer()) {
      const int64_t at = f["at_step"].get<int64_t>();
      if (at >= 1 && at <= job.baseline_step) {
        r.unfired.push_back(absl::StrCat(id, ": at_step ", at, ", a step the fault-free run reaches (it ends at ",
                                         job.baseline_step, ")"));
      }
    }
  }
  if (dry_faults.empty()) return absl::OkStatus();
  const std::string dir = seed_dir + "/dry";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  json plan;
  plan["seed"] = r.seed;
  plan["faults"] = dry_faults;
  const std::string plan_path = dir + "/plan.json";
  {
    std::ofstream out(plan_path);
    out << plan.dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", plan_path));
  }
  const std::string run_dir = dir + "/run";
  std::vector<std::string> args = {"train", "--checkpoint-dir", run_dir, "--fault-plan", plan_path};
  std::unique_ptr<SimSeed> sim;
  if (job.run.sim) {
    args.insert(args.end(), {"--run-record", dir + "/run_record.jsonl"});
    sim = std::make_unique<SimSeed>(run_dir, job.baseline_sim->env.get());
  }
  args.insert(args.end(), job.train_flags.begin(), job.train_flags.end());
  FOREMAN_ASSIGN_OR_RETURN(ChildResult child, RunJobProcess(job, args, dir + "/run-0.log", sim.get(), run_dir, 0));
  (void)child;
  auto fired_dry = ReadFiredFaults(sim != nullptr ? sim->env.get() : job.run.env, run_dir);
  std::set<std::string> told;
  if (fired_dry.ok()) {
    for (const FiredFault& f : *fired_dry) {
      if (!told.insert(f.id).second) continue;
      r.unfired.push_back(absl::StrCat(f.id, ": the fault-free run performs the operation it waits for (",
                                       EnvOpName(f.op), " #", f.op_index, " of ", job.run.Rel(f.path), ")"));
    }
  }
  fs::remove_all(dir, ec);
  return absl::OkStatus();
}

StatusOr<ProcessSeedReport> RunSeed(const Job& job, int64_t seed) {
  const auto start = std::chrono::steady_clock::now();
  ProcessSeedReport r;
  r.seed = seed;
  r.replay = ReplayCommand(job, seed, /*for_report=*/false);
  r.replay_report = ReplayCommand(job, seed, /*for_report=*/true);
  for (const std::string& name : InvariantNames()) r.invariants[name] = Invariant();
  const std::string seed_dir = absl::StrCat(job.run.work, "/seed-", seed);
  FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> args, PrepareSeed(job, seed_dir, r));
  // --disk sim: the seed's own disk, read by every check of the seed.
  std::unique_ptr<SimSeed> sim;
  Env* const real_env = job.run.env;
  if (job.run.sim) {
    sim = std::make_unique<SimSeed>(seed_dir + "/run", job.baseline_sim->env.get());
    job.run.env = sim->env.get();
  }
  StatusOr<bool> done = RunProcesses(job, seed_dir, args, sim.get(), r);
  if (done.ok()) FinishSeed(job, seed_dir + "/run", *done, r);
  job.run.env = real_env;
  FOREMAN_RETURN_IF_ERROR(done.status());
  FOREMAN_RETURN_IF_ERROR(FindUnfiredFaults(job, seed_dir, *done, r));
  if (sim != nullptr) {
    for (auto& [name, details] : sim->findings) {
      for (std::string& d : details) r.invariants[name].Fail(job.run.Rel(d));
      if (const int64_t more = sim->findings_dropped[name]; more > 0) {
        r.invariants[name].Fail(absl::StrCat("and ", more, " more such findings at durable saves"));
      }
    }
    r.durable_saves_checked = sim->durable_saves;
    // A failed seed's disk, as the last process left it, for a person to read.
    if (!r.ok()) CopyOutOfDisk(sim->disk.get(), seed_dir + "/run", Env::Default()).IgnoreError();
  }
  r.elapsed_ms = MillisSince(start);
  return r;
}

// The fault-free run every seed is compared with.
Status RunBaseline(Job& job) {
  ChaosRun& run = job.run;
  const std::string baseline = run.work + "/baseline";
  std::error_code ec;
  fs::remove_all(baseline, ec);
  fs::create_directories(baseline, ec);
  job.baseline_dir = baseline + "/run";
  std::vector<std::string> args = {"train", "--checkpoint-dir", job.baseline_dir};
  args.insert(args.end(), job.train_flags.begin(), job.train_flags.end());
  if (run.sim) job.baseline_sim = std::make_unique<SimSeed>(job.baseline_dir, Env::Default());
  auto base = RunJobProcess(job, args, baseline + "/run-0.log", job.baseline_sim.get(), job.baseline_dir, 0);
  if (!base.ok()) return absl::InternalError(base.status().message());
  auto base_step = LatestCheckpointStep(run.sim ? job.baseline_sim->env.get() : run.env, job.baseline_dir);
  if (base->exit_code != kTrainExitOk || !base_step.ok() || *base_step < 0) {
    // foreman train's last lines: its error, and CLI11's usage hint.
    const std::string said = LastLines(ReadWholeFile(baseline + "/run-0.log"), 4);
    const std::string how = base->timed_out ? absl::StrCat("did not end within --timeout-secs ", run.options.timeout_secs,
                                                           " (allowed: (0, 86400]; give more than the job needs)")
                                            : absl::StrCat("exited ", base->exit_code);
    const std::string message = absl::StrCat("the fault-free run (foreman train ", absl::StrJoin(job.train_flags, " "),
                                             ") ", how, said);
    if (run.temporary && !run.options.keep) fs::remove_all(run.work, ec);
    return base->exit_code == kTrainExitUsage ? absl::InvalidArgumentError(message) : absl::InternalError(message);
  }
  job.baseline_step = *base_step;
  job.baseline_ms = base->elapsed_ms;
  return absl::OkStatus();
}

// The train flags as run: the user's or the default job's, with a fixed
// thread count (bit-for-bit results) and a progress line after every step
// (the global_step invariant reads them).
std::vector<std::string> TrainFlagsAsRun(const ChaosRun& run) {
  const ChaosOptions& o = run.options;
  std::vector<std::string> flags = o.train_flags.empty() ? DefaultTrainFlags() : o.train_flags;
  if (run.sim && o.train_flags.empty()) {
    // The power preset's job reads a subset of the data (the same job; its
    // load no longer dominates a seed).
    flags.push_back("--data-dir");
    flags.push_back(run.work + "/data");
  }
  if (!HasFlag(flags, "--threads")) {
    flags.push_back("--threads");
    flags.push_back("1");
  }
  flags.push_back("--log-step-count-steps");
  flags.push_back("1");
  return flags;
}

// The seeds, each row told as it ends.
StatusOr<std::vector<ProcessSeedReport>> RunSeeds(const Job& job) {
  ChaosRun& run = job.run;
  std::vector<ProcessSeedReport> reports;
  std::error_code ec;
  for (int64_t seed : run.seeds) {
    auto r = RunSeed(job, seed);
    if (!r.ok()) return Status(r.status().code(), absl::StrCat("seed ", seed, ": ", r.status().message()));
    if (r->refused) {
      // A refused plan or flags: every seed would be refused the same way.
      if (run.temporary && !run.options.keep) fs::remove_all(run.work, ec);
      return absl::InvalidArgumentError(absl::StrCat(
          "seed ", seed,
          ": foreman train refused the job's first run (exit 2: the same command fails the same way); stopped "
          "before any further seed",
          r->refused_lines));
    }
    run.observer.OnTable(ProcessTableRow(*r));
    // A temporary work directory keeps only what a failure needs (a soak of
    // thousands of seeds would otherwise fill the disk).
    if (run.temporary && !run.options.keep && r->ok()) fs::remove_all(absl::StrCat(run.work, "/seed-", seed), ec);
    reports.push_back(std::move(*r));
  }
  return reports;
}

}  // namespace

StatusOr<Subprocess> SpawnObserved(const SpawnOptions& o, ChaosObserver& observer, int slot) {
  sigset_t stop_signals, old;
  sigemptyset(&stop_signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop_signals, sig);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &old);
  StatusOr<Subprocess> child = Subprocess::Spawn(o);
  if (child.ok()) observer.OnProcessGroup(slot, child->pid());
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return child;
}

// -- --shrink ----------------------------------------------------------------

namespace {

// The invariants `r` failed.
std::set<std::string> FailedInvariants(const ProcessSeedReport& r) {
  std::set<std::string> names;
  for (const auto& [name, inv] : r.invariants) {
    if (!inv.ok) names.insert(name);
  }
  return names;
}

// Shrinks the failing plan of options.seed (ChaosOptions::shrink).
StatusOr<ChaosReport> ShrinkSeed(Job& job) {
  ChaosRun& run = job.run;
  const int64_t seed = *run.options.seed;
  constexpr int kMaxRuns = 80;
  int runs = 0;
  FOREMAN_ASSIGN_OR_RETURN(json plan, SeedPlan(run, seed));
  // A trial: the seed under `candidate`; true when it still fails one of
  // the invariants the seed's own plan failed.
  std::set<std::string> target;
  auto fails = [&](const json& candidate, const std::string& what) -> StatusOr<bool> {
    ++runs;
    job.plan_override = &candidate;
    auto r = RunSeed(job, seed);
    job.plan_override = nullptr;
    if (!r.ok()) return r.status();
    const std::set<std::string> failed = FailedInvariants(*r);
    bool same = false;
    for (const std::string& name : failed) same = same || target.empty() || target.count(name) > 0;
    const bool still = !failed.empty() && same;
    run.observer.OnTable(absl::StrFormat("  run %2d: %-60s %s\n", runs, what,
                                         still ? absl::StrCat("fails (", absl::StrJoin(failed, ", "), ")")
                                               : std::string("holds")));
    if (still && target.empty()) target = failed;
    return still;
  };
  run.observer.OnTable(absl::StrCat("shrinking seed ", seed, "'s plan (", plan["faults"].size(), " faults)\n"));
  FOREMAN_ASSIGN_OR_RETURN(bool failing, fails(plan, "the seed's own plan"));
  ChaosReport report;
  report.seeds = 1;
  if (!failing) {
    report.summary = absl::StrCat("\nseed ", seed, " holds every invariant: nothing to shrink\n");
    FinishWorkDirectory(run, &report);
    return report;
  }
  report.failed = 1;
  const std::size_t before = plan["faults"].size();
  // 1. Drop each fault the failure does not need (again after any drop).
  for (bool dropped = true; dropped && runs < kMaxRuns;) {
    dropped = false;
    for (std::size_t i = 0; i < plan["faults"].size() && runs < kMaxRuns; ++i) {
      json candidate = plan;
      candidate["faults"].erase(candidate["faults"].begin() + static_cast<std::ptrdiff_t>(i));
      FOREMAN_ASSIGN_OR_RETURN(bool still, fails(candidate, absl::StrCat("without ", plan["faults"][i].value("id", "?"))));
      if (still) {
        plan = std::move(candidate);
        dropped = true;
        break;
      }
    }
  }
  // 2. Each remaining fault as early as it still fails: a probabilistic one
  //    at the first operation it matches; nth and at_step halved, then
  //    searched down.
  for (std::size_t i = 0; i < plan["faults"].size() && runs < kMaxRuns; ++i) {
    json& f = plan["faults"][i];
    const std::string id = f.value("id", "?");
    if (f.contains("probability") && f["probability"].is_number() && f["probability"].get<double>() < 1.0) {
      json candidate = plan;
      candidate["faults"][i]["probability"] = 1.0;
      FOREMAN_ASSIGN_OR_RETURN(bool still, fails(candidate, absl::StrCat(id, " at its first operation")));
      if (still) plan = std::move(candidate);
    }
    for (const char* key : {"nth", "at_step"}) {
      json& g = plan["faults"][i];
      if (!g.contains(key) || !g[key].is_number_integer()) continue;
      int64_t lo = 1, hi = g[key].get<int64_t>();  // hi fails; find the smallest that does
      while (lo < hi && runs < kMaxRuns) {
        const int64_t mid = lo + (hi - lo) / 2;
        json candidate = plan;
        candidate["faults"][i][key] = mid;
        FOREMAN_ASSIGN_OR_RETURN(bool still, fails(candidate, absl::StrCat(id, " at ", key, " ", mid)));
        if (still) {
          hi = mid;
          plan = std::move(candidate);
        } else {
          lo = mid + 1;
        }
      }
    }
  }
  json out = plan;
  if (run.changes_training) out["changes_training"] = true;
  const std::string path = absl::StrCat(run.work, "/shrunk-seed-", seed, ".json");
  {
    std::ofstream file(path);
    file << out.dump(2) << "\n";
    if (!file) return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  std::string replay = absl::StrCat("foreman chaos --plan ", ShellQuote(path));
  if (run.sim) absl::StrAppend(&replay, " --disk sim");
  absl::StrAppend(&replay, " --seed ", seed);
  if (run.options.timeout_secs != 60) absl::StrAppend(&replay, " --timeout-secs ", run.options.timeout_secs);
  if (!run.options.train_flags.empty()) {
    absl::StrAppend(&replay, " --");
    for (const std::string& w : run.options.train_flags) absl::StrAppend(&replay, " ", ShellQuote(w));
  }
  report.summary = absl::StrCat("\nseed ", seed, "'s plan shrunk from ", before, " to ", plan["faults"].size(),
                                " faults in ", runs, " runs; it still fails ", absl::StrJoin(target, ", "),
                                runs >= kMaxRuns ? " (stopped at the run limit: maybe not minimal)" : "", ":\n",
                                out.dump(2), "\nplan: ", path, "\nreplay: ", replay, "\n");
  run.temporary = false;  // the plan file lives there
  FinishWorkDirectory(run, &report);
  return report;
}

}  // namespace

StatusOr<ChaosReport> RunProcessChaos(ChaosRun& run) {
  Job job{run, TrainFlagsAsRun(run)};
  const auto started = std::chrono::steady_clock::now();
  if (run.sim && run.options.train_flags.empty()) {
    if (Status s = WriteDataSubset(data::kFashionMnistDir, run.work + "/data", kSimTrainExamples, kSimTestExamples);
        !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--disk sim: the job's data: ", s.message()));
    }
  }
  FOREMAN_RETURN_IF_ERROR(RunBaseline(job));
  const std::string what =
      run.options.plan_file.empty() ? absl::StrCat("preset ", run.preset) : absl::StrCat("plan ", run.options.plan_file);
  run.observer.OnTable(absl::StrCat("foreman chaos: ", what, ", train flags: ", absl::StrJoin(job.train_flags, " "),
                                    "\n",
                                    absl::StrFormat("fault-free run: global_step %lld in %.1f s\n",
                                                    static_cast<long long>(job.baseline_step),
                                                    static_cast<double>(job.baseline_ms) / 1000),
                                    run.options.shrink ? "" : ProcessTableHeader()));
  if (run.options.shrink) return ShrinkSeed(job);
  FOREMAN_ASSIGN_OR_RETURN(std::vector<ProcessSeedReport> reports, RunSeeds(job));
  ChaosReport report;
  report.seeds = static_cast<int64_t>(reports.size());
  for (const ProcessSeedReport& r : reports) report.failed += r.ok() ? 0 : 1;
  const int64_t total_ms = MillisSince(started);
  report.summary = ProcessSummary(run, reports, total_ms);
  report.json_written = WriteJsonReport(
      run, ProcessReportJson(run, job.train_flags, job.baseline_step, job.baseline_ms, reports, report.failed, total_ms));
  FinishWorkDirectory(run, &report);
  return report;
}

}  // namespace foreman::internal
