// Child processes: spawn a program into its own process group, wait for it
// with a timeout, kill its group (internal; not installed; CAF-free).
//
// One helper for every process Foreman starts (`foreman chaos`'s train
// runs, the tasks and `ip`/`unshare` helpers of `foreman chaos --preset
// cluster`, the tasks of `foreman cluster local`). A child started by
// Subprocess::Spawn():
//   - runs `argv` with `program` (a path, or a name looked up on PATH before
//     the fork), in this process's environment plus SpawnOptions::env;
//   - is the leader of a new process group (pgid == pid, set by the child
//     and by the parent before Spawn returns: a KillGroup right after Spawn
//     reaches it), so a terminal's Ctrl-C reaches only the parent, and a
//     kill of the group reaches whatever the child started;
//   - reads stdin from /dev/null; writes stdout and stderr where
//     ChildOutput says (a file, created or truncated or appended to;
//     /dev/null; a descriptor such as a pipe); keeps no other descriptor
//     (every descriptor >= 3 is closed at exec, also ones another thread
//     opened without O_CLOEXEC; Linux >= 5.11, before that only the
//     O_CLOEXEC ones are);
//   - starts its program with no signal blocked and every signal at
//     SIG_DFL (also those this process ignores: SIGINT, SIGTERM, SIGHUP,
//     SIGPIPE, ...), whatever this process's mask and handlers are;
//   - optionally joins the user and network namespaces of another process
//     first (SpawnOptions::join_namespaces_of).
// A child that cannot be set up exits before its program runs, after
// writing one line to its stderr (the log) that names the cause:
//   127  "foreman: cannot execute <program>: <strerror>" (execve failed)
//   126  "foreman: cannot join the <user|network> namespace of process <pid>:
//        <strerror>", or "foreman: cannot make its own process group: ..."
//
// The parent-death rule (SpawnOptions::parent_death_signal, default SIGKILL).
// The child is started with PR_SET_PDEATHSIG = that signal, so when its
// parent dies -- in any way: exit, a crash, SIGKILL -- the kernel sends the
// signal to the child. A parent that died between fork() and the prctl()
// is caught by comparing getppid() with the pid the parent had before the
// fork: the child then exits 128 + the signal without running its program.
//   SIGKILL  the child ends at once, wherever it is (a train job loses the
//            steps since its last checkpoint, as under any SIGKILL). The
//            default: no orphan runs on.
//   SIGTERM  the child is asked to stop and may take its time (foreman
//            train stops at a step boundary and saves its final checkpoint);
//            it then runs without a parent: nobody reaps it or reads its
//            pipes (a write to a pipe whose reader is gone gets SIGPIPE).
//   0        nothing happens: the child outlives its parent.
// What it does NOT do:
//   - The signal goes to the child alone, not to its process group: what
//     the child started itself is orphaned (reparented to init, or to the
//     nearest PR_SET_CHILD_SUBREAPER) and goes on running unless it set a
//     death signal of its own. (foreman train starts no processes.)
//   - "Parent" is the *thread* that called Spawn: the signal fires when that
//     thread exits, even though the process lives on. Call Spawn from a
//     thread that lives as long as the child should (the main thread, or a
//     supervisor thread that outlives its children) -- never from a
//     short-lived thread or a pool's worker that may be retired.
//   - The kernel clears the death signal when the child later execs a
//     set-user-ID / set-group-ID / file-capability program or changes its
//     credentials; such a program is not covered.
//   - Destructors do not run when the parent is killed (SIGKILL, _exit, a
//     crash): a Subprocess's destructor is no substitute for the death
//     signal, and the death signal is no substitute for the destructor (an
//     error path that returns early must not leave children running: the
//     destructor kills the group).
//
// Ownership. A Subprocess owns its child: its destructor (and a move
// assignment over it) kills the whole group with SIGKILL and reaps the
// leader unless the child was already reaped or Release()d, so no error path
// leaks a process. When the leader ends, Poll/Wait/Finish reap it; before the
// reap, any process still alive in its group (a grandchild that outlived it)
// is killed with SIGKILL and reported (ExitStatus::left_processes), and the
// reap waits (up to 5000 ms) until none is left alive. Every kill happens
// while the leader is not yet reaped, so its pid -- which is the group id --
// cannot have been reused by another process. Processes that left the group
// themselves (setsid, setpgid) are out of reach.
//
// Threads. Spawn may be called from any thread, also while other threads
// run (a CAF actor system, a thread pool): the child is made by the clone
// system call (fork's semantics: it copies only the calling thread), and
// between clone and exec it makes only raw system calls -- no libc wrapper a
// sanitizer intercepts, so the child behaves the same in every build
// (everything -- argv, envp, paths, descriptors -- is prepared before the
// clone; the child allocates nothing and takes no lock, so a lock another
// thread held at the clone cannot deadlock it). libc's pthread_atfork
// handlers do not run. The calling thread
// has every signal blocked for the fork's duration (its mask is restored
// before Spawn returns), so none of this process's handlers runs in the
// child before it has reset them. Spawn reads `environ` before the fork: a
// concurrent setenv()/putenv() is not safe (it never is). One Subprocess is
// used by one thread at a time. Do not let anything else reap the child
// (waitpid(-1, ...), SIGCHLD set to SIG_IGN): Poll/Wait then fail with
// FAILED_PRECONDITION.
//
// The three uses. Their death signals today: none for `foreman chaos`'s
// train runs (parent_death_signal = 0 keeps that; the default SIGKILL ends
// them with a killed `foreman chaos`), SIGKILL for the chaos cluster's
// tasks and helpers, SIGTERM for `foreman cluster local`'s tasks.
//
// ```cpp
// // `foreman chaos`: one train run under a timeout, output into its log.
// internal::SpawnOptions o;
// o.program = "/proc/self/exe";  // this program again
// o.argv = {"foreman", "train", "--checkpoint-dir", run_dir};
// o.stdout_to = internal::ChildOutput::File(log_path);  // stderr: the same file
// FOREMAN_ASSIGN_OR_RETURN(internal::Subprocess child, internal::Subprocess::Spawn(o));
// g_child_pgid = child.pid();  // for a signal handler's kill(-pgid, SIGKILL)
// FOREMAN_ASSIGN_OR_RETURN(internal::FinishResult r, child.Finish(timeout_ms));
// // r.exit.exit_code (137 after the timeout's SIGKILL), r.timed_out, r.exit.left_processes
//
// // `foreman chaos --preset cluster`: `ip` (on PATH) inside a holder's namespaces.
// o = internal::SpawnOptions();
// o.argv = {"ip", "link", "set", "lo", "up"};
// o.join_namespaces_of = holder_pid;
// // ... Spawn, then Finish(5000); a task: Poll() in the supervision loop,
// // a planned kill: KillGroup(SIGKILL), then Wait(timeout_ms).
//
// // `foreman cluster local`: a task whose output goes through pipes.
// o = internal::SpawnOptions();
// o.program = "/proc/self/exe";
// o.argv = {"foreman", "train", "--job-name", "worker", "--task-index", "0"};
// o.stdout_to = internal::ChildOutput::Fd(out_pipe[1]);  // the caller closes its copy after Spawn
// o.stderr_to = internal::ChildOutput::Fd(err_pipe[1]);
// o.parent_death_signal = SIGTERM;  // the tasks stop gracefully if cluster local dies
// // ... Spawn; Signal(SIGINT) forwards a Ctrl-C to the chief alone; Poll() in the loop.
// ```
#pragma once

#include <sys/types.h>

#include <csignal>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "foreman/status.hpp"

namespace foreman::internal {

/// Where a child's stdout or stderr goes. A value; the factories below make
/// every kind.
struct ChildOutput {
  enum class Kind {
    kDevNull,  // /dev/null
    kFile,     // `path`, created (mode 0644 less the umask) or truncated
    kAppend,   // `path`, created or appended to (O_APPEND)
    kFd,       // a duplicate of `fd`
    kStdout,   // stderr only: the same open file as stdout (2>&1)
  };
  Kind kind = Kind::kDevNull;
  std::string path;  // kFile, kAppend
  int fd = -1;       // kFd

  static ChildOutput DevNull() { return {}; }
  static ChildOutput File(std::string path) { return {Kind::kFile, std::move(path), -1}; }
  static ChildOutput Append(std::string path) { return {Kind::kAppend, std::move(path), -1}; }
  /// `fd` (e.g. a pipe's write end) stays the caller's: Spawn duplicates it
  /// into the child and never closes it. Open it with O_CLOEXEC, and close
  /// the parent's copy after Spawn, so that the reader sees EOF when the
  /// child ends.
  static ChildOutput Fd(int fd) { return {Kind::kFd, "", fd}; }
  static ChildOutput Stdout() { return {Kind::kStdout, "", -1}; }
};

/// What to start and how. Paths relative to this process's working
/// directory, which the child shares.
struct SpawnOptions {
  /// The argument vector, argv[0] first (what the program sees as its
  /// name). REQUIRES: not empty, no word contains a NUL byte.
  std::vector<std::string> argv;
  /// The program to execute: a path with a '/' ("/proc/self/exe": this
  /// program again) is used as it is; a name without '/' is looked up on
  /// the child's PATH (this process's, or SpawnOptions::env's when that sets
  /// PATH; "/bin:/usr/bin" when none is set; empty entries skipped): the
  /// first regular file there that this process may execute. Empty:
  /// argv[0], the same way.
  std::string program;
  /// Variables set in the child's environment, after this process's
  /// environment (a name given here replaces that variable). REQUIRES: names
  /// non-empty, without '=' or NUL; values without NUL.
  std::vector<std::pair<std::string, std::string>> env;
  /// stdout; stderr defaults to the same open file (2>&1), so the two
  /// streams interleave in the order the child wrote them.
  ChildOutput stdout_to = ChildOutput::DevNull();
  ChildOutput stderr_to = ChildOutput::Stdout();
  /// The signal the child gets when the thread that called Spawn dies (the
  /// rule at the top of this file); 0: none. REQUIRES: 0 or a valid signal.
  int parent_death_signal = SIGKILL;
  /// > 0: before exec the child joins the user namespace (unless it is
  /// already this process's) and then the network namespace of this
  /// process, e.g. a holder that `unshare -rn` started. 0: it stays in ours.
  pid_t join_namespaces_of = 0;
};

/// How a child ended, as a shell reports it.
struct ExitStatus {
  /// The exit status (0-255), or 128 + term_signal when a signal ended it
  /// (137: SIGKILL, 143: SIGTERM).
  int exit_code = 0;
  /// The signal that ended it; 0 when it exited.
  int term_signal = 0;
  /// When it ended, other processes of its group were still alive (a
  /// grandchild that outlived it): they were killed with SIGKILL. False when
  /// this Subprocess had itself sent SIGKILL to the group (KillGroup,
  /// Finish's timeout): everything there was being killed anyway.
  bool left_processes = false;
};

/// Finish()'s result.
struct FinishResult {
  ExitStatus exit;
  /// It did not end within the timeout: its group was killed (SIGKILL),
  /// `exit` is then that kill's (exit_code 137).
  bool timed_out = false;
};

/// An owned child process (the leader of its own process group). Move-only.
/// Not thread-safe: one thread at a time (pid() may be copied for a signal
/// handler).
class Subprocess {
 public:
  /// Starts `options.argv` as the top of this file describes; returns once
  /// the child is in its own group (it may not have exec'd yet: exec
  /// failures show as exit 127, see the top of this file).
  /// Errors: INVALID_ARGUMENT for options that break a REQUIRES above (the
  /// field named); NOT_FOUND for a program name not on PATH (the PATH named);
  /// opening an output file or the namespace holder's /proc/<pid>/ns files,
  /// and fork(), map errno as Env does (ENOENT NOT_FOUND, EACCES/EPERM
  /// PERMISSION_DENIED, any other INTERNAL), the message naming the call or
  /// file and strerror. Thread-safety: see the top of this file.
  static StatusOr<Subprocess> Spawn(const SpawnOptions& options);

  /// Owns nothing.
  Subprocess() = default;
  Subprocess(Subprocess&& other) noexcept;
  /// Kills and reaps what this owned first (as the destructor does).
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  /// Unless reaped or released: SIGKILL to the group, then reaps the leader
  /// (and waits for the group's other processes to die), each wait at most
  /// 5000 ms; a leader stuck past that (uninterruptible sleep) is left a
  /// zombie.
  ~Subprocess();

  /// The child's pid, which is also its process group id; -1 when this owns
  /// nothing (default-constructed, moved from, released).
  pid_t pid() const { return pid_; }
  /// How it ended, once reaped; nullopt before.
  const std::optional<ExitStatus>& exit_status() const { return exit_; }

  /// Does not block: reaps the child if it has ended (the leftover kill at
  /// the top of this file included) and returns how it ended; nullopt while
  /// it runs. Once reaped, returns the same ExitStatus again.
  /// Errors: FAILED_PRECONDITION when this owns nothing, or when the child
  /// was reaped elsewhere (ECHILD); INTERNAL for another waitid() error.
  StatusOr<std::optional<ExitStatus>> Poll();
  /// As Poll(), waiting at most `timeout_ms` (>= 0; 0: Poll) for the end:
  /// on a pidfd (poll(2)), or, where pidfd_open(2) is unavailable (Linux <
  /// 5.3, no descriptor left), polling every 1-10 ms. nullopt: still running
  /// at the timeout. Extra error: INVALID_ARGUMENT for a negative timeout.
  StatusOr<std::optional<ExitStatus>> Wait(int64_t timeout_ms);
  /// Waits at most `timeout_ms` (>= 0) for the end; past it, kills the
  /// group with SIGKILL and reaps the leader (timed_out). Errors as Wait(),
  /// and DEADLINE_EXCEEDED when the leader is not gone 5000 ms after the
  /// SIGKILL (still owned: the destructor tries again).
  StatusOr<FinishResult> Finish(int64_t timeout_ms);

  /// Sends `sig` to the child alone (not its group), e.g. to forward a
  /// Ctrl-C. After the reap, does nothing and returns OK (its pid may name
  /// another process by then). Errors: FAILED_PRECONDITION when this owns
  /// nothing; INVALID_ARGUMENT for an invalid signal; kill(2)'s errno as Env
  /// maps it otherwise.
  Status Signal(int sig);
  /// Sends `sig` (default SIGKILL) to every process of the child's group.
  /// Returns at once; Wait() for the leader's end. After the reap, does
  /// nothing and returns OK (the reap killed what was left). Errors as
  /// Signal().
  Status KillGroup(int sig = SIGKILL);

  /// Gives up ownership: returns the pid (-1 when this owned nothing) and
  /// owns nothing afterwards. The caller must reap the child (waitpid) and
  /// kill its group if need be.
  pid_t Release();

 private:
  Subprocess(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  // Reaps the ended (zombie) leader after killing what is left of its group.
  StatusOr<ExitStatus> Reap();
  // Kill, reap, close: the destructor's work.
  void Discard() noexcept;

  pid_t pid_ = -1;
  int pidfd_ = -1;  // pidfd_open(pid_), or -1
  bool sigkilled_group_ = false;
  std::optional<ExitStatus> exit_;
};

/// Waits at most `timeout_ms` (>= 0) for child `pid` of this process to end,
/// without reaping it (waitid WNOWAIT: it stays a zombie, its pid and group
/// id taken). `pidfd`: pidfd_open(pid) to wait on, or -1 to poll every
/// 1-10 ms. Returns true when it has ended, false at the timeout.
/// Errors: FAILED_PRECONDITION when `pid` is not an unreaped child of this
/// process (ECHILD); INVALID_ARGUMENT for a negative timeout; INTERNAL for
/// another waitid() or poll() error. Thread-safe.
StatusOr<bool> AwaitChildExit(pid_t pid, int pidfd, int64_t timeout_ms);

/// True when some process of process group `pgid` is alive: not a zombie
/// (or a zombie leader whose other threads still run). Reads /proc (when it
/// cannot, any member, a zombie too, counts). Thread-safe; not for signal
/// handlers.
bool ProcessGroupAlive(pid_t pgid);

}  // namespace foreman::internal
