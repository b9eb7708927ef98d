// Tests for the child-process helper (src/platform/subprocess.hpp):
// Subprocess::Spawn, its waits and kills, the parent-death rule,
// AwaitChildExit and ProcessGroupAlive.
//
// The children are /bin/sh scripts and sleep. Every wait is bounded
// (kWaitMs); every child is owned by a Subprocess (killed with its group
// when a failed assertion leaves the scope) or by a KillOnExit guard.
#include "platform/subprocess.hpp"
#include "support/test_util.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace foreman::internal {
namespace {

using foreman::testing::TempDir;
using Clock = std::chrono::steady_clock;

// The bound on a wait for a child that is expected to end (or to start)
// soon: generous for a loaded machine and the sanitizer builds; a passing
// test never waits for it.
constexpr int64_t kWaitMs = 10000;

int64_t MillisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

SpawnOptions Sh(const std::string& script) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  return o;
}

Subprocess MustSpawn(const SpawnOptions& o) {
  StatusOr<Subprocess> child = Subprocess::Spawn(o);
  REQUIRE_MESSAGE(child.ok(), child.status().ToString());
  return std::move(*child);
}

// Waits (bounded) for the child to end.
ExitStatus MustEnd(Subprocess& child) {
  StatusOr<std::optional<ExitStatus>> status = child.Wait(kWaitMs);
  REQUIRE_MESSAGE(status.ok(), status.status().ToString());
  REQUIRE_MESSAGE(status->has_value(), "the child did not end within ", kWaitMs, " ms");
  return **status;
}

// Exit code of `script` run by /bin/sh.
int ExitCodeOf(const std::string& script) {
  Subprocess child = MustSpawn(Sh(script));
  return MustEnd(child).exit_code;
}

// A /proc/<pid>/stat field after the command name: 0 the state, 2 the
// process group. "" when there is no such process.
std::string StatField(pid_t pid, int index) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const std::size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return "";
  std::istringstream in(stat.substr(paren + 1));
  std::string field;
  for (int i = 0; i <= index; ++i) in >> field;
  return field;
}

// `pid` exists and is not a zombie.
bool Alive(pid_t pid) {
  const std::string state = StatField(pid, 0);
  return !state.empty() && state != "Z" && state != "X";
}

// Polls (1 ms apart, at most kWaitMs) until `done()`; returns its last value.
template <class Fn>
bool Eventually(Fn done) {
  const auto start = Clock::now();
  while (!done()) {
    if (MillisSince(start) > kWaitMs) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// `pid` runs the program named `comm` (it has exec'd: everything before its
// exec, the death signal included, is in place).
bool AwaitExec(pid_t pid, const std::string& comm) {
  return Eventually([&] { return ReadFile(absl::StrCat("/proc/", pid, "/comm")) == comm + "\n"; });
}

// The pid a script printed as its log's first line ("echo $!").
pid_t FirstLinePid(const std::string& log_path) {
  pid_t pid = 0;
  std::string text;
  REQUIRE_MESSAGE(Eventually([&] {
                    text = ReadFile(log_path);
                    return text.find('\n') != std::string::npos;
                  }),
                  "no line in ", log_path);
  REQUIRE_MESSAGE(absl::SimpleAtoi(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))), &pid), text);
  REQUIRE(pid > 0);
  return pid;
}

// SIGKILL to a process this test started outside a Subprocess, at scope
// exit, and a bounded reap when it is our child.
struct KillOnExit {
  pid_t pid = -1;
  ~KillOnExit() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    if (AwaitChildExit(pid, -1, kWaitMs).value_or(false)) waitpid(pid, nullptr, 0);
  }
};

// -- exit codes and results --------------------------------------------------------

TEST_CASE("Spawn: the exit code is the exit status, or 128 + the signal that ended the child") {
  CHECK(ExitCodeOf("exit 0") == 0);
  CHECK(ExitCodeOf("exit 3") == 3);
  CHECK(ExitCodeOf("exit 255") == 255);

  Subprocess term = MustSpawn(Sh("kill -TERM $$; sleep 30"));
  const ExitStatus t = MustEnd(term);
  CHECK(t.exit_code == 128 + SIGTERM);
  CHECK(t.term_signal == SIGTERM);
  CHECK_FALSE(t.left_processes);

  Subprocess killed = MustSpawn(Sh("kill -KILL $$; sleep 30"));
  const ExitStatus k = MustEnd(killed);
  CHECK(k.exit_code == 137);
  CHECK(k.term_signal == SIGKILL);

  Subprocess exited = MustSpawn(Sh("exit 137"));
  const ExitStatus e = MustEnd(exited);
  CHECK(e.exit_code == 137);
  CHECK(e.term_signal == 0);  // an exit, not a signal
}

TEST_CASE("Poll does not block; once reaped, Poll and Wait return the same end again") {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "30"};
  Subprocess child = MustSpawn(o);
  const auto start = Clock::now();
  StatusOr<std::optional<ExitStatus>> running = child.Poll();
  REQUIRE(running.ok());
  CHECK_FALSE(running->has_value());
  CHECK_FALSE(child.exit_status().has_value());
  StatusOr<std::optional<ExitStatus>> waited = child.Wait(50);
  REQUIRE(waited.ok());
  CHECK_FALSE(waited->has_value());
  CHECK(MillisSince(start) >= 50);
  CHECK(MillisSince(start) < kWaitMs);

  REQUIRE(child.KillGroup(SIGTERM).ok());
  std::optional<ExitStatus> end;
  REQUIRE(Eventually([&] {
    StatusOr<std::optional<ExitStatus>> p = child.Poll();
    REQUIRE(p.ok());
    end = *p;
    return end.has_value();
  }));
  CHECK(end->term_signal == SIGTERM);
  CHECK(end->exit_code == 143);
  REQUIRE(child.exit_status().has_value());
  CHECK(child.exit_status()->exit_code == 143);
  StatusOr<std::optional<ExitStatus>> again = child.Wait(kWaitMs);
  REQUIRE(again.ok());
  REQUIRE(again->has_value());
  CHECK((*again)->exit_code == 143);
  // After the reap its pid may be another process's: the kills do nothing.
  CHECK(child.KillGroup(SIGKILL).ok());
  CHECK(child.Signal(SIGTERM).ok());
}

TEST_CASE("Finish: an end within the timeout is not a timeout") {
  Subprocess child = MustSpawn(Sh("exit 4"));
  StatusOr<FinishResult> r = child.Finish(kWaitMs);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(r->exit.exit_code == 4);
  CHECK_FALSE(r->timed_out);
  CHECK_FALSE(r->exit.left_processes);
}

// -- stdin, stdout, stderr, descriptors -------------------------------------------

TEST_CASE("stdout and stderr go into one file, in the order written; the file is truncated first") {
  TempDir dir;
  const std::string log = dir / "run.log";
  WriteFile(log, "what an earlier run wrote, longer than this run's output\n");
  SpawnOptions o = Sh("echo out; echo err >&2; echo out again");
  o.stdout_to = ChildOutput::File(log);
  Subprocess child = MustSpawn(o);
  CHECK(MustEnd(child).exit_code == 0);
  CHECK(ReadFile(log) == "out\nerr\nout again\n");
}

TEST_CASE("ChildOutput::Append keeps what the file held") {
  TempDir dir;
  const std::string log = dir / "run.log";
  WriteFile(log, "first run\n");
  SpawnOptions o = Sh("echo second run; echo its error >&2");
  o.stdout_to = ChildOutput::Append(log);
  Subprocess child = MustSpawn(o);
  CHECK(MustEnd(child).exit_code == 0);
  CHECK(ReadFile(log) == "first run\nsecond run\nits error\n");
}

TEST_CASE("stdout into a pipe the caller keeps, stderr into a file of its own") {
  TempDir dir;
  int fds[2];
  REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
  SpawnOptions o = Sh("echo to the pipe; echo to the file >&2");
  o.stdout_to = ChildOutput::Fd(fds[1]);
  o.stderr_to = ChildOutput::File(dir / "err.log");
  Subprocess child = MustSpawn(o);
  CHECK(fcntl(fds[1], F_GETFD) >= 0);  // still the caller's
  close(fds[1]);
  CHECK(MustEnd(child).exit_code == 0);
  std::string got;
  char buf[256];
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    REQUIRE(poll(&p, 1, static_cast<int>(kWaitMs)) == 1);
    const ssize_t n = read(fds[0], buf, sizeof buf);
    REQUIRE(n >= 0);
    if (n == 0) break;  // EOF: no other copy of the write end is left
    got.append(buf, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  CHECK(got == "to the pipe\n");
  CHECK(ReadFile(dir / "err.log") == "to the file\n");
}

TEST_CASE("stdout goes to /dev/null unless told otherwise") {
  TempDir dir;
  // $(...): the shell's own fd 1, not a redirected one.
  SpawnOptions o = Sh("echo lost; out=$(readlink /proc/$$/fd/1); echo \"$out\" >&2");
  o.stderr_to = ChildOutput::File(dir / "err.log");
  Subprocess child = MustSpawn(o);
  CHECK(MustEnd(child).exit_code == 0);
  CHECK(ReadFile(dir / "err.log") == "/dev/null\n");
}

// This process's stdin, replaced by a pipe with a line in it for the scope.
struct StdinWithData {
  int saved = -1;
  StdinWithData() {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    REQUIRE(write(fds[1], "data\n", 5) == 5);
    close(fds[1]);
    saved = dup(STDIN_FILENO);
    REQUIRE(dup2(fds[0], STDIN_FILENO) == STDIN_FILENO);
    close(fds[0]);
  }
  ~StdinWithData() {
    if (saved >= 0) dup2(saved, STDIN_FILENO);
    if (saved >= 0) close(saved);
  }
};

TEST_CASE("stdin is /dev/null, not the parent's stdin") {
  TempDir dir;
  StdinWithData parent_stdin;  // a child that inherited it would read "data"
  SpawnOptions o = Sh("readlink /proc/$$/fd/0; if read line; then echo \"read $line\"; else echo eof; fi");
  o.stdout_to = ChildOutput::File(dir / "out.log");
  Subprocess child = MustSpawn(o);
  CHECK(MustEnd(child).exit_code == 0);
  CHECK(ReadFile(dir / "out.log") == "/dev/null\neof\n");
}

TEST_CASE("no descriptor but 0, 1 and 2 reaches the child, also one opened without O_CLOEXEC") {
  TempDir dir;
  const int raw = open("/dev/null", O_RDONLY);  // no O_CLOEXEC
  REQUIRE(raw >= 0);
  const int leaky = fcntl(raw, F_DUPFD, 50);  // F_DUPFD: not close-on-exec either
  close(raw);
  REQUIRE(leaky >= 50);
  SpawnOptions o = Sh(absl::StrCat("if [ -e /proc/$$/fd/", leaky, " ]; then echo open; else echo closed; fi"));
  o.stdout_to = ChildOutput::File(dir / "out.log");
  Subprocess child = MustSpawn(o);
  const ExitStatus end = MustEnd(child);
  close(leaky);
  CHECK(end.exit_code == 0);
  CHECK(ReadFile(dir / "out.log") == "closed\n");
}

// -- environment, program lookup ---------------------------------------------------

// Sets an environment variable of this process for the scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) { setenv(name.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

TEST_CASE("SpawnOptions::env adds variables and replaces same-named ones; the rest is inherited") {
  TempDir dir;
  ScopedEnv kept("FOREMAN_SUBPROCESS_TEST_KEPT", "kept");
  ScopedEnv replaced("FOREMAN_SUBPROCESS_TEST_REPLACED", "old");
  SpawnOptions o = Sh(
      "echo \"$FOREMAN_SUBPROCESS_TEST_KEPT|$FOREMAN_SUBPROCESS_TEST_REPLACED|$FOREMAN_SUBPROCESS_TEST_NEW\"; "
      "env | grep -c '^FOREMAN_SUBPROCESS_TEST_REPLACED='");
  o.env = {{"FOREMAN_SUBPROCESS_TEST_REPLACED", "new"}, {"FOREMAN_SUBPROCESS_TEST_NEW", "a b=c"}};
  o.stdout_to = ChildOutput::File(dir / "out.log");
  Subprocess child = MustSpawn(o);
  CHECK(MustEnd(child).exit_code == 0);
  CHECK(ReadFile(dir / "out.log") == "kept|new|a b=c\n1\n");
}

TEST_CASE("a program name without '/' is looked up on the child's PATH") {
  TempDir dir;
  // On this process's PATH.
  SpawnOptions sh;
  sh.argv = {"sh", "-c", "exit 5"};
  Subprocess child = MustSpawn(sh);
  CHECK(MustEnd(child).exit_code == 5);

  // On the PATH that SpawnOptions::env gives the child, also as `program`
  // apart from argv[0]; a directory of that name earlier on PATH is skipped.
  const std::string bin = dir / "bin";
  REQUIRE(mkdir(bin.c_str(), 0755) == 0);
  REQUIRE(mkdir((dir / "decoy").c_str(), 0755) == 0);
  REQUIRE(mkdir((dir / "decoy/foreman-subprocess-hello").c_str(), 0755) == 0);
  const std::string script = bin + "/foreman-subprocess-hello";
  WriteFile(script, "#!/bin/sh\necho \"hello from $0 as $1\"\n");
  REQUIRE(chmod(script.c_str(), 0755) == 0);
  SpawnOptions o;
  o.program = "foreman-subprocess-hello";
  o.argv = {"hello", "argv1"};
  o.env = {{"PATH", absl::StrCat(dir / "decoy", "::", bin, ":/usr/bin:/bin")}};
  o.stdout_to = ChildOutput::File(dir / "out.log");
  Subprocess hello = MustSpawn(o);
  CHECK(MustEnd(hello).exit_code == 0);
  CHECK(ReadFile(dir / "out.log") == absl::StrCat("hello from ", script, " as argv1\n"));

  // Not found: no child, the error names the program and the PATH.
  SpawnOptions missing;
  missing.argv = {"foreman-subprocess-no-such-program"};
  missing.env = {{"PATH", bin}};
  StatusOr<Subprocess> none = Subprocess::Spawn(missing);
  REQUIRE_FALSE(none.ok());
  CHECK(absl::IsNotFound(none.status()));
  CHECK(absl::StrContains(none.status().message(), "'foreman-subprocess-no-such-program' not found on PATH"));
  CHECK(absl::StrContains(none.status().message(), bin));
}

TEST_CASE("a program that cannot be executed: exit 127, one line in its log naming it and the cause") {
  TempDir dir;
  const std::string log = dir / "run.log";
  SpawnOptions o;
  o.program = dir / "no-such-program";
  o.argv = {"foreman"};
  o.stdout_to = ChildOutput::File(log);
  Subprocess child = MustSpawn(o);
  const ExitStatus end = MustEnd(child);
  CHECK(end.exit_code == 127);
  CHECK(end.term_signal == 0);
  CHECK(ReadFile(log) == absl::StrCat("foreman: cannot execute ", dir / "no-such-program",
                                      ": No such file or directory\n"));

  // A file without execute permission (also for root).
  const std::string plain = dir / "not-executable";
  WriteFile(plain, "#!/bin/sh\necho ran\n");
  REQUIRE(chmod(plain.c_str(), 0644) == 0);
  o.program = plain;
  Subprocess denied = MustSpawn(o);
  CHECK(MustEnd(denied).exit_code == 127);
  CHECK(ReadFile(log) == absl::StrCat("foreman: cannot execute ", plain, ": Permission denied\n"));
}

TEST_CASE("Spawn refuses bad options with INVALID_ARGUMENT or NOT_FOUND, starting nothing") {
  TempDir dir;
  auto code_of = [](const SpawnOptions& o) { return Subprocess::Spawn(o).status().code(); };
  SpawnOptions empty;
  CHECK(code_of(empty) == absl::StatusCode::kInvalidArgument);
  SpawnOptions nul = Sh(std::string("echo a\0b", 8));
  CHECK(code_of(nul) == absl::StatusCode::kInvalidArgument);
  SpawnOptions bad_env = Sh("true");
  bad_env.env = {{"A=B", "c"}};
  CHECK(code_of(bad_env) == absl::StatusCode::kInvalidArgument);
  bad_env.env = {{"", "c"}};
  CHECK(code_of(bad_env) == absl::StatusCode::kInvalidArgument);
  SpawnOptions self_stdout = Sh("true");
  self_stdout.stdout_to = ChildOutput::Stdout();
  CHECK(code_of(self_stdout) == absl::StatusCode::kInvalidArgument);
  SpawnOptions bad_fd = Sh("true");
  bad_fd.stderr_to = ChildOutput::Fd(-1);
  CHECK(code_of(bad_fd) == absl::StatusCode::kInvalidArgument);
  SpawnOptions no_path = Sh("true");
  no_path.stdout_to = ChildOutput::File("");
  CHECK(code_of(no_path) == absl::StatusCode::kInvalidArgument);
  for (int sig : {-1, SIGSTOP, NSIG}) {
    SpawnOptions bad_signal = Sh("true");
    bad_signal.parent_death_signal = sig;
    CHECK(code_of(bad_signal) == absl::StatusCode::kInvalidArgument);
  }
  SpawnOptions no_dir = Sh("true");
  no_dir.stdout_to = ChildOutput::File(dir / "missing/run.log");
  StatusOr<Subprocess> s = Subprocess::Spawn(no_dir);
  CHECK(absl::IsNotFound(s.status()));
  CHECK(absl::StrContains(s.status().message(), dir / "missing/run.log"));
  SpawnOptions no_holder = Sh("true");
  no_holder.join_namespaces_of = 0x7ffffff0;  // above any pid_max
  s = Subprocess::Spawn(no_holder);
  CHECK(absl::IsNotFound(s.status()));
  CHECK(absl::StrContains(s.status().message(), "/proc/2147483632/ns/user"));
}

TEST_CASE("a Subprocess that owns nothing refuses with FAILED_PRECONDITION; a negative timeout is refused") {
  Subprocess none;
  CHECK(none.pid() == -1);
  CHECK(absl::IsFailedPrecondition(none.Poll().status()));
  CHECK(absl::IsFailedPrecondition(none.KillGroup()));
  CHECK(absl::IsFailedPrecondition(none.Signal(SIGTERM)));
  CHECK(none.Release() == -1);
  Subprocess child = MustSpawn(Sh("exit 0"));
  CHECK(absl::IsInvalidArgument(child.Wait(-1).status()));
  CHECK(absl::IsInvalidArgument(child.Finish(-1).status()));
  CHECK(absl::IsInvalidArgument(child.Signal(0)));
  CHECK(absl::IsInvalidArgument(child.KillGroup(NSIG)));
  CHECK(MustEnd(child).exit_code == 0);
}

// -- signals -----------------------------------------------------------------------

void Ignore(int) {}

TEST_CASE("the child starts with no signal blocked and every signal at SIG_DFL") {
  TempDir dir;
  // This thread: SIGTERM and SIGUSR1 blocked, SIGINT ignored, a handler on
  // SIGHUP -- a child that inherited them would show them.
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGUSR1);
  REQUIRE(pthread_sigmask(SIG_BLOCK, &block, &old_mask) == 0);
  struct sigaction ign {}, handler {}, old_int {}, old_hup {};
  ign.sa_handler = SIG_IGN;
  handler.sa_handler = Ignore;
  sigaction(SIGINT, &ign, &old_int);
  sigaction(SIGHUP, &handler, &old_hup);
  SpawnOptions o;
  o.argv = {"grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status"};
  o.stdout_to = ChildOutput::File(dir / "out.log");
  StatusOr<Subprocess> child = Subprocess::Spawn(o);
  // This process's own state is back as it was before any assertion.
  sigset_t now;
  pthread_sigmask(SIG_SETMASK, &old_mask, &now);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  CHECK(sigismember(&now, SIGTERM) == 1);  // Spawn left the caller's mask as it was
  REQUIRE_MESSAGE(child.ok(), child.status().ToString());
  CHECK(MustEnd(*child).exit_code == 0);
  CHECK(ReadFile(dir / "out.log") == "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
}

// -- process groups ----------------------------------------------------------------

TEST_CASE("the child leads its own process group as soon as Spawn returns") {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "30"};
  Subprocess child = MustSpawn(o);
  CHECK(getpgid(child.pid()) == child.pid());
  CHECK(getpgid(child.pid()) != getpgrp());
  CHECK(ProcessGroupAlive(child.pid()));
  REQUIRE(child.KillGroup().ok());
  const ExitStatus end = MustEnd(child);
  CHECK(end.term_signal == SIGKILL);
  CHECK_FALSE(end.left_processes);  // we killed it: not a leftover
}

TEST_CASE("KillGroup signals every process of the group; Signal the child alone") {
  TempDir dir;
  const std::string log = dir / "run.log";
  SpawnOptions o = Sh("sleep 30 & echo $!; sleep 30");
  o.stdout_to = ChildOutput::File(log);
  Subprocess child = MustSpawn(o);
  const pid_t grandchild = FirstLinePid(log);
  auto stopped = [](pid_t pid) { return StatField(pid, 0) == "T"; };
  REQUIRE(child.Signal(SIGSTOP).ok());
  REQUIRE(Eventually([&] { return stopped(child.pid()); }));
  CHECK_FALSE(stopped(grandchild));  // nothing was sent to it
  REQUIRE(child.KillGroup(SIGSTOP).ok());
  CHECK(Eventually([&] { return stopped(grandchild); }));
  REQUIRE(child.KillGroup(SIGKILL).ok());
  const ExitStatus end = MustEnd(child);
  CHECK(end.term_signal == SIGKILL);
  CHECK_FALSE(end.left_processes);
  CHECK_FALSE(Alive(grandchild));
}

TEST_CASE("Finish: past the timeout the whole group is killed and reported as timed out") {
  TempDir dir;
  const std::string log = dir / "run.log";
  SpawnOptions o = Sh("sleep 30 & echo $!; sleep 30");
  o.stdout_to = ChildOutput::File(log);
  Subprocess child = MustSpawn(o);
  const pid_t grandchild = FirstLinePid(log);
  CHECK(Alive(grandchild));
  CHECK(StatField(grandchild, 2) == absl::StrCat(child.pid()));  // in the child's group
  const auto start = Clock::now();
  StatusOr<FinishResult> r = child.Finish(300);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(MillisSince(start) >= 300);
  CHECK(MillisSince(start) < kWaitMs);
  CHECK(r->timed_out);
  CHECK(r->exit.exit_code == 137);
  CHECK(r->exit.term_signal == SIGKILL);
  CHECK_FALSE(r->exit.left_processes);
  CHECK_FALSE(Alive(grandchild));  // gone with its group, before Finish returned
}

TEST_CASE("a grandchild left in the group when the child exits is reported and killed") {
  TempDir dir;
  const std::string log = dir / "run.log";
  SpawnOptions o = Sh("sleep 30 & echo $!");
  o.stdout_to = ChildOutput::File(log);
  Subprocess child = MustSpawn(o);
  const ExitStatus end = MustEnd(child);
  CHECK(end.exit_code == 0);
  CHECK(end.left_processes);
  CHECK_FALSE(Alive(FirstLinePid(log)));
}

TEST_CASE("ProcessGroupAlive: true while a member lives, false for an empty or a zombie-only group") {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "30"};
  Subprocess child = MustSpawn(o);
  const pid_t pid = child.pid();
  CHECK(ProcessGroupAlive(pid));
  REQUIRE(child.Signal(SIGKILL).ok());
  // Ended but not reaped: a zombie leader alone is not alive.
  REQUIRE(AwaitChildExit(pid, -1, kWaitMs).value_or(false));
  CHECK_FALSE(ProcessGroupAlive(pid));
  CHECK(MustEnd(child).term_signal == SIGKILL);
  CHECK_FALSE(ProcessGroupAlive(0));
}

// -- ownership ---------------------------------------------------------------------

TEST_CASE("the destructor kills the group and reaps the child; a move assignment does so for the old one") {
  TempDir dir;
  const std::string log = dir / "run.log";
  pid_t pid = -1, grandchild = -1;
  {
    SpawnOptions o = Sh("sleep 30 & echo $!; sleep 30");
    o.stdout_to = ChildOutput::File(log);
    Subprocess child = MustSpawn(o);
    pid = child.pid();
    grandchild = FirstLinePid(log);
    REQUIRE(Alive(grandchild));
  }
  errno = 0;
  CHECK(waitpid(pid, nullptr, WNOHANG) == -1);  // already reaped
  CHECK(errno == ECHILD);
  CHECK_FALSE(Alive(grandchild));

  SpawnOptions sleep;
  sleep.argv = {"/bin/sleep", "30"};
  Subprocess first = MustSpawn(sleep);
  const pid_t first_pid = first.pid();
  first = MustSpawn(sleep);
  CHECK(first.pid() != first_pid);
  errno = 0;
  CHECK(waitpid(first_pid, nullptr, WNOHANG) == -1);
  CHECK(errno == ECHILD);
  Subprocess moved(std::move(first));
  CHECK(first.pid() == -1);  // NOLINT(bugprone-use-after-move): moved from owns nothing
  CHECK(moved.pid() > 0);
}

TEST_CASE("Release gives the child up; AwaitChildExit waits for it by polling without a pidfd") {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "30"};
  KillOnExit guard;
  {
    Subprocess child = MustSpawn(o);
    guard.pid = child.Release();
    CHECK(child.pid() == -1);
  }
  REQUIRE(guard.pid > 0);
  CHECK(Alive(guard.pid));  // the destructor left it alone
  const auto start = Clock::now();
  StatusOr<bool> ended = AwaitChildExit(guard.pid, -1, 200);
  REQUIRE(ended.ok());
  CHECK_FALSE(*ended);
  CHECK(MillisSince(start) >= 200);
  CHECK(MillisSince(start) < kWaitMs);
  CHECK(Alive(guard.pid));
  REQUIRE(kill(guard.pid, SIGKILL) == 0);
  ended = AwaitChildExit(guard.pid, -1, kWaitMs);
  REQUIRE(ended.ok());
  CHECK(*ended);
  int status = 0;
  REQUIRE(waitpid(guard.pid, &status, 0) == guard.pid);  // AwaitChildExit did not reap it
  CHECK(WIFSIGNALED(status));
  guard.pid = -1;
  CHECK(absl::IsFailedPrecondition(AwaitChildExit(getpid(), -1, 0).status()));  // not our child
  CHECK(absl::IsInvalidArgument(AwaitChildExit(1, -1, -5).status()));
}

// -- the parent-death rule ---------------------------------------------------------

// This process as the reaper of orphans for the scope (so that a grandchild
// whose parent died is our child: we can wait for it and reap it).
struct Subreaper {
  Subreaper() { REQUIRE(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0); }
  ~Subreaper() { prctl(PR_SET_CHILD_SUBREAPER, 0); }
};

// Forks an intermediate process that spawns `sleep 30` with `death_signal`,
// waits until sleep runs, reports its pid on a pipe and exits; reaps the
// intermediate and returns the sleep's pid (now ours: we are the subreaper).
pid_t OrphanedGrandchild(int death_signal) {
  int fds[2];
  REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
  const pid_t intermediate = fork();
  REQUIRE(intermediate >= 0);
  if (intermediate == 0) {
    // No doctest here: this process only reports and exits.
    SpawnOptions o;
    o.argv = {"/bin/sleep", "30"};
    o.parent_death_signal = death_signal;
    StatusOr<Subprocess> child = Subprocess::Spawn(o);
    if (!child.ok()) _exit(1);
    const pid_t pid = child->Release();
    if (!AwaitExec(pid, "sleep")) {
      kill(pid, SIGKILL);
      _exit(2);
    }
    if (write(fds[1], &pid, sizeof pid) != sizeof pid) _exit(3);
    _exit(0);  // the thread that called Spawn dies
  }
  close(fds[1]);
  KillOnExit reap_intermediate{intermediate};
  pid_t grandchild = -1;
  pollfd p{fds[0], POLLIN, 0};
  const bool reported = poll(&p, 1, static_cast<int>(kWaitMs)) == 1 &&
                        read(fds[0], &grandchild, sizeof grandchild) == sizeof grandchild;
  close(fds[0]);
  REQUIRE_MESSAGE(reported, "the intermediate process reported no grandchild");
  REQUIRE(AwaitChildExit(intermediate, -1, kWaitMs).value_or(false));
  int status = 0;
  REQUIRE(waitpid(intermediate, &status, 0) == intermediate);
  reap_intermediate.pid = -1;
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  return grandchild;
}

TEST_CASE("parent_death_signal: the child gets it when its parent dies; 0 lets it outlive the parent") {
  Subreaper subreaper;
  for (int sig : {SIGKILL, SIGTERM}) {
    CAPTURE(sig);
    KillOnExit grandchild{OrphanedGrandchild(sig)};
    StatusOr<bool> ended = AwaitChildExit(grandchild.pid, -1, kWaitMs);
    REQUIRE(ended.ok());
    REQUIRE_MESSAGE(*ended, "the grandchild outlived its parent");
    int status = 0;
    REQUIRE(waitpid(grandchild.pid, &status, 0) == grandchild.pid);
    grandchild.pid = -1;
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == sig);
  }
  KillOnExit survivor{OrphanedGrandchild(0)};
  StatusOr<bool> ended = AwaitChildExit(survivor.pid, -1, 300);
  REQUIRE(ended.ok());
  CHECK_FALSE(*ended);  // still running 300 ms after its parent died
  CHECK(Alive(survivor.pid));
}

TEST_CASE("parent_death_signal follows the thread that called Spawn, not the process") {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "30"};
  for (int sig : {SIGKILL, 0}) {
    CAPTURE(sig);
    o.parent_death_signal = sig;
    StatusOr<Subprocess> spawned = absl::UnknownError("not run");
    std::thread spawner([&] {
      spawned = Subprocess::Spawn(o);
      if (spawned.ok()) AwaitExec(spawned->pid(), "sleep");  // the death signal is set
    });
    spawner.join();  // the parent thread has ended; this process lives on
    REQUIRE_MESSAGE(spawned.ok(), spawned.status().ToString());
    Subprocess child = std::move(*spawned);
    StatusOr<std::optional<ExitStatus>> end = child.Wait(sig == 0 ? 300 : kWaitMs);
    REQUIRE(end.ok());
    if (sig == 0) {
      CHECK_FALSE(end->has_value());  // no death signal: it runs on (the destructor kills it)
    } else {
      REQUIRE(end->has_value());
      CHECK((*end)->term_signal == SIGKILL);
    }
  }
}

// -- namespaces --------------------------------------------------------------------

std::string NsLink(const std::string& pid, const char* ns) {
  char buf[256];
  const std::string path = absl::StrCat("/proc/", pid, "/ns/", ns);
  const ssize_t n = readlink(path.c_str(), buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
}

TEST_CASE("join_namespaces_of: the child runs in the holder's user and network namespaces") {
  TempDir dir;
  // A holder as the chaos cluster makes them: `unshare -rn sleep`, where
  // unprivileged user namespaces and util-linux's unshare are there.
  SpawnOptions probe;
  probe.argv = {"unshare", "-rn", "true"};
  StatusOr<Subprocess> can = Subprocess::Spawn(probe);
  if (!can.ok() || MustEnd(*can).exit_code != 0) {
    MESSAGE("skipped: `unshare -rn true` does not work here");
    return;
  }
  SpawnOptions h;
  h.argv = {"unshare", "-rn", "sleep", "30"};
  Subprocess holder = MustSpawn(h);
  const std::string holder_pid = absl::StrCat(holder.pid());
  REQUIRE(AwaitExec(holder.pid(), "sleep"));
  REQUIRE(NsLink(holder_pid, "net") != NsLink("self", "net"));

  SpawnOptions o = Sh("readlink /proc/self/ns/user /proc/self/ns/net");
  o.join_namespaces_of = holder.pid();
  o.stdout_to = ChildOutput::File(dir / "out.log");
  Subprocess child = MustSpawn(o);
  CHECK(MustEnd(child).exit_code == 0);
  CHECK(ReadFile(dir / "out.log") ==
        absl::StrCat(NsLink(holder_pid, "user"), "\n", NsLink(holder_pid, "net"), "\n"));

  // A holder made from inside the first one's namespaces (`unshare -n`, as
  // the chaos cluster makes its namespace B): a new network namespace in
  // the first one's user namespace.
  SpawnOptions h2;
  h2.argv = {"unshare", "-n", "sleep", "30"};
  h2.join_namespaces_of = holder.pid();
  Subprocess inner = MustSpawn(h2);
  REQUIRE(AwaitExec(inner.pid(), "sleep"));
  const std::string inner_pid = absl::StrCat(inner.pid());
  CHECK(NsLink(inner_pid, "user") == NsLink(holder_pid, "user"));
  CHECK(NsLink(inner_pid, "net") != NsLink(holder_pid, "net"));
}

TEST_CASE("join_namespaces_of a holder in our own user namespace joins only its network namespace") {
  TempDir dir;
  // `unshare -n` without a user namespace of its own needs CAP_SYS_ADMIN.
  SpawnOptions h;
  h.argv = {"unshare", "-n", "sleep", "30"};
  h.stderr_to = ChildOutput::DevNull();
  Subprocess holder = MustSpawn(h);
  bool ended = false;
  REQUIRE(Eventually([&] {
    ended = holder.Poll().value_or(std::nullopt).has_value();
    return ended || ReadFile(absl::StrCat("/proc/", holder.pid(), "/comm")) == "sleep\n";
  }));
  if (ended) {
    MESSAGE("skipped: `unshare -n` needs CAP_SYS_ADMIN here");
    return;
  }
  const std::string holder_pid = absl::StrCat(holder.pid());
  REQUIRE(NsLink(holder_pid, "user") == NsLink("self", "user"));
  SpawnOptions o = Sh("readlink /proc/self/ns/user /proc/self/ns/net");
  o.join_namespaces_of = holder.pid();
  o.stdout_to = ChildOutput::File(dir / "out.log");
  Subprocess child = MustSpawn(o);
  CHECK(MustEnd(child).exit_code == 0);  // setns into one's own user namespace would fail: 126
  CHECK(ReadFile(dir / "out.log") == absl::StrCat(NsLink("self", "user"), "\n", NsLink(holder_pid, "net"), "\n"));
}

}  // namespace
}  // namespace foreman::internal
