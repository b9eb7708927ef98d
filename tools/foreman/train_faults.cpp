// `foreman train --fault-plan` (train_faults.hpp).
#include "train_faults.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "command.hpp"
#include "train_report.hpp"
#include "foreman/logging.hpp"

namespace foreman::cli {

// The record of the run: the earlier processes' firings and this one's.
// OnFire is a FaultObserver: called on the firing thread (the training
// thread, the saver's, the summary writer's); thread-safe.
class FaultRecorder {
 public:
  FaultRecorder(Env* base, std::string dir) : base_(base), dir_(std::move(dir)) {}

  // The earlier processes' record (before any fault can fire).
  void Load(std::vector<FiredFault> earlier) {
    std::lock_guard<std::mutex> lock(mu_);
    record_ = std::move(earlier);
  }

  void OnFire(const FiredFault& f) {
    std::lock_guard<std::mutex> lock(mu_);
    record_.push_back(f);
    if (Status s = WriteFiredFaults(base_, dir_, record_); !s.ok()) {
      // Nothing can be undone here: say what a restart may do.
      std::fprintf(stderr,
                   "foreman train: warning: cannot record the injected fault %s in %s/%s (%s): a restarted run "
                   "may inject it again\n",
                   f.id.c_str(), dir_.c_str(), kFaultRecordFile, EscapeForTerminal(s.message()).c_str());
    }
  }

 private:
  Env* const base_;
  const std::string dir_;
  std::mutex mu_;
  std::vector<FiredFault> record_;
};

namespace {

// Raises a process fault's signal on this process (the training thread, in
// the FaultInjectionHook's before_run). SIGKILL ends it here. SIGTERM goes
// to the SignalWatcher, which requests the run's stop: wait (at most 10 s)
// until it has, so that the session stops at the end of this very step --
// the same step in every run of the plan, not whenever the watcher thread
// gets to it.
void RaiseProcessFault(int sig, StopRequest& stop) {
  if (sig != SIGTERM) {
    kill(getpid(), sig);
    return;
  }
  std::mutex mu;
  std::condition_variable cv;
  bool requested = false;
  const int64_t listener = stop.Listen([&](const Status&) {
    std::lock_guard<std::mutex> lock(mu);
    requested = true;
    cv.notify_all();
  });
  kill(getpid(), sig);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return requested; });
  }
  stop.Unlisten(listener);
}

// NewDurableSavesListener's (train_faults.hpp): waits by being there, and
// records each durable save.
class DurableSavesListener : public CheckpointSaverListener {
 public:
  DurableSavesListener(std::shared_ptr<RunRecordWriter> record, std::string dir,
                       std::function<void(int64_t, const std::string&)> on_durable_save)
      : record_(std::move(record)), dir_(std::move(dir)), on_durable_save_(std::move(on_durable_save)) {}
  StatusOr<bool> after_save(Session* /*session*/, int64_t global_step) override {
    const std::string prefix = absl::StrCat(dir_, "/model.ckpt-", global_step);
    if (record_ != nullptr) record_->Save(global_step, prefix);
    if (on_durable_save_) on_durable_save_(global_step, prefix);
    return false;
  }

 private:
  const std::shared_ptr<RunRecordWriter> record_;
  const std::string dir_;
  const std::function<void(int64_t, const std::string&)> on_durable_save_;
};

// RecordingObserver's (train_faults.hpp).
class RecordingObserver final : public MlpJobObserver {
 public:
  RecordingObserver(std::shared_ptr<RunRecordWriter> record, std::shared_ptr<MlpJobObserver> next)
      : record_(std::move(record)), next_(std::move(next)) {}
  void OnStep(const MlpJobProgress& progress) override {
    record_->Step(progress.global_step);
    next_->OnStep(progress);
  }
  void OnEval(const MlpJobEval& eval) override { next_->OnEval(eval); }
  void OnWarning(const std::string& warning) override { next_->OnWarning(warning); }
  void OnEnd() override { next_->OnEnd(); }

 private:
  const std::shared_ptr<RunRecordWriter> record_;
  const std::shared_ptr<MlpJobObserver> next_;
};

// The id of the injected fault `s` reports: its InjectedFaultId (an env,
// step, hook or actor fault's mark), or a kNanLoss fault fired in this
// process behind a NanLossDuringTrainingError (NanTensorHook's, which does
// not know of faults).
std::optional<std::string> InjectedFaultIn(const Status& s, const std::vector<FiredFault>& fired,
                                           const std::vector<StepFault>& steps) {
  if (std::optional<std::string> id = InjectedFaultId(s)) return id;
  if (!IsNanLossDuringTraining(s)) return std::nullopt;
  for (const FiredFault& f : fired) {
    for (const StepFault& step : steps) {
      if (step.id == f.id && step.kind == StepFault::Kind::kNanLoss) return f.id;
    }
  }
  return std::nullopt;
}

}  // namespace

// 1a. --fault-plan, read and checked before anything is written: a bad plan
//     is exit 2 with ParseFaultPlan's message. The faults are armed, but
//     nothing goes through them before the record is read (1b).
std::optional<int> PrepareFaults(const std::string& plan_path, const std::string& checkpoint_dir,
                                 const std::shared_ptr<StopRequest>& stop, Env* base, bool in_process,
                                 TrainFaults& job) {
  if (plan_path.empty()) return std::nullopt;
  auto plan = ReadFaultPlan(Env::Default(), plan_path);
  if (!plan.ok()) return Fail(kExitUsage, "bad fault plan", plan.status());
  job.plan = *std::move(plan);
  if (in_process && !job.plan.processes.empty()) {
    return Fail(kExitUsage, "bad fault plan",
                absl::InvalidArgumentError(absl::StrCat(
                    plan_path, ": fault \"", job.plan.processes.front().id,
                    "\": a process fault signals the process, and a simulated process (foreman chaos --disk sim) "
                    "shares the harness's: use a crash fault ({\"type\": \"env\", \"kind\": \"crash\", ...}) "
                    "to end it")));
  }
  job.faulty = std::make_unique<FaultyEnv>(base, job.plan.seed);
  // Draws keyed under the run directory: a replay elsewhere takes the same course.
  job.faulty->set_key_root(checkpoint_dir);
  for (const EnvFault& e : job.plan.env) {
    if (!in_process && (e.kind == EnvFault::Kind::kCrash || e.kind == EnvFault::Kind::kTornWrite)) {
      return Fail(kExitUsage, "bad fault plan",
                  absl::InvalidArgumentError(absl::StrCat(
                      plan_path, ": fault \"", e.id, "\": kind ",
                      e.kind == EnvFault::Kind::kCrash ? "crash" : "torn_write",
                      " simulates a power cut, which needs an in-memory file system; foreman train writes to the "
                      "real disk: use a process fault instead ({\"type\": \"process\", \"signal\": \"SIGKILL\", "
                      "\"at_step\": N} kills the job without a final checkpoint)")));
    }
    if (e.op == EnvOp::kLock) {
      // The lock is taken before the record of fired faults (which lives in
      // the locked directory) is read, so through the real Env: such a
      // fault would silently never fire.
      return Fail(kExitUsage, "bad fault plan",
                  absl::InvalidArgumentError(absl::StrCat(
                      plan_path, ": fault \"", e.id,
                      "\": op lock: foreman train takes its directory's lock before any fault applies, so this fault "
                      "would never fire (a lock held by another process is exit 2 already)")));
    }
    if (Status s = job.faulty->AddFault(e); !s.ok()) {
      return Fail(kExitUsage, "bad fault plan", Status(s.code(), absl::StrCat(plan_path, ": ", s.message())));
    }
  }
  // A NaN-loss fault acts on a fetch the runs request: foreman train's is
  // "loss" (another name would silently never fire).
  for (const StepFault& s : job.plan.steps) {
    if (s.kind == StepFault::Kind::kNanLoss && s.loss_tensor != "loss") {
      return Fail(kExitUsage, "bad fault plan",
                  absl::InvalidArgumentError(absl::StrCat(plan_path, ": fault \"", s.id, "\": \"loss_tensor\" must be "
                                                          "\"loss\" (the fetch foreman train's runs request), got \"",
                                                          s.loss_tensor, "\"")));
    }
  }
  job.recorder = std::make_shared<FaultRecorder>(base, checkpoint_dir);
  job.faulty->set_on_fire([recorder = job.recorder](const FiredFault& fired) { recorder->OnFire(fired); });
  FaultInjectionHook::Options options;
  options.steps = job.plan.steps;
  options.hooks = job.plan.hooks;
  options.processes = job.plan.processes;
  options.actors = job.plan.actors;
  options.seed = job.plan.seed;
  options.on_fire = [recorder = job.recorder](const FiredFault& fired) { recorder->OnFire(fired); };
  options.raise_signal = [stop](int sig) { RaiseProcessFault(sig, *stop); };
  auto hook = FaultInjectionHook::Create(options);
  if (!hook.ok()) {
    return Fail(kExitUsage, "bad fault plan",
                Status(hook.status().code(), absl::StrCat(plan_path, ": ", hook.status().message())));
  }
  job.hook = *std::move(hook);
  return std::nullopt;
}

// 1b. With the lock held: the run's record of fired faults (a corrupt one
//     is exit 2 naming it), MarkFired on the Env and the hook; from here on
//     the job's Env is the FaultyEnv.
std::optional<int> LoadFaultRecord(const std::string& checkpoint_dir, Env* base, TrainFaults& job) {
  if (job.faulty == nullptr) return std::nullopt;
  auto record = ReadFiredFaults(base, checkpoint_dir);
  if (!record.ok()) {
    return Fail(kExitUsage, "bad fault record",
                Status(record.status().code(),
                       absl::StrCat(record.status().message(), " (remove it to inject every fault of the plan again)")));
  }
  job.faulty->MarkFired(*record);
  job.hook->MarkFired(*record);
  job.recorder->Load(*std::move(record));
  if (job.record != nullptr) return std::nullopt;  // --run-record's file
  auto run_record = RunRecordWriter::Open(checkpoint_dir);
  if (!run_record.ok()) return Fail(kExitFailed, "cannot open the run record", run_record.status());
  job.record = *std::move(run_record);
  return std::nullopt;
}

std::shared_ptr<CheckpointSaverListener> NewDurableSavesListener(
    std::shared_ptr<RunRecordWriter> record, std::string checkpoint_dir,
    std::function<void(int64_t, const std::string&)> on_durable_save) {
  return std::make_shared<DurableSavesListener>(std::move(record), std::move(checkpoint_dir),
                                                std::move(on_durable_save));
}

std::shared_ptr<MlpJobObserver> RecordingObserver(std::shared_ptr<RunRecordWriter> record,
                                                  std::shared_ptr<MlpJobObserver> next) {
  if (record == nullptr) return next;
  return std::make_shared<class RecordingObserver>(std::move(record), std::move(next));
}

void RecordRecoveries(std::shared_ptr<RunRecordWriter> record, RecoveryOptions& recovery) {
  if (record == nullptr) return;
  recovery.on_recovered = [record, before = std::move(recovery.on_recovered)](const RecoveryReport& r) {
    if (before) before(r);
    record->Recovery(r.cause, r.global_step_before, r.restored_global_step, r.steps_lost);
  };
}

std::optional<int> InjectedFaultExit(const TrainFaults& faults, const std::string& what, const Status& s) {
  if (faults.faulty == nullptr || s.ok()) return std::nullopt;
  std::vector<FiredFault> fired = faults.faulty->fired();
  if (faults.hook != nullptr) {
    const std::vector<FiredFault> hook_fired = faults.hook->fired();
    fired.insert(fired.end(), hook_fired.begin(), hook_fired.end());
  }
  std::optional<std::string> id = InjectedFaultIn(s, fired, faults.plan.steps);
  if (!id) return std::nullopt;
  if (faults.record != nullptr) faults.record->InjectedStop(*id);
  std::fprintf(stderr, "foreman train: %s: %s\nforeman train: stopped by injected fault %s: %s\n", what.c_str(),
               EscapeForTerminal(s.message()).c_str(), id->c_str(),
               s.ToString(absl::StatusToStringMode::kWithNoExtraData).c_str());
  return kExitInjectedFault;
}

}  // namespace foreman::cli
