// `foreman cluster local` and `foreman cluster status` (issue 13, points 1
// and 6; docs/cluster.md).
//
// local: a whole cluster on 127.0.0.1, as torchrun --standalone does for
// PyTorch: free ports are picked, N ps and M worker `foreman train`
// processes are started (this same executable, /proc/self/exe) with the
// cluster flags, each in its own process group (a terminal's Ctrl-C reaches
// only this process, which forwards it once); their output lines come out
// prefixed with their task ("[worker 1] ..."). The chief (worker 0) decides
// the end, as in TF1: a SIGINT/SIGTERM/SIGHUP is the user's request to end
// the job, forwarded to the chief, which `cluster local` starts with
// --signal-ends-training (so it stops at the step boundary, ends training on
// the ps tasks and takes its final checkpoint; the others then stop by
// themselves); a second
// one is forwarded to every task; a third kills them all. Once the chief
// exits, the others get --end-grace-secs to exit, then SIGTERM, then 5 s,
// then SIGKILL. Exit: the chief's code (128 + N when a signal N ended it).
// If `cluster local` itself is killed, each task gets a SIGTERM
// (PR_SET_PDEATHSIG). The machinery is the library's RunLocalCluster
// (foreman/local_cluster.hpp); this file parses flags and prints.
//
// stop: EndClusterTraining (foreman/cluster_status.hpp) on a worker task's
// address: the explicit end of a running job, where a signal is an eviction.
//
// status: asks a task's address (foreman/cluster_status.hpp) and prints one line
// per task it learned of; the "last heard" fields (docs/cluster.md) are
// what the tasks themselves saw: last_answer_ms on a ps line is the asked
// worker's time since that ps task last answered it, last_apply_ms on a
// worker line ps 0's time since that worker's last apply arrived; an asked
// ps task lists the workers it has heard from, indented under its line.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "command.hpp"
#include "foreman/cluster_status.hpp"
#include "foreman/local_cluster.hpp"
#include "foreman/logging.hpp"

namespace foreman::cli {
namespace {

// Flags `cluster local` sets itself: refused among the train flags.
constexpr const char* kOwnFlags[] = {"--ps-hosts", "--worker-hosts", "--job-name", "--task-index", "--insecure",
                           "--signal-ends-training"};

struct LocalFlags {
  int64_t ps = 1;
  int64_t workers = 2;
  int64_t end_grace_secs = 30;
};

int RunLocal(const LocalFlags& f, const std::vector<std::string>& train_flags) {
  if (f.ps < 1 || f.ps > 64) {
    std::fprintf(stderr, "foreman cluster local: --ps must be in [1, 64], got %lld\n", static_cast<long long>(f.ps));
    return kExitUsage;
  }
  if (f.workers < 1 || f.workers > 64) {
    std::fprintf(stderr, "foreman cluster local: --workers must be in [1, 64], got %lld\n",
                 static_cast<long long>(f.workers));
    return kExitUsage;
  }
  if (f.end_grace_secs < 0 || f.end_grace_secs > 86400) {
    std::fprintf(stderr, "foreman cluster local: --end-grace-secs must be in [0, 86400], got %lld\n",
                 static_cast<long long>(f.end_grace_secs));
    return kExitUsage;
  }
  for (const std::string& a : train_flags) {
    for (const char* own : kOwnFlags) {
      if (a == own || absl::StartsWith(a, absl::StrCat(own, "="))) {
        std::fprintf(stderr,
                     "foreman cluster local: %s is set by `cluster local` itself (127.0.0.1, free ports); "
                     "drop it (to start tasks on several machines, run `foreman train` with the cluster flags "
                     "on each: docs/cluster.md)\n",
                     own);
        return kExitUsage;
      }
    }
  }
  LocalClusterOptions options;
  options.num_ps = static_cast<int>(f.ps);
  options.num_workers = static_cast<int>(f.workers);
  options.end_grace_secs = f.end_grace_secs;
  options.train_flags = train_flags;
  // Each task's lines, prefixed with it ("[worker 1] ..."), on the stream it used.
  options.on_task_line = [](std::string_view task, bool is_stderr, std::string_view line) {
    FILE* to = is_stderr ? stderr : stdout;
    // A task's line stays one line.
    const std::string safe = EscapeForTerminal(absl::string_view(line.data(), line.size()));
    std::fprintf(to, "[%.*s] %s\n", static_cast<int>(task.size()), task.data(), safe.c_str());
    std::fflush(to);
  };
  options.on_message = [](std::string_view m) {
    const std::string safe = EscapeForTerminal(absl::string_view(m.data(), m.size()));
    std::fprintf(stderr, "foreman cluster local: %s\n", safe.c_str());
    std::fflush(stderr);
  };
  StatusOr<LocalClusterResult> result = RunLocalCluster(options);
  if (!result.ok()) {
    std::fprintf(stderr, "foreman cluster local: %s\n", EscapeForTerminal(result.status().message()).c_str());
    return absl::IsInvalidArgument(result.status()) ? kExitUsage : kExitFailed;
  }
  return result->exit_code;
}

// -- status -------------------------------------------------------------------------

struct StatusFlags {
  std::string target;
  int64_t timeout_ms = 2000;
  int64_t heartbeat_ms = 200;
  int64_t connection_timeout_ms = 1000;
  std::string tls_cert, tls_key, tls_ca;
};

// The ClusterOptions a client of a running cluster (`cluster status`,
// `cluster stop`: `command`) connects with; nullopt after printing why the
// flags are bad.
std::optional<ClusterOptions> ClientOptions(const StatusFlags& f, const char* command) {
  if (f.heartbeat_ms <= 0 || f.connection_timeout_ms < 3 * f.heartbeat_ms) {
    std::fprintf(stderr,
                 "foreman cluster %s: --heartbeat-ms must be > 0 and --connection-timeout-ms >= 3 x it "
                 "(got %lld and %lld)\n",
                 command, static_cast<long long>(f.heartbeat_ms), static_cast<long long>(f.connection_timeout_ms));
    return std::nullopt;
  }
  ClusterOptions options;
  options.heartbeat_ms = f.heartbeat_ms;
  options.connection_timeout_ms = f.connection_timeout_ms;
  options.tls_cert = f.tls_cert;
  options.tls_key = f.tls_key;
  options.tls_ca = f.tls_ca;
  return options;
}

// The flags `cluster status` and `cluster stop` share, into `f`.
void AddClientFlags(CLI::App* cmd, StatusFlags* f, const char* target_help, const char* timeout_help) {
  cmd->add_option("target", f->target, target_help)->required();
  cmd->add_option("--timeout-ms", f->timeout_ms, timeout_help)->transform(DecimalInt64());
  cmd->add_option("--heartbeat-ms", f->heartbeat_ms, "As the cluster's --heartbeat-ms")->transform(DecimalInt64());
  cmd->add_option("--connection-timeout-ms", f->connection_timeout_ms, "As the cluster's --connection-timeout-ms")
      ->transform(DecimalInt64());
  cmd->add_option("--tls-cert", f->tls_cert, "This client's certificate (PEM), from the cluster's CA")
      ->transform(NonEmpty());
  cmd->add_option("--tls-key", f->tls_key, "Its private key (PEM)")->transform(NonEmpty());
  cmd->add_option("--tls-ca", f->tls_ca, "The cluster's CA certificate(s) (PEM)")->transform(NonEmpty());
}

int RunStatus(const StatusFlags& f) {
  const std::optional<ClusterOptions> options = ClientOptions(f, "status");
  if (!options.has_value()) return kExitUsage;
  auto reports = QueryClusterStatus(f.target, *options, f.timeout_ms);
  if (!reports.ok()) {
    std::fprintf(stderr, "foreman cluster status: %s\n", EscapeForTerminal(reports.status().message()).c_str());
    return absl::IsInvalidArgument(reports.status()) ? kExitUsage : kExitFailed;
  }
  const ClusterTaskReport& asked = reports->front();
  const ClusterTaskReport* ps0 = nullptr;
  for (const ClusterTaskReport& r : *reports) {
    if (r.job_name == "ps" && r.task_index == 0 && r.reachable) ps0 = &r;
  }
  auto ms_or_never = [](int64_t ms) { return ms < 0 ? std::string("never") : absl::StrCat(ms); };
  for (const ClusterTaskReport& r : *reports) {
    const std::string who = r.task_index >= 0 ? absl::StrCat(r.job_name, " ", r.task_index) : std::string("?");
    std::string line = absl::StrCat(who, "  ", r.address, "  ");
    if (!r.reachable) {
      absl::StrAppend(&line, "unreachable: ", r.error);
    } else if (r.job_name == "ps") {
      absl::StrAppend(&line, !r.initialized ? "not initialized" : r.frozen ? "frozen (a checkpoint)" : "serving");
      if (r.global_step >= 0) absl::StrAppend(&line, "  global_step ", r.global_step);
      absl::StrAppend(&line, "  applied_updates ", r.applied_updates, "  refused_updates ", r.refused_updates);
    } else {
      absl::StrAppend(&line, "serving", r.task_index == 0 && r.job_name == "worker" ? " (chief)" : "",
                      "  steps ", r.worker_steps);
    }
    if (r.reachable) {
      absl::StrAppend(&line, "  job ", r.cluster_job_id);
      if (&r != &asked && asked.reachable && r.cluster_job_id != asked.cluster_job_id) {
        absl::StrAppend(&line, " (not the asked task's job ", asked.cluster_job_id, ")");
      }
    }
    if (&r != &asked && asked.reachable && asked.job_name != "ps" && r.job_name == "ps" && r.task_index >= 0) {
      // The asked worker's view of this ps task.
      const auto k = static_cast<std::size_t>(r.task_index);
      if (k < asked.ps_last_answer_ms.size()) {
        absl::StrAppend(&line, "  last_answer_ms ", ms_or_never(asked.ps_last_answer_ms[k]));
      }
    }
    if (r.job_name == "worker" && r.task_index >= 0) {
      // ps 0's view of this worker (every step of every worker reaches ps 0).
      const auto k = static_cast<std::size_t>(r.task_index);
      if (ps0 == nullptr) {
        absl::StrAppend(&line, "  last_apply_ms unknown (ps 0 not reachable)");
      } else {
        absl::StrAppend(&line, "  last_apply_ms ",
                        ms_or_never(k < ps0->worker_last_apply_ms.size() ? ps0->worker_last_apply_ms[k] : -1));
      }
    }
    std::printf("%s\n", EscapeForTerminal(line).c_str());  // holds what the peers said
    if (&r == &asked && r.reachable && r.job_name == "ps") {
      // An asked ps task knows the workers only by index, from their applies.
      for (std::size_t k = 0; k < r.worker_last_apply_ms.size(); ++k) {
        if (r.worker_last_apply_ms[k] < 0) continue;
        std::printf("  worker %zu  applies %lld  last_apply_ms %lld\n", k,
                    static_cast<long long>(k < r.worker_applies.size() ? r.worker_applies[k] : 0),
                    static_cast<long long>(r.worker_last_apply_ms[k]));
      }
    }
  }
  std::fflush(stdout);
  return reports->front().reachable ? kExitOk : kExitFailed;
}

// -- stop -----------------------------------------------------------------------------

int RunStop(const StatusFlags& f) {
  const std::optional<ClusterOptions> options = ClientOptions(f, "stop");
  if (!options.has_value()) return kExitUsage;
  StatusOr<ClusterStopReport> stopped = EndClusterTraining(f.target, *options, f.timeout_ms);
  if (!stopped.ok()) {
    std::fprintf(stderr, "foreman cluster stop: %s\n", EscapeForTerminal(stopped.status().message()).c_str());
    return absl::IsInvalidArgument(stopped.status()) ? kExitUsage : kExitFailed;
  }
  // ps 0 not initialised yet (no chief has started the job): no step to name.
  const std::string at = stopped->global_step >= 0
                             ? absl::StrCat("at global_step ", stopped->global_step)
                             : std::string("before its ps tasks were initialised (no global_step yet)");
  std::printf("%s\n", EscapeForTerminal(absl::StrCat(
                           "ended training of cluster job ", stopped->cluster_job_id, " ", at,
                           " on ", stopped->ps_tasks, " ps task(s): each worker stops at its "
                           "next step, the chief after its final checkpoint, and every task exits 0"))
                           .c_str());
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

void AddClusterCommand(CLI::App& app, int* exit_code) {
  CLI::App* cluster = app.add_subcommand(
      "cluster", "Run a whole cluster on this machine (local), ask a running cluster's task (status), or end a running job "
      "(stop)");
  cluster->require_subcommand(1);

  auto local_flags = std::make_shared<LocalFlags>();
  CLI::App* local = cluster->add_subcommand(
      "local",
      "Start N ps and M worker `foreman train` processes on 127.0.0.1 (free ports), with the other flags as "
      "`foreman train` flags (like torchrun --standalone). Output lines are prefixed with their task; a signal "
      "goes to the chief (worker 0), which ends the run; exits with the chief's code (2: bad flags).");
  local->add_option("--ps", local_flags->ps, "Number of ps tasks (default 1)")->transform(DecimalInt64());
  local->add_option("--workers", local_flags->workers, "Number of workers, the chief included (default 2)")
      ->transform(DecimalInt64());
  local->add_option("--end-grace-secs", local_flags->end_grace_secs,
                    "After the chief exits, how long the others get before a SIGTERM (then 5 s to a SIGKILL)")
      ->transform(DecimalInt64());
  local->allow_extras();
  local->callback([local, local_flags, exit_code] { *exit_code = RunLocal(*local_flags, local->remaining()); });

  auto status_flags = std::make_shared<StatusFlags>();
  CLI::App* status = cluster->add_subcommand(
      "status",
      "Ask the task at tcp://HOST:PORT (or tls://, with the --tls-* files) and, for a worker, every task of its "
      "cluster: role, address, state, global_step (ps) or steps (worker). Exit 0 when the asked task answered, "
      "1 otherwise, 2 bad flags.");
  AddClientFlags(status, status_flags.get(), "tcp://HOST:PORT or tls://HOST:PORT of a ps or worker task",
                 "Bound on each connect and each question (ms)");
  status->callback([status_flags, exit_code] { *exit_code = RunStatus(*status_flags); });

  auto stop_flags = std::make_shared<StatusFlags>();
  stop_flags->timeout_ms = 5000;
  CLI::App* stop = cluster->add_subcommand(
      "stop",
      "End a running job early, on purpose (a signal to the chief is only its eviction): ask the worker task at "
      "tcp://HOST:PORT (or tls://) for its cluster and end training on every ps task; each worker then stops, "
      "the chief after its final checkpoint, and every task exits 0. Exit 0 when every ps task ended training, "
      "1 otherwise, 2 bad flags.");
  AddClientFlags(stop, stop_flags.get(), "tcp://HOST:PORT or tls://HOST:PORT of a worker task (the chief's)",
                 "Bound on each connect and each request (ms)");
  stop->callback([stop_flags, exit_code] { *exit_code = RunStop(*stop_flags); });
}

}  // namespace foreman::cli
