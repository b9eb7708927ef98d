// Subprocess (platform/subprocess.hpp): fork/exec into an own process group,
// waits on a pidfd, kills of the group while its leader is unreaped.
#include "platform/subprocess.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "platform/errno_status.hpp"

extern char** environ;

namespace foreman::internal {
namespace {

// How long a SIGKILLed process may take to be gone.
constexpr int64_t kKillWaitMs = 5000;
// PATH when the child's environment sets none (glibc's confstr(_CS_PATH)).
constexpr char kDefaultPath[] = "/bin:/usr/bin";

// A descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// `fd` moved to a number >= 3 (the child's dup2 onto 0, 1 and 2 then never
// overwrites a source it still needs), close-on-exec; -1 (errno set) on an
// error. Takes ownership of `fd`.
int AboveStdio(int fd) {
  if (fd < 0 || fd > STDERR_FILENO) return fd;
  const int high = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  const int err = errno;
  close(fd);
  errno = err;
  return high;
}

std::chrono::steady_clock::time_point Deadline(int64_t timeout_ms) {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
}

// Microseconds until `deadline` (<= 0: passed).
int64_t MicrosLeft(std::chrono::steady_clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now()).count();
}

void SleepMicros(int64_t us) {
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>((us % 1000000) * 1000)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// Waits (polling, 1-10 ms apart) at most `timeout_ms` for group `pgid` to
// have no live process; true when it has none.
bool AwaitGroupGone(pid_t pgid, int64_t timeout_ms) {
  const auto deadline = Deadline(timeout_ms);
  int64_t step_us = 1000;
  while (ProcessGroupAlive(pgid)) {
    const int64_t left = MicrosLeft(deadline);
    if (left <= 0) return false;
    SleepMicros(std::min(left, step_us));
    step_us = std::min<int64_t>(step_us * 2, 10000);
  }
  return true;
}

// -- the child, between clone and exec: raw system calls only -------------------
//
// The child is made by the clone system call itself, not by libc's fork(),
// and makes only raw system calls until execve. Under a sanitizer, fork()
// and the libc wrappers below are intercepted: ThreadSanitizer's fork()
// starts its background thread again in the child (setns into a user
// namespace then fails with EINVAL: the caller must be single-threaded),
// and its _exit() runs its exit-time work, which flushed the parent's
// buffered stdout into the child's log. A raw system call is the same in
// every build, and the child touches nothing a lock of another thread could
// have held at the clone (no allocation, no stdio, no interceptor).

// Everything the child needs, prepared before the clone.
struct ChildPlan {
  const char* path = nullptr;  // what execve runs
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;  // -1: the same as stdout
  int ns_fd[2] = {-1, -1};
  int ns_type[2] = {0, 0};
  const char* ns_error[2] = {nullptr, nullptr};  // "foreman: cannot join ...: "
  const char* pgid_error = nullptr;
  const char* exec_error = nullptr;
  int death_signal = 0;
  pid_t parent = 0;
};

[[noreturn]] void ChildExit(int code) {
  for (;;) syscall(SYS_exit_group, code);
}

// The kernel's struct sigaction (rt_sigaction), which is not libc's.
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  std::uint64_t mask;
};
constexpr long kKernelSigsetBytes = sizeof(std::uint64_t);

// Writes `prefix`, errno `err`'s description and a newline to stderr as one
// write, then exits with `code`.
[[noreturn]] void ChildFail(const char* prefix, int err, int code) {
  char line[1024];
  std::size_t n = 0;
  const char* desc = strerrordesc_np(err);  // a table look-up: no lock, no allocation
  for (const char* part : {prefix, desc != nullptr ? desc : "unknown error", "\n"}) {
    for (const char* c = part; *c != '\0' && n < sizeof line; ++c) line[n++] = *c;
  }
  if (n == sizeof line) line[n - 1] = '\n';
  syscall(SYS_write, STDERR_FILENO, line, n);
  ChildExit(code);
}

// dup2 as a system call (aarch64 has only dup3, which refuses old == new).
bool ChildDup(int from, int to) {
  if (from == to) return syscall(SYS_fcntl, to, F_SETFD, 0) == 0;
  return syscall(SYS_dup3, from, to, 0) == to;
}

[[noreturn]] void RunChild(const ChildPlan& p) {
  // Descriptors first: the lines below go into the child's stderr.
  if (!ChildDup(p.stdin_fd, STDIN_FILENO) || !ChildDup(p.stdout_fd, STDOUT_FILENO) ||
      !ChildDup(p.stderr_fd >= 0 ? p.stderr_fd : STDOUT_FILENO, STDERR_FILENO)) {
    ChildExit(126);
  }
  if (syscall(SYS_setpgid, 0, 0) != 0) ChildFail(p.pgid_error, errno, 126);
  // Every signal at its default (the parent's handlers must not run here
  // once the mask is emptied, and an ignored signal would stay ignored
  // across exec); every signal is still blocked (Spawn blocked them).
  KernelSigaction dfl{};
  dfl.handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) syscall(SYS_rt_sigaction, sig, &dfl, nullptr, kKernelSigsetBytes);
  }
  // No descriptor but 0, 1 and 2 survives the exec (Linux >= 5.11; before,
  // only those opened with O_CLOEXEC are closed).
  syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
  for (int i = 0; i < 2; ++i) {
    if (p.ns_fd[i] >= 0 && syscall(SYS_setns, p.ns_fd[i], p.ns_type[i]) != 0) {
      ChildFail(p.ns_error[i], errno, 126);
    }
  }
  // After setns: a change of credentials would clear the death signal.
  if (p.death_signal != 0) {
    syscall(SYS_prctl, PR_SET_PDEATHSIG, p.death_signal, 0, 0, 0);
    if (syscall(SYS_getppid) != p.parent) ChildExit(128 + p.death_signal);  // it died before the prctl
  }
  const std::uint64_t none = 0;
  syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, nullptr, kKernelSigsetBytes);
  syscall(SYS_execve, p.path, p.argv, p.envp);
  ChildFail(p.exec_error, errno, 127);
}

// -- before the fork --------------------------------------------------------------

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

// A descriptor for `out` (>= 3, close-on-exec, ours to close); -1 in *fd for
// ChildOutput::Stdout().
Status OpenOutput(const ChildOutput& out, const char* field, UniqueFd* fd) {
  int raw = -1;
  switch (out.kind) {
    case ChildOutput::Kind::kDevNull:
      raw = open("/dev/null", O_WRONLY | O_CLOEXEC);
      if (raw < 0) return ErrnoError("open /dev/null", errno);
      break;
    case ChildOutput::Kind::kFile:
    case ChildOutput::Kind::kAppend: {
      if (out.path.empty() || HasNul(out.path)) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": an empty path or one with a NUL byte"));
      }
      const int mode = out.kind == ChildOutput::Kind::kFile ? O_TRUNC : O_APPEND;
      raw = open(out.path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | mode, 0644);
      if (raw < 0) return ErrnoError(absl::StrCat("cannot open ", out.path, " (", field, ")"), errno);
      break;
    }
    case ChildOutput::Kind::kFd:
      if (out.fd < 0 || fcntl(out.fd, F_GETFD) < 0) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": descriptor ", out.fd, " is not open"));
      }
      raw = fcntl(out.fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
      if (raw < 0) return ErrnoError(absl::StrCat("dup of descriptor ", out.fd, " (", field, ")"), errno);
      break;
    case ChildOutput::Kind::kStdout:
      if (std::string_view(field) == "stdout_to") {
        return absl::InvalidArgumentError("stdout_to: ChildOutput::Stdout() is for stderr_to only");
      }
      *fd = UniqueFd();
      return absl::OkStatus();
  }
  raw = AboveStdio(raw);
  if (raw < 0) return ErrnoError(absl::StrCat("fcntl F_DUPFD_CLOEXEC (", field, ")"), errno);
  *fd = UniqueFd(raw);
  return absl::OkStatus();
}

// `name` as execve needs it: itself when it has a '/', else the first
// executable regular file of that name on `path_var`.
StatusOr<std::string> ResolveProgram(const std::string& name, const std::string& path_var) {
  if (name.find('/') != std::string::npos) return name;
  for (absl::string_view dir : absl::StrSplit(path_var, ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    struct stat st {};
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return absl::NotFoundError(absl::StrCat("program '", name, "' not found on PATH (", path_var, ")"));
}

}  // namespace

// -- Subprocess -------------------------------------------------------------------

StatusOr<Subprocess> Subprocess::Spawn(const SpawnOptions& options) {
  // Arguments and environment.
  if (options.argv.empty()) return absl::InvalidArgumentError("SpawnOptions::argv is empty (argv[0] is required)");
  for (std::size_t i = 0; i < options.argv.size(); ++i) {
    if (HasNul(options.argv[i])) {
      return absl::InvalidArgumentError(absl::StrCat("SpawnOptions::argv[", i, "] contains a NUL byte"));
    }
  }
  std::set<std::string, std::less<>> names;
  std::string path_var;
  bool path_set = false;
  for (const auto& [name, value] : options.env) {
    if (name.empty() || name.find('=') != std::string::npos || HasNul(name) || HasNul(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SpawnOptions::env: '", name, "' is not a valid variable name (or its value has a NUL)"));
    }
    names.insert(name);
    if (name == "PATH") {
      path_var = value;
      path_set = true;
    }
  }
  if (options.parent_death_signal < 0 || options.parent_death_signal >= NSIG ||
      options.parent_death_signal == SIGSTOP) {
    return absl::InvalidArgumentError(
        absl::StrCat("SpawnOptions::parent_death_signal: ", options.parent_death_signal, " is not a signal"));
  }
  if (options.join_namespaces_of < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SpawnOptions::join_namespaces_of: ", options.join_namespaces_of, " is not a pid"));
  }
  std::vector<std::string> env_words;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    if (names.count(name) > 0) continue;
    if (!path_set && name == "PATH" && kv.size() > name.size()) {
      path_var = std::string(kv.substr(name.size() + 1));
      path_set = true;
    }
    env_words.emplace_back(kv);
  }
  for (const auto& [name, value] : options.env) env_words.push_back(absl::StrCat(name, "=", value));
  if (!path_set) path_var = kDefaultPath;
  FOREMAN_ASSIGN_OR_RETURN(
      const std::string path,
      ResolveProgram(options.program.empty() ? options.argv[0] : options.program, path_var));

  std::vector<std::string> argv_words = options.argv;
  std::vector<char*> argv, envp;
  for (std::string& w : argv_words) argv.push_back(w.data());
  argv.push_back(nullptr);
  for (std::string& w : env_words) envp.push_back(w.data());
  envp.push_back(nullptr);

  // Descriptors (all >= 3 and close-on-exec; ours close when this returns).
  UniqueFd in, out, err;
  {
    const int raw = AboveStdio(open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (raw < 0) return ErrnoError("open /dev/null", errno);
    in = UniqueFd(raw);
  }
  FOREMAN_RETURN_IF_ERROR(OpenOutput(options.stdout_to, "stdout_to", &out));
  FOREMAN_RETURN_IF_ERROR(OpenOutput(options.stderr_to, "stderr_to", &err));

  ChildPlan plan;
  // Namespaces: opened here, so that a holder that is gone is an error of
  // Spawn; one that is already ours is not joined (setns refuses to join
  // one's own user namespace).
  UniqueFd ns_fds[2];
  std::string ns_errors[2];
  if (options.join_namespaces_of > 0) {
    struct Ns {
      const char* file;
      int type;
      const char* what;
    };
    const Ns kinds[2] = {{"user", CLONE_NEWUSER, "user"}, {"net", CLONE_NEWNET, "network"}};
    for (int i = 0; i < 2; ++i) {
      const std::string file = absl::StrCat("/proc/", options.join_namespaces_of, "/ns/", kinds[i].file);
      const int raw = AboveStdio(open(file.c_str(), O_RDONLY | O_CLOEXEC));
      if (raw < 0) return ErrnoError(absl::StrCat("cannot open ", file, " (SpawnOptions::join_namespaces_of)"), errno);
      ns_fds[i] = UniqueFd(raw);
      struct stat theirs {}, ours {};
      const std::string own = absl::StrCat("/proc/self/ns/", kinds[i].file);
      if (fstat(raw, &theirs) == 0 && stat(own.c_str(), &ours) == 0 && theirs.st_dev == ours.st_dev &&
          theirs.st_ino == ours.st_ino) {
        continue;  // already there
      }
      ns_errors[i] =
          absl::StrCat("foreman: cannot join the ", kinds[i].what, " namespace of process ", options.join_namespaces_of, ": ");
      plan.ns_fd[i] = raw;
      plan.ns_type[i] = kinds[i].type;
      plan.ns_error[i] = ns_errors[i].c_str();
    }
  }
  const std::string exec_error = absl::StrCat("foreman: cannot execute ", path, ": ");
  const std::string pgid_error = "foreman: cannot make its own process group: ";
  plan.path = path.c_str();
  plan.argv = argv.data();
  plan.envp = envp.data();
  plan.stdin_fd = in.get();
  plan.stdout_fd = out.get();
  plan.stderr_fd = err.get();
  plan.pgid_error = pgid_error.c_str();
  plan.exec_error = exec_error.c_str();
  plan.death_signal = options.parent_death_signal;
  plan.parent = getpid();

  // Every signal blocked across the fork: no handler of ours runs in the
  // child before it has reset them (the child unblocks just before exec).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  // fork() as the system call (see "the child" above): SIGCHLD at its
  // exit, a copy of this thread's address space and stack.
  const pid_t pid = static_cast<pid_t>(syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0));
  if (pid == 0) RunChild(plan);
  const int fork_errno = errno;
  if (pid > 0) setpgid(pid, pid);  // also here: a kill of the group right after Spawn reaches the child
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) return ErrnoError("fork", fork_errno);
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));  // -1: Wait polls
  return Subprocess(pid, pidfd);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      pidfd_(std::exchange(other.pidfd_, -1)),
      sigkilled_group_(std::exchange(other.sigkilled_group_, false)),
      exit_(std::exchange(other.exit_, std::nullopt)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Discard();
    pid_ = std::exchange(other.pid_, -1);
    pidfd_ = std::exchange(other.pidfd_, -1);
    sigkilled_group_ = std::exchange(other.sigkilled_group_, false);
    exit_ = std::exchange(other.exit_, std::nullopt);
  }
  return *this;
}

Subprocess::~Subprocess() { Discard(); }

void Subprocess::Discard() noexcept {
  if (pid_ > 0 && !exit_.has_value()) {
    kill(-pid_, SIGKILL);
    sigkilled_group_ = true;
    Wait(kKillWaitMs).IgnoreError();  // reaps; a leader stuck past it stays a zombie
  }
  if (pidfd_ >= 0) close(pidfd_);
  pid_ = -1;
  pidfd_ = -1;
  sigkilled_group_ = false;
  exit_.reset();
}

StatusOr<std::optional<ExitStatus>> Subprocess::Poll() { return Wait(0); }

StatusOr<std::optional<ExitStatus>> Subprocess::Wait(int64_t timeout_ms) {
  if (pid_ < 0) return absl::FailedPreconditionError("Subprocess: owns no process");
  if (timeout_ms < 0) return absl::InvalidArgumentError(absl::StrCat("timeout_ms must be >= 0, got ", timeout_ms));
  if (exit_.has_value()) return exit_;
  FOREMAN_ASSIGN_OR_RETURN(const bool ended, AwaitChildExit(pid_, pidfd_, timeout_ms));
  if (!ended) return std::optional<ExitStatus>();
  FOREMAN_ASSIGN_OR_RETURN(ExitStatus status, Reap());
  exit_ = status;
  if (pidfd_ >= 0) close(pidfd_);
  pidfd_ = -1;
  return exit_;
}

StatusOr<ExitStatus> Subprocess::Reap() {
  // The leader has ended but is not reaped: its pid, the group's id, is
  // still taken, so the kill below cannot reach another group.
  ExitStatus status;
  if (ProcessGroupAlive(pid_)) {
    status.left_processes = !sigkilled_group_;
    kill(-pid_, SIGKILL);
    AwaitGroupGone(pid_, kKillWaitMs);
  }
  int wstatus = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &wstatus, 0);  // a zombie: returns at once
  } while (r < 0 && errno == EINTR);
  if (r != pid_) {
    const int err = errno;
    if (err == ECHILD) {
      return absl::FailedPreconditionError(absl::StrCat("process ", pid_, " was reaped elsewhere (waitpid: ",
                                                        std::strerror(err), ")"));
    }
    return ErrnoError(absl::StrCat("waitpid ", pid_), err);
  }
  if (WIFEXITED(wstatus)) {
    status.exit_code = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    status.term_signal = WTERMSIG(wstatus);
    status.exit_code = 128 + status.term_signal;
  }
  return status;
}

StatusOr<FinishResult> Subprocess::Finish(int64_t timeout_ms) {
  FinishResult result;
  FOREMAN_ASSIGN_OR_RETURN(std::optional<ExitStatus> status, Wait(timeout_ms));
  if (!status.has_value()) {
    result.timed_out = true;
    FOREMAN_RETURN_IF_ERROR(KillGroup(SIGKILL));
    FOREMAN_ASSIGN_OR_RETURN(status, Wait(kKillWaitMs));
    if (!status.has_value()) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid_, " did not end within ", kKillWaitMs, " ms of its SIGKILL"));
    }
  }
  result.exit = *status;
  return result;
}

Status Subprocess::Signal(int sig) {
  if (pid_ < 0) return absl::FailedPreconditionError("Subprocess: owns no process");
  if (sig <= 0 || sig >= NSIG) return absl::InvalidArgumentError(absl::StrCat(sig, " is not a signal"));
  if (exit_.has_value()) return absl::OkStatus();
  if (kill(pid_, sig) != 0) return ErrnoError(absl::StrCat("kill ", pid_), errno);
  return absl::OkStatus();
}

Status Subprocess::KillGroup(int sig) {
  if (pid_ < 0) return absl::FailedPreconditionError("Subprocess: owns no process");
  if (sig <= 0 || sig >= NSIG) return absl::InvalidArgumentError(absl::StrCat(sig, " is not a signal"));
  if (exit_.has_value()) return absl::OkStatus();
  if (kill(-pid_, sig) != 0) return ErrnoError(absl::StrCat("kill -", pid_), errno);
  if (sig == SIGKILL) sigkilled_group_ = true;
  return absl::OkStatus();
}

pid_t Subprocess::Release() {
  const pid_t pid = pid_;
  if (pidfd_ >= 0) close(pidfd_);
  pid_ = -1;
  pidfd_ = -1;
  sigkilled_group_ = false;
  exit_.reset();
  return pid;
}

// -- free functions ---------------------------------------------------------------

StatusOr<bool> AwaitChildExit(pid_t pid, int pidfd, int64_t timeout_ms) {
  if (timeout_ms < 0) return absl::InvalidArgumentError(absl::StrCat("timeout_ms must be >= 0, got ", timeout_ms));
  const auto deadline = Deadline(timeout_ms);
  int64_t step_us = 1000;
  while (true) {
    siginfo_t info;
    std::memset(&info, 0, sizeof info);
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == ECHILD) {
        return absl::FailedPreconditionError(
            absl::StrCat("process ", pid, " is not an unreaped child of this process (waitid: ", std::strerror(err), ")"));
      }
      return ErrnoError(absl::StrCat("waitid ", pid), err);
    }
    if (info.si_pid == pid) return true;
    const int64_t left_us = MicrosLeft(deadline);
    if (left_us <= 0) return false;
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      const int64_t left_ms = std::min<int64_t>((left_us + 999) / 1000, INT_MAX);
      if (poll(&p, 1, static_cast<int>(left_ms)) < 0 && errno != EINTR) {
        return ErrnoError(absl::StrCat("poll on the pidfd of process ", pid), errno);
      }
    } else {
      SleepMicros(std::min(left_us, step_us));
      step_us = std::min<int64_t>(step_us * 2, 10000);
    }
  }
}

bool ProcessGroupAlive(pid_t pgid) {
  if (pgid <= 0) return false;
  if (kill(-pgid, 0) != 0 && errno == ESRCH) return false;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return true;  // kill() saw a member
  bool alive = false;
  while (!alive) {
    const dirent* entry = readdir(proc);
    if (entry == nullptr) break;
    int pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid) || pid <= 0) continue;
    const std::string stat_path = absl::StrCat("/proc/", pid, "/stat");
    const int fd = open(stat_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // gone meanwhile
    char buf[1024];
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) continue;
    // "pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt
    // majflt cmajflt utime stime cutime cstime priority nice num_threads ..."
    // (proc(5)); comm may hold spaces and parentheses: fields follow the
    // last ')'.
    const absl::string_view line(buf, static_cast<std::size_t>(n));
    const std::size_t close_paren = line.rfind(')');
    if (close_paren == absl::string_view::npos) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line.substr(close_paren + 1), ' ', absl::SkipEmpty());
    if (fields.size() < 18) continue;
    int group = 0;
    int64_t threads = 0;
    if (!absl::SimpleAtoi(fields[2], &group) || group != pgid) continue;
    const char state = fields[0].empty() ? '?' : fields[0][0];
    const bool dead = state == 'Z' || state == 'X';
    alive = !dead || (absl::SimpleAtoi(fields[17], &threads) && threads > 1);
  }
  closedir(proc);
  return alive;
}

}  // namespace foreman::internal
