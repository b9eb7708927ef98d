// `foreman chaos --preset cluster` (chaos_cluster.hpp; docs/fault-injection.md,
// "--preset cluster").
//
// Per seed K, in <work>/seed-K/: plan.json (the seed's events), run/ (the
// chief's --checkpoint-dir) and <task>-<n>.log (stdout and stderr of the nth
// start of task ps / chief / worker1). The three tasks are children
// (fork/exec of /proc/self/exe) in their own process groups on free
// 127.0.0.1 ports (see Partitions below). A supervision loop (every 20 ms) reaps exits, reads the
// chief's progress lines, fires the next event when the chief reported its
// step (SIGKILL to the task's group), restarts the killed task on its own
// port after the drawn delay, and watches the chief's checkpoints. The run
// ends when every task has ended (the chief at --max-steps; the ps and
// worker 1 after the chief ended training).
//
// Partitions: where `unshare -rn` can make a veth pair (checked once), a
// seed whose plan cuts a task runs its cluster in two network namespaces
// (PartitionNet: each held by a `sleep` child; the partitioned task in B,
// the others in A, on 10.213.0.x with --insecure; each task child joins
// them with setns before its exec); the cut and the heal are `ip neigh`
// subprocesses run in the namespaces, as tests/cluster_partition_test.sh.
#include "chaos_cluster.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "chaos_checks.hpp"
#include "command.hpp"
#include "foreman/env.hpp"
#include "cluster/local_ports.hpp"
#include "platform/hash.hpp"

namespace foreman::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kMaxRestarts = 10;
constexpr int64_t kFirstEventStep = 30;  // past the first checkpoint (step 20)
constexpr int64_t kMaxSteps = 3000;

// The default job: about 7 s a seed on two cores, steps slow enough (a
// 784-64-10 MLP, batch 100) that a worker alone does not finish the job
// during a killed chief's 0.2-2 s restart delay; a checkpoint every 20
// steps, a progress line per step (the events fire on the chief's).
const std::vector<std::string>& DefaultClusterTrainFlags() {
  static const std::vector<std::string> flags = {"--max-steps", "3000", "--hidden", "64", "--batch-size", "100",
                                                 "--threads", "1", "--eval-every-steps", "0"};
  return flags;
}

// Set by --preset cluster itself: refused after --.
constexpr const char* kOwnFlags[] = {"--ps-hosts", "--worker-hosts", "--job-name", "--task-index",
                                     "--checkpoint-dir", "--fault-plan", "--insecure", "--ps-wait-secs",
                                     "--ps-join-timeout-secs", "--save-checkpoint-steps", "--log-step-count-steps"};

// The value of `--name V` or `--name=V` as an integer; nullopt when absent.
std::optional<int64_t> IntFlag(const std::vector<std::string>& flags, const std::string& name) {
  for (std::size_t i = 0; i < flags.size(); ++i) {
    std::string v;
    if (flags[i] == name && i + 1 < flags.size()) {
      v = flags[i + 1];
    } else if (absl::StartsWith(flags[i], name + "=")) {
      v = flags[i].substr(name.size() + 1);
    } else {
      continue;
    }
    int64_t n = 0;
    if (absl::SimpleAtoi(v, &n)) return n;
  }
  return std::nullopt;
}

std::string QuotedWords(const std::vector<std::string>& words) {
  std::vector<std::string> q;
  for (const std::string& w : words) q.push_back(ShellQuote(w));
  return absl::StrJoin(q, " ");
}

class Draws {
 public:
  explicit Draws(uint64_t seed) : state_(seed ^ 0x636c7573746572ULL) {}  // "cluster": its own stream
  uint64_t Next() {
    const uint64_t out = internal::SplitMix64(state_);
    state_ += internal::kSplitMix64Gamma;
    return out;
  }
  int64_t In(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1)); }

 private:
  uint64_t state_;
};

// -- signals ---------------------------------------------------------------------

// The live tasks' process groups and the network namespaces' holders, for
// the handler (0: none).
volatile sig_atomic_t g_pgids[5] = {0, 0, 0, 0, 0};
char g_kept_line[PATH_MAX + 64] = {};
std::size_t g_kept_line_size = 0;

void OnSignal(int sig) {
  for (int i = 0; i < 5; ++i) {
    const pid_t pgid = g_pgids[i];
    if (pgid > 0) kill(-pgid, SIGKILL);
  }
  static const char kMessage[] = "\nforeman chaos: interrupted; the running cluster's tasks were killed\n";
  ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  if (g_kept_line_size > 0) ignored = write(STDERR_FILENO, g_kept_line, g_kept_line_size);
  (void)ignored;
  _exit(128 + sig);
}

void InstallHandlers(const std::string& work) {
  const std::string line = absl::StrCat("foreman chaos: work directory kept: ", work, "\n");
  if (line.size() <= sizeof g_kept_line) {
    std::memcpy(g_kept_line, line.data(), line.size());
    g_kept_line_size = line.size();
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
}

// -- the tasks --------------------------------------------------------------------

constexpr const char* kTaskNames[3] = {"ps", "chief", "worker 1"};
constexpr const char* kTaskFiles[3] = {"ps", "chief", "worker1"};
constexpr int kPs = 0, kChief = 1, kWorker1 = 2;

struct RunRecord {
  int task = 0;
  int n = 0;  // its nth start
  int exit_code = -1;
  std::string ended_by;
  bool killed_by_plan = false;
  bool timed_out = false;
  bool left_processes = false;
  bool cut_at_end = false;  // its network was cut when the chief ended training
  int64_t checkpoint_at_start = -1;  // the chief's latest checkpoint when it started (-1: none)
  int64_t first_step = -1;           // the first / last step it reported (-1: none)
  int64_t last_step = -1;
  int64_t elapsed_ms = 0;
};

struct Task {
  pid_t pid = -1;  // -1: not running
  Clock::time_point started;
  int starts = 0;
  std::string log_path;
  std::size_t log_offset = 0;  // how far the chief's log was read
  std::string partial;
  RunRecord run;
  std::optional<Clock::time_point> restart_at;
};

struct SeedReport {
  int64_t seed = 0;
  json plan;
  std::vector<std::string> fired;
  int64_t restarts = 0;
  int64_t partitions = 0;  // partitions fired (each healed)
  int64_t steps_lost = 0;
  std::vector<RunRecord> runs;
  std::map<std::string, Invariant> invariants;
  std::string replay;
  std::string replay_report;  // with the report's paths (no absolute path)
  int64_t elapsed_ms = 0;
  bool ok() const {
    for (const auto& [n, i] : invariants) {
      if (!i.ok) return false;
    }
    return true;
  }
};

std::string ReadFrom(const std::string& path, std::size_t offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(static_cast<std::streamoff>(offset));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// In a forked child: joins the user and network namespaces of process
// `holder` (0: stays). False on an error (errno set).
bool EnterNamespaces(pid_t holder) {
  if (holder <= 0) return true;
  char path[64];
  for (const char* ns : {"user", "net"}) {
    std::snprintf(path, sizeof path, "/proc/%d/ns/%s", static_cast<int>(holder), ns);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, 0) != 0) return false;
    close(fd);
  }
  return true;
}

// Starts `args` (/proc/self/exe when `exe` is empty, else `exe` found on
// PATH) in its own process group, in the namespaces of `ns_holder` (0: ours),
// output into `log` ("" = /dev/null).
StatusOr<pid_t> Spawn(const std::vector<std::string>& args, const std::string& log, pid_t ns_holder = 0,
                      const std::string& exe = "") {
  std::vector<std::string> words = {exe.empty() ? "foreman" : exe};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  const int log_fd = log.empty() ? open("/dev/null", O_WRONLY | O_CLOEXEC)
                                 : open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot create ", log, ": ", std::strerror(errno)));
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    if (null_fd >= 0) close(null_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // foreman chaos killed: no orphaned task
    if (getppid() != parent) _exit(1);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (!EnterNamespaces(ns_holder)) {
      const int err = errno;
      std::fprintf(stderr, "foreman chaos: cannot enter the namespaces of process %d: %s\n",
                   static_cast<int>(ns_holder), std::strerror(err));
      _exit(126);
    }
    if (exe.empty()) {
      execv("/proc/self/exe", argv.data());
    } else {
      execvp(exe.c_str(), argv.data());
    }
    _exit(127);
  }
  setpgid(pid, pid);
  close(log_fd);
  if (null_fd >= 0) close(null_fd);
  return pid;
}

// -- partitions (tests/cluster_partition_test.sh does the same in bash) ---------

// Waits at most 5 s for child `pid` (its group killed past that); its exit code.
int WaitChild(pid_t pid) {
  int status = 0;
  for (int i = 0; i < 250; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid, SIGKILL);
  waitpid(pid, &status, 0);
  return 124;
}

// "" when this run can cut a task's network, else why not.
std::string PartitionUnavailable(const std::vector<std::string>& train_flags) {
  for (const char* tls : {"--tls-cert", "--tls-key", "--tls-ca"}) {
    if (HasFlag(train_flags, tls)) {
      return absl::StrCat("the train flags set ", tls, " (a partitioned cluster runs --insecure on a veth pair)");
    }
  }
  auto pid = Spawn({"-rn", "ip", "link", "add", "fa", "type", "veth", "peer", "name", "fb"}, "", 0, "unshare");
  if (!pid.ok()) return std::string(pid.status().message());
  if (const int rc = WaitChild(*pid); rc != 0) {
    return absl::StrCat("`unshare -rn ip link add fa type veth peer name fb` exited ", rc,
                        ": needs unprivileged user namespaces, util-linux's unshare and iproute2's ip");
  }
  return "";
}

constexpr const char* kAddrA = "10.213.0.1";  // the chief and the task not cut
constexpr const char* kAddrB = "10.213.0.2";  // the partitioned task

// One seed's two network namespaces, each held by a `sleep` child: A (a new
// user + network namespace) and B (a network namespace inside A's user
// namespace), joined by a veth pair fa (A, kAddrA) - fb (B, kAddrB). The
// destructor kills both holders (the namespaces go with them).
struct PartitionNet {
  pid_t a = 0, b = 0;
  ~PartitionNet() {
    for (pid_t* p : {&b, &a}) {
      if (*p <= 0) continue;
      kill(-*p, SIGKILL);
      waitpid(*p, nullptr, 0);
      g_pgids[p == &a ? 3 : 4] = 0;
      *p = 0;
    }
  }
  // `ip args` in holder's namespaces.
  static Status Ip(pid_t holder, const std::vector<std::string>& args) {
    FOREMAN_ASSIGN_OR_RETURN(pid_t pid, Spawn(args, "", holder, "ip"));
    if (const int rc = WaitChild(pid); rc != 0) {
      return absl::InternalError(
          absl::StrCat("`ip ", absl::StrJoin(args, " "), "` in the namespaces of process ", holder, " exited ", rc));
    }
    return absl::OkStatus();
  }
  static StatusOr<pid_t> Holder(pid_t in, const std::vector<std::string>& args, int slot) {
    FOREMAN_ASSIGN_OR_RETURN(pid_t pid, Spawn(args, "", in, "unshare"));
    g_pgids[slot] = pid;
    std::error_code outer_ec;
    const std::string outer =
        fs::read_symlink(in > 0 ? absl::StrCat("/proc/", in, "/ns/net") : "/proc/self/ns/net", outer_ec).string();
    for (int i = 0; i < 250; ++i) {
      std::error_code ec;
      const fs::path mine = fs::read_symlink(absl::StrCat("/proc/", pid, "/ns/net"), ec);
      if (!ec && mine.string() != outer) return pid;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    g_pgids[slot] = 0;
    return absl::InternalError(absl::StrCat("`unshare ", absl::StrJoin(args, " "), "` made no network namespace in 5 s"));
  }
  Status SetUp() {
    FOREMAN_ASSIGN_OR_RETURN(a, Holder(0, {"-rn", "sleep", "3600"}, 3));
    FOREMAN_ASSIGN_OR_RETURN(b, Holder(a, {"-n", "sleep", "3600"}, 4));
    for (const auto& [in, args] : std::vector<std::pair<pid_t, std::vector<std::string>>>{
             {a, {"link", "set", "lo", "up"}},
             {a, {"link", "add", "fa", "type", "veth", "peer", "name", "fb"}},
             {a, {"link", "set", "fb", "netns", absl::StrCat(b)}},
             {a, {"addr", "add", absl::StrCat(kAddrA, "/24"), "dev", "fa"}},
             {a, {"link", "set", "fa", "up"}},
             {b, {"link", "set", "lo", "up"}},
             {b, {"addr", "add", absl::StrCat(kAddrB, "/24"), "dev", "fb"}},
             {b, {"link", "set", "fb", "up"}}}) {
      FOREMAN_RETURN_IF_ERROR(Ip(in, args));
    }
    return absl::OkStatus();
  }
  // Silent both ways: each side's neighbour entry for the other becomes a
  // MAC address nobody has (no RST, no ICMP, the links stay up).
  Status Cut() const {
    FOREMAN_RETURN_IF_ERROR(Ip(a, {"neigh", "replace", kAddrB, "lladdr", "02:00:00:00:13:02", "dev", "fa", "nud", "permanent"}));
    return Ip(b, {"neigh", "replace", kAddrA, "lladdr", "02:00:00:00:13:01", "dev", "fb", "nud", "permanent"});
  }
  Status Heal() const {
    FOREMAN_RETURN_IF_ERROR(Ip(a, {"neigh", "del", kAddrB, "dev", "fa"}));
    return Ip(b, {"neigh", "del", kAddrA, "dev", "fb"});
  }
};

struct Cluster {
  const ClusterChaosOptions& o;
  std::string partition_unavailable;  // "" = partitions are drawn
  std::vector<std::string> train_flags;
  int64_t max_steps = kMaxSteps;
  Env* env = Env::Default();

  std::string Rel(const std::string& s) const { return absl::StrReplaceAll(s, {{o.work + "/", ""}, {o.work, "."}}); }
};

std::string EndedBy(const RunRecord& r) {
  if (r.timed_out) return "timeout (killed)";
  if (r.killed_by_plan) return "SIGKILL (planned)";
  if (r.exit_code == 0) return "done";
  if (r.exit_code == 1 && r.cut_at_end) return "exit 1 (cut off when the chief ended training)";
  if (r.exit_code > 128) return absl::StrCat("signal ", r.exit_code - 128);
  return absl::StrCat("exit ", r.exit_code);
}

StatusOr<SeedReport> RunSeed(const Cluster& c, int64_t seed) {
  const auto seed_start = Clock::now();
  SeedReport r;
  r.seed = seed;
  r.plan = ClusterChaosPlan(static_cast<uint64_t>(seed), c.max_steps, c.partition_unavailable.empty());
  r.replay = absl::StrCat("foreman chaos --preset cluster --seed ", seed);
  if (c.o.timeout_secs != 60) absl::StrAppend(&r.replay, " --timeout-secs ", c.o.timeout_secs);
  r.replay_report = r.replay;
  if (!c.o.train_flags.empty()) {
    absl::StrAppend(&r.replay, " -- ", QuotedWords(c.o.train_flags));
    absl::StrAppend(&r.replay_report, " -- ", QuotedWords(c.o.report_train_flags));
  }
  for (const std::string& name : InvariantNames()) r.invariants[name] = Invariant();
  Invariant& verify = r.invariants["checkpoints_verify"];
  Invariant& steps = r.invariants["global_step"];
  Invariant& bounded = r.invariants["bounded"];
  Invariant& finished = r.invariants["finished"];
  r.invariants["final_weights"].checked = false;
  r.invariants["final_weights"].details.push_back(
      "not applicable: asynchronous training with two workers is not bit-for-bit reproducible");
  r.invariants["scalars_once"].checked = false;
  r.invariants["scalars_once"].details.push_back("not applicable: two writers share no event file");

  const std::string dir = absl::StrCat(c.o.work, "/seed-", seed);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  {
    std::ofstream out(dir + "/plan.json");
    out << r.plan.dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", dir, "/plan.json"));
  }
  const std::string run_dir = dir + "/run";
  FOREMAN_ASSIGN_OR_RETURN(std::vector<int> ports, internal::FreeLoopbackPorts(3));
  // A plan with a partition: the partitioned task runs in namespace B, the
  // others in A (their own network: the ports are free there too).
  int cut_task = -1;
  for (const json& e : r.plan["events"]) {
    if (e.contains("partition")) cut_task = e["partition"] == "ps" ? kPs : kWorker1;
  }
  PartitionNet net;
  if (cut_task >= 0) FOREMAN_RETURN_IF_ERROR(net.SetUp());
  auto host_of = [&](int t) { return cut_task < 0 ? "127.0.0.1" : t == cut_task ? kAddrB : kAddrA; };
  const int64_t timeout_ms = static_cast<int64_t>(std::ceil(c.o.timeout_secs * 1000));
  // Shorter than the timeout: a ps that never returns ends the workers (exit
  // 1) before they are killed as hung.
  const int64_t ps_wait_secs = std::max<int64_t>(1, static_cast<int64_t>(c.o.timeout_secs / 2));
  std::vector<std::string> common = c.train_flags;
  for (const std::string& w :
       {std::string("--ps-hosts"), absl::StrCat(host_of(kPs), ":", ports[0]), std::string("--worker-hosts"),
        absl::StrCat(host_of(kChief), ":", ports[1], ",", host_of(kWorker1), ":", ports[2]),
        std::string("--log-step-count-steps"), std::string("1")}) {
    common.push_back(w);
  }
  if (cut_task >= 0) common.push_back("--insecure");  // not loopback: TLS or --insecure
  if (!HasFlag(common, "--heartbeat-ms")) common.insert(common.end(), {"--heartbeat-ms", "200"});
  if (!HasFlag(common, "--connection-timeout-ms")) common.insert(common.end(), {"--connection-timeout-ms", "1000"});
  auto args_of = [&](int task) {
    std::vector<std::string> a = {"train"};
    a.insert(a.end(), common.begin(), common.end());
    if (task == kPs) {
      a.insert(a.end(), {"--job-name", "ps", "--task-index", "0", "--checkpoint-dir", dir + "/ps-unused",
                         "--ps-join-timeout-secs", absl::StrCat(static_cast<int64_t>(std::ceil(c.o.timeout_secs)))});
    } else if (task == kChief) {
      a.insert(a.end(), {"--job-name", "worker", "--task-index", "0", "--checkpoint-dir", run_dir,
                         "--save-checkpoint-steps", "20", "--ps-wait-secs", absl::StrCat(ps_wait_secs)});
    } else {
      a.insert(a.end(), {"--job-name", "worker", "--task-index", "1", "--checkpoint-dir", dir + "/worker1-unused",
                         "--ps-wait-secs", absl::StrCat(ps_wait_secs)});
    }
    return a;
  };

  Task tasks[3];
  int64_t last_ckpt = -1;  // the chief's latest checkpoint seen
  auto start_task = [&](int t) -> Status {
    Task& k = tasks[t];
    k.log_path = absl::StrCat(dir, "/", kTaskFiles[t], "-", k.starts, ".log");
    FOREMAN_ASSIGN_OR_RETURN(k.pid, Spawn(args_of(t), k.log_path, cut_task < 0 ? 0 : t == cut_task ? net.b : net.a));
    g_pgids[t] = k.pid;
    k.started = Clock::now();
    k.run = RunRecord();
    k.run.task = t;
    k.run.n = k.starts++;
    k.run.checkpoint_at_start = last_ckpt;
    k.log_offset = 0;
    k.partial.clear();
    k.restart_at.reset();
    return absl::OkStatus();
  };
  // Reads the task's new progress lines ("step <n>...") into its record.
  auto read_steps = [&](Task& k) {
    const std::string text = ReadFrom(k.log_path, k.log_offset);
    k.log_offset += text.size();
    k.partial += text;
    std::size_t start = 0;
    for (std::size_t nl; (nl = k.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      absl::string_view line(k.partial.data() + start, nl - start);
      if (!absl::ConsumePrefix(&line, "step ")) continue;
      const std::size_t end = line.find_first_not_of("0123456789");
      int64_t s = 0;
      if (!absl::SimpleAtoi(line.substr(0, end), &s)) continue;
      if (k.run.first_step < 0) k.run.first_step = s;
      k.run.last_step = s;
    }
    k.partial.erase(0, start);
  };
  // Ends task `t`'s record after its exit (`status` from waitpid).
  auto ended = [&](int t, int status) {
    Task& k = tasks[t];
    read_steps(k);
    k.run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    k.run.elapsed_ms = MillisSince(k.started);
    if (kill(-k.pid, 0) == 0) {
      k.run.left_processes = true;
      kill(-k.pid, SIGKILL);
      bounded.Fail(absl::StrCat(kTaskNames[t], " run ", k.run.n, " left processes in its group (killed)"));
    }
    k.run.ended_by = EndedBy(k.run);
    g_pgids[t] = 0;
    k.pid = -1;
    r.runs.push_back(k.run);
    if (t == kChief) {
      if (Status s = VerifyListedCheckpoints(c.env, run_dir); !s.ok()) {
        verify.Fail(absl::StrCat("after chief run ", k.run.n, ": ", c.Rel(std::string(s.message()))));
      }
      const std::string log = ReadFrom(k.log_path, 0);
      const std::size_t at = log.rfind("(global steps lost: ");
      int64_t lost = 0;
      if (at != std::string::npos) {
        const std::string num = log.substr(at + 20, log.find(')', at) - at - 20);
        if (absl::SimpleAtoi(num, &lost)) r.steps_lost += lost;
      }
    }
  };

  // On an error of foreman chaos itself (a fork or a log that fails): no
  // task is left running.
  auto kill_all = [&] {
    for (int u = 0; u < 3; ++u) {
      if (tasks[u].pid > 0) {
        kill(-tasks[u].pid, SIGKILL);
        waitpid(tasks[u].pid, nullptr, 0);
        g_pgids[u] = 0;
        tasks[u].pid = -1;
      }
    }
  };
  for (int t : {kPs, kWorker1, kChief}) {
    if (Status s = start_task(t); !s.ok()) {
      kill_all();
      return s;
    }
  }
  const json& events = r.plan["events"];
  std::size_t next_event = 0;
  bool chief_done = false;  // the chief exited 0: training ended
  bool cut = false;               // a partition is on
  Clock::time_point heal_at{};    // until then
  while (true) {
    // 1. Exits and hangs.
    for (int t = 0; t < 3; ++t) {
      Task& k = tasks[t];
      if (k.pid < 0) continue;
      int status = 0;
      if (waitpid(k.pid, &status, WNOHANG) == k.pid) {
        ended(t, status);
        if (t == kChief && status == 0) {
          chief_done = true;
          // Training ended while a task was cut off: healed, it finds the
          // ps gone (the ps ends after the chief) and waits --ps-wait-secs.
          if (cut && tasks[cut_task].pid > 0) tasks[cut_task].run.cut_at_end = true;
        }
        continue;
      }
      if (MillisSince(k.started) > timeout_ms) {
        kill(-k.pid, SIGKILL);
        waitpid(k.pid, &status, 0);
        k.run.timed_out = true;
        bounded.Fail(absl::StrCat(kTaskNames[t], " run ", k.run.n, " did not end within --timeout-secs ",
                                  c.o.timeout_secs, " (its process group was killed)"));
        ended(t, status);
      }
    }
    // 2. The chief's checkpoints never go back.
    if (auto ckpt = LatestCheckpointStep(c.env, run_dir); ckpt.ok() && *ckpt >= 0) {
      if (*ckpt < last_ckpt) {
        steps.Fail(absl::StrCat("the chief's latest checkpoint went back from step ", last_ckpt, " to ", *ckpt));
      }
      last_ckpt = std::max(last_ckpt, *ckpt);
    }
    Task& chief = tasks[kChief];
    if (chief.pid > 0) read_steps(chief);
    // 3. Restarts due.
    bool restart_pending = false;
    for (int t = 0; t < 3; ++t) {
      Task& k = tasks[t];
      if (!k.restart_at) continue;
      if (chief_done) {
        k.restart_at.reset();  // training ended: nothing to rejoin
        continue;
      }
      if (Clock::now() < *k.restart_at || k.pid > 0) {
        restart_pending = true;
        continue;
      }
      if (r.restarts >= kMaxRestarts) {
        k.restart_at.reset();
        continue;
      }
      if (Status s = start_task(t); !s.ok()) {
        kill_all();
        return s;
      }
      ++r.restarts;
    }
    // 3b. The heal due (also after the chief ended: the others end then).
    if (cut && Clock::now() >= heal_at) {
      if (Status s = net.Heal(); !s.ok()) {
        kill_all();
        return s;
      }
      cut = false;
    }
    // 4. The next event, once the chief reported its step (and the last
    //    event's restart or heal is done).
    if (next_event < events.size() && !restart_pending && !cut && chief.pid > 0 &&
        chief.run.last_step >= events[next_event]["at_chief_step"].get<int64_t>()) {
      const json& e = events[next_event++];
      if (e.contains("partition")) {
        if (Status s = net.Cut(); !s.ok()) {
          kill_all();
          return s;
        }
        r.fired.push_back(e["id"].get<std::string>());
        ++r.partitions;
        cut = true;
        heal_at = Clock::now() + std::chrono::milliseconds(e["heal_after_ms"].get<int64_t>());
        continue;
      }
      const std::string target = e["kill"].get<std::string>();
      const int t = target == "ps" ? kPs : target == "chief" ? kChief : kWorker1;
      Task& k = tasks[t];
      if (k.pid > 0) {
        kill(-k.pid, SIGKILL);
        int status = 0;
        waitpid(k.pid, &status, 0);
        k.run.killed_by_plan = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        ended(t, status);
        r.fired.push_back(e["id"].get<std::string>());
        k.restart_at = Clock::now() + std::chrono::milliseconds(e["restart_after_ms"].get<int64_t>());
      }
    }
    bool any_alive = false;
    for (const Task& k : tasks) any_alive = any_alive || k.pid > 0 || k.restart_at.has_value();
    if (!any_alive) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a poll of 3 children and a log file
  }
  // The ends cluster.md's failure table gives: the chief 0 at --max-steps,
  // the others 0 after the chief ended training, a planned kill 137.
  for (int t = 0; t < 3; ++t) {
    const RunRecord* last = nullptr;
    for (const RunRecord& run : r.runs) {
      if (run.task != t) continue;
      if (run.killed_by_plan) {
        if (run.exit_code != 128 + SIGKILL) {
          finished.Fail(absl::StrCat(kTaskNames[t], " run ", run.n, " exited ", run.exit_code, " before its kill"));
        }
        continue;
      }
      last = &run;
    }
    if (last == nullptr) continue;  // killed last, after training ended
    // docs/cluster.md's failure table: a worker whose ps is gone past
    // --ps-wait-secs exits 1; cut off when the chief ended training, it
    // never learnt of the end, and the ps was gone when it was healed (its
    // log says so; any other exit 1 fails).
    const bool missed_end =
        t == kWorker1 && last->exit_code == 1 && last->cut_at_end &&
        absl::StrContains(ReadFrom(absl::StrCat(dir, "/", kTaskFiles[t], "-", last->n, ".log"), 0),
                          "waiting for the ps tasks; ClusterOptions::ps_wait_secs");
    if (last->exit_code != 0 && !missed_end) {
      finished.Fail(absl::StrCat(kTaskNames[t], " run ", last->n, " ended by ", last->ended_by,
                                 last->exit_code == 1 && t != kChief ? " (1: the ps was gone past --ps-wait-secs?)" : "",
                                 "; see ", kTaskFiles[t], "-", last->n, ".log"));
    }
  }
  // A restarted chief resumes past the checkpoint it started with (it
  // re-attaches to the ps, or restores that checkpoint and its first step
  // is the one after it): never at or before it.
  for (const RunRecord& run : r.runs) {
    if (run.task == kChief && run.n > 0 && run.first_step >= 0 && run.first_step <= run.checkpoint_at_start) {
      steps.Fail(absl::StrCat("chief run ", run.n, " reported step ", run.first_step,
                              " first, not past the latest checkpoint (step ", run.checkpoint_at_start,
                              ") when it started"));
    }
  }
  if (!chief_done) {
    finished.Fail("the chief did not end training (exit 0)");
  } else if (last_ckpt < c.max_steps) {
    finished.Fail(absl::StrCat("the chief's final checkpoint is at step ", last_ckpt, ", --max-steps ", c.max_steps));
  }
  if (Status s = VerifyListedCheckpoints(c.env, run_dir); !s.ok()) {
    verify.Fail(absl::StrCat("at the end: ", c.Rel(std::string(s.message()))));
  }
  r.elapsed_ms = MillisSince(seed_start);
  return r;
}

json SeedJson(const SeedReport& r) {
  json j;
  j["seed"] = r.seed;
  j["ok"] = r.ok();
  j["plan"] = r.plan;
  j["faults_planned"] = r.plan["events"].size();
  j["faults_fired"] = r.fired;
  j["restarts"] = r.restarts;
  j["partitions"] = r.partitions;
  j["steps_lost"] = r.steps_lost;
  json runs = json::array();
  for (const RunRecord& run : r.runs) {
    runs.push_back({{"task", kTaskNames[run.task]},
                    {"n", run.n},
                    {"exit_code", run.exit_code},
                    {"ended_by", run.ended_by},
                    {"checkpoint_at_start", run.checkpoint_at_start},
                    {"first_step", run.first_step},
                    {"last_step", run.last_step},
                    {"elapsed_ms", run.elapsed_ms}});
  }
  j["runs"] = runs;
  json inv = json::object();
  for (const auto& [name, i] : r.invariants) inv[name] = {{"ok", i.ok}, {"checked", i.checked}, {"details", i.details}};
  j["invariants"] = inv;
  j["replay"] = r.replay_report;
  j["elapsed_ms"] = r.elapsed_ms;
  return j;
}

}  // namespace

json ClusterChaosPlan(uint64_t seed, int64_t max_steps, bool partitions) {
  Draws d(seed);
  Draws p(seed ^ 0x6e6574637574ULL);  // "netcut": its own stream
  const char* partitioned = p.In(0, 1) == 0 ? "worker 1" : "ps";
  const int64_t n = d.In(1, 3);
  const int64_t last = std::max<int64_t>(kFirstEventStep + 2, max_steps * 2 / 5);
  std::set<int64_t> at;
  while (static_cast<int64_t>(at.size()) < n) at.insert(d.In(kFirstEventStep, last));
  json events = json::array();
  int64_t i = 0;
  for (int64_t step : at) {
    const bool cut = p.In(0, 2) == 0;
    const int64_t heal_after_ms = p.In(1000, 3000);
    const char* kill = kTaskNames[d.In(0, 2)];
    const int64_t restart_after_ms = d.In(200, 2000);
    if (partitions && cut) {
      events.push_back({{"id", absl::StrCat("e", i++)},
                        {"partition", partitioned},
                        {"at_chief_step", step},
                        {"heal_after_ms", heal_after_ms}});
      continue;
    }
    events.push_back({{"id", absl::StrCat("e", i++)},
                      {"kill", kill},
                      {"signal", "SIGKILL"},
                      {"at_chief_step", step},
                      {"restart_after_ms", restart_after_ms}});
  }
  return {{"preset", "cluster"}, {"seed", seed}, {"max_steps", max_steps}, {"events", events}};
}

std::string ClusterTrainFlagsError(const std::vector<std::string>& train_flags) {
  for (const char* own : kOwnFlags) {
    if (HasFlag(train_flags, own)) {
      return absl::StrCat("the train flags after -- may not set ", own, ": --preset cluster sets it per task");
    }
  }
  if (!train_flags.empty() && !IntFlag(train_flags, "--max-steps").has_value()) {
    return "--preset cluster needs --max-steps N among the train flags after -- (the chief's end)";
  }
  return "";
}

int RunClusterChaos(const ClusterChaosOptions& o) {
  Cluster c{o};
  c.train_flags = o.train_flags.empty() ? DefaultClusterTrainFlags() : o.train_flags;
  c.max_steps = IntFlag(c.train_flags, "--max-steps").value_or(kMaxSteps);
  InstallHandlers(o.work);
  c.partition_unavailable = PartitionUnavailable(c.train_flags);
  const std::string partition =
      c.partition_unavailable.empty() ? "available" : absl::StrCat("not available here (", c.partition_unavailable, ")");
  const auto started = Clock::now();
  std::printf("foreman chaos: preset cluster (1 ps, the chief, worker 1), train flags: %s\npartition: %s\n",
              absl::StrJoin(c.train_flags, " ").c_str(), partition.c_str());
  std::printf("%6s %7s %8s %10s %11s %11s %13s %12s %7s %8s\n", "seed", "faults", "restarts", "steps_lost",
              "checkpoints", "global_step", "final_weights", "scalars_once", "bounded", "finished");
  std::fflush(stdout);
  std::vector<SeedReport> reports;
  std::error_code ec;
  for (int64_t seed : o.seeds) {
    auto r = RunSeed(c, seed);
    if (!r.ok()) {
      std::fprintf(stderr, "foreman chaos: seed %lld: %s\n", static_cast<long long>(seed),
                   std::string(r.status().message()).c_str());
      return kExitFailed;
    }
    const auto& i = r->invariants;
    std::printf("%6lld %7s %8lld %10lld %11s %11s %13s %12s %7s %8s\n", static_cast<long long>(seed),
                absl::StrCat(r->fired.size(), "/", r->plan["events"].size()).c_str(),
                static_cast<long long>(r->restarts), static_cast<long long>(r->steps_lost),
                InvariantCell(i.at("checkpoints_verify")).c_str(), InvariantCell(i.at("global_step")).c_str(),
                InvariantCell(i.at("final_weights")).c_str(), InvariantCell(i.at("scalars_once")).c_str(),
                InvariantCell(i.at("bounded")).c_str(), InvariantCell(i.at("finished")).c_str());
    std::fflush(stdout);
    if (o.temporary && !o.keep && r->ok()) fs::remove_all(absl::StrCat(o.work, "/seed-", seed), ec);
    reports.push_back(std::move(*r));
  }
  int64_t failed = 0;
  for (const SeedReport& r : reports) {
    if (r.ok()) continue;
    ++failed;
    std::printf("\nseed %lld FAILED:\n", static_cast<long long>(r.seed));
    for (const std::string& name : InvariantNames()) {
      const Invariant& i = r.invariants.at(name);
      if (i.ok) continue;
      for (const std::string& d : i.details) std::printf("  %s: %s\n", name.c_str(), d.c_str());
    }
    std::printf("  runs:");
    for (const RunRecord& run : r.runs) {
      std::printf(" [%s %d: %s, steps %lld..%lld]", kTaskNames[run.task], run.n, run.ended_by.c_str(),
                  static_cast<long long>(run.first_step), static_cast<long long>(run.last_step));
    }
    std::printf("\n  logs: %s/seed-%lld\n  replay: %s\n", o.work.c_str(), static_cast<long long>(r.seed),
                r.replay.c_str());
  }
  const int64_t total_ms = MillisSince(started);
  int64_t partitions = 0;
  for (const SeedReport& r : reports) partitions += r.partitions;
  std::printf("\n%zu seeds, %lld failed, %.1f s (partition: %s)\n", reports.size(), static_cast<long long>(failed),
              static_cast<double>(total_ms) / 1000,
              c.partition_unavailable.empty() ? absl::StrCat(partitions, " fired").c_str() : partition.c_str());
  int code = failed == 0 ? kExitOk : kExitFailed;
  if (!o.json_path.empty()) {
    json report;
    report["preset"] = "cluster";
    report["train_flags"] = o.train_flags.empty() ? c.train_flags : o.report_train_flags;
    report["timeout_secs"] = o.timeout_secs;
    report["max_restarts"] = kMaxRestarts;
    report["partition"] = partition;
    json seeds = json::array();
    for (const SeedReport& r : reports) seeds.push_back(SeedJson(r));
    report["seeds"] = seeds;
    report["failed"] = failed;
    report["ok"] = failed == 0;
    report["elapsed_ms"] = total_ms;
    std::ofstream out(o.json_path);
    out << report.dump(2) << "\n";
    out.close();
    if (!out) {
      std::fprintf(stderr, "foreman chaos: cannot write --json %s\n", o.json_path.c_str());
      code = kExitFailed;
    }
  }
  if (o.temporary && !o.keep && failed == 0) {
    fs::remove_all(o.work, ec);
  } else {
    std::printf("work directory: %s\n", o.work.c_str());
  }
  return code;
}

}  // namespace foreman::cli
