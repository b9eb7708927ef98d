// Example: fault injection in your own job (docs/fault-injection.md). Trains
// the linear model of the other examples under a MonitoredTrainingSession
// whose file system is a FaultyEnv and whose hooks include a
// FaultInjectionHook, both driven by one FaultPlan:
//   - "preempt": ABORTED at global_step 120. The session recovers in-process
//     from model.ckpt-100 (20 steps lost) and trains on;
//   - "disk-full": ENOSPC on the first write of model.ckpt-150's data file.
//     A checkpoint that cannot be written is not a preemption: the run ends
//     with RESOURCE_EXHAUSTED naming the file, and model.ckpt-100 stays the
//     latest checkpoint.
// Every fault that fires is recorded in RUN_DIR/fault_record.json before it
// takes effect. Run the example again on the same directory, as a supervisor
// would restart a job: it resumes from model.ckpt-100, the recorded faults do
// not fire again, and it finishes at step 200.
//
// With PLAN_JSON, the plan comes from that file instead (the format:
// ParseFaultPlan in foreman/fault.hpp); the built-in plan is printed as JSON
// on every run, as a starting point.
//
//   fault_injection RUN_DIR [PLAN_JSON]
#include <cerrno>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "foreman/env.hpp"
#include "foreman/fault.hpp"
#include "foreman/hooks.hpp"
#include "foreman/monitored_session.hpp"
#include "linear_model.hpp"

namespace {

foreman::FaultPlan BuiltInPlan() {
  foreman::FaultPlan plan;
  plan.seed = 1;
  foreman::StepFault preempt;
  preempt.id = "preempt";
  preempt.code = absl::StatusCode::kAborted;
  preempt.message = "the cluster manager took the machine back";
  preempt.at_step = 120;
  plan.steps.push_back(preempt);
  foreman::EnvFault full;
  full.id = "disk-full";
  full.path_pattern = "*/model.ckpt-150.data-*";  // the temporary's name ends in a suffix
  full.op = foreman::EnvOp::kAppend;
  full.kind = foreman::EnvFault::Kind::kError;
  full.error = ENOSPC;
  full.nth = 1;
  plan.env.push_back(full);
  return plan;
}

int Fail(const char* what, const foreman::Status& s) {
  std::fprintf(stderr, "error: %s: %s\n", what, s.ToString().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s RUN_DIR [PLAN_JSON]\n", argv[0]);
    return 2;
  }
  const std::string run_dir = argv[1];
  foreman::Env* disk = foreman::Env::Default();

  foreman::FaultPlan plan = BuiltInPlan();
  if (argc == 3) {
    foreman::StatusOr<foreman::FaultPlan> read = foreman::ReadFaultPlan(disk, argv[2]);
    if (!read.ok()) return Fail("plan", read.status());
    plan = *std::move(read);
  }
  std::printf("plan: %s\n", foreman::FaultPlanToJson(plan).c_str());
  if (foreman::Status s = disk->RecursivelyCreateDir(run_dir); !s.ok()) return Fail("run directory", s);

  // The faults earlier processes of this run fired: they do not fire again.
  foreman::StatusOr<std::vector<foreman::FiredFault>> earlier = foreman::ReadFiredFaults(disk, run_dir);
  if (!earlier.ok()) return Fail("fault record", earlier.status());
  std::printf("faults fired before: %zu\n", earlier->size());

  // One record for the run: what fired before plus every new firing, written
  // through the real disk (never through the FaultyEnv) before the fault
  // takes effect, so even a fault that kills the process is remembered.
  auto record_mu = std::make_shared<std::mutex>();
  auto record = std::make_shared<std::vector<foreman::FiredFault>>(*earlier);
  foreman::FaultObserver on_fire = [=](const foreman::FiredFault& f) {
    std::lock_guard<std::mutex> lock(*record_mu);
    record->push_back(f);
    std::printf("fault fired: %s at %s (%lld)\n", f.id.c_str(), f.path.c_str(),
                static_cast<long long>(f.op_index));
    std::fflush(stdout);
    foreman::Status s = foreman::WriteFiredFaults(disk, run_dir, *record);
    if (!s.ok()) std::fprintf(stderr, "warning: the fault record was not written: %s\n", s.ToString().c_str());
  };

  foreman::FaultyEnv faulty(disk, plan.seed);
  for (const foreman::EnvFault& f : plan.env) {
    if (foreman::Status s = faulty.AddFault(f); !s.ok()) return Fail("plan", s);
  }
  faulty.MarkFired(*earlier);
  faulty.set_on_fire(on_fire);

  foreman::FaultInjectionHook::Options hook_options;
  hook_options.steps = plan.steps;
  hook_options.hooks = plan.hooks;
  hook_options.processes = plan.processes;
  hook_options.actors = plan.actors;
  hook_options.seed = plan.seed;
  hook_options.on_fire = on_fire;
  auto faults = foreman::FaultInjectionHook::Create(hook_options);
  if (!faults.ok()) return Fail("plan", faults.status());
  (*faults)->MarkFired(*earlier);

  foreman::StopAtStepHook::Options stop_options;
  stop_options.last_step = 200;
  auto stop = foreman::StopAtStepHook::Create(stop_options);
  if (!stop.ok()) return Fail("StopAtStepHook", stop.status());

  foreman::MonitoredTrainingSessionOptions options;
  options.graph = foreman_examples::LinearModel();
  // A plan's nan_loss faults act on the step's fetched loss.
  (void)options.graph->SetStep((*faults)->WrapStep(options.graph->step()));
  options.checkpoint_dir = run_dir;
  options.save_checkpoint_steps = 50;
  options.save_summaries_steps = 25;
  options.config.env = &faulty;
  options.config.intra_op_parallelism_threads = 1;
  options.recovery.initial_backoff = absl::Milliseconds(10);
  options.recovery.on_recovered = [](const foreman::RecoveryReport& r) {
    std::printf("recovered from %s: global_step %lld -> %lld, %lld steps lost\n",
                r.cause.ToString(absl::StatusToStringMode::kWithNoExtraData).c_str(),
                static_cast<long long>(r.global_step_before), static_cast<long long>(r.restored_global_step),
                static_cast<long long>(r.steps_lost));
  };
  // A NaN loss (a plan's nan_loss faults, on the "loss" fetch) fails the run.
  foreman::NanTensorHook::Options nan_options;
  nan_options.loss_tensor = "loss";
  auto nan = foreman::NanTensorHook::Create(nan_options);
  if (!nan.ok()) return Fail("NanTensorHook", nan.status());
  options.hooks = {*faults, *stop, *nan};

  auto session = foreman::MonitoredTrainingSession(std::move(options));
  if (!session.ok()) {
    std::fprintf(stderr, "training failed: %s\n", session.status().ToString().c_str());
    return 1;
  }
  int64_t runs = 0;
  while (!(*session)->should_stop()) {
    if (!(*session)->run({"train_op", "loss"}).ok()) break;  // close() returns the error
    ++runs;
  }
  foreman::Status closed = (*session)->close();
  std::printf("runs: %lld, recoveries: %lld\n", static_cast<long long>(runs),
              static_cast<long long>((*session)->recoveries()));
  if (!closed.ok()) {
    // The message without its payloads; the injected fault's id is one.
    std::fprintf(stderr, "training failed: %s\n", closed.ToString(absl::StatusToStringMode::kWithNoExtraData).c_str());
    if (std::optional<std::string> id = foreman::InjectedFaultId(closed)) {
      std::fprintf(stderr, "caused by injected fault %s\n", id->c_str());
    }
    std::fprintf(stderr, "run me again on %s to resume without the faults that fired\n", run_dir.c_str());
    return 1;
  }
  std::printf("done: checkpoints and events in %s\n", run_dir.c_str());
  return 0;
}
