// Supervisor (supervisor.hpp): TF's standard services as LooperThreads of the
// supervisor's Coordinator, writing through the runtime's service actors.
#include "foreman/supervisor.hpp"

#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "foreman/checkpoint.hpp"
#include "foreman/summary.hpp"
#include "formats/saver.hpp"
#include "platform/log.hpp"
#include "platform/path.hpp"
#include "runtime/runtime.hpp"

namespace foreman {
namespace {

bool Enabled(const std::optional<double>& secs) { return secs.has_value() && *secs > 0; }

// TF: Supervisor.save_path.
std::string SavePath(const SupervisorOptions& o) { return JoinPath(o.logdir, o.checkpoint_basename); }

// How long a standard service waits for one checkpoint to become durable, and
// stop() for the event file to flush: long enough for a slow disk, bounded so
// a wedged actor cannot hang the caller.
constexpr absl::Duration kServiceTimeout = absl::Minutes(10);

}  // namespace

struct Supervisor::Impl {
  SupervisorOptions options;  // after B155's defaults
  std::vector<std::string> summary_op;
  std::shared_ptr<Saver> saver;
  std::unique_ptr<Coordinator> coord;
  std::unique_ptr<SessionManager> session_manager;
  // Per prepared chief session; stop(close_summary_writer=true) shuts it
  // down, so the next session writes a new event file (B157: "reopens").
  std::unique_ptr<internal::Runtime> runtime;
  std::shared_ptr<internal::SummaryWriterService> writer;
  Session* services_session = nullptr;
  // The error stop() last returned (managed_session's, say): the caller has
  // it, so the destructor's join, which finds it again, does not log it.
  Status returned_by_stop;
  // The restarts of the runtimes already shut down (service_restarts()).
  std::vector<ServiceRestart> past_restarts;

  Status EnsureRuntime(const SessionConfig& config) {
    if (runtime != nullptr) return absl::OkStatus();
    // The checkpoint directory's lock comes first, before the restore reads
    // the directory and the summary writer opens an event file there: a
    // directory another process uses is refused before anything is written
    // (as MonitoredTrainingSession). The runtime's checkpoint saver then uses
    // this lock (RuntimeOptions::held_lock); it is released when the runtime
    // shuts down, unless the caller passed a lock of its own.
    RuntimeOptions runtime_options = options.runtime;
    const std::string dir = internal::NormalizeDirectory(options.logdir);
    if (!options.logdir.empty() && saver != nullptr && Enabled(options.save_model_secs) &&
        options.graph->has_global_step() &&
        (runtime_options.held_lock == nullptr ||
         internal::NormalizeDirectory(runtime_options.held_lock_directory) != dir)) {
      FOREMAN_ASSIGN_OR_RETURN(runtime_options.held_lock, LockCheckpointDirectory(config.env, dir));
      runtime_options.held_lock_directory = dir;
    }
    FOREMAN_ASSIGN_OR_RETURN(runtime, internal::Runtime::Create(runtime_options, config));
    runtime->SetCoordinator(coord.get());
    if (!options.logdir.empty()) {
      FOREMAN_ASSIGN_OR_RETURN(writer, runtime->SummaryWriter(options.logdir));
    }
    return absl::OkStatus();
  }

  Status ShutdownRuntime() {
    writer.reset();
    if (runtime == nullptr) return absl::OkStatus();
    runtime->SetCoordinator(nullptr);
    Status s = runtime->Shutdown(kServiceTimeout);
    for (ServiceRestart& r : runtime->restarts()) past_restarts.push_back(std::move(r));
    runtime.reset();
    return s;
  }
};

StatusOr<std::unique_ptr<Supervisor>> Supervisor::Create(SupervisorOptions options) {
  if (options.graph == nullptr) return absl::InvalidArgumentError("Supervisor: options.graph is required");
  if (!(options.recovery_wait_secs >= 0) || !(options.stop_grace_secs >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("Supervisor: recovery_wait_secs (", options.recovery_wait_secs,
                                                   ") and stop_grace_secs (", options.stop_grace_secs,
                                                   ") must be >= 0"));
  }
  if (options.config.env == nullptr || options.config.clock == nullptr) {
    return absl::InvalidArgumentError("Supervisor: config.env and config.clock must not be null");
  }
  auto impl = std::make_unique<Impl>();
  // B155: defaults for every op not given.
  if (!options.ready_op) options.ready_op = DefaultReadyOp();
  if (!options.ready_for_local_init_op) options.ready_for_local_init_op = DefaultReadyForLocalInitOp();
  if (!options.init_op) options.init_op = DefaultInitOp();
  if (!options.local_init_op) options.local_init_op = DefaultLocalInitOp();
  if (options.summary_op.use_default()) {
    impl->summary_op = options.graph->summary_ops();
  } else if (options.summary_op.kind == Defaultable<std::vector<std::string>>::Kind::kValue) {
    impl->summary_op = options.summary_op.value;
  }
  if (options.saver.use_default()) {
    if (!options.graph->GlobalVariableNames().empty()) {
      FOREMAN_ASSIGN_OR_RETURN(impl->saver, internal::NewDefaultSaver(options.config.env, options.config.clock));
    }
  } else if (options.saver.kind == Defaultable<std::shared_ptr<Saver>>::Kind::kValue) {
    impl->saver = options.saver.value;
  }
  // B156: a worker writes no summaries and no checkpoints.
  if (!options.is_chief) {
    options.logdir.clear();
    options.save_summaries_secs.reset();
    options.save_model_secs.reset();
    impl->summary_op.clear();
  }
  options.graph->Finalize();  // B155: the graph is finalized in the constructor

  SessionManagerOptions sm;
  sm.local_init_op = options.local_init_op;
  sm.ready_op = options.ready_op;
  sm.ready_for_local_init_op = options.ready_for_local_init_op;
  sm.graph = options.graph;
  sm.recovery_wait = absl::Seconds(options.recovery_wait_secs);
  FOREMAN_ASSIGN_OR_RETURN(impl->session_manager, SessionManager::Create(std::move(sm)));
  impl->coord = std::make_unique<Coordinator>(std::nullopt, options.config.clock);
  impl->options = std::move(options);
  return std::unique_ptr<Supervisor>(new Supervisor(std::move(impl)));
}

Supervisor::Supervisor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Supervisor::~Supervisor() {
  // Threads first (they use the runtime), then the actors.
  impl_->coord->request_stop().IgnoreError();
  Status joined = impl_->coord->join(absl::Seconds(impl_->options.stop_grace_secs), /*ignore_live_threads=*/true);
  if (!joined.ok() && joined != impl_->returned_by_stop) FOREMAN_LOG_WARN("Supervisor: {}", joined.ToString());
  Status s = impl_->ShutdownRuntime();
  if (!s.ok()) FOREMAN_LOG_ERROR("Supervisor: shutting down its services: {}", s.ToString());
}

StatusOr<std::unique_ptr<Session>> Supervisor::prepare_or_wait_for_session(const std::string& master,
                                                                           std::optional<SessionConfig> config,
                                                                           bool wait_for_checkpoint,
                                                                           absl::Duration max_wait,
                                                                           bool start_standard_services) {
  const SessionConfig cfg = config.value_or(impl_->options.config);
  impl_->coord->clear_stop();  // B157
  impl_->returned_by_stop = absl::OkStatus();
  if (!impl_->options.is_chief) {
    return impl_->session_manager->wait_for_session(master, cfg, max_wait);
  }
  FOREMAN_RETURN_IF_ERROR(impl_->EnsureRuntime(cfg));
  PrepareSessionOptions prepare;
  prepare.init_op = impl_->options.init_op;
  prepare.saver = impl_->saver;
  if (impl_->saver != nullptr) prepare.checkpoint_dir = impl_->options.logdir;
  prepare.wait_for_checkpoint = wait_for_checkpoint;
  prepare.max_wait = max_wait;
  prepare.config = cfg;
  prepare.init_feed_dict = impl_->options.init_feed_dict;
  prepare.init_fn = impl_->options.init_fn;
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<Session> session,
                           impl_->session_manager->prepare_session(master, std::move(prepare)));
  if (start_standard_services) FOREMAN_RETURN_IF_ERROR(this->start_standard_services(session.get()));
  return session;
}

Status Supervisor::start_standard_services(Session* session) { return StartServices(session, nullptr); }

// `keep_alive` (may be null) owns `session`: managed_session passes it so a
// service thread that outlives stop()'s grace period (detached as a
// straggler) still finds its session alive.
Status Supervisor::StartServices(Session* session, std::shared_ptr<Session> keep_alive) {
  if (!impl_->options.is_chief) {
    return absl::FailedPreconditionError("start_standard_services: only the chief runs the standard services");
  }
  if (session == nullptr) return absl::InvalidArgumentError("start_standard_services: null session");
  if (impl_->services_session == session) return absl::OkStatus();
  FOREMAN_RETURN_IF_ERROR(impl_->EnsureRuntime(session->config()));
  impl_->services_session = session;
  const SupervisorOptions& o = impl_->options;
  const bool has_step = session->graph()->has_global_step();
  auto writer = impl_->writer;
  if (writer == nullptr) return absl::OkStatus();  // no logdir: no services (B158)

  // B158: START at the current step, when there is a global step to put in it.
  if (has_step) {
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, session->GlobalStep());
    writer->AddSessionLog(SessionLogStatus::kStart, step);
  }
  Coordinator* coord = impl_->coord.get();
  Clock* clock = session->config().clock;

  if (Enabled(o.save_summaries_secs) && !impl_->summary_op.empty()) {
    std::vector<std::string> summary_op = impl_->summary_op;
    auto target = [session, keep_alive, writer, summary_op, has_step]() -> Status {
      FOREMAN_ASSIGN_OR_RETURN(TensorMap out, session->Run(summary_op));
      std::vector<std::string> parts;
      for (const std::string& fetch : summary_op) {
        FOREMAN_ASSIGN_OR_RETURN(std::string part, out.at(fetch).scalar<std::string>());
        parts.push_back(std::move(part));
      }
      int64_t step = 0;
      if (has_step) {
        FOREMAN_ASSIGN_OR_RETURN(step, session->GlobalStep());
      }
      writer->AddSummary(parts.size() == 1 ? parts[0] : MergeSummaries(parts), step);
      return absl::OkStatus();
    };
    FOREMAN_RETURN_IF_ERROR(
        LooperThread::Start(coord, "SVSummaryThread", absl::Seconds(*o.save_summaries_secs), target).status());
  }

  if (Enabled(o.save_summaries_secs) && has_step) {
    // SVStepCounterThread: the first firing records where it starts; each
    // later one writes global_step/sec over the interval (first 10 logged).
    struct Counter {
      bool primed = false;
      int64_t last_step = 0;
      absl::Duration last_time;
      int logged = 0;
    };
    auto counter = std::make_shared<Counter>();
    auto target = [session, keep_alive, writer, counter, clock]() -> Status {
      FOREMAN_ASSIGN_OR_RETURN(int64_t step, session->GlobalStep());
      const absl::Duration now = clock->MonotonicNow();
      // A firing that catches up a missed interval (LooperThread keeps TF's
      // fixed rate) measures no time: nothing to report.
      const double elapsed = absl::ToDoubleSeconds(now - counter->last_time);
      if (counter->primed && elapsed > 0) {
        const double rate = static_cast<double>(step - counter->last_step) / elapsed;
        writer->AddSummary(ScalarSummary("global_step/sec", static_cast<float>(rate)), step);
        if (counter->logged < 10) {
          ++counter->logged;
          FOREMAN_LOG_INFO("global_step/sec: {:g}", rate);
        }
      }
      counter->primed = true;
      counter->last_step = step;
      counter->last_time = now;
      return absl::OkStatus();
    };
    FOREMAN_RETURN_IF_ERROR(
        LooperThread::Start(coord, "SVStepCounterThread", absl::Seconds(*o.save_summaries_secs), target).status());
  }

  if (Enabled(o.save_model_secs) && impl_->saver != nullptr && has_step) {
    FOREMAN_ASSIGN_OR_RETURN(std::shared_ptr<internal::CheckpointService> checkpointer,
                             impl_->runtime->CheckpointSaver(o.logdir, impl_->saver, o.checkpoint_basename));
    const std::string save_path = SavePath(o);
    // The previous save's snapshot, handed back with its ticket: each save
    // copies into it in place (as CheckpointSaverHook does; a second copy of
    // the variables is held between saves). Only this thread touches it.
    auto spare = std::make_shared<std::map<std::string, Tensor>>();
    auto target = [session, keep_alive, checkpointer, save_path, spare]() -> Status {
      // TF's SVTimerCheckpointThread logs this line (no step) before each save.
      FOREMAN_LOG_INFO("Saving checkpoint to path {}", save_path);
      FOREMAN_ASSIGN_OR_RETURN(int64_t step, session->GlobalStep());
      std::map<std::string, Tensor> snapshot = std::move(*spare);
      spare->clear();
      // SnapshotInto holds the values' mutex: the copy happens between steps.
      FOREMAN_RETURN_IF_ERROR(internal::SnapshotInto(*session, &snapshot).status());
      std::shared_ptr<internal::SaveTicket> ticket = checkpointer->StartSave(std::move(snapshot), step);
      Status saved = ticket->Wait(kServiceTimeout);
      // A save still in flight (timed out) keeps its buffers.
      if (ticket->IsDone()) *spare = ticket->TakeBuffers();
      if (!saved.ok() && ticket->IsLost()) {
        // As CheckpointSaverHook: the policy restarts the saver (or escalates).
        FOREMAN_LOG_WARN("The checkpoint of step {} was lost: {}; the checkpoint_saver is restarted by the "
                         "session's restart policy and training goes on",
                         step, saved.ToString());
        return absl::OkStatus();
      }
      return saved;
    };
    FOREMAN_RETURN_IF_ERROR(
        LooperThread::Start(coord, "SVTimerCheckpointThread", absl::Seconds(*o.save_model_secs), target).status());
  }
  return absl::OkStatus();
}

std::vector<ServiceRestart> Supervisor::service_restarts() const {
  std::vector<ServiceRestart> out = impl_->past_restarts;
  if (impl_->runtime != nullptr) {
    for (ServiceRestart& r : impl_->runtime->restarts()) out.push_back(std::move(r));
  }
  return out;
}

Status Supervisor::stop(bool close_summary_writer, bool ignore_live_threads) {
  impl_->coord->request_stop().IgnoreError();
  Status joined = impl_->coord->join(absl::Seconds(impl_->options.stop_grace_secs), ignore_live_threads);
  impl_->services_session = nullptr;
  // B159: even when join failed, STOP (without a step) and the writer closed.
  if (impl_->writer != nullptr) impl_->writer->AddSessionLog(SessionLogStatus::kStop, std::nullopt);
  if (close_summary_writer) {
    Status shutdown = impl_->ShutdownRuntime();
    if (!shutdown.ok()) {
      FOREMAN_LOG_ERROR("Supervisor: closing the summary writer: {}", shutdown.ToString());
      if (joined.ok()) joined = shutdown;
    }
  } else if (impl_->writer != nullptr) {
    Status flushed = impl_->writer->Flush(kServiceTimeout);
    if (!flushed.ok() && joined.ok()) joined = flushed;
  }
  impl_->returned_by_stop = joined;
  return joined;
}

Status Supervisor::managed_session(const std::string& master, std::optional<SessionConfig> config,
                                   const std::function<Status(Session&)>& block, bool start_standard_services,
                                   bool close_summary_writer) {
  StatusOr<std::shared_ptr<Session>> session = [&]() -> StatusOr<std::shared_ptr<Session>> {
    FOREMAN_ASSIGN_OR_RETURN(std::shared_ptr<Session> created,
                             prepare_or_wait_for_session(master, std::move(config), /*wait_for_checkpoint=*/false,
                                                         absl::Seconds(7200), /*start_standard_services=*/false));
    if (start_standard_services && impl_->options.is_chief) {
      FOREMAN_RETURN_IF_ERROR(StartServices(created.get(), created));
    }
    return created;
  }();
  if (!session.ok()) {
    // TF: the exception raised inside the `with` goes to request_stop, then
    // stop() re-raises it.
    impl_->coord->request_stop(session.status()).IgnoreError();
    Status stopped = stop(close_summary_writer);
    return stopped.ok() ? session.status() : stopped;
  }
  Status block_status = InvokeUserCode("managed_session block", [&] { return block(**session); });
  if (!block_status.ok()) {
    // B160-B161: recorded unless stop was already requested; OUT_OF_RANGE is
    // a clean stop (the coordinator's clean-stop code).
    impl_->coord->request_stop(block_status).IgnoreError();
  }
  Status stopped = stop(close_summary_writer);
  Status closed = (*session)->Close();
  if (!closed.ok()) FOREMAN_LOG_WARN("managed_session: closing the session: {}", closed.ToString());
  return stopped;
}

Status Supervisor::summary_computed(Session* session, const std::string& serialized_summary,
                                    std::optional<int64_t> global_step) {
  if (impl_->writer == nullptr) {
    return absl::FailedPreconditionError("summary_computed() needs a summary writer (no logdir, or not the chief)");
  }
  int64_t step = 0;
  if (global_step.has_value()) {
    step = *global_step;
  } else {
    FOREMAN_ASSIGN_OR_RETURN(step, session->GlobalStep());
  }
  impl_->writer->AddSummary(serialized_summary, step);
  return absl::OkStatus();
}

StatusOr<LooperThread*> Supervisor::loop(std::optional<absl::Duration> interval, std::function<Status()> target,
                                         std::string name) {
  return LooperThread::Start(impl_->coord.get(), std::move(name), interval, std::move(target));
}

bool Supervisor::should_stop() const { return impl_->coord->should_stop(); }
Status Supervisor::request_stop(const Status& status) { return impl_->coord->request_stop(status); }
bool Supervisor::wait_for_stop(std::optional<absl::Duration> timeout) { return impl_->coord->wait_for_stop(timeout); }
bool Supervisor::stop_on_exception(const std::function<Status()>& fn) { return impl_->coord->stop_on_exception(fn); }
Coordinator* Supervisor::coord() { return impl_->coord.get(); }
bool Supervisor::is_chief() const { return impl_->options.is_chief; }
std::string Supervisor::save_path() const { return SavePath(impl_->options); }
const SupervisorOptions& Supervisor::options() const { return impl_->options; }

}  // namespace foreman
