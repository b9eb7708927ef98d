// How a `foreman` subcommand plugs into the CLI: each command file defines an
// Add<Name>Command() that registers a CLI11 subcommand whose callback runs the
// command and stores its exit code in *exit_code.
//
// Exit codes, for every subcommand:
//   0  success
//   1  the work failed (the error is printed in one line)
//   2  bad flags or bad input files (the message names what and where)
//   3  `foreman train --fault-plan`: an injected fault ended the run
#pragma once

#include <CLI/CLI.hpp>

namespace foreman::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitInjectedFault = 3;

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
/// Exit codes: 0 done or stopped by a signal after the final checkpoint,
/// 1 training failed, 2 bad flags/data/plan/incompatible directory, 3 an
/// injected fault (--fault-plan) ended the run, 130 second signal (and, as
/// a shell reports it, 137 for a SIGKILL).
void AddTrainCommand(CLI::App& app, int* exit_code);

}  // namespace foreman::cli
