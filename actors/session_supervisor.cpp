#include "session_supervisor.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "foreman/mutex.hpp"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "actor_system.hpp"
#include "checkpoint_saver.hpp"
#include "formats/saver.hpp"
#include "input_pipeline.hpp"
#include "fault/injected_fault.hpp"
#include "platform/log.hpp"
#include "platform/path.hpp"
#include "runtime/runtime.hpp"
#include "step_counter.hpp"
#include "summary_writer.hpp"

namespace foreman::internal {

// -- the session_supervisor actor --------------------------------------------------

namespace {

struct ServiceChild {
  ChildSpec spec;
  caf::actor actor;          // null while down
  int64_t restarts = 0;      // how many times it was restarted
  bool removed = false;      // not restarted (temporary / transient): gone for good
  bool awaiting_down = false;  // stopped by a restart group; its down_msg is expected
  // A temporary service stopped with a failed sibling (one_for_all,
  // rest_for_one): removed once down, never restarted (OTP). Why it was
  // stopped (CANCELLED naming the sibling); OK when not.
  Status removed_with_sibling;
  // Injected kills (ServiceFaults::Kill) waiting for this incarnation's exit
  // to be handled.
  std::vector<std::shared_ptr<Completion>> kill_waiters;
};

// Services restarting together after one failure (its back-off, then every
// member down, then all are spawned again in start order).
struct PendingRestart {
  std::vector<std::size_t> members;  // indexes into services, in start order
  std::size_t failed = 0;
  Status reason;  // the failed service's exit status (OK: a normal exit)
  absl::Duration backoff;
  bool timer_done = false;
  std::vector<std::shared_ptr<Completion>> kill_waiters;  // the failed service's, completed once it is restarted
};

struct session_supervisor_state {
  std::shared_ptr<FailureCell> cell;
  std::shared_ptr<const SupervisorOptions> options;
  caf::actor failure_sink;  // null once it is down
  caf::actor_addr failure_sink_addr;
  std::vector<ServiceChild> services;  // in start order
  std::map<uint64_t, PendingRestart> pending;
  uint64_t next_pending = 0;
  std::deque<absl::Duration> restart_times;  // on options.clock, within the period
  bool shutting_down = false;
  std::set<caf::actor_addr> children_ever;  // every incarnation's address
  static const char* name;
};
const char* session_supervisor_state::name = "session_supervisor";

using supervisor_actor = caf::stateful_actor<session_supervisor_state>;

std::string KindOf(const ChildSpec& spec) {
  if (!spec.kind.empty()) return spec.kind;
  return spec.name.substr(0, spec.name.find('('));
}

// Every child still running, the failure_sink last.
std::vector<caf::actor> Running(supervisor_actor* self) {
  std::vector<caf::actor> out;
  for (const ServiceChild& c : self->state.services) {
    if (c.actor) out.push_back(c.actor);
  }
  if (self->state.failure_sink) out.push_back(self->state.failure_sink);
  return out;
}

// Services go first, the failure_sink last, so that a failure reported while
// the services stop still finds it.
void StopChildren(supervisor_actor* self) {
  auto& st = self->state;
  std::vector<caf::actor> running = Running(self);
  if (running.empty()) {
    self->quit();
    return;
  }
  const bool only_failure_sink = running.size() == 1 && running.front() == st.failure_sink;
  for (const caf::actor& child : running) {
    if (child != st.failure_sink || only_failure_sink) self->send_exit(child, caf::exit_reason::user_shutdown);
  }
}

// The run fails with `s` (TF: a failing service ends the run).
void Escalate(supervisor_actor* self, const std::string& name, const Status& s) {
  auto& st = self->state;
  if (st.failure_sink && !st.shutting_down) {
    self->send(st.failure_sink, report_atom::value, name, ToMessage(s));
  } else {
    st.cell->Report(name, s);
  }
}

// The kill waiters of an exit just handled: completed once the failure_sink
// has taken every report sent before (its mailbox is in order), so a waiter
// finds the run's error set when the exit escalated.
void KillApplied(supervisor_actor* self, std::vector<std::shared_ptr<Completion>> waiters) {
  for (auto& done : waiters) {
    if (self->state.failure_sink) {
      self->send(self->state.failure_sink, flush_atom::value, std::move(done));
    } else {
      done->Complete(absl::OkStatus());
    }
  }
}

void StartService(supervisor_actor* self, std::size_t i, const caf::actor& actor) {
  ServiceChild& c = self->state.services[i];
  c.actor = actor;
  self->state.children_ever.insert(actor.address());
  self->link_to(actor);  // Our abnormal death takes the children down.
  self->monitor(actor);
  if (c.spec.link) ChildLink::Rebind(c.spec.link, actor);
}

std::string LossText(const ServiceRestart& r) {
  if (!r.saves_lost.empty()) {
    return absl::StrCat("; the checkpoint save(s) of step(s) [", absl::StrJoin(r.saves_lost, ", "), "] lost");
  }
  if (r.events_lost < 0) return "";
  std::vector<int64_t> shown(r.steps_lost.begin(),
                             r.steps_lost.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(
                                                        r.steps_lost.size(), 20)));
  return absl::StrCat("; ", r.events_lost, " queued event(s) lost, at step(s) [", absl::StrJoin(shown, ", "),
                      r.steps_lost.size() > shown.size() ? ", ..." : "", "]");
}

// A pending restart that will not happen (the tree shuts down): requests
// parked for its members fail.
void DropPending(supervisor_actor* self, const PendingRestart& p) {
  for (std::size_t j : p.members) {
    const ServiceChild& c = self->state.services[j];
    if (c.spec.link) {
      c.spec.link->MarkFailed(absl::UnavailableError("the session's actors are shutting down"));
    }
  }
}

// Spawns the group again once its back-off is over and every member is down.
void MaybeRestart(supervisor_actor* self, uint64_t id) {
  auto& st = self->state;
  auto it = st.pending.find(id);
  if (it == st.pending.end()) return;
  PendingRestart& p = it->second;
  if (st.shutting_down || !st.failure_sink) {
    DropPending(self, it->second);
    KillApplied(self, std::move(it->second.kill_waiters));
    st.pending.erase(it);
    return;
  }
  if (!p.timer_done) return;
  for (std::size_t j : p.members) {
    if (st.services[j].awaiting_down) return;
  }
  PendingRestart group = std::move(p);
  st.pending.erase(it);
  for (std::size_t j : group.members) {
    ServiceChild& c = st.services[j];
    if (c.spec.link && c.spec.link->retired()) {  // its owner stopped it meanwhile
      c.removed = true;
      continue;
    }
    ServiceRestart record;
    record.service = c.spec.name;
    record.reason = j == group.failed ? group.reason : absl::OkStatus();
    record.restarted = true;
    record.by_strategy = j != group.failed;
    record.backoff = j == group.failed ? group.backoff : absl::ZeroDuration();
    if (c.spec.link) record.saves_lost = c.spec.link->TakeLostSaves();
    if (c.spec.on_exit) c.spec.on_exit(&record, true);
    caf::actor actor;
    Status s = InvokeUserCode(absl::StrCat("restarting ", c.spec.name), [&] { actor = c.spec.spawn(self, st.failure_sink); });
    if (s.ok() && !actor) s = absl::InternalError(absl::StrCat("restarting ", c.spec.name, ": no actor"));
    if (!s.ok()) {
      c.removed = true;
      if (c.spec.on_stopped) c.spec.on_stopped(s);
      if (c.spec.link) c.spec.link->MarkFailed(s);
      Escalate(self, c.spec.name, s);
      continue;
    }
    ++c.restarts;
    StartService(self, j, actor);
    if (c.spec.on_restarted) c.spec.on_restarted(actor);
    FOREMAN_LOG_WARN("{} restarted ({} restart {}, {}, at most {} within {}){}{}{}", c.spec.name,
                     RestartTypeName(st.options->policy.TypeOf(KindOf(c.spec))), c.restarts,
                     RestartStrategyName(st.options->policy.strategy), st.options->policy.max_restarts,
                     absl::FormatDuration(st.options->policy.period),
                     record.by_strategy ? " with a failed sibling" : "",
                     record.reason.ok() ? std::string(" after a normal exit")
                                        : absl::StrCat(" after: ", record.reason.ToString(absl::StatusToStringMode::kWithNoExtraData)),
                     LossText(record));
    st.options->log->Add(std::move(record));
  }
  KillApplied(self, std::move(group.kill_waiters));
}

// A service went down while the tree runs: the policy decides.
void ServiceDown(supervisor_actor* self, std::size_t i, const caf::error& reason) {
  auto& st = self->state;
  ServiceChild& c = st.services[i];
  const RestartPolicy& policy = st.options->policy;
  const bool normal = !reason;
  if (c.spec.link && c.spec.link->retired()) {  // its owner stopped it: not a failure
    c.removed = true;
    return;
  }
  if (policy.IsTensorFlowDefault()) {
    const Status status = normal ? absl::OkStatus() : ErrorToStatus(reason, c.spec.name);
    if (c.spec.on_stopped) c.spec.on_stopped(status);
    if (!normal) {
      if (c.spec.link) c.spec.link->MarkFailed(status);
      Escalate(self, c.spec.name, status);
    }
    return;
  }
  const Status status = normal ? absl::OkStatus() : ErrorToStatus(reason, c.spec.name);
  const RestartType type = policy.TypeOf(KindOf(c.spec));
  const bool restart = type == RestartType::kPermanent || (type == RestartType::kTransient && !normal);
  if (!restart) {
    c.removed = true;
    if (c.spec.link) c.spec.link->MarkRemoved(status);
    ServiceRestart record;
    record.service = c.spec.name;
    record.reason = status;
    if (c.spec.link) record.saves_lost = c.spec.link->TakeLostSaves();
    if (c.spec.on_exit) c.spec.on_exit(&record, false);
    FOREMAN_LOG_WARN("{} ({}) exited{}; not restarted, the run goes on without it{}", c.spec.name,
                     RestartTypeName(type), normal ? " normally" : absl::StrCat(": ", status.ToString(absl::StatusToStringMode::kWithNoExtraData)),
                     LossText(record));
    st.options->log->Add(std::move(record));
    return;
  }
  // Restart intensity (OTP): at most max_restarts within period.
  const absl::Duration now = st.options->clock->MonotonicNow();
  while (!st.restart_times.empty() && st.restart_times.front() <= now - policy.period) st.restart_times.pop_front();
  if (static_cast<int64_t>(st.restart_times.size()) >= policy.max_restarts) {
    const Status escalated =
        normal ? absl::InternalError(absl::StrCat(c.spec.name, " exited normally"))
               : status;
    if (policy.max_restarts > 0) {
      FOREMAN_LOG_ERROR("{}: restart intensity exceeded (at most {} restart(s) within {}); the run fails with {}",
                        c.spec.name, policy.max_restarts, absl::FormatDuration(policy.period), escalated.ToString(absl::StatusToStringMode::kWithNoExtraData));
    }
    c.removed = true;
    if (c.spec.on_stopped) c.spec.on_stopped(escalated);
    if (c.spec.link) c.spec.link->MarkFailed(escalated);
    Escalate(self, c.spec.name, escalated);
    return;
  }
  st.restart_times.push_back(now);
  PendingRestart group;
  group.failed = i;
  group.reason = status;
  group.backoff = RestartBackoff(policy, c.spec.name, c.restarts + 1);
  // The kill's waiters: with no back-off the restart is made in this
  // handler (or once the group's other members are down), and they are
  // completed then; with a back-off, the decision (a restart scheduled) is
  // what they wait for, completed now by the down handler, not after the
  // back-off (up to kMaxRestartBackoff, longer than FaultInjectionHook's
  // bounded wait).
  if (group.backoff <= absl::ZeroDuration()) {
    group.kill_waiters.swap(c.kill_waiters);
  }
  for (std::size_t j = 0; j < st.services.size(); ++j) {
    ServiceChild& other = st.services[j];
    const bool member = j == i || (policy.strategy == RestartStrategy::kOneForAll) ||
                        (policy.strategy == RestartStrategy::kRestForOne && j > i);
    if (!member || other.removed) continue;
    if (j != i) {
      if (!other.actor || other.awaiting_down) continue;  // down already: its own failure handles it
      other.awaiting_down = true;
      self->send_exit(other.actor, caf::exit_reason::user_shutdown);
      if (policy.TypeOf(KindOf(other.spec)) == RestartType::kTemporary) {
        // OTP: a temporary child is never restarted, not even when its
        // group is: it is stopped with the others and removed once down.
        other.removed_with_sibling = absl::CancelledError(absl::StrCat(
            "stopped by the restart strategy (", RestartStrategyName(policy.strategy), ") when ", c.spec.name,
            " failed"));
        continue;
      }
    }
    group.members.push_back(j);
  }
  const uint64_t id = st.next_pending++;
  const absl::Duration backoff = group.backoff;
  st.pending.emplace(id, std::move(group));
  if (backoff <= absl::ZeroDuration()) {
    st.pending[id].timer_done = true;
    MaybeRestart(self, id);
  } else {
    self->delayed_send(self, absl::ToChronoNanoseconds(backoff), restart_atom::value, id);
  }
}

caf::behavior session_supervisor(supervisor_actor* self, std::shared_ptr<FailureCell> cell,
                                 std::shared_ptr<const SupervisorOptions> options) {
  MakeQuiet(self, "session_supervisor");
  self->state.cell = std::move(cell);
  self->state.options = std::move(options);
  self->state.failure_sink = SpawnFailureSink(self, self->state.cell);
  self->state.failure_sink_addr = self->state.failure_sink.address();
  self->state.children_ever.insert(self->state.failure_sink_addr);
  self->link_to(self->state.failure_sink);
  self->monitor(self->state.failure_sink);

  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source == st.failure_sink_addr && st.failure_sink) {
      st.failure_sink = nullptr;
      const bool expected = !dm.reason || (st.shutting_down && dm.reason == caf::exit_reason::user_shutdown);
      if (!expected) st.cell->Report("failure_sink", ErrorToStatus(dm.reason, "failure_sink"));
      if (st.shutting_down) StopChildren(self);
      return;
    }
    std::size_t i = 0;
    while (i < st.services.size() && !(st.services[i].actor && st.services[i].actor.address() == dm.source)) ++i;
    if (i == st.services.size()) return;
    ServiceChild& c = st.services[i];
    c.actor = nullptr;
    if (st.shutting_down) {
      const bool expected = !dm.reason || dm.reason == caf::exit_reason::user_shutdown;
      if (!expected) st.cell->Report(c.spec.name, ErrorToStatus(dm.reason, c.spec.name));
      KillApplied(self, std::move(c.kill_waiters));
      StopChildren(self);
      return;
    }
    if (c.awaiting_down) {  // stopped for a restart group
      c.awaiting_down = false;
      KillApplied(self, std::move(c.kill_waiters));
      if (!c.removed_with_sibling.ok()) {  // temporary: not a member, removed
        c.removed = true;
        if (c.spec.link) c.spec.link->MarkRemoved(c.removed_with_sibling);
        ServiceRestart record;
        record.service = c.spec.name;
        record.reason = c.removed_with_sibling;
        record.by_strategy = true;
        if (c.spec.link) record.saves_lost = c.spec.link->TakeLostSaves();
        if (c.spec.on_exit) c.spec.on_exit(&record, false);
        FOREMAN_LOG_WARN("{} (temporary) {}; not restarted, the run goes on without it{}", c.spec.name,
                         std::string(record.reason.message()), LossText(record));
        st.options->log->Add(std::move(record));
        return;
      }
      for (auto& [id, p] : st.pending) {
        if (std::find(p.members.begin(), p.members.end(), i) != p.members.end()) {
          MaybeRestart(self, id);
          break;
        }
      }
      return;
    }
    ServiceDown(self, i, dm.reason);
    // Escalated, removed or forgotten: applied now (a restart's group holds
    // its waiters until the restart).
    KillApplied(self, std::move(st.services[i].kill_waiters));
  });

  self->set_exit_handler([=](caf::exit_msg& em) {
    auto& st = self->state;
    // A child's link (any incarnation's): its down_msg says the rest.
    if (em.source && st.children_ever.count(em.source) != 0) return;
    if (st.shutting_down) return;
    st.shutting_down = true;
    for (auto& [id, p] : st.pending) {
      DropPending(self, p);
      KillApplied(self, std::move(p.kill_waiters));
    }
    st.pending.clear();
    StopChildren(self);
  });

  return {
      [=](spawn_atom, const ChildSpec& spec, const std::shared_ptr<SpawnReply>& reply) {
        auto& st = self->state;
        if (st.shutting_down || !st.failure_sink) {
          reply->done->Complete(absl::FailedPreconditionError(
              absl::StrCat("cannot start ", spec.name, ": the session's actors are shutting down")));
          return;
        }
        ServiceChild child;
        child.spec = spec;
        caf::actor actor;
        Status s = InvokeUserCode(absl::StrCat("starting ", spec.name),
                                  [&] { actor = child.spec.spawn(self, st.failure_sink); });
        if (s.ok() && !actor) s = absl::InternalError(absl::StrCat("starting ", spec.name, ": no actor"));
        if (!s.ok()) {
          reply->done->Complete(std::move(s));
          return;
        }
        st.services.push_back(std::move(child));
        StartService(self, st.services.size() - 1, actor);
        reply->actor = actor;
        reply->done->Complete(absl::OkStatus());
      },
      [=](kill_atom, const std::string& name, const caf::error& reason, const std::shared_ptr<Completion>& done) {
        auto& st = self->state;
        for (ServiceChild& c : st.services) {
          if (c.spec.name != name || !c.actor) continue;
          c.kill_waiters.push_back(done);
          self->send(c.actor, kill_atom::value, reason);
          return;
        }
        done->Complete(absl::OkStatus());  // not running: nothing to apply
      },
      [=](restart_atom, uint64_t id) {
        auto it = self->state.pending.find(id);
        if (it == self->state.pending.end()) return;
        it->second.timer_done = true;
        MaybeRestart(self, id);
      },
  };
}

}  // namespace

caf::actor SpawnSessionSupervisor(caf::actor_system& system, std::shared_ptr<FailureCell> cell,
                                  const SupervisorOptions& options) {
  // Shared, not moved into CAF's spawn tuple (GCC 12 warns maybe-uninitialized
  // on a moved std::map there).
  auto shared = std::make_shared<const SupervisorOptions>(options);
  return system.spawn(session_supervisor, std::move(cell), std::move(shared));
}

caf::actor SpawnSessionSupervisor(caf::actor_system& system, std::shared_ptr<FailureCell> cell) {
  auto shared = std::make_shared<const SupervisorOptions>();
  return system.spawn(session_supervisor, std::move(cell), std::move(shared));
}

// -- Runtime ------------------------------------------------------------------------

namespace {

// Spawning is a round trip to the supervisor on the shared scheduler; it
// only takes long when the process is starved.
constexpr absl::Duration kSpawnTimeout = absl::Seconds(30);
// What the destructor allows a Shutdown() nobody called.
constexpr absl::Duration kDestructorShutdownTimeout = absl::Seconds(60);

class RuntimeImpl : public Runtime, public ServiceFaults {
 public:
  RuntimeImpl(const RuntimeOptions& options, const SessionConfig& config)
      : options_(WithoutLock(options)),
        config_(config),
        cell_(std::make_shared<FailureCell>()),
        held_lock_(options.held_lock) {}

  ~RuntimeImpl() override {
    {
      MutexLock l(shutdown_mu_);
      if (shut_down_) return;  // Whoever called Shutdown() got its status.
    }
    Status s = Shutdown(kDestructorShutdownTimeout);
    if (!s.ok()) FOREMAN_LOG_ERROR("Shutting down the session's actors: {}", s.ToString());
  }

  Status Start() {
    caf::actor_system* system = options_.actor_system;
    if (system == nullptr) {
      FOREMAN_ASSIGN_OR_RETURN(process_system_, AcquireProcessActorSystem(config_.actor_threads));
      system = process_system_.get();
    }
    system_ = system;
    // Spawned from a thread that ends at once (actor_system.hpp).
    return RunOnShortLivedThread([&] {
      auto supervisor = std::make_shared<ChildLink>("session_supervisor");
      SupervisorOptions sup;
      sup.policy = options_.restart;
      sup.clock = config_.clock;
      sup.log = restart_log_;
      ChildLink::Attach(supervisor, SpawnSessionSupervisor(*system_, cell_, sup));
      supervisor_ = std::move(supervisor);
      return absl::OkStatus();
    });
  }

  // -- Services --

  StatusOr<std::shared_ptr<SummaryWriterService>> SummaryWriter(const std::string& logdir) override {
    MutexLock l(mu_);
    FOREMAN_ASSIGN_OR_RETURN(auto writer, SummaryWriterLocked(logdir));
    return std::shared_ptr<SummaryWriterService>(std::move(writer));
  }

  StatusOr<std::shared_ptr<CheckpointService>> CheckpointSaver(const std::string& dir_in,
                                                               std::shared_ptr<Saver> saver,
                                                               const std::string& basename) override {
    MutexLock l(mu_);
    FOREMAN_RETURN_IF_ERROR(CheckRunningLocked());
    if (dir_in.empty()) return absl::InvalidArgumentError("CheckpointSaver: empty checkpoint directory");
    if (saver == nullptr) return absl::InvalidArgumentError("CheckpointSaver: no saver");
    const std::string dir = NormalizeDirectory(dir_in);
    auto it = savers_.find(dir);
    if (it != savers_.end()) {
      if (it->second->saver() == saver && it->second->basename() == basename) return {it->second};
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint directory ", dir, " already has a checkpoint saver in this session (one writer per directory)"));
    }
    std::shared_ptr<FileLock> lock;
    if (held_lock_ != nullptr && !options_.held_lock_directory.empty() &&
        NormalizeDirectory(options_.held_lock_directory) == dir) {
      lock = held_lock_;  // the caller's: the directory stays locked throughout
    } else {
      FOREMAN_ASSIGN_OR_RETURN(lock, LockCheckpointDirectory(config_.env, dir));
    }
    // As the lock's holder, before this directory's first
    // save, remove what interrupted saves left. No save of ours can be in
    // flight yet (the saver actor starts below), and the lock keeps every
    // other writer out, so no live save's temporaries can match.
    if (StatusOr<int> removed = RemoveStaleSaveTemporaries(config_.env, dir, basename); !removed.ok()) {
      FOREMAN_LOG_WARN("Not removing stale save temporaries in {}: {}", dir, removed.status().ToString());
    }
    FOREMAN_ASSIGN_OR_RETURN(auto writer, SummaryWriterLocked(dir));
    CheckpointSaverArgs args;
    args.directory = dir;
    args.basename = basename;
    args.saver = saver;
    args.lock = std::move(lock);
    args.summary_writer = writer;
    args.clock = config_.clock;
    args.cell = cell_;
    args.observers = save_observers_;
    args.faults = std::make_shared<MessageFaults>();
    args.exit_on_error = Restartable("checkpoint_saver");
    auto faults = args.faults;
    const std::string name = absl::StrCat("checkpoint_saver(", dir, ")");
    FOREMAN_ASSIGN_OR_RETURN(
        auto link, SpawnChildLocked(name, "checkpoint_saver", faults,
                                    [args](caf::local_actor* parent, const caf::actor& failure_sink) {
                                      CheckpointSaverArgs a = args;  // a restart spawns from the same args
                                      a.failure_sink = failure_sink;
                                      return SpawnCheckpointSaver(parent, std::move(a));
                                    }));
    auto handle = std::make_shared<CheckpointHandle>(dir, basename, std::move(saver), std::move(link));
    savers_[dir] = handle;
    return {handle};
  }

  StatusOr<std::shared_ptr<StepCounterService>> StepCounter(const std::string& output_dir_in,
                                                            const std::string& tag) override {
    MutexLock l(mu_);
    FOREMAN_RETURN_IF_ERROR(CheckRunningLocked());
    const std::string output_dir = output_dir_in.empty() ? "" : NormalizeDirectory(output_dir_in);
    const std::string key = absl::StrCat(output_dir, "\n", tag);
    auto it = counters_.find(key);
    if (it != counters_.end()) return {it->second};
    std::shared_ptr<SummaryWriterService> writer;
    if (!output_dir.empty()) {
      FOREMAN_ASSIGN_OR_RETURN(writer, SummaryWriterLocked(output_dir));
    }
    auto faults = std::make_shared<MessageFaults>();
    Clock* clock = config_.clock;
    FOREMAN_ASSIGN_OR_RETURN(
        auto link, SpawnChildLocked(absl::StrCat("step_counter(", output_dir, ")"), "step_counter", faults,
                                    [tag, writer, faults, clock](caf::local_actor* parent, const caf::actor&) {
                                      return SpawnStepCounter(parent, tag, writer, faults, clock);
                                    }));
    auto handle = std::make_shared<StepCounterHandle>(std::move(link));
    counters_[key] = handle;
    return {handle};
  }

  StatusOr<std::unique_ptr<data::InputPipeline>> NewInputPipeline(std::shared_ptr<const data::Dataset> dataset,
                                                                   data::InputPipelineOptions options) override {
    if (dataset == nullptr) return absl::InvalidArgumentError("NewInputPipeline: no dataset");
    if (options.prefetch_batches < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("NewInputPipeline: prefetch_batches must be >= 1, got ", options.prefetch_batches));
    }
    if (options.actor_system != nullptr) {
      return absl::InvalidArgumentError(
          "NewInputPipeline: options.actor_system must be null: the producer lives in the session's actor system");
    }
    if (options.clock != Clock::Real()) {
      return absl::InvalidArgumentError(
          "NewInputPipeline: options.clock must be left at its default: the session's Clock (SessionConfig::clock) "
          "measures Next()'s timeout");
    }
    options.clock = config_.clock;
    MutexLock l(mu_);
    FOREMAN_RETURN_IF_ERROR(CheckRunningLocked());
    namespace ip = data::internal_pipeline;
    auto buffer = std::make_shared<ip::PrefetchBuffer>();
    auto faults = std::make_shared<MessageFaults>();
    ip::ProducerArgs args{dataset, buffer, std::move(options.before_batch), faults, config_.clock, true};
    options.before_batch = nullptr;
    const std::string name = absl::StrCat("input_pipeline(", ++pipelines_started_, ")");
    const RestartType type = options_.restart.TypeOf("input_pipeline");
    std::weak_ptr<ip::PrefetchBuffer> weak = buffer;
    // The producer's link, once spawned: a normal exit carries no payload,
    // the link has the kill's (ChildLink::ExitCause).
    auto link_slot = std::make_shared<std::weak_ptr<ChildLink>>();
    auto cause = [link_slot](const Status& reason) {
      if (!reason.ok()) return reason;
      auto l = link_slot->lock();
      return l ? l->ExitCause() : reason;
    };
    FOREMAN_ASSIGN_OR_RETURN(
        auto link,
        SpawnChildLocked(
            name, "input_pipeline", faults,
            [args](caf::local_actor* parent, const caf::actor&) { return ip::SpawnProducer(parent, args); },
            [weak, name, type, cause](ServiceRestart* record, bool restart) {
              if (restart) return;
              if (auto b = weak.lock()) {
                b->ProducerGone(WithPayloadsOf(
                    absl::FailedPreconditionError(absl::StrCat(
                        "input pipeline: the producer ", name, " was removed by the restart policy (",
                        RestartTypeName(type), ") after ",
                        record->reason.ok() ? std::string("a normal exit")
                                            : record->reason.ToString(absl::StatusToStringMode::kWithNoExtraData))),
                    cause(record->reason)));
              }
            },
            [weak](const caf::actor& actor) {
              // Restarted while its pipeline was being destroyed (after the
              // destructor found no producer to stop): stop it; its link is
              // retired, so the supervisor forgets it.
              if (auto b = weak.lock(); b == nullptr || !b->ProducerRestarted()) {
                caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
              }
            },
            [weak, name, cause](const Status& reason) {
              if (auto b = weak.lock()) {
                b->ProducerGone(
                    WithPayloadsOf(absl::FailedPreconditionError(absl::StrCat(
                                       "input pipeline: the producer ", name, " stopped and is not restarted: ",
                                       reason.ok() ? std::string("it exited normally")
                                                   : reason.ToString(absl::StatusToStringMode::kWithNoExtraData))),
                                   cause(reason)));
              }
            }));
    *link_slot = link;
    pipelines_.push_back(Pipeline{buffer, link});
    return ip::MakeSupervisedPipeline(std::move(dataset), std::move(options), std::move(buffer), std::move(link));
  }

  void SetCoordinator(Coordinator* coord) override { cell_->SetCoordinator(coord); }
  Status error() override { return cell_->error(); }
  void ObserveSaves(SaveObservers::Fn fn) override { save_observers_->Add(std::move(fn)); }

  Status WaitForPendingSaves(absl::Duration timeout) override {
    std::vector<std::shared_ptr<CheckpointHandle>> savers;
    {
      MutexLock l(mu_);
      for (auto& [dir, saver] : savers_) savers.push_back(saver);
    }
    return WaitForSaves(savers, absl::Now() + timeout);
  }

  Clock* clock() override { return config_.clock; }
  Env* env() override { return config_.env; }
  ServiceFaults* service_faults() override { return this; }
  std::vector<ServiceRestart> restarts() override { return restart_log_->Get(); }

  // -- ServiceFaults --

  // The supervisor sends each kill (so it knows whose exit to wait for).
  int Kill(const std::string& service, const std::string& fault_id, bool normal_exit,
           std::vector<std::shared_ptr<Completion>>* applied) override {
    const Status kill =
        WithInjectedFault(absl::InternalError(absl::StrCat("injected actor fault ", fault_id)), fault_id);
    const caf::error reason = normal_exit ? caf::error{} : StatusToError(kill);
    int n = 0;
    for (const Registered& r : RegisteredOf(service)) {
      if (!r.link->alive()) continue;
      // A normal exit carries no payload: the link keeps the kill's, for
      // the errors of requests the service cannot take any more.
      r.link->NoteKill(kill);
      auto done = std::make_shared<Completion>();
      supervisor_->Track(done);
      if (!supervisor_->Send(kill_atom::value, r.link->name(), reason, done)) continue;
      ++n;
      if (applied != nullptr) applied->push_back(std::move(done));
    }
    return n;
  }

  int DelayOrDrop(const std::string& service, const std::string& fault_id, bool drop, int64_t count,
                  absl::Duration delay) override {
    int n = 0;
    for (const Registered& r : RegisteredOf(service)) {
      r.faults->Add(fault_id, drop, std::max<int64_t>(count, 1), delay);
      ++n;
    }
    return n;
  }

  // -- Runtime --

  Status Shutdown(absl::Duration timeout) override {
    MutexLock shutdown_lock(shutdown_mu_);
    if (shut_down_) return shutdown_status_;
    if (supervisor_ == nullptr) {  // Start() failed: nothing runs.
      MutexLock l(mu_);
      held_lock_.reset();
      shut_down_ = true;
      return shutdown_status_;
    }
    const absl::Time deadline = absl::Now() + timeout;
    auto remaining = [&] { return std::max(absl::ZeroDuration(), deadline - absl::Now()); };

    std::vector<std::shared_ptr<CheckpointHandle>> savers;
    std::vector<std::shared_ptr<SummaryWriterHandle>> writers;
    std::vector<std::shared_ptr<StepCounterHandle>> counters;
    std::vector<std::shared_ptr<ChildLink>> links;
    {
      MutexLock l(mu_);
      stopping_ = true;  // No new services from here on.
      for (auto& [dir, s] : savers_) {
        savers.push_back(s);
        links.push_back(s->link());
      }
      for (auto& [dir, w] : writers_) {
        writers.push_back(w);
        links.push_back(w->link());
      }
      for (auto& [key, c] : counters_) {
        counters.push_back(c);
        links.push_back(c->link());
      }
      for (Pipeline& p : pipelines_) {
        // Next() fails at once from here on (its producer is stopped below).
        if (auto b = p.buffer.lock()) {
          b->ProducerGone(absl::FailedPreconditionError(
              absl::StrCat("input pipeline: the session is closed (close()): ", p.link->name(), " is shut down")));
        }
        links.push_back(p.link);
      }
    }

    // 1. Pending saves, which also queue their CHECKPOINT events, and what the
    // step counters still hold for the writers. 2. Flush and close every event
    // file. 3. Stop the actors, the failure_sink last.
    Status status = WaitForSaves(savers, deadline);
    // A service that is down (removed by the restart policy, or between
    // two incarnations) is skipped: its failure, if any, is in error().
    for (auto& counter : counters) {
      if (!counter->link()->alive()) continue;
      Status s = counter->Drain(remaining());
      if (status.ok()) status = s;
    }
    for (auto& writer : writers) {
      if (!writer->link()->alive()) continue;
      Status s = writer->Close(remaining());
      if (status.ok()) status = s;
    }
    supervisor_->SendExit(caf::exit_reason::user_shutdown);
    std::vector<std::string> running;
    if (!supervisor_->WaitExited(remaining())) running.push_back(supervisor_->name());
    for (auto& link : links) {
      if (!link->WaitExited(remaining())) running.push_back(link->name());
    }
    // No handle may outlive the actor system (caf-0.17.md §8), not even one
    // a hook still holds through its service object.
    for (auto& link : links) link->Detach();
    supervisor_->Detach();
    if (!running.empty()) {
      Status s = absl::DeadlineExceededError(
          absl::StrCat("shutting down the session's actors: still running after ", absl::FormatDuration(timeout),
                       ": ", absl::StrJoin(running, ", ")));
      status = s;
      if (process_system_ != nullptr) {
        // ~actor_system would wait for them forever: keep it.
        FOREMAN_LOG_ERROR("{}; keeping the actor system alive so that the process can go on", s.ToString());
        LeakActorSystem(process_system_);
      }
    }
    process_system_.reset();
    {
      MutexLock l(mu_);
      held_lock_.reset();  // the checkpoint saver's copy went with it: unlocked, unless the caller holds it
    }

    Status first_error = cell_->error();
    shutdown_status_ = first_error.ok() ? status : first_error;
    shut_down_ = true;
    return shutdown_status_;
  }

 private:
  Status CheckRunningLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopping_) return absl::FailedPreconditionError("the session's services are shut down");
    return absl::OkStatus();
  }

  StatusOr<std::shared_ptr<SummaryWriterHandle>> SummaryWriterLocked(const std::string& logdir_in)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    FOREMAN_RETURN_IF_ERROR(CheckRunningLocked());
    if (logdir_in.empty()) return absl::InvalidArgumentError("SummaryWriter: empty logdir");
    const std::string logdir = NormalizeDirectory(logdir_in);
    auto it = writers_.find(logdir);
    if (it != writers_.end()) return it->second;
    EventFileWriterOptions options;
    options.env = config_.env;
    options.clock = config_.clock;
    FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<EventFileWriter> file_writer,
                             EventFileWriter::Create(logdir, options));
    auto queue = std::make_shared<SummaryQueue>();
    SummaryWriterArgs args;
    args.writer = std::move(file_writer);
    args.options = options;
    args.logdir = logdir;
    args.queue = queue;
    // Under a restart policy a write error ends the incarnation, and the
    // supervisor decides; under TF's the writer reports it and runs on.
    args.exit_on_error = !options_.restart.IsTensorFlowDefault();
    args.faults = std::make_shared<MessageFaults>();
    auto faults = args.faults;
    // The first spawn hands over the open writer; a restart opens a new file.
    auto first = std::make_shared<std::shared_ptr<EventFileWriter>>(std::move(args.writer));
    FOREMAN_ASSIGN_OR_RETURN(
        auto link, SpawnChildLocked(
                       absl::StrCat("summary_writer(", logdir, ")"), "summary_writer", faults,
                       [args, first](caf::local_actor* parent, const caf::actor& failure_sink) {
                         SummaryWriterArgs a = args;
                         a.writer = std::move(*first);  // null after the first incarnation
                         *first = nullptr;
                         a.failure_sink = failure_sink;
                         return SpawnSummaryWriter(parent, std::move(a));
                       },
                       [queue](ServiceRestart* record, bool restart) {
                         LostEvents lost = restart ? queue->Reopen() : queue->lost();
                         record->events_lost = lost.events;
                         record->steps_lost = std::move(lost.steps);
                       },
                       // Bound: take what was queued meanwhile (a drain sent
                       // before the rebind went to the old incarnation).
                       [](const caf::actor& actor) { caf::anon_send(actor, drain_atom::value); }));
    auto handle = std::make_shared<SummaryWriterHandle>(logdir, std::move(queue), std::move(link),
                                                        args.exit_on_error);
    writers_[logdir] = handle;
    return handle;
  }

  // The supervisor attaches the actor (and every later incarnation) to the
  // returned link, the service's stable address.
  StatusOr<std::shared_ptr<ChildLink>> SpawnChildLocked(
      const std::string& name, const std::string& kind, std::shared_ptr<MessageFaults> faults,
      std::function<caf::actor(caf::local_actor*, const caf::actor&)> spawn,
      std::function<void(ServiceRestart*, bool)> on_exit = {},
      std::function<void(const caf::actor&)> on_restarted = {},
      std::function<void(const Status&)> on_stopped = {}) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto reply = std::make_shared<SpawnReply>();
    auto link = std::make_shared<ChildLink>(name, Restartable(kind));
    supervisor_->Track(reply->done);
    ChildSpec spec{name, std::move(spawn), kind, link, std::move(on_exit), std::move(on_restarted),
                   std::move(on_stopped)};
    if (!supervisor_->Send(spawn_atom::value, std::move(spec), reply)) {
      reply->done->Complete(absl::UnavailableError("the session_supervisor is not running"));
    }
    Status s = reply->done->Wait(kSpawnTimeout, absl::StrCat("starting ", name));
    reply->actor = nullptr;
    if (!s.ok()) {
      link->Detach();
      return s;
    }
    MutexLock l(registry_mu_);
    registered_.push_back(Registered{kind, link, std::move(faults)});
    return link;
  }

  // Every service spawned, for the actor faults.
  struct Registered {
    std::string kind;
    std::shared_ptr<ChildLink> link;
    std::shared_ptr<MessageFaults> faults;
  };
  std::vector<Registered> RegisteredOf(const std::string& kind) {
    MutexLock l(registry_mu_);
    std::vector<Registered> out;
    for (const Registered& r : registered_) {
      if (r.kind == kind) out.push_back(r);
    }
    return out;
  }

  static Status WaitForSaves(const std::vector<std::shared_ptr<CheckpointHandle>>& savers, absl::Time deadline) {
    Status status;
    for (auto& saver : savers) {
      std::shared_ptr<SaveTicket> ticket = saver->last_ticket();
      if (ticket == nullptr) continue;
      Status s = ticket->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()));
      // Lost with a restarted saver: logged by the hook; the run goes on
      // (an escalation is in error()).
      if (!s.ok() && ticket->IsLost()) continue;
      if (status.ok()) status = s;
    }
    return status;
  }

  // The policy may restart services of `kind` (not temporary, some restarts
  // allowed): their links park requests and mark lost saves.
  bool Restartable(const std::string& kind) const {
    const RestartPolicy& p = options_.restart;
    return !p.IsTensorFlowDefault() && p.max_restarts > 0 && p.TypeOf(kind) != RestartType::kTemporary;
  }

  // The caller's lock, kept (for the checkpoint saver) until Shutdown().
  static RuntimeOptions WithoutLock(RuntimeOptions options) {
    options.held_lock.reset();
    return options;
  }

  const RuntimeOptions options_;  // without held_lock (held_lock_)
  SessionConfig config_;
  std::shared_ptr<FailureCell> cell_;
  const std::shared_ptr<SaveObservers> save_observers_ = std::make_shared<SaveObservers>();
  const std::shared_ptr<RestartLog> restart_log_ = std::make_shared<RestartLog>();
  Mutex registry_mu_;  // after mu_ when both are taken
  std::vector<Registered> registered_ ABSL_GUARDED_BY(registry_mu_);
  // Declared before the handles: released after them.
  ActorSystemRef process_system_;
  caf::actor_system* system_ = nullptr;
  std::shared_ptr<ChildLink> supervisor_;

  Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  Status shutdown_status_ ABSL_GUARDED_BY(shutdown_mu_);

  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<FileLock> held_lock_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<SummaryWriterHandle>> writers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<CheckpointHandle>> savers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<StepCounterHandle>> counters_ ABSL_GUARDED_BY(mu_);
  // Session-owned input pipelines: their buffers (the pipelines own them)
  // and the producers' links, which Shutdown stops and detaches.
  struct Pipeline {
    std::weak_ptr<data::internal_pipeline::PrefetchBuffer> buffer;
    std::shared_ptr<ChildLink> link;
  };
  std::vector<Pipeline> pipelines_ ABSL_GUARDED_BY(mu_);
  int64_t pipelines_started_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const RuntimeOptions& options, const SessionConfig& config) {
  if (config.actor_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("actor_threads must be >= 0, got ", config.actor_threads));
  }
  if (config.env == nullptr || config.clock == nullptr) {
    return absl::InvalidArgumentError("Runtime::Create: the session config needs an env and a clock");
  }
  FOREMAN_RETURN_IF_ERROR(ValidateRestartPolicy(options.restart));
  auto runtime = std::make_unique<RuntimeImpl>(options, config);
  FOREMAN_RETURN_IF_ERROR(runtime->Start());
  return std::unique_ptr<Runtime>(std::move(runtime));
}

}  // namespace foreman::internal
