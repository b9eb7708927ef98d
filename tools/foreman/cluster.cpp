// `foreman cluster local` and `foreman cluster status` (issue 13, points 1
// and 6; docs/cluster.md).
//
// local: a whole cluster on 127.0.0.1, as torchrun --standalone does for
// PyTorch: free ports are picked, N ps and M worker `foreman train`
// processes are started (this same executable, /proc/self/exe) with the
// cluster flags, each in its own process group (a terminal's Ctrl-C reaches
// only this process, which forwards it once); their output lines come out
// prefixed with their task ("[worker 1] ..."). The chief (worker 0) decides
// the end, as in TF1: a SIGINT/SIGTERM/SIGHUP is forwarded to the chief
// (which stops at the step boundary, ends training on the ps tasks and
// takes its final checkpoint; the others then stop by themselves); a second
// one is forwarded to every task; a third kills them all. Once the chief
// exits, the others get --end-grace-secs to exit, then SIGTERM, then 5 s,
// then SIGKILL. Exit: the chief's code (128 + N when a signal N ended it).
// If `cluster local` itself is killed, each task gets a SIGTERM
// (PR_SET_PDEATHSIG).
//
// status: asks a task's address (cluster_status.hpp) and prints one line
// per task it learned of; the "last heard" fields (docs/cluster.md) are
// what the tasks themselves saw: last_answer_ms on a ps line is the asked
// worker's time since that ps task last answered it, last_apply_ms on a
// worker line ps 0's time since that worker's last apply arrived; an asked
// ps task lists the workers it has heard from, indented under its line.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "actors/cluster_status.hpp"
#include "command.hpp"
#include "cluster/local_ports.hpp"

namespace foreman::cli {
namespace {

// Flags `cluster local` sets itself: refused among the train flags.
constexpr const char* kOwnFlags[] = {"--ps-hosts", "--worker-hosts", "--job-name", "--task-index", "--insecure"};

struct LocalFlags {
  int64_t ps = 1;
  int64_t workers = 2;
  int64_t end_grace_secs = 30;
};

struct Child {
  std::string name;  // "ps 0", "worker 1"
  pid_t pid = -1;
  int out = -1, err = -1;        // read ends of its stdout / stderr pipes
  std::string out_buf, err_buf;  // partial lines
  bool exited = false;
  int code = 0;  // exit code, or 128 + signal
};

// Writes every complete line of `buf` to `to`, prefixed; keeps the rest
// (all of it at `eof`).
void FlushLines(std::string& buf, const std::string& prefix, FILE* to, bool eof) {
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(to, "%s%.*s\n", prefix.c_str(), static_cast<int>(nl - start), buf.data() + start);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (eof && !buf.empty()) {
    std::fprintf(to, "%s%s\n", prefix.c_str(), buf.c_str());
    buf.clear();
  }
  std::fflush(to);
}

// Reads what is there on `fd` into `buf`; false at EOF (the fd is closed).
bool Drain(int& fd, std::string& buf, const std::string& prefix, FILE* to) {
  char chunk[4096];
  for (;;) {
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n > 0) {
      buf.append(chunk, static_cast<std::size_t>(n));
      FlushLines(buf, prefix, to, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    FlushLines(buf, prefix, to, true);
    close(fd);
    fd = -1;
    return false;
  }
}

StatusOr<pid_t> Spawn(const std::vector<std::string>& args, const sigset_t& old_mask, int out_w, int err_w,
                      const std::vector<int>& close_in_child) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork(): ", std::strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);  // its own group: a terminal's Ctrl-C reaches the parent only
    // `cluster local` killed (SIGKILL): its tasks get a SIGTERM, not orphaned.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    for (int fd : close_in_child) close(fd);
    dup2(out_w, STDOUT_FILENO);
    dup2(err_w, STDERR_FILENO);
    close(out_w);
    close(err_w);
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    execv("/proc/self/exe", argv.data());
    const char* what = "foreman cluster local: cannot run /proc/self/exe\n";
    (void)!write(STDERR_FILENO, what, std::strlen(what));
    _exit(127);
  }
  setpgid(pid, pid);  // also here: no race with the child's own call
  return pid;
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

int CodeOf(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return 1;
}

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
  const int ps = static_cast<int>(f.ps);
  const int workers = static_cast<int>(f.workers);
  auto ports = internal::FreeLoopbackPorts(ps + workers);
  if (!ports.ok()) {
    std::fprintf(stderr, "foreman cluster local: %s\n", std::string(ports.status().message()).c_str());
    return kExitFailed;
  }
  std::vector<std::string> ps_hosts, worker_hosts;
  for (int i = 0; i < ps; ++i) ps_hosts.push_back(absl::StrCat("127.0.0.1:", (*ports)[i]));
  for (int i = 0; i < workers; ++i) worker_hosts.push_back(absl::StrCat("127.0.0.1:", (*ports)[ps + i]));
  const std::string ps_flag = absl::StrJoin(ps_hosts, ",");
  const std::string worker_flag = absl::StrJoin(worker_hosts, ",");

  // Signals: taken from a signalfd in the loop below.
  sigset_t set, old_mask;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGCHLD);
  sigprocmask(SIG_BLOCK, &set, &old_mask);
  const int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    std::fprintf(stderr, "foreman cluster local: signalfd(): %s\n", std::strerror(errno));
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    return kExitFailed;
  }
  std::fprintf(stderr, "foreman cluster local: %d ps task(s) at %s; %d worker(s) at %s (worker 0 is the chief)\n",
               ps, ps_flag.c_str(), workers, worker_flag.c_str());
  std::fflush(stderr);

  // ps tasks first, then the chief and the other workers.
  std::vector<Child> children;
  std::vector<int> parent_fds = {sfd};
  Status started;
  for (int i = 0; i < ps + workers && started.ok(); ++i) {
    const bool is_ps = i < ps;
    const int index = is_ps ? i : i - ps;
    Child c;
    c.name = absl::StrCat(is_ps ? "ps " : "worker ", index);
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      started = absl::UnavailableError(absl::StrCat("pipe(): ", std::strerror(errno)));
      break;
    }
    std::vector<std::string> args = {"foreman", "train"};
    args.insert(args.end(), train_flags.begin(), train_flags.end());
    for (std::string a : {std::string("--ps-hosts"), ps_flag, std::string("--worker-hosts"), worker_flag,
                          std::string("--job-name"), std::string(is_ps ? "ps" : "worker"),
                          std::string("--task-index"), std::to_string(index)}) {
      args.push_back(std::move(a));
    }
    std::vector<int> close_in_child = parent_fds;
    close_in_child.push_back(out[0]);
    close_in_child.push_back(err[0]);
    auto pid = Spawn(args, old_mask, out[1], err[1], close_in_child);
    close(out[1]);
    close(err[1]);
    if (!pid.ok()) {
      close(out[0]);
      close(err[0]);
      started = pid.status();
      break;
    }
    c.pid = *pid;
    c.out = out[0];
    c.err = err[0];
    fcntl(c.out, F_SETFL, O_NONBLOCK);
    fcntl(c.err, F_SETFL, O_NONBLOCK);
    parent_fds.push_back(c.out);
    parent_fds.push_back(c.err);
    children.push_back(std::move(c));
  }
  Child* chief = children.size() > static_cast<std::size_t>(ps) ? &children[ps] : nullptr;
  if (!started.ok()) {
    std::fprintf(stderr, "foreman cluster local: cannot start the tasks: %s\n",
                 std::string(started.message()).c_str());
  }

  using Clock = std::chrono::steady_clock;
  int signals = 0;
  int ended_by_signal = 0;  // a signal that went to every task (the run ends at once)
  // After the chief's exit (or a failed start): the others' deadline, and
  // what was already sent (0 nothing, 1 SIGTERM, 2 SIGKILL).
  std::optional<Clock::time_point> others_deadline;
  if (chief == nullptr) others_deadline = Clock::now();
  int escalation = 0;
  auto signal_all = [&](int sig) {
    for (Child& c : children) {
      if (!c.exited) kill(c.pid, sig);
    }
  };
  auto all_done = [&] {
    for (const Child& c : children) {
      if (!c.exited || c.out >= 0 || c.err >= 0) return false;
    }
    return true;
  };
  while (!all_done()) {
    std::vector<pollfd> fds;
    fds.push_back({sfd, POLLIN, 0});
    std::vector<std::pair<Child*, bool>> owners;  // (child, stdout?)
    for (Child& c : children) {
      if (c.out >= 0) fds.push_back({c.out, POLLIN, 0}), owners.push_back({&c, true});
      if (c.err >= 0) fds.push_back({c.err, POLLIN, 0}), owners.push_back({&c, false});
    }
    int wait_ms = 200;
    poll(fds.data(), fds.size(), wait_ms);
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Child& c = *owners[i - 1].first;
      const std::string prefix = absl::StrCat("[", c.name, "] ");
      if (owners[i - 1].second) {
        Drain(c.out, c.out_buf, prefix, stdout);
      } else {
        Drain(c.err, c.err_buf, prefix, stderr);
      }
    }
    signalfd_siginfo info;
    while (read(sfd, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;
      ++signals;
      if (signals == 1 && chief != nullptr && !chief->exited) {
        std::fprintf(stderr,
                     "foreman cluster local: %s received: forwarded to the chief (worker 0), which ends the run "
                     "(a second signal goes to every task, a third kills them)\n",
                     SignalName(sig));
        kill(chief->pid, sig);
      } else if (signals <= 2) {
        std::fprintf(stderr, "foreman cluster local: %s received: forwarded to every task\n", SignalName(sig));
        signal_all(sig);
        ended_by_signal = sig;
      } else {
        std::fprintf(stderr, "foreman cluster local: %s received again: killing every task\n", SignalName(sig));
        signal_all(SIGKILL);
      }
      std::fflush(stderr);
    }
    for (Child& c : children) {
      if (c.exited) continue;
      int wstatus = 0;
      const pid_t r = waitpid(c.pid, &wstatus, WNOHANG);
      if (r == c.pid) {
        c.exited = true;
        c.code = CodeOf(wstatus);
        if (&c == chief) {
          std::fprintf(stderr, "foreman cluster local: the chief exited %d; waiting up to %llds for the others\n",
                       c.code, static_cast<long long>(f.end_grace_secs));
          std::fflush(stderr);
          others_deadline = Clock::now() + std::chrono::seconds(f.end_grace_secs);
        }
      }
    }
    if (others_deadline && Clock::now() >= *others_deadline) {
      bool left = false;
      for (const Child& c : children) left = left || !c.exited;
      if (left && escalation < 2) {
        std::vector<std::string> names;
        for (const Child& c : children) {
          if (!c.exited) names.push_back(c.name);
        }
        std::fprintf(stderr, "foreman cluster local: still running after the chief's exit: %s; sending %s\n",
                     absl::StrJoin(names, ", ").c_str(), escalation == 0 ? "SIGTERM" : "SIGKILL");
        std::fflush(stderr);
        signal_all(escalation == 0 ? SIGTERM : SIGKILL);
        ++escalation;
        others_deadline = Clock::now() + std::chrono::seconds(5);
      }
    }
  }
  close(sfd);
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  std::vector<std::string> summary;
  for (const Child& c : children) summary.push_back(absl::StrCat(c.name, " ", c.code));
  std::fprintf(stderr, "foreman cluster local: exit codes: %s\n", absl::StrJoin(summary, ", ").c_str());
  if (!started.ok() || chief == nullptr) return kExitFailed;
  // The user's second signal ended every task at once (the chief then fails
  // on its lost ps): the exit says so, as a second signal to `foreman train` does.
  if (ended_by_signal != 0 && chief->code != 0) return 128 + ended_by_signal;
  return chief->code;
}

// -- status -------------------------------------------------------------------------

struct StatusFlags {
  std::string target;
  int64_t timeout_ms = 2000;
  int64_t heartbeat_ms = 200;
  int64_t connection_timeout_ms = 1000;
  std::string tls_cert, tls_key, tls_ca;
};

int RunStatus(const StatusFlags& f) {
  ClusterOptions options;
  options.heartbeat_ms = f.heartbeat_ms;
  options.connection_timeout_ms = f.connection_timeout_ms;
  options.tls_cert = f.tls_cert;
  options.tls_key = f.tls_key;
  options.tls_ca = f.tls_ca;
  if (f.heartbeat_ms <= 0 || f.connection_timeout_ms < 3 * f.heartbeat_ms) {
    std::fprintf(stderr,
                 "foreman cluster status: --heartbeat-ms must be > 0 and --connection-timeout-ms >= 3 x it "
                 "(got %lld and %lld)\n",
                 static_cast<long long>(f.heartbeat_ms), static_cast<long long>(f.connection_timeout_ms));
    return kExitUsage;
  }
  auto reports = internal::QueryClusterStatus(f.target, options, f.timeout_ms);
  if (!reports.ok()) {
    std::fprintf(stderr, "foreman cluster status: %s\n", std::string(reports.status().message()).c_str());
    return absl::IsInvalidArgument(reports.status()) ? kExitUsage : kExitFailed;
  }
  const internal::ClusterTaskReport& asked = reports->front();
  const internal::ClusterTaskReport* ps0 = nullptr;
  for (const internal::ClusterTaskReport& r : *reports) {
    if (r.job_name == "ps" && r.task_index == 0 && r.reachable) ps0 = &r;
  }
  auto ms_or_never = [](int64_t ms) { return ms < 0 ? std::string("never") : absl::StrCat(ms); };
  for (const internal::ClusterTaskReport& r : *reports) {
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
    std::printf("%s\n", line.c_str());
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

}  // namespace

void AddClusterCommand(CLI::App& app, int* exit_code) {
  CLI::App* cluster = app.add_subcommand(
      "cluster", "Run a whole cluster on this machine (local), or ask a running cluster's task (status)");
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
  status->add_option("target", status_flags->target, "tcp://HOST:PORT or tls://HOST:PORT of a ps or worker task")
      ->required();
  status->add_option("--timeout-ms", status_flags->timeout_ms, "Bound on each connect and each question (ms)")
      ->transform(DecimalInt64());
  status->add_option("--heartbeat-ms", status_flags->heartbeat_ms, "As the cluster's --heartbeat-ms")
      ->transform(DecimalInt64());
  status->add_option("--connection-timeout-ms", status_flags->connection_timeout_ms,
                     "As the cluster's --connection-timeout-ms")
      ->transform(DecimalInt64());
  status->add_option("--tls-cert", status_flags->tls_cert, "This client's certificate (PEM), from the cluster's CA")
      ->transform(NonEmpty());
  status->add_option("--tls-key", status_flags->tls_key, "Its private key (PEM)")->transform(NonEmpty());
  status->add_option("--tls-ca", status_flags->tls_ca, "The cluster's CA certificate(s) (PEM)")
      ->transform(NonEmpty());
  status->callback([status_flags, exit_code] { *exit_code = RunStatus(*status_flags); });
}

}  // namespace foreman::cli
