// One seed of `foreman chaos --preset cluster` (chaos_cluster.hpp;
// docs/fault-injection.md, "--preset cluster").
//
// Per seed K, in <work>/seed-K/: plan.json (the seed's events), run/ (the
// chief's --checkpoint-dir) and <task>-<n>.log (stdout and stderr of the nth
// start of task ps / chief / worker1). The three tasks are children
// (internal::Subprocess of ChaosOptions::foreman_program, death signal
// SIGKILL) in their own process groups on free 127.0.0.1 ports
// (internal::FreeLoopbackPorts). The chief and worker 1 each write their
// run record (`foreman train --run-record`, foreman/fault.hpp's
// RunRecordWriter) to <task>-<n>.jsonl beside the log; the harness reads
// those, never the logs. A supervision loop (every 20 ms) reaps exits,
// reads the chief's step events, fires the next event when the chief
// reported its step (SIGKILL to the task's group), restarts the killed
// task on its own port after the drawn delay, and watches the chief's
// checkpoints. The run ends when every task has ended (the chief at
// --max-steps; the ps and worker 1 after the chief ended training).
//
// Partitions (chaos_cluster_net.hpp): a seed whose plan cuts a task runs its
// cluster in two network namespaces (the partitioned task in B, the others in
// A, on 10.213.0.x with --insecure; each task joins them before its exec).
#include "fault/chaos_cluster.hpp"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/local_ports.hpp"
#include "fault/chaos_cluster_net.hpp"
#include "fault/run_record.hpp"
#include "platform/subprocess.hpp"

namespace foreman::internal {

std::string ReadClusterLog(const std::string& path, std::size_t offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(static_cast<std::streamoff>(offset));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string EndedBy(const ClusterTaskRun& r) {
  if (r.timed_out) return "timeout (killed)";
  if (r.killed_by_plan) return "SIGKILL (planned)";
  if (r.exit_code == 0) return "done";
  if (r.exit_code == 1 && r.cut_at_end) return "exit 1 (cut off when the chief ended training)";
  if (r.exit_code > 128) return absl::StrCat("signal ", r.exit_code - 128);
  return absl::StrCat("exit ", r.exit_code);
}

struct Task {
  Subprocess proc;
  bool running = false;
  Clock::time_point started;
  int starts = 0;
  std::string log_path;
  std::string record_path;        // its run record ("" for the ps: it trains nothing)
  std::size_t record_offset = 0;  // how far the record was read
  std::string partial;            // a line of it not yet ended by '\n'
  bool record_failed = false;     // its record could not be read (reported once)
  ClusterTaskRun run;
  std::optional<Clock::time_point> restart_at;
};

// One seed's cluster, from its start to its checks.
class SeedRun {
 public:
  SeedRun(const ClusterJob& job, int64_t seed) : job_(job), run_(job.run), net_(job.run.observer) { r_.seed = seed; }

  StatusOr<ClusterSeedReport> Run() {
    const auto seed_start = Clock::now();
    r_ = NewClusterSeedReport(job_, r_.seed);
    FOREMAN_RETURN_IF_ERROR(Prepare());
    if (Status s = Supervise(); !s.ok()) {
      KillAll();
      return s;
    }
    CheckClusterEnds(job_, dir_, chief_done_, last_ckpt_, r_);
    r_.elapsed_ms = MillisSince(seed_start);
    return std::move(r_);
  }

 private:
  // The seed's directory and plan.json, the ports, the namespaces, the
  // flags every task shares; then the three tasks started.
  Status Prepare() {
    dir_ = absl::StrCat(run_.work, "/seed-", r_.seed);
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::create_directories(dir_, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir_, ": ", ec.message()));
    {
      std::ofstream out(dir_ + "/plan.json");
      out << r_.plan.dump(2) << "\n";
      if (!out) return absl::InternalError(absl::StrCat("cannot write ", dir_, "/plan.json"));
    }
    run_dir_ = dir_ + "/run";
    FOREMAN_ASSIGN_OR_RETURN(ports_, FreeLoopbackPorts(3));
    // A plan with a partition: the partitioned task runs in namespace B, the
    // others in A (their own network: the ports are free there too).
    for (const json& e : r_.plan["events"]) {
      if (e.contains("partition")) cut_task_ = e["partition"] == "ps" ? kPs : kWorker1;
    }
    if (cut_task_ >= 0) FOREMAN_RETURN_IF_ERROR(net_.SetUp());
    CommonFlags();
    for (int t : {kPs, kWorker1, kChief}) {
      if (Status s = StartTask(t); !s.ok()) {
        KillAll();
        return s;
      }
    }
    return absl::OkStatus();
  }

  const char* HostOf(int t) const {
    return cut_task_ < 0 ? "127.0.0.1" : t == cut_task_ ? kPartitionAddrB : kPartitionAddrA;
  }

  void CommonFlags() {
    common_ = job_.train_flags;
    for (const std::string& w :
         {std::string("--ps-hosts"), absl::StrCat(HostOf(kPs), ":", ports_[0]), std::string("--worker-hosts"),
          absl::StrCat(HostOf(kChief), ":", ports_[1], ",", HostOf(kWorker1), ":", ports_[2])}) {
      common_.push_back(w);
    }
    if (cut_task_ >= 0) common_.push_back("--insecure");  // not loopback: TLS or --insecure
    if (!HasFlag(common_, "--heartbeat-ms")) common_.insert(common_.end(), {"--heartbeat-ms", "200"});
    if (!HasFlag(common_, "--connection-timeout-ms")) {
      common_.insert(common_.end(), {"--connection-timeout-ms", "1000"});
    }
  }

  std::vector<std::string> ArgsOf(int task) const {
    const double timeout_secs = run_.options.timeout_secs;
    // Shorter than the timeout: a ps that never returns ends the workers
    // (exit 1) before they are killed as hung.
    const int64_t ps_wait_secs = std::max<int64_t>(1, static_cast<int64_t>(timeout_secs / 2));
    std::vector<std::string> a = {"foreman", "train"};
    a.insert(a.end(), common_.begin(), common_.end());
    if (task == kPs) {
      a.insert(a.end(), {"--job-name", "ps", "--task-index", "0", "--checkpoint-dir", dir_ + "/ps-unused",
                         "--ps-join-timeout-secs", absl::StrCat(static_cast<int64_t>(std::ceil(timeout_secs)))});
    } else if (task == kChief) {
      a.insert(a.end(), {"--job-name", "worker", "--task-index", "0", "--checkpoint-dir", run_dir_,
                         "--save-checkpoint-steps", "20", "--ps-wait-secs", absl::StrCat(ps_wait_secs),
                         "--run-record", tasks_[task].record_path});
    } else {
      a.insert(a.end(), {"--job-name", "worker", "--task-index", "1", "--checkpoint-dir", dir_ + "/worker1-unused",
                         "--ps-wait-secs", absl::StrCat(ps_wait_secs), "--run-record", tasks_[task].record_path});
    }
    return a;
  }

  Status StartTask(int t) {
    Task& k = tasks_[t];
    k.log_path = absl::StrCat(dir_, "/", kClusterTaskFiles[t], "-", k.starts, ".log");
    k.record_path = t == kPs ? "" : absl::StrCat(dir_, "/", kClusterTaskFiles[t], "-", k.starts, ".jsonl");
    SpawnOptions o;
    o.program = run_.options.foreman_program;
    o.argv = ArgsOf(t);
    o.stdout_to = ChildOutput::File(k.log_path);
    o.join_namespaces_of = cut_task_ < 0 ? 0 : t == cut_task_ ? net_.b() : net_.a();
    FOREMAN_ASSIGN_OR_RETURN(k.proc, SpawnObserved(o, run_.observer, t));  // death signal SIGKILL: no orphaned task
    k.running = true;
    k.started = Clock::now();
    k.run = ClusterTaskRun();
    k.run.task = t;
    k.run.n = k.starts++;
    k.run.checkpoint_at_start = last_ckpt_;
    k.record_offset = 0;
    k.partial.clear();
    k.record_failed = false;
    k.restart_at.reset();
    return absl::OkStatus();
  }

  // Reads the task's new run record events (whole lines) into its run:
  // steps, recoveries' steps lost, a failure. A line cut off by a kill
  // stays in `partial` and is never read.
  void ReadRecord(int t) {
    Task& k = tasks_[t];
    if (k.record_path.empty() || k.record_failed) return;
    const std::string text = ReadClusterLog(k.record_path, k.record_offset);
    k.record_offset += text.size();
    k.partial += text;
    const std::size_t end = k.partial.rfind('\n');
    if (end == std::string::npos) return;
    StatusOr<std::vector<json>> events =
        ParseRunRecord(k.partial.substr(0, end + 1), absl::StrCat(kClusterTaskFiles[t], "-", k.run.n, ".jsonl"));
    k.partial.erase(0, end + 1);
    if (!events.ok()) {
      k.record_failed = true;
      r_.invariants["finished"].Fail(absl::StrCat(kClusterTaskNames[t], " run ", k.run.n,
                                                  ": its run record cannot be read: ", events.status().message()));
      return;
    }
    for (const json& e : *events) {
      const std::string& kind = e["event"].get_ref<const std::string&>();
      if (kind == "step" && e.contains("global_step") && e["global_step"].is_number_integer()) {
        const int64_t s = e["global_step"].get<int64_t>();
        if (k.run.first_step < 0) k.run.first_step = s;
        k.run.last_step = s;
      } else if (kind == "recovery" && e.contains("steps_lost") && e["steps_lost"].is_number_integer()) {
        k.run.steps_lost += e["steps_lost"].get<int64_t>();
      } else if (kind == "failed") {
        k.run.failed_code = e.value("code", "");
        k.run.failed = absl::StrCat(k.run.failed_code, ": ", e.value("message", ""));
      }
    }
  }

  // Ends task `t`'s record after its exit (reaped: `exit`).
  void Ended(int t, const ExitStatus& exit) {
    Task& k = tasks_[t];
    ReadRecord(t);
    k.run.exit_code = exit.exit_code;
    k.run.elapsed_ms = MillisSince(k.started);
    if (exit.left_processes) {
      k.run.left_processes = true;
      r_.invariants["bounded"].Fail(
          absl::StrCat(kClusterTaskNames[t], " run ", k.run.n, " left processes in its group (killed)"));
    }
    k.run.ended_by = EndedBy(k.run);
    run_.observer.OnProcessGroup(t, 0);
    k.proc = Subprocess();
    k.running = false;
    r_.runs.push_back(k.run);
    if (t != kChief) return;
    if (Status s = VerifyListedCheckpoints(run_.env, run_dir_); !s.ok()) {
      r_.invariants["checkpoints_verify"].Fail(
          absl::StrCat("after chief run ", k.run.n, ": ", run_.Rel(std::string(s.message()))));
    }
    r_.steps_lost += k.run.steps_lost;
  }

  // Kills task `t`'s group now and reaps it.
  StatusOr<ExitStatus> Kill(int t) {
    FOREMAN_ASSIGN_OR_RETURN(FinishResult f, tasks_[t].proc.Finish(0));
    return f.exit;
  }

  // On an error of foreman chaos itself: no task is left running.
  void KillAll() {
    for (int u = 0; u < 3; ++u) {
      if (!tasks_[u].running) continue;
      tasks_[u].proc = Subprocess();  // its destructor kills the group and reaps it
      tasks_[u].running = false;
      run_.observer.OnProcessGroup(u, 0);
    }
  }

  // 1. Exits and hangs.
  Status ReapExits() {
    const int64_t timeout_ms = static_cast<int64_t>(std::ceil(run_.options.timeout_secs * 1000));
    for (int t = 0; t < 3; ++t) {
      Task& k = tasks_[t];
      if (!k.running) continue;
      FOREMAN_ASSIGN_OR_RETURN(std::optional<ExitStatus> exit, k.proc.Poll());
      if (exit.has_value()) {
        Ended(t, *exit);
        if (t == kChief && exit->exit_code == 0) {
          chief_done_ = true;
          // Training ended while a task was cut off: healed, it finds the
          // ps gone (the ps ends after the chief) and waits --ps-wait-secs.
          if (cut_ && tasks_[cut_task_].running) tasks_[cut_task_].run.cut_at_end = true;
        }
        continue;
      }
      if (MillisSince(k.started) > timeout_ms) {
        FOREMAN_ASSIGN_OR_RETURN(ExitStatus killed, Kill(t));
        k.run.timed_out = true;
        r_.invariants["bounded"].Fail(absl::StrCat(kClusterTaskNames[t], " run ", k.run.n,
                                                   " did not end within --timeout-secs ", run_.options.timeout_secs,
                                                   " (its process group was killed)"));
        Ended(t, killed);
      }
    }
    return absl::OkStatus();
  }

  // 2. The chief's checkpoints never go back.
  void WatchCheckpoints() {
    if (auto ckpt = LatestCheckpointStep(run_.env, run_dir_); ckpt.ok() && *ckpt >= 0) {
      if (*ckpt < last_ckpt_) {
        r_.invariants["global_step"].Fail(
            absl::StrCat("the chief's latest checkpoint went back from step ", last_ckpt_, " to ", *ckpt));
      }
      last_ckpt_ = std::max(last_ckpt_, *ckpt);
    }
    if (tasks_[kChief].running) ReadRecord(kChief);
  }

  // 3. Restarts due; *pending when one is still waiting.
  Status Restarts(bool* pending) {
    *pending = false;
    for (int t = 0; t < 3; ++t) {
      Task& k = tasks_[t];
      if (!k.restart_at) continue;
      if (chief_done_) {
        k.restart_at.reset();  // training ended: nothing to rejoin
        continue;
      }
      if (Clock::now() < *k.restart_at || k.running) {
        *pending = true;
        continue;
      }
      if (r_.restarts >= kChaosMaxRestarts) {
        k.restart_at.reset();
        continue;
      }
      FOREMAN_RETURN_IF_ERROR(StartTask(t));
      ++r_.restarts;
    }
    // 3b. The heal due (also after the chief ended: the others end then).
    if (cut_ && Clock::now() >= heal_at_) {
      FOREMAN_RETURN_IF_ERROR(net_.Heal());
      cut_ = false;
    }
    return absl::OkStatus();
  }

  // 4. The next event, once the chief reported its step (and the last
  //    event's restart or heal is done).
  Status NextEvent(bool restart_pending) {
    const json& events = r_.plan["events"];
    const Task& chief = tasks_[kChief];
    if (next_event_ >= events.size() || restart_pending || cut_ || !chief.running ||
        chief.run.last_step < events[next_event_]["at_chief_step"].get<int64_t>()) {
      return absl::OkStatus();
    }
    const json& e = events[next_event_++];
    if (e.contains("partition")) {
      FOREMAN_RETURN_IF_ERROR(net_.Cut());
      r_.fired.push_back(e["id"].get<std::string>());
      ++r_.partitions;
      cut_ = true;
      heal_at_ = Clock::now() + std::chrono::milliseconds(e["heal_after_ms"].get<int64_t>());
      return absl::OkStatus();
    }
    const std::string target = e["kill"].get<std::string>();
    const int t = target == "ps" ? kPs : target == "chief" ? kChief : kWorker1;
    Task& k = tasks_[t];
    if (!k.running) return absl::OkStatus();
    FOREMAN_ASSIGN_OR_RETURN(ExitStatus killed, Kill(t));
    k.run.killed_by_plan = killed.term_signal == SIGKILL;
    Ended(t, killed);
    r_.fired.push_back(e["id"].get<std::string>());
    k.restart_at = Clock::now() + std::chrono::milliseconds(e["restart_after_ms"].get<int64_t>());
    return absl::OkStatus();
  }

  Status Supervise() {
    while (true) {
      FOREMAN_RETURN_IF_ERROR(ReapExits());
      WatchCheckpoints();
      bool restart_pending = false;
      FOREMAN_RETURN_IF_ERROR(Restarts(&restart_pending));
      const bool was_cut = cut_;
      FOREMAN_RETURN_IF_ERROR(NextEvent(restart_pending));
      if (cut_ && !was_cut) continue;  // a cut just fired: look again at once
      bool any_alive = false;
      for (const Task& k : tasks_) any_alive = any_alive || k.running || k.restart_at.has_value();
      if (!any_alive) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a poll of 3 children and a record file
    }
  }

  const ClusterJob& job_;
  ChaosRun& run_;
  ClusterSeedReport r_;
  std::string dir_, run_dir_;
  std::vector<int> ports_;
  int cut_task_ = -1;
  std::vector<std::string> common_;
  // Declared before the tasks: destroyed after them (a task in a namespace
  // ends before its holder).
  PartitionNet net_;
  Task tasks_[3];
  int64_t last_ckpt_ = -1;  // the chief's latest checkpoint seen
  std::size_t next_event_ = 0;
  bool chief_done_ = false;  // the chief exited 0: training ended
  bool cut_ = false;         // a partition is on
  Clock::time_point heal_at_{};
};

}  // namespace

StatusOr<ClusterSeedReport> RunClusterSeed(const ClusterJob& job, int64_t seed) {
  SeedRun run(job, seed);
  return run.Run();
}

}  // namespace foreman::internal
