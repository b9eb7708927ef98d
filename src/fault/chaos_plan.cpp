// `foreman chaos`'s preset plans (chaos_plan.hpp).
#include "fault/chaos_plan.hpp"

#include "absl/strings/str_cat.h"
#include "platform/hash.hpp"

namespace foreman::internal {
namespace {

// The plan's draws come from a SplitMix64Stream (platform/hash.hpp), fixed
// by its definition, unlike std::uniform_int_distribution's.
template <class T, std::size_t N>
const T& Pick(SplitMix64Stream& rng, const T (&options)[N]) {
  return options[rng.Uniform(0, static_cast<int64_t>(N) - 1)];
}

constexpr int64_t kFirstStep = 1;
constexpr int64_t kLastStep = 199;

nlohmann::json DiskFault(SplitMix64Stream& rng, const std::string& id) {
  struct Target {
    const char* path;
    const char* what;
  };
  // Patterns end in '*': checkpoint files are written as temporaries
  // (docs/fault-injection.md); "*/checkpoint.tmp*" is the state file's.
  static constexpr Target kTargets[] = {
      {"*.data-*", "data"}, {"*.index*", "index"}, {"*/checkpoint.tmp*", "state"}};
  static constexpr const char* kOps[] = {"append", "sync", "rename"};
  static constexpr const char* kErrors[] = {"EIO", "ENOSPC"};
  const Target& target = Pick(rng, kTargets);
  std::string op = Pick(rng, kOps);
  // The state file is written in one append.
  const int64_t max_nth = op == std::string("append") && std::string(target.what) != "state" ? 30 : 10;
  nlohmann::json f;
  f["id"] = id;
  f["type"] = "env";
  f["path"] = target.path;
  f["op"] = op;
  f["error"] = Pick(rng, kErrors);
  f["nth"] = rng.Uniform(1, max_nth);
  return f;
}

nlohmann::json StepFault(SplitMix64Stream& rng, const std::string& id) {
  static constexpr const char* kKinds[] = {"ABORTED", "UNAVAILABLE", "INTERNAL", "nan_loss"};
  const std::string kind = Pick(rng, kKinds);
  nlohmann::json f;
  f["id"] = id;
  f["type"] = "step";
  if (kind == "nan_loss") {
    f["nan_loss"] = true;
  } else {
    f["status"] = kind;
  }
  f["at_step"] = rng.Uniform(kFirstStep, kLastStep);
  return f;
}

nlohmann::json SignalFault(SplitMix64Stream& rng, const std::string& id) {
  static constexpr const char* kSignals[] = {"SIGKILL", "SIGTERM"};
  nlohmann::json f;
  f["id"] = id;
  f["type"] = "process";
  f["signal"] = Pick(rng, kSignals);
  f["at_step"] = rng.Uniform(kFirstStep, kLastStep);
  return f;
}

// A service actor killed (TF's default policy: the run ends, naming the
// fault, and the supervisor restarts the job), delayed, or dropping its next
// messages (a summary batch, a step-rate record: lost; a save: the run ends
// with DEADLINE_EXCEEDED). The input pipeline's producer is killed or
// delayed, never dropped: a dropped batch leaves the step waiting for
// foreman train's 60 s batch timeout before the run fails, too long for a seed. None
// changes training (a restarted job re-reads its batches from the restored
// position: the same ones).
nlohmann::json ActorFault(SplitMix64Stream& rng, const std::string& id) {
  static constexpr const char* kServices[] = {"summary_writer", "step_counter", "checkpoint_saver", "input_pipeline"};
  static constexpr const char* kKinds[] = {"kill", "delay", "drop"};
  static constexpr const char* kInputKinds[] = {"kill", "delay"};
  nlohmann::json f;
  f["id"] = id;
  f["type"] = "actor";
  const std::string service = Pick(rng, kServices);
  f["service"] = service;
  const std::string kind = service == "input_pipeline" ? Pick(rng, kInputKinds) : Pick(rng, kKinds);
  f["kind"] = kind;
  f["at_step"] = rng.Uniform(kFirstStep, kLastStep);
  if (kind == "delay") f["delay_ms"] = rng.Uniform(1, 50);
  if (kind != "kill") f["count"] = rng.Uniform(1, 3);
  return f;
}

// A power cut (--disk sim): at a probabilistic point among one kind of
// mutating file operation, so that every such operation of the run is a
// candidate and a seed's points are the same however threads interleave
// (the draws are keyed per file, FaultyEnv's). Half of them aim at the
// checkpoint's commit protocol (its files and the state file), where a
// crash between two steps is what finds a missing sync.
nlohmann::json PowerCut(SplitMix64Stream& rng, const std::string& id) {
  static constexpr const char* kOps[] = {"new_writable", "append", "flush", "sync", "close",
                                         "rename",       "delete", "create_dir", "sync_dir"};
  static constexpr const char* kCommitPaths[] = {"*.data-*", "*.index*", "*/checkpoint*", "*/run"};
  nlohmann::json f;
  f["id"] = id;
  f["type"] = "env";
  f["kind"] = "crash";
  f["op"] = Pick(rng, kOps);
  const bool commit = rng.Uniform(0, 1) == 1;
  f["path"] = commit ? Pick(rng, kCommitPaths) : "*";
  // One point in about `every` operations of its kind and paths.
  const int64_t every = commit ? rng.Uniform(1, 40) : rng.Uniform(2, 400);
  f["probability"] = 1.0 / static_cast<double>(every);
  return f;
}

// A write torn by the next power cut: its first half durable, the rest not.
nlohmann::json TornWrite(SplitMix64Stream& rng, const std::string& id) {
  static constexpr const char* kPaths[] = {"*", "*.data-*", "*.index*", "*events.out.tfevents*"};
  nlohmann::json f;
  f["id"] = id;
  f["type"] = "env";
  f["kind"] = "torn_write";
  f["op"] = "append";
  f["path"] = Pick(rng, kPaths);
  f["probability"] = 1.0 / static_cast<double>(rng.Uniform(1, 60));
  return f;
}

}  // namespace

const std::vector<std::string>& ChaosPresetNames() {
  static const std::vector<std::string> names = {"disk", "steps", "actors", "signals", "all", "power"};
  return names;
}

StatusOr<nlohmann::json> ChaosPresetPlan(const std::string& preset, uint64_t seed) {
  // FNV-1a of the preset's name: each preset draws its own stream.
  SplitMix64Stream rng(Fnv1a64(absl::StrCat("foreman-chaos/", preset)) ^ (seed * kSplitMix64Gamma));
  nlohmann::json faults = nlohmann::json::array();
  if (preset == "disk") {
    const int64_t n = rng.Uniform(1, 2);
    for (int64_t i = 1; i <= n; ++i) faults.push_back(DiskFault(rng, absl::StrCat("disk-", i)));
  } else if (preset == "steps") {
    const int64_t n = rng.Uniform(1, 2);
    for (int64_t i = 1; i <= n; ++i) faults.push_back(StepFault(rng, absl::StrCat("step-", i)));
  } else if (preset == "actors") {
    const int64_t n = rng.Uniform(1, 2);
    for (int64_t i = 1; i <= n; ++i) faults.push_back(ActorFault(rng, absl::StrCat("actor-", i)));
  } else if (preset == "signals") {
    faults.push_back(SignalFault(rng, "signal-1"));
  } else if (preset == "all") {
    const int64_t n = rng.Uniform(1, 3);
    for (int64_t i = 1; i <= n; ++i) {
      switch (rng.Uniform(0, 3)) {
        case 0: faults.push_back(DiskFault(rng, absl::StrCat("disk-", i))); break;
        case 1: faults.push_back(StepFault(rng, absl::StrCat("step-", i))); break;
        case 2: faults.push_back(ActorFault(rng, absl::StrCat("actor-", i))); break;
        default: faults.push_back(SignalFault(rng, absl::StrCat("signal-", i))); break;
      }
    }
  } else if (preset == "power") {
    const int64_t n = rng.Uniform(1, 3);
    for (int64_t i = 1; i <= n; ++i) faults.push_back(PowerCut(rng, absl::StrCat("power-", i)));
    if (rng.Uniform(0, 1) == 1) faults.push_back(TornWrite(rng, "torn-1"));
    if (rng.Uniform(0, 3) == 0) faults.push_back(DiskFault(rng, "disk-1"));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--preset: unknown preset '", preset, "' (disk, steps, actors, signals, all or power)"));
  }
  nlohmann::json plan;
  plan["seed"] = seed;
  plan["faults"] = std::move(faults);
  return plan;
}

}  // namespace foreman::internal
