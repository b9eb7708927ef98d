#include "session_supervisor.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "foreman/mutex.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "actor_system.hpp"
#include "checkpoint_saver.hpp"
#include "formats/saver.hpp"
#include "platform/log.hpp"
#include "platform/path.hpp"
#include "runtime/runtime.hpp"
#include "step_counter.hpp"
#include "summary_writer.hpp"

namespace foreman::internal {

// -- the session_supervisor actor --------------------------------------------------

namespace {

struct session_supervisor_state {
  std::shared_ptr<FailureCell> cell;
  caf::actor coordinator;  // null once it is down
  std::map<caf::actor_addr, std::string> names;  // every live child
  std::vector<caf::actor> children;              // the same, as handles
  bool shutting_down = false;
  static const char* name;
};
const char* session_supervisor_state::name = "session_supervisor";

using supervisor_actor = caf::stateful_actor<session_supervisor_state>;

void AddChild(supervisor_actor* self, const caf::actor& child, std::string name) {
  self->link_to(child);  // Our abnormal death takes the children down.
  self->monitor(child);
  self->state.names[child.address()] = std::move(name);
  self->state.children.push_back(child);
}

// Services go first, the coordinator last, so that a failure reported while
// the services stop still finds it.
void StopChildren(supervisor_actor* self) {
  auto& st = self->state;
  if (st.children.empty()) {
    self->quit();
    return;
  }
  const bool only_coordinator = st.children.size() == 1 && st.children.front() == st.coordinator;
  for (const caf::actor& child : st.children) {
    if (child != st.coordinator || only_coordinator) self->send_exit(child, caf::exit_reason::user_shutdown);
  }
}

caf::behavior session_supervisor(supervisor_actor* self, std::shared_ptr<FailureCell> cell) {
  MakeQuiet(self, "session_supervisor");
  self->state.cell = std::move(cell);
  self->state.coordinator = SpawnCoordinator(self, self->state.cell);
  AddChild(self, self->state.coordinator, "coordinator");

  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    auto it = st.names.find(dm.source);
    if (it == st.names.end()) return;
    const std::string name = it->second;
    st.names.erase(it);
    st.children.erase(std::remove_if(st.children.begin(), st.children.end(),
                                     [&](const caf::actor& a) { return a.address() == dm.source; }),
                      st.children.end());
    const bool coordinator_down = st.coordinator && st.coordinator.address() == dm.source;
    if (coordinator_down) st.coordinator = nullptr;
    const bool expected = !dm.reason || (st.shutting_down && dm.reason == caf::exit_reason::user_shutdown);
    if (!expected) {
      Status s = ErrorToStatus(dm.reason, name);
      if (st.coordinator && !st.shutting_down) {
        self->send(st.coordinator, report_atom::value, name, ToMessage(s));
      } else {
        st.cell->Report(name, s);
      }
    }
    if (st.shutting_down) StopChildren(self);
  });

  self->set_exit_handler([=](caf::exit_msg& em) {
    auto& st = self->state;
    // A child's link: its down_msg says the rest.
    if (em.source && st.names.count(em.source) != 0) return;
    if (st.shutting_down) return;
    st.shutting_down = true;
    StopChildren(self);
  });

  return {
      [=](spawn_atom, const ChildSpec& spec, const std::shared_ptr<SpawnReply>& reply) {
        auto& st = self->state;
        if (st.shutting_down || !st.coordinator) {
          reply->done->Complete(absl::FailedPreconditionError(
              absl::StrCat("cannot start ", spec.name, ": the session's actors are shutting down")));
          return;
        }
        caf::actor child;
        Status s = InvokeUserCode(absl::StrCat("starting ", spec.name),
                                  [&] { child = spec.spawn(self, st.coordinator); });
        if (s.ok() && !child) s = absl::InternalError(absl::StrCat("starting ", spec.name, ": no actor"));
        if (!s.ok()) {
          reply->done->Complete(std::move(s));
          return;
        }
        AddChild(self, child, spec.name);
        reply->actor = child;
        reply->done->Complete(absl::OkStatus());
      },
  };
}

}  // namespace

caf::actor SpawnSessionSupervisor(caf::actor_system& system, std::shared_ptr<FailureCell> cell) {
  return system.spawn(session_supervisor, std::move(cell));
}

// -- Runtime ------------------------------------------------------------------------

namespace {

// Spawning is a round trip to the supervisor on the shared scheduler; it
// only takes long when the process is starved.
constexpr absl::Duration kSpawnTimeout = absl::Seconds(30);
// What the destructor allows a Shutdown() nobody called.
constexpr absl::Duration kDestructorShutdownTimeout = absl::Seconds(60);

class RuntimeImpl : public Runtime {
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
      ChildLink::Attach(supervisor, SpawnSessionSupervisor(*system_, cell_));
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
    const std::string name = absl::StrCat("checkpoint_saver(", dir, ")");
    FOREMAN_ASSIGN_OR_RETURN(
        auto link, SpawnChildLocked(name, [args](caf::local_actor* parent, const caf::actor& coordinator) mutable {
          args.coordinator = coordinator;
          return SpawnCheckpointSaver(parent, std::move(args));
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
    FOREMAN_ASSIGN_OR_RETURN(
        auto link, SpawnChildLocked(absl::StrCat("step_counter(", output_dir, ")"),
                                    [tag, writer](caf::local_actor* parent, const caf::actor&) {
                                      return SpawnStepCounter(parent, tag, writer);
                                    }));
    auto handle = std::make_shared<StepCounterHandle>(std::move(link));
    counters_[key] = handle;
    return {handle};
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
    }

    // 1. Pending saves, which also queue their CHECKPOINT events, and what the
    // step counters still hold for the writers. 2. Flush and close every event
    // file. 3. Stop the actors, the coordinator last.
    Status status = WaitForSaves(savers, deadline);
    for (auto& counter : counters) {
      Status s = counter->Drain(remaining());
      if (status.ok()) status = s;
    }
    for (auto& writer : writers) {
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
    std::shared_ptr<EventFileWriter> writer = std::move(file_writer);
    auto queue = std::make_shared<SummaryQueue>();
    FOREMAN_ASSIGN_OR_RETURN(
        auto link,
        SpawnChildLocked(absl::StrCat("summary_writer(", logdir, ")"),
                         [writer, queue, logdir](caf::local_actor* parent, const caf::actor& coordinator) {
                           return SpawnSummaryWriter(parent, writer, queue, coordinator, logdir);
                         }));
    auto handle = std::make_shared<SummaryWriterHandle>(logdir, std::move(queue), std::move(link));
    writers_[logdir] = handle;
    return handle;
  }

  StatusOr<std::shared_ptr<ChildLink>> SpawnChildLocked(
      const std::string& name,
      std::function<caf::actor(caf::local_actor*, const caf::actor&)> spawn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto reply = std::make_shared<SpawnReply>();
    supervisor_->Track(reply->done);
    if (!supervisor_->Send(spawn_atom::value, ChildSpec{name, std::move(spawn)}, reply)) {
      reply->done->Complete(absl::UnavailableError("the session_supervisor is not running"));
    }
    FOREMAN_RETURN_IF_ERROR(reply->done->Wait(kSpawnTimeout, absl::StrCat("starting ", name)));
    auto link = std::make_shared<ChildLink>(name);
    ChildLink::Attach(link, std::move(reply->actor));
    reply->actor = nullptr;
    return link;
  }

  static Status WaitForSaves(const std::vector<std::shared_ptr<CheckpointHandle>>& savers, absl::Time deadline) {
    Status status;
    for (auto& saver : savers) {
      std::shared_ptr<SaveTicket> ticket = saver->last_ticket();
      if (ticket == nullptr) continue;
      Status s = ticket->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()));
      if (status.ok()) status = s;
    }
    return status;
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
};

}  // namespace

StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const RuntimeOptions& options, const SessionConfig& config) {
  if (config.actor_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("actor_threads must be >= 0, got ", config.actor_threads));
  }
  if (config.env == nullptr || config.clock == nullptr) {
    return absl::InvalidArgumentError("Runtime::Create: the session config needs an env and a clock");
  }
  auto runtime = std::make_unique<RuntimeImpl>(options, config);
  FOREMAN_RETURN_IF_ERROR(runtime->Start());
  return std::unique_ptr<Runtime>(std::move(runtime));
}

}  // namespace foreman::internal
