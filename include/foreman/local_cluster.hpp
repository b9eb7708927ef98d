// A whole cluster on this machine (`foreman cluster local`):
// N ps and M worker `foreman train` processes on 127.0.0.1, as torchrun
// --standalone does for PyTorch. TF1 has no such launcher (each task is
// started by hand with --ps_hosts, --worker_hosts, --job_name, --task_index).
//
// RunLocalCluster picks free loopback ports, starts the ps tasks and then
// the workers (`<program> train <train_flags> --ps-hosts ... --worker-hosts
// ... --job-name ps|worker --task-index K`, and `--signal-ends-training`
// for the chief), each the leader of its own
// process group (a terminal's Ctrl-C reaches only this process), with
// SIGTERM as its parent-death signal (if this process dies, each task is
// asked to stop), and hands every line they write to the caller. The chief
// (worker 0) decides the end, as in TF1:
//  - a SIGINT/SIGTERM/SIGHUP this process receives is the user's request
//    to end the whole job: it is forwarded to the chief, started with
//    --signal-ends-training (so it stops at a step boundary, ends training
//    on the ps tasks and takes its final checkpoint, instead of exiting as
//    an evicted chief, 75, with training going on); the others then stop
//    by themselves; a
//    second one goes to every task; a third kills them all (SIGKILL);
//  - once the chief exits, the others get end_grace_secs to exit, then a
//    SIGTERM, then 5 s, then a SIGKILL.
//
//   ```cpp
//   #include "foreman/local_cluster.hpp"
//   foreman::LocalClusterOptions options;
//   options.num_ps = 0;  // out of range: refused before anything starts
//   if (foreman::RunLocalCluster(options).status().code() != absl::StatusCode::kInvalidArgument) {
//     return absl::InternalError("expected INVALID_ARGUMENT");
//   }
//   // A real run: options.program = the foreman executable, options.num_ps = 1, options.num_workers = 2,
//   // options.train_flags = {"--max-steps", "100", "--checkpoint-dir", dir}; the result's exit_code is
//   // the chief's.
//   ```
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "foreman/status.hpp"

namespace foreman {

struct LocalClusterOptions {
  /// The foreman executable each task runs (a path; "/proc/self/exe": this
  /// program, as `foreman cluster local` does).
  std::string program = "/proc/self/exe";
  /// ps tasks and worker tasks (the chief included), each in [1, 64].
  int num_ps = 1;
  int num_workers = 2;
  /// After the chief exits, how long the others get before a SIGTERM
  /// (seconds, in [0, 86400]).
  int64_t end_grace_secs = 30;
  /// `foreman train` flags given to every task, before the cluster flags
  /// RunLocalCluster sets itself (--ps-hosts, --worker-hosts, --job-name,
  /// --task-index; the caller refuses those among its own).
  std::vector<std::string> train_flags;
  /// Called with each line a task writes (without its '\n'; a last line
  /// without one at the end of its output included), `task` "ps K" or
  /// "worker K", `is_stderr` which stream; in the order they were read.
  /// Empty: the lines are dropped.
  std::function<void(std::string_view task, bool is_stderr, std::string_view line)> on_task_line;
  /// Called with each line saying what RunLocalCluster does (the ports,
  /// a signal forwarded, the chief's exit, a SIGTERM or SIGKILL sent to the
  /// tasks left, the exit codes), without a prefix or '\n'. Empty: dropped.
  std::function<void(std::string_view message)> on_message;
};

struct LocalClusterResult {
  /// What `foreman cluster local` exits with: the chief's exit code (128 +
  /// N when a signal N ended it); 128 + N when the caller's second signal N
  /// went to every task and the chief did not exit 0; 1 when not every task
  /// could be started (those that were are stopped as after the chief's exit).
  int exit_code = 1;
  /// Each task started, in start order (ps tasks, then workers): its name
  /// ("ps 0", "worker 1") and exit code (128 + N for a signal N).
  std::vector<std::pair<std::string, int>> task_exit_codes;
};

/// Runs the cluster described at the top of this file until every task has
/// exited and its output is read to the end; the callbacks run on the
/// calling thread. While it runs, SIGINT, SIGTERM, SIGHUP and SIGCHLD are
/// blocked in the calling thread and read from a signalfd (restored before
/// it returns): for the process's signals to reach it, the other threads
/// must have them blocked too (simplest: call it from a single-threaded
/// program). Nothing else may reap this process's children meanwhile.
/// Every wait is bounded (end_grace_secs, then 5 s per escalation).
/// Errors (nothing is started): INVALID_ARGUMENT for options out of range
/// (naming the field); UNAVAILABLE when the free ports cannot be found
/// (FreeLoopbackPorts' message); INTERNAL "signalfd(): <strerror>". A task
/// that fails is not an error: its exit code is in the result. Not
/// thread-safe: one call at a time per process. TF: none.
StatusOr<LocalClusterResult> RunLocalCluster(const LocalClusterOptions& options);

}  // namespace foreman
