// `foreman train --fault-plan` (docs/train.md "Faults in foreman train"):
// the plan's env faults wrap the job's Env (a FaultyEnv over the POSIX Env),
// its step, hook and process faults go into a FaultInjectionHook. Every
// firing is appended to <checkpoint-dir>/fault_record.json (through the POSIX
// Env, never the FaultyEnv) before the fault takes effect, so a process
// fault is on disk before its signal; the next process of the run reads the
// record and MarkFired()s it, so a fault without `repeat` fires once per
// run, not once per process.
//
// The job takes what it needs through its seams: the Env (the run
// directory's set_env, MlpJobOptions::env), the hook first among its hooks
// (MlpJobOptions::first_hooks), the step wrapper for NaN-loss faults
// (MlpJobOptions::wrap_step) and the durable-saves listener.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "foreman/env.hpp"
#include "foreman/fault.hpp"
#include "foreman/hooks.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/status.hpp"
#include "foreman/stop.hpp"

namespace foreman::cli {

class FaultRecorder;

// What --fault-plan armed; empty (inactive) without the flag.
struct TrainFaults {
  FaultPlan plan;
  std::unique_ptr<FaultyEnv> faulty;
  std::shared_ptr<FaultInjectionHook> hook;
  std::shared_ptr<FaultRecorder> recorder;
  // <checkpoint-dir>/run_record.jsonl (RunRecordWriter), opened with the
  // fault record (1b): what the process did, for foreman chaos.
  std::shared_ptr<RunRecordWriter> record;

  bool active() const { return faulty != nullptr; }
};

// 1a. --fault-plan, read and checked before anything is written: a bad plan
//     is exit 2 with ParseFaultPlan's message. The faults are armed, but
//     nothing goes through them before the record is read (1b). Returns the
//     exit code when the job ends here.
//     `base` is the job's file system (the POSIX Env, or a simulated disk:
//     `in_process`, where a plan's process faults are refused, since their
//     signal would end the program that simulates the process).
std::optional<int> PrepareFaults(const std::string& plan_path, const std::string& checkpoint_dir,
                                 const std::shared_ptr<StopRequest>& stop, Env* base, bool in_process,
                                 TrainFaults& faults);

// 1b. With the lock held: the run's record of fired faults (a corrupt one
//     is exit 2 naming it), MarkFired on the Env and the hook; from here on
//     the job's Env is faults.faulty. Nothing without a plan.
std::optional<int> LoadFaultRecord(const std::string& checkpoint_dir, Env* base, TrainFaults& faults);

// With --fault-plan: every checkpoint is durable before training goes on
// (CheckpointSaverHook: with a listener the training thread waits at the
// boundary that started a save until it is durable), as TF's synchronous
// saves are. Without it a SIGKILL at step k finds the save scheduled just
// before k committed or not, depending on the saver thread's timing, and a
// failed save ends the run a few steps later or sooner: the same plan
// would lose different steps in different runs.
// Each durable save is appended to the run record (`record`, may be null)
// and told to `on_durable_save` (may be empty: foreman chaos --disk sim's
// check), before training goes on.
std::shared_ptr<CheckpointSaverListener> NewDurableSavesListener(
    std::shared_ptr<RunRecordWriter> record, std::string checkpoint_dir,
    std::function<void(int64_t, const std::string&)> on_durable_save = {});

// With --fault-plan: the run record's step and recovery events, through the
// job's observer (forwarding to `next`) and RecoveryOptions::on_recovered
// (chained after `recovery`'s own).
std::shared_ptr<MlpJobObserver> RecordingObserver(std::shared_ptr<RunRecordWriter> record,
                                                  std::shared_ptr<MlpJobObserver> next);
void RecordRecoveries(std::shared_ptr<RunRecordWriter> record, RecoveryOptions& recovery);

// When `s` reports a fault injected in this process: prints "foreman train:
// <what>: <message>" and "foreman train: stopped by injected fault <id>:
// <status>", appends an injected_stop event to the run record, and returns kExitInjectedFault, so that a supervisor (foreman
// chaos) can tell it from a real failure; nullopt otherwise.
std::optional<int> InjectedFaultExit(const TrainFaults& faults, const std::string& what, const Status& s);

}  // namespace foreman::cli
