// RunLocalCluster (foreman/local_cluster.hpp): `foreman cluster local`'s
// tasks as child processes (platform/subprocess.hpp), their output read
// through pipes, the user's signals taken from a signalfd, all in one poll
// loop on the calling thread.
#include "foreman/local_cluster.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/local_ports.hpp"
#include "platform/subprocess.hpp"

namespace foreman {
namespace {

using Clock = std::chrono::steady_clock;

struct Task {
  std::string name;  // "ps 0", "worker 1"
  internal::Subprocess process;
  int out = -1, err = -1;        // read ends of its stdout / stderr pipes
  std::string out_buf, err_buf;  // partial lines
  bool exited = false;
  int code = 0;  // exit code, or 128 + signal
};

// The caller's callbacks, empty ones dropping what they get.
class Sinks {
 public:
  explicit Sinks(const LocalClusterOptions& o) : options_(o) {}
  void Message(std::string_view m) const {
    if (options_.on_message) options_.on_message(m);
  }
  void Line(const Task& t, bool is_stderr, std::string_view line) const {
    if (options_.on_task_line) options_.on_task_line(t.name, is_stderr, line);
  }

 private:
  const LocalClusterOptions& options_;
};

// Hands every complete line of `buf` on; keeps the rest (all of it at `eof`).
void FlushLines(const Sinks& sinks, const Task& t, bool is_stderr, std::string& buf, bool eof) {
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    sinks.Line(t, is_stderr, std::string_view(buf).substr(start, nl - start));
    start = nl + 1;
  }
  buf.erase(0, start);
  if (eof && !buf.empty()) {
    sinks.Line(t, is_stderr, buf);
    buf.clear();
  }
}

// Reads what is there on `fd` into `buf`; at EOF closes it (fd = -1).
void Drain(const Sinks& sinks, Task& t, bool is_stderr) {
  int& fd = is_stderr ? t.err : t.out;
  std::string& buf = is_stderr ? t.err_buf : t.out_buf;
  char chunk[4096];
  for (;;) {
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n > 0) {
      buf.append(chunk, static_cast<std::size_t>(n));
      FlushLines(sinks, t, is_stderr, buf, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    FlushLines(sinks, t, is_stderr, buf, true);
    close(fd);
    fd = -1;
    return;
  }
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

Status CheckOptions(const LocalClusterOptions& o) {
  if (o.num_ps < 1 || o.num_ps > 64) {
    return absl::InvalidArgumentError(absl::StrCat("LocalClusterOptions.num_ps must be in [1, 64], got ", o.num_ps));
  }
  if (o.num_workers < 1 || o.num_workers > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalClusterOptions.num_workers must be in [1, 64], got ", o.num_workers));
  }
  if (o.end_grace_secs < 0 || o.end_grace_secs > 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalClusterOptions.end_grace_secs must be in [0, 86400], got ", o.end_grace_secs));
  }
  if (o.program.empty()) return absl::InvalidArgumentError("LocalClusterOptions.program is empty");
  return absl::OkStatus();
}

// Starts task `name` with `args` after "train", its output into new pipes.
StatusOr<Task> StartTask(const LocalClusterOptions& o, std::string name, const std::vector<std::string>& args) {
  Task t;
  t.name = std::move(name);
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::UnavailableError(absl::StrCat("pipe(): ", std::strerror(errno)));
  if (pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    close(out[0]);
    close(out[1]);
    return absl::UnavailableError(absl::StrCat("pipe(): ", std::strerror(e)));
  }
  internal::SpawnOptions spawn;
  spawn.program = o.program;
  spawn.argv = {"foreman", "train"};
  spawn.argv.insert(spawn.argv.end(), o.train_flags.begin(), o.train_flags.end());
  spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
  spawn.stdout_to = internal::ChildOutput::Fd(out[1]);
  spawn.stderr_to = internal::ChildOutput::Fd(err[1]);
  // This process killed (even SIGKILL): its tasks get a SIGTERM, not orphaned.
  spawn.parent_death_signal = SIGTERM;
  StatusOr<internal::Subprocess> process = internal::Subprocess::Spawn(spawn);
  close(out[1]);
  close(err[1]);
  if (!process.ok()) {
    close(out[0]);
    close(err[0]);
    return process.status();
  }
  t.process = *std::move(process);
  t.out = out[0];
  t.err = err[0];
  fcntl(t.out, F_SETFL, O_NONBLOCK);
  fcntl(t.err, F_SETFL, O_NONBLOCK);
  return t;
}

// The run's state between the start and the last exit.
class Run {
 public:
  Run(const LocalClusterOptions& o, const Sinks& sinks, int sfd) : o_(o), sinks_(sinks), sfd_(sfd) {}

  // Starts the ps tasks, then the chief and the other workers.
  void Start(const std::string& ps_flag, const std::string& worker_flag) {
    for (int i = 0; i < o_.num_ps + o_.num_workers && started_.ok(); ++i) {
      const bool is_ps = i < o_.num_ps;
      const int index = is_ps ? i : i - o_.num_ps;
      std::vector<std::string> args = {"--ps-hosts", ps_flag, "--worker-hosts", worker_flag, "--job-name",
                                       is_ps ? "ps" : "worker", "--task-index", std::to_string(index)};
      // The user's signal to `cluster local` ends the whole job (a signal
      // to a chief started without it is an eviction: training goes on).
      if (!is_ps && index == 0) args.push_back("--signal-ends-training");
      StatusOr<Task> t = StartTask(o_, absl::StrCat(is_ps ? "ps " : "worker ", index), args);
      if (!t.ok()) {
        started_ = t.status();
        break;
      }
      tasks_.push_back(*std::move(t));
    }
    chief_ = tasks_.size() > static_cast<std::size_t>(o_.num_ps) ? static_cast<int>(o_.num_ps) : -1;
    if (!started_.ok()) sinks_.Message(absl::StrCat("cannot start the tasks: ", started_.message()));
    if (chief_ < 0) SetOthersDeadline(Clock::now());
  }

  // Until every task has exited and its pipes are at EOF.
  void Loop() {
    while (!AllDone()) {
      ReadOutput();
      TakeSignals();
      Reap();
      Escalate();
    }
  }

  LocalClusterResult Result() const {
    LocalClusterResult r;
    std::vector<std::string> summary;
    for (const Task& t : tasks_) {
      summary.push_back(absl::StrCat(t.name, " ", t.code));
      r.task_exit_codes.emplace_back(t.name, t.code);
    }
    sinks_.Message(absl::StrCat("exit codes: ", absl::StrJoin(summary, ", ")));
    if (!started_.ok() || chief_ < 0) {
      r.exit_code = 1;
    } else if (ended_by_signal_ != 0 && tasks_[chief_].code != 0) {
      // The user's second signal ended every task at once (the chief then
      // fails on its lost ps): the exit says so, as a second signal to
      // `foreman train` does.
      r.exit_code = 128 + ended_by_signal_;
    } else {
      r.exit_code = tasks_[chief_].code;
    }
    return r;
  }

 private:
  bool AllDone() const {
    for (const Task& t : tasks_) {
      if (!t.exited || t.out >= 0 || t.err >= 0) return false;
    }
    return true;
  }

  void SignalAll(int sig) {
    for (Task& t : tasks_) {
      if (!t.exited) t.process.Signal(sig).IgnoreError();
    }
  }

  void ReadOutput() {
    std::vector<pollfd> fds;
    fds.push_back({sfd_, POLLIN, 0});
    std::vector<std::pair<Task*, bool>> owners;  // (task, stderr?)
    for (Task& t : tasks_) {
      if (t.out >= 0) fds.push_back({t.out, POLLIN, 0}), owners.push_back({&t, false});
      if (t.err >= 0) fds.push_back({t.err, POLLIN, 0}), owners.push_back({&t, true});
    }
    poll(fds.data(), fds.size(), /*timeout ms=*/200);
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) Drain(sinks_, *owners[i - 1].first, owners[i - 1].second);
    }
  }

  void TakeSignals() {
    signalfd_siginfo info;
    while (read(sfd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;
      ++signals_;
      if (signals_ == 1 && chief_ >= 0 && !tasks_[chief_].exited) {
        sinks_.Message(absl::StrCat(SignalName(sig),
                                    " received: forwarded to the chief (worker 0), which ends the run (a second "
                                    "signal goes to every task, a third kills them)"));
        tasks_[chief_].process.Signal(sig).IgnoreError();
      } else if (signals_ <= 2) {
        sinks_.Message(absl::StrCat(SignalName(sig), " received: forwarded to every task"));
        SignalAll(sig);
        ended_by_signal_ = sig;
      } else {
        sinks_.Message(absl::StrCat(SignalName(sig), " received again: killing every task"));
        for (Task& t : tasks_) {
          if (!t.exited) t.process.KillGroup(SIGKILL).IgnoreError();
        }
      }
    }
  }

  void Reap() {
    for (std::size_t i = 0; i < tasks_.size(); ++i) {
      Task& t = tasks_[i];
      if (t.exited) continue;
      StatusOr<std::optional<internal::ExitStatus>> polled = t.process.Poll();
      if (!polled.ok()) {
        // Reaped elsewhere: its code is unknown.
        t.exited = true;
        t.code = 1;
      } else if (polled->has_value()) {
        t.exited = true;
        t.code = (*polled)->exit_code;
      } else {
        continue;
      }
      if (static_cast<int>(i) == chief_) {
        sinks_.Message(absl::StrCat("the chief exited ", t.code, "; waiting up to ", o_.end_grace_secs,
                                    "s for the others"));
        SetOthersDeadline(Clock::now() + std::chrono::seconds(o_.end_grace_secs));
      }
    }
  }

  // After the chief's exit (or a failed start): SIGTERM at the deadline,
  // SIGKILL 5 s later.
  void Escalate() {
    if (!has_others_deadline_ || Clock::now() < others_deadline_ || escalation_ >= 2) return;
    std::vector<std::string> names;
    for (const Task& t : tasks_) {
      if (!t.exited) names.push_back(t.name);
    }
    if (names.empty()) return;
    sinks_.Message(absl::StrCat("still running after the chief's exit: ", absl::StrJoin(names, ", "), "; sending ",
                                escalation_ == 0 ? "SIGTERM" : "SIGKILL"));
    for (Task& t : tasks_) {
      if (t.exited) continue;
      // SIGKILL to the task's whole group: a child of it that outlives the
      // task would hold its pipes open (and the loop waits for their EOF).
      (escalation_ == 0 ? t.process.Signal(SIGTERM) : t.process.KillGroup(SIGKILL)).IgnoreError();
    }
    ++escalation_;
    SetOthersDeadline(Clock::now() + std::chrono::seconds(5));
  }

  const LocalClusterOptions& o_;
  const Sinks& sinks_;
  const int sfd_;
  std::vector<Task> tasks_;
  Status started_;
  int chief_ = -1;  // index into tasks_, -1 when the chief was not started
  int signals_ = 0;
  int ended_by_signal_ = 0;  // a signal that went to every task (the run ends at once)
  // After the chief's exit (or a failed start): the others' deadline, and
  // what was already sent (0 nothing, 1 SIGTERM, 2 SIGKILL).
  void SetOthersDeadline(Clock::time_point t) {
    others_deadline_ = t;
    has_others_deadline_ = true;
  }
  // Not std::optional: GCC 12 at -O2 under -fsanitize=thread warns that its
  // payload may be used uninitialized (-Werror).
  bool has_others_deadline_ = false;
  Clock::time_point others_deadline_{};
  int escalation_ = 0;
};

}  // namespace

StatusOr<LocalClusterResult> RunLocalCluster(const LocalClusterOptions& options) {
  FOREMAN_RETURN_IF_ERROR(CheckOptions(options));
  const int ps = options.num_ps;
  const int workers = options.num_workers;
  FOREMAN_ASSIGN_OR_RETURN(std::vector<int> ports, internal::FreeLoopbackPorts(ps + workers));
  std::vector<std::string> ps_hosts, worker_hosts;
  for (int i = 0; i < ps; ++i) ps_hosts.push_back(absl::StrCat("127.0.0.1:", ports[i]));
  for (int i = 0; i < workers; ++i) worker_hosts.push_back(absl::StrCat("127.0.0.1:", ports[ps + i]));
  const std::string ps_flag = absl::StrJoin(ps_hosts, ",");
  const std::string worker_flag = absl::StrJoin(worker_hosts, ",");

  // Signals: taken from a signalfd in the loop.
  sigset_t set, old_mask;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &set, &old_mask);
  const int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    const int e = errno;
    pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    return absl::InternalError(absl::StrCat("signalfd(): ", std::strerror(e)));
  }
  const Sinks sinks(options);
  sinks.Message(absl::StrCat(ps, " ps task(s) at ", ps_flag, "; ", workers, " worker(s) at ", worker_flag,
                             " (worker 0 is the chief)"));
  LocalClusterResult result;
  {
    Run run(options, sinks, sfd);
    run.Start(ps_flag, worker_flag);
    run.Loop();
    result = run.Result();
  }
  close(sfd);
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return result;
}

}  // namespace foreman
