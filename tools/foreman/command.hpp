// How a `foreman` subcommand plugs into the CLI: each command file defines an
// Add<Name>Command() that registers a CLI11 subcommand whose callback runs the
// command and stores its exit code in *exit_code.
//
// Exit codes, for every subcommand:
//   0  success
//   1  the work failed (the error is printed in one line)
//   2  bad flags or bad input files (the message names what and where)
//   3  `foreman train --fault-plan`: an injected fault ended the run
//  75  `foreman train` as a cluster task: stopped by a signal (an eviction),
//      not finished; start it again (sysexits.h's EX_TEMPFAIL)
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace foreman {
class Env;
struct SimulatedProcess;
}

namespace foreman::cli {

/// CLI11 reads integers with strtoll in base 0: "99999999999999999999" became
/// INT64_MAX and "010" 8. Every integer flag goes through this first: a
/// decimal int64 (absl::SimpleAtoi, which refuses overflow) is rewritten to
/// its canonical text, anything else is a ValidationError (exit 2) that
/// CLI11 prefixes with the flag's name.
inline CLI::Validator DecimalInt64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        int64_t value = 0;
        if (!absl::SimpleAtoi(text, &value)) {
          return absl::StrCat("'", text, "' is not a whole number in [", INT64_MIN, ", ", INT64_MAX, "]");
        }
        text = std::to_string(value);
        return std::string();
      },
      "");
}

/// A path flag given as "" (an unset shell variable) is an error, never
/// "not given".
inline CLI::Validator NonEmpty() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? std::string("must not be empty") : std::string(); },
      "");
}

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInjectedFault = 3;
/// A cluster task stopped by a signal before the job's end: the chief after
/// its final checkpoint (training goes on on the ps tasks), a worker at its
/// step boundary, a ps task. Restarting it with the same flags is right
/// (docs/cluster.md "Failures"). Not 128 + N: a shell reports those for a
/// process the signal killed, and 130 is a second signal's.
inline constexpr int kExitStopped = 75;

/// `foreman chaos`: runs a small `foreman train` job under seeded fault plans,
/// restarting it as a supervisor would, and checks invariants after every run
/// (docs/fault-injection.md). Exit codes: 0 every invariant held, 1 one
/// failed, 2 bad flags or plan.
void AddChaosCommand(CLI::App& app, int* exit_code);
/// A test program's hook (tests/support/foreman_testing_main.cpp): called
/// with a seed's run directory after its first process exits, before the
/// checks. `foreman` itself never sets it. Set before RunForeman.
using ChaosFirstExitHook = void (*)(const std::string& run_dir);
void SetChaosFirstExitHookForTest(ChaosFirstExitHook hook);
/// A test program's disk (tests/support/foreman_lying_disk_main.cpp): under
/// `chaos --disk sim`, each simulated process's Env is the one this returns
/// around the simulated disk (a disk that lies about its syncs, say). The
/// returned Env must reach the disk through EnvWrapper::base(). `foreman`
/// itself never sets it. Set before RunForeman.
using SimulatedDiskWrapper = std::unique_ptr<Env> (*)(Env* disk);
void SetSimulatedDiskWrapperForTest(SimulatedDiskWrapper wrap);

/// `foreman cluster local`: a whole cluster (N ps, M workers) of `foreman
/// train` processes on 127.0.0.1, watched, its signals forwarded to the
/// chief; exits with the chief's code (2: bad flags). `foreman cluster
/// status tcp://HOST:PORT`: each task's role, address, state and steps;
/// exit 0 when the asked task answered, 1 otherwise, 2 bad flags.
/// docs/cluster.md.
void AddClusterCommand(CLI::App& app, int* exit_code);

/// `foreman devices`: CUDA devices visible to this build.
void AddDevicesCommand(CLI::App& app, int* exit_code);

/// `foreman events <file or logdir>`: tags, steps and values of event files
/// (text, or JSON lines with --json).
void AddEventsCommand(CLI::App& app, int* exit_code);

/// `foreman inspect <prefix or dir>`: a checkpoint's variables (TF's
/// inspect_checkpoint): names, dtypes, shapes; optionally values and stats.
void AddInspectCommand(CLI::App& app, int* exit_code);

/// `foreman train`: trains an MLP on Fashion-MNIST under a
/// MonitoredTrainingSession (checkpoints, summaries, resume, signals).
/// Exit codes: 0 done or (one process) stopped by a signal after the final
/// checkpoint, 1 training failed, 2 bad flags/data/plan/incompatible
/// directory, 3 an injected fault (--fault-plan) ended the run, 75
/// (kExitStopped) a cluster task stopped by a signal, not finished, 130
/// second signal (and, as a shell reports it, 137 for a SIGKILL).
void AddTrainCommand(CLI::App& app, int* exit_code);

/// `foreman chaos --disk sim`'s simulated process: `foreman train` with
/// `args` (args[0] == "train", then its flags) run in this process over
/// `process` (foreman/chaos.hpp: the Env under every file the job touches,
/// the log file, the durable-save observer), with no signal watcher (the
/// calling program keeps its signals) and a plan's process faults refused
/// (exit 2). Returns the exit code, as the command's; stdout and stderr are
/// the caller's.
int RunTrainInProcess(const std::vector<std::string>& args, const SimulatedProcess& process);

/// The whole `foreman` program: parses argv, runs the subcommand, returns
/// the exit code (main.cpp; a test build of the program calls it too).
int RunForeman(int argc, char** argv);

}  // namespace foreman::cli
