// MonitoredSession, SingularMonitoredSession and MonitoredTrainingSession
// (include/foreman/monitored_session.hpp). TF: monitored_session.py
// (MonitoredSession, _RecoverableSession, _CoordinatedSession, _HookedSession,
// MonitoredTrainingSession); spec §0-§4 and §16, decisions 1-4.
//
// TF stacks four wrappers; here one Impl plays all of them:
//   _HookedSession       HookedRun(): before_run / merge / run / after_run and
//                        the hooks' stop flag (B27-B36).
//   _CoordinatedSession  one Coordinator per created raw session (B19, B54);
//                        closing stops and joins it (B52).
//   _RecoverableSession  RunRecoverably(): a preemption error closes the raw
//                        session and re-runs the call on a new one (B45-B50),
//                        bounded with back-off (decision 2). Absent for
//                        SingularMonitoredSession (B23).
//   MonitoredSession     begin() / end() and close() (B19, B38-B43).
//
// Threads: everything runs on the training thread except should_stop(),
// recoveries(), steps_lost() and SingularMonitoredSession::stop_error(),
// which read atomics and the coordinators. A coordinator that has been
// replaced is kept alive until the session is destroyed, so a reader that
// loaded its pointer never sees it freed.
#include "foreman/monitored_session.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "foreman/checkpoint.hpp"
#include "foreman/mutex.hpp"
#include "foreman/summary.hpp"
#include "platform/log.hpp"
#include "platform/path.hpp"
#include "runtime/runtime.hpp"
#include "runtime/session_access.hpp"
#include "runtime/session_target.hpp"
#include "runtime/user_code.hpp"

namespace foreman {

namespace {

// B46: TF's _PREEMPTION_ERRORS.
bool IsPreemption(const Status& s) { return absl::IsAborted(s) || absl::IsUnavailable(s); }

// Python's str() of a list of names, as TF's conflict messages print it:
// ['a', 'b'].
std::string PyList(const std::vector<std::string>& names) {
  std::string out = "[";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ", ";
    absl::StrAppend(&out, "'", names[i], "'");
  }
  return out + "]";
}

// B32: TF's _raise_if_feeds_intersects; keys sorted for a stable message.
Status CheckFeedsDisjoint(const TensorMap& a, const TensorMap& b, const char* message) {
  std::vector<std::string> both;
  for (const auto& [name, value] : b) {
    if (a.count(name) != 0) both.push_back(name);
  }
  if (both.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(message, " Conflict(s): ", PyList(both)));
}

// B33: the caller's options with a hook's merged in.
void MergeRunOptions(const RunOptions& incoming, RunOptions* options) {
  options->trace_level = std::max(options->trace_level, incoming.trace_level);
  options->timeout_in_ms = std::max(options->timeout_in_ms, incoming.timeout_in_ms);
  options->report_tensor_allocations_upon_oom =
      options->report_tensor_allocations_upon_oom || incoming.report_tensor_allocations_upon_oom;
}

// A hook's name for messages; name() is user code and may throw.
std::string HookName(const std::shared_ptr<SessionRunHook>& hook) {
  try {
    std::string name = hook->name();
    return name.empty() ? "SessionRunHook" : name;
  } catch (...) {
    return "SessionRunHook";
  }
}

const Status& StatusOf(const Status& s) { return s; }
template <class T>
const Status& StatusOf(const StatusOr<T>& s) {
  return s.status();
}

// Calls a hook's callback: a thrown error becomes a Status (InvokeUserCode),
// and every error, returned or thrown, names the hook and the callback
// ("hook <Name>::<callback>: ...") once, its code and payloads kept.
template <class Fn>
auto CallHook(const std::string& where, Fn&& fn) {
  auto r = InvokeUserCode(where, std::forward<Fn>(fn));
  // An error already named after the user's callback (user_code.hpp) keeps
  // that name alone.
  if (!r.ok() && !internal::IsAttributedToUserCode(StatusOf(r)) &&
      !absl::StartsWith(StatusOf(r).message(), absl::StrCat(where, ": "))) {
    return decltype(r)(Annotate(StatusOf(r), where));
  }
  return r;
}

std::string FormatSeconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), " s"); }

/// The run's one stop grace period: `stop`'s when the caller passed one
/// (then `secs`, if set, must agree with it), else `secs` for the
/// StopRequest the session makes (unset: StopRequestOptions' default, TF's
/// 120 s).
StatusOr<absl::Duration> StopGracePeriod(const std::optional<double>& secs, const StopRequest* stop) {
  if (stop == nullptr) return secs.has_value() ? absl::Seconds(*secs) : StopRequestOptions().grace_period;
  if (secs.has_value() && absl::Seconds(*secs) != stop->grace_period()) {
    return absl::InvalidArgumentError(absl::StrCat("stop_grace_period_secs=", *secs,
                                                   " but RuntimeOptions::stop's grace period is ",
                                                   FormatSeconds(stop->grace_period()), "; set one"));
  }
  return stop->grace_period();
}

}  // namespace

// -- Impl -------------------------------------------------------------------------

struct MonitoredSession::Impl {
  // Fixed at Create.
  std::shared_ptr<SessionCreator> creator;
  HookList hooks;
  std::vector<std::string> hook_names;  // "hook <Name>::" prefixes, by index
  // Where(i, "before_run") / Where(i, "after_run"), built once: every run
  // names them.
  std::vector<std::string> before_run_where;
  std::vector<std::string> after_run_where;
  // The StopRequest's grace period (StopGracePeriod), fixed at Create.
  absl::Duration stop_grace_period;
  RecoveryOptions recovery;
  RuntimeOptions runtime_options;
  bool recoverable = true;  // false: SingularMonitoredSession (B23)
  std::shared_ptr<Graph> graph;
  bool graph_was_finalized = true;  // B22
  Clock* clock = Clock::Real();

  // Coordinators ever created, the current one last; declared before the
  // runtime so the runtime (whose actors may hold the current one) goes first.
  std::vector<std::unique_ptr<Coordinator>> coordinators;
  std::atomic<Coordinator*> coord{nullptr};       // current; null between sessions
  std::atomic<Coordinator*> last_coord{nullptr};  // the latest, kept after close
  std::unique_ptr<internal::Runtime> runtime;
  std::unique_ptr<Session> session;  // null between sessions and after close

  // The one home of a stop (stop.hpp): RuntimeOptions::stop or our own. Its
  // listener forwards a request to the current coordinator and wakes a
  // recovery's back-off; coord_mu orders that against CreateSession's
  // installing a new coordinator, so no request is missed.
  std::shared_ptr<StopRequest> stop;
  int64_t stop_listener = 0;
  Mutex coord_mu;
  std::condition_variable_any backoff_cv;  // with coord_mu: a stop ends the back-off
  bool stopped_before_step = false;   // HookedRun returned StoppedBeforeStep()

  std::atomic<bool> hook_stop{false};  // B35: the _HookedSession's flag
  std::atomic<bool> ended{false};      // a run ended training (clean or not)
  std::atomic<bool> closed{false};
  bool run_failed = false;  // ended with an error: no end() (B39)
  Status first_error;       // what close() returns (first wins)
  std::optional<Status> close_status;

  // Decision 2.
  std::deque<absl::Duration> recovery_times;  // MonotonicNow() of recent recoveries
  std::mt19937_64 rng;
  std::atomic<int64_t> recoveries{0};
  std::atomic<int64_t> steps_lost{0};
  bool recovery_pending = false;            // a new session is due to log the loss
  std::optional<int64_t> step_before_error;  // global_step when the pending recovery began
  // RecoveryOptions::on_recovered: the report being measured (only when
  // there is a callback), on clock->MonotonicNow().
  std::optional<RecoveryReport> report;
  absl::Duration report_decided_at;  // the first recovery's decision
  absl::Duration report_restored_at;
  bool report_restored = false;  // a session was restored since the last recovery began
  // Issue 13: a cluster target's wait for an unreachable ps task
  // (RemoteValues::ps_wait, learnt from each session created), and when the
  // current wait began (nullopt: not waiting; cleared by a created session).
  std::optional<internal::RemoteValues::PsWait> ps_wait;
  std::optional<absl::Duration> ps_wait_since;
  absl::Duration ps_wait_logged_at;

  // HookedRun's working storage, kept between runs so that a steady loop
  // allocates nothing: each hook's args (before_run_into), and the run's
  // plan — the merged fetch names and where each hook's and the caller's
  // results sit among them — rebuilt only when the caller's or a hook's
  // fetch names change. A run nested in a hook's callback (user code may
  // call run() there) uses its own.
  struct RunScratch {
    SessionRunArgs original_args;  // what the context shows (B28); its fetches: the plan's caller part
    std::vector<SessionRunArgs> hook_args;               // by hook, kept for before_run_into
    bool planned = false;
    std::vector<std::vector<std::string>> hook_fetches;  // by hook, as planned
    std::vector<std::string> all_fetches;                // caller's and hooks', sorted, unique
    std::vector<std::pair<std::size_t, std::size_t>> caller_out;  // (index in fetches, slot), unique names
    std::vector<TensorMap> hook_results;                 // each hook's own results (B31), keys as planned
    std::vector<std::vector<std::pair<Tensor*, std::size_t>>> hook_slots;  // hook_results' values <- slot
    std::vector<Tensor> values;                          // the run's results, by all_fetches index
    std::vector<unsigned char> answered;
  };
  RunScratch scratch;
  bool scratch_in_use = false;

  ~Impl();

  Status Start();
  void ListenForStop();
  void StopListening();
  Status StoppedBeforeStep();
  absl::Duration RemainingGrace() const;
  void Abort();
  Status CreateSession();
  Status EnsureSession();
  Status BeginRecovery(const Status& cause, absl::Duration failed_at);
  void FinishReport(std::optional<absl::Duration> next_good_step);
  void WriteRecoverySummary(const RecoveryReport& r);
  absl::Duration Backoff(int k);
  Status TeardownSession(bool recovering);
  static bool IsPsEviction(const Status& s);
  void SaveForPsEviction();
  template <class Attempt>
  Status RunRecoverably(const Attempt& attempt);
  Status EndWith(const Status& s);
  StatusOr<TensorMap> HookedRun(const std::vector<std::string>& fetches, const TensorMap& feeds,
                                const RunOptions& options, RunMetadata* run_metadata);
  Status BeforeRun(SessionRunContext& ctx, RunScratch& sc, const TensorMap& feeds, TensorMap* merged_feeds,
                   const TensorMap** run_feeds, RunOptions* merged_options);
  static void Plan(RunScratch& sc);
  Status AfterRun(SessionRunContext& ctx, RunScratch& sc, RunOptions& merged_options, RunMetadata* metadata);
  Status Close();
  void RecordError(const Status& s) {
    if (first_error.ok() && !s.ok()) first_error = s;
  }
  // A service's or a thread's error reported before now is the earlier one.
  void PollBackgroundError();
  bool ShouldStop() const;
  // B50: a preemption error a thread (not a service: those are local
  // failures a new session would not cure) reported to the coordinator.
  bool RecoverableCoordinatorError(const Status& s) const {
    return recoverable && IsPreemption(s) && (runtime == nullptr || runtime->error().ok());
  }
  std::string Where(std::size_t i, const char* callback) const {
    return absl::StrCat("hook ", hook_names[i], "::", callback);
  }
};

MonitoredSession::Impl::~Impl() { StopListening(); }

// A ps task's refusal of an update while it is stopping (Server::Evict;
// ps_shard.hpp's ps_evict_atom).
bool MonitoredSession::Impl::IsPsEviction(const Status& s) {
  return absl::IsUnavailable(s) && absl::StrContains(s.message(), " is stopping (evicted)");
}

// The chief's checkpoint for an evicted ps task: each CheckpointSaverHook
// saves now (the chief's, with the run directory). Its failure is logged:
// the recovery then restores the latest checkpoint, as after a ps crash.
void MonitoredSession::Impl::SaveForPsEviction() {
  for (const auto& hook : hooks) {
    auto* saver = dynamic_cast<CheckpointSaverHook*>(hook.get());
    if (saver == nullptr) continue;
    StatusOr<int64_t> step = session->GlobalStep();
    FOREMAN_LOG_WARN("A ps task is stopping (evicted): taking a checkpoint at global_step {} before it exits.",
                     step.ok() ? absl::StrCat(*step) : std::string("?"));
    Status s = saver->SaveNow(session.get());
    if (s.ok()) {
      FOREMAN_LOG_INFO("Checkpoint for the evicted ps task saved at global_step {}.",
                       step.ok() ? absl::StrCat(*step) : std::string("?"));
    } else {
      FOREMAN_LOG_WARN("The checkpoint for the evicted ps task failed (the recovery restores the latest one): {}",
                       s.ToString());
    }
  }
}

void MonitoredSession::Impl::ListenForStop() {
  stop_listener = stop->Listen([this](const Status& s) {
    MutexLock l(coord_mu);
    if (Coordinator* c = coord.load(std::memory_order_acquire); c != nullptr) c->request_stop(s).IgnoreError();
    backoff_cv.notify_all();
  });
}

void MonitoredSession::Impl::StopListening() {
  if (stop != nullptr && stop_listener != 0) stop->Unlisten(stop_listener);
  stop_listener = 0;
}

// A run() that a request_stop() reached before its step: a clean end.
Status MonitoredSession::Impl::StoppedBeforeStep() {
  stopped_before_step = true;
  return absl::CancelledError("MonitoredSession: stop requested (request_stop) before the step: no step ran");
}

// The coordinator's join gets what is left of the stop grace period (the
// StopRequest's; never more than all of it, should the StopRequest measure
// on another clock than the session's).
absl::Duration MonitoredSession::Impl::RemainingGrace() const {
  std::optional<absl::Duration> deadline = stop->grace_deadline();
  if (!deadline.has_value()) return stop_grace_period;
  const absl::Duration left = *deadline - clock->MonotonicNow();
  return std::max(absl::ZeroDuration(), std::min(left, stop_grace_period));
}

bool MonitoredSession::Impl::ShouldStop() const {
  if (closed.load(std::memory_order_acquire) || ended.load(std::memory_order_acquire) ||
      hook_stop.load(std::memory_order_acquire) || stop->stop_requested()) {
    return true;
  }
  Coordinator* c = coord.load(std::memory_order_acquire);
  if (c == nullptr || !c->should_stop()) return false;
  // B50: a preemption error a thread reported is recovered from by the next
  // run() (the recoverable layer answers False); anything else stops.
  return !RecoverableCoordinatorError(c->status());
}

void MonitoredSession::Impl::PollBackgroundError() {
  if (!first_error.ok()) return;
  if (stop->stop_requested()) {
    RecordError(stop->status());
    if (!first_error.ok()) return;
  }
  if (Coordinator* c = coord.load(std::memory_order_acquire); c != nullptr) {
    Status s = c->status();
    if (!s.ok()) {
      first_error = s;
      return;
    }
  }
  if (runtime) RecordError(runtime->error());
}

Status MonitoredSession::Impl::Start() {
  const SessionConfig& config = creator->config();
  if (config.clock != nullptr) clock = config.clock;
  rng.seed(recovery.seed);
  graph = creator->scaffold() ? creator->scaffold()->graph() : nullptr;
  graph_was_finalized = graph == nullptr || graph->finalized();
  // Issue 13: a cluster target's ps wait applies from the first session on
  // (a worker started before its ps tasks waits for them, as a recovery).
  if (const std::string& master = creator->master(); !master.empty()) {
    StatusOr<std::shared_ptr<internal::SessionValues>> values = internal::ResolveSessionTarget(master);
    if (values.ok() && (*values)->remote != nullptr) {
      const internal::RemoteValues::PsWait w = (*values)->remote->ps_wait();
      if (w.wait > absl::ZeroDuration()) ps_wait = w;
    }
  }
  hook_names.reserve(hooks.size());
  for (std::size_t i = 0; i < hooks.size(); ++i) {
    if (!hooks[i]) return absl::InvalidArgumentError(absl::StrCat("MonitoredSession: hooks[", i, "] is null"));
    hook_names.push_back(HookName(hooks[i]));
    before_run_where.push_back(Where(i, "before_run"));
    after_run_where.push_back(Where(i, "after_run"));
  }

  if (stop == nullptr) {
    StopRequestOptions stop_options;
    stop_options.grace_period = stop_grace_period;
    stop_options.clock = clock;
    stop = std::make_shared<StopRequest>(std::move(stop_options));
  }
  ListenForStop();
  StatusOr<std::unique_ptr<internal::Runtime>> rt = internal::Runtime::Create(runtime_options, config);
  if (!rt.ok()) return rt.status();
  runtime = std::move(rt).value();
  for (std::size_t i = 0; i < hooks.size(); ++i) {
    auto* user = dynamic_cast<internal::ServiceUser*>(hooks[i].get());
    if (user == nullptr) continue;  // a hook that uses no service actors
    Status s = CallHook(Where(i, "AttachServices"), [&] { user->AttachServices(runtime.get()); });
    if (!s.ok()) {
      Abort();
      return s;
    }
  }
  // B19 (1): begin() once, in order, before any session exists (B20, B21).
  for (std::size_t i = 0; i < hooks.size(); ++i) {
    Status s = CallHook(Where(i, "begin"), [&] { return hooks[i]->begin(); });
    if (!s.ok()) {
      Abort();
      return s;
    }
  }
  // B19 (2)-(5), retried on preemption as a recovery is (decision 2).
  Status s = EnsureSession();
  if (!s.ok()) {
    Abort();
    return s;
  }
  return absl::OkStatus();
}

// Create() failed: decision 3, nothing started may outlive the failure.
void MonitoredSession::Impl::Abort() {
  closed.store(true, std::memory_order_release);
  StopListening();
  if (stop != nullptr && stop->stop_requested()) stop->Complete();
  Status t = TeardownSession(/*recovering=*/false);
  if (!t.ok()) FOREMAN_LOG_WARN("MonitoredSession: while giving up creation: {}", t.ToString());
  if (runtime) {
    Status sd = runtime->Shutdown(runtime_options.shutdown_timeout);
    if (!sd.ok()) FOREMAN_LOG_WARN("MonitoredSession: while giving up creation: {}", sd.ToString());
  }
  runtime_options.held_lock.reset();  // the caller's reference, if any, keeps it
  if (!graph_was_finalized) graph->Unfinalize();
  close_status = absl::FailedPreconditionError("MonitoredSession was never created");
}

// B19 (2)-(5): raw session, a fresh coordinator with no clean-stop codes
// (B54), after_create_session on every hook in order.
Status MonitoredSession::Impl::CreateSession() {
  StatusOr<std::unique_ptr<Session>> created =
      InvokeUserCode("session creator", [&] { return creator->create_session(); });
  if (!created.ok()) return created.status();
  if (*created == nullptr) return absl::InternalError("session creator returned a null session");
  session = std::move(created).value();

  coordinators.push_back(std::make_unique<Coordinator>(std::vector<absl::StatusCode>{}, clock));
  Coordinator* c = coordinators.back().get();
  runtime->SetCoordinator(c);
  {
    MutexLock l(coord_mu);
    coord.store(c, std::memory_order_release);
    last_coord.store(c, std::memory_order_release);
  }
  // A stop requested before (or between sessions) holds for this one too.
  if (stop->stop_requested()) c->request_stop(stop->status()).IgnoreError();
  // TF builds a new _HookedSession per created session: its flag starts clear.
  hook_stop.store(false, std::memory_order_release);

  if (std::optional<internal::RemoteValues::PsWait> w = internal::SessionAccess::ps_wait(*session)) ps_wait = *w;
  if (ps_wait_since.has_value()) {
    FOREMAN_LOG_INFO("Recovery: the ps tasks are reachable again after {}.",
                     FormatSeconds(clock->MonotonicNow() - *ps_wait_since));
    ps_wait_since.reset();
  }
  for (std::size_t i = 0; i < hooks.size(); ++i) {
    Status s = CallHook(Where(i, "after_create_session"),
                              [&] { return hooks[i]->after_create_session(session.get(), c); });
    if (!s.ok()) return s;
  }

  if (recovery_pending) {
    recovery_pending = false;
    StatusOr<int64_t> restored = session->GlobalStep();
    if (restored.ok() && step_before_error.has_value()) {
      const int64_t lost = std::max<int64_t>(0, *step_before_error - *restored);
      steps_lost.fetch_add(lost, std::memory_order_relaxed);
      if (report.has_value()) {
        if (report->global_step_before < 0) report->global_step_before = *step_before_error;
        report->restored_global_step = *restored;
        report->steps_lost += lost;
      }
      FOREMAN_LOG_WARN(
          "Recovered from a preemption error (recovery {}): global_step {} before the error, {} restored; "
          "{} steps lost.",
          recoveries.load(), *step_before_error, *restored, lost);
    } else {
      FOREMAN_LOG_WARN("Recovered from a preemption error (recovery {}): a new session was created.",
                       recoveries.load());
    }
    step_before_error.reset();
    if (report.has_value()) {
      report_restored_at = clock->MonotonicNow();
      report->restore = report_restored_at - report_decided_at;
      report_restored = true;
    }
  }
  return absl::OkStatus();
}

Status MonitoredSession::Impl::EnsureSession() {
  while (session == nullptr || coord.load(std::memory_order_acquire) == nullptr) {
    Status s = CreateSession();
    if (s.ok()) return s;
    const absl::Duration failed_at = clock->MonotonicNow();
    // A service's failure (a save that could not be written) is local: a new
    // session would not cure it, whatever its code.
    if (!RecoverableCoordinatorError(s)) return s;
    FOREMAN_RETURN_IF_ERROR(BeginRecovery(s, failed_at));
  }
  return absl::OkStatus();
}

// k-th recovery in the window: initial * 2^(k-1), capped, times a jitter in
// [0.5, 1.5) (53 random bits, the same on every platform for one seed).
absl::Duration MonitoredSession::Impl::Backoff(int k) {
  absl::Duration d = recovery.initial_backoff;
  for (int i = 1; i < k && d < recovery.max_backoff; ++i) d *= 2;
  d = std::min(d, recovery.max_backoff);
  const double jitter = 0.5 + static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return d * jitter;
}

// B47 / decision 2: counts the recovery against the budget, logs it, closes
// the raw session and waits the back-off. The caller creates the next one.
Status MonitoredSession::Impl::BeginRecovery(const Status& cause, absl::Duration failed_at) {
  const absl::Duration now = clock->MonotonicNow();
  // Issue 13: while a ps task is unreachable, one recovery keeps
  // re-creating the session every retry_interval until the wait is spent
  // (not counted again, no back-off); a stop request ends the wait.
  const bool waiting_for_ps = ps_wait.has_value() && absl::IsUnavailable(cause) && !recovery.unbounded;
  if (waiting_for_ps && ps_wait_since.has_value()) {
    const absl::Duration waited = now - *ps_wait_since;
    if (waited >= ps_wait->wait || stop->stop_requested()) {
      const std::string why = stop->stop_requested()
                                  ? absl::StrCat("a stop was requested after ", FormatSeconds(waited))
                                  : absl::StrCat("still unreachable after ", FormatSeconds(waited));
      Status gave_up = absl::UnavailableError(
          absl::StrCat(cause.message(), " (", why, " of waiting for the ps tasks; ClusterOptions::ps_wait_secs / ",
                       "--ps-wait-secs is ", FormatSeconds(ps_wait->wait), ")"));
      FOREMAN_LOG_ERROR("Giving up the recovery: {}", gave_up.ToString());
      return gave_up;
    }
    if (now - ps_wait_logged_at >= absl::Seconds(5)) {
      ps_wait_logged_at = now;
      FOREMAN_LOG_INFO("Recovery: still waiting for the ps tasks ({} of {}): {}", FormatSeconds(waited),
                       FormatSeconds(ps_wait->wait), cause.ToString());
    }
    FOREMAN_RETURN_IF_ERROR(TeardownSession(/*recovering=*/true));
    MutexLock l(coord_mu);
    clock->WaitUntil(coord_mu, backoff_cv, clock->MonotonicNow() + ps_wait->retry_interval,
                     [this] { return stop->stop_requested(); });
    return absl::OkStatus();
  }
  while (!recovery_times.empty() && now - recovery_times.front() >= recovery.window) recovery_times.pop_front();
  if (!recovery.unbounded && static_cast<int>(recovery_times.size()) >= recovery.max_recoveries) {
    FOREMAN_LOG_ERROR(
        "Giving up after {} recoveries within {} (RecoveryOptions.max_recoveries / window); the error is "
        "returned: {}",
        recovery_times.size(), FormatSeconds(recovery.window), cause.ToString());
    return cause;
  }
  recovery_times.push_back(now);
  const int k = static_cast<int>(recovery_times.size());
  if (recovery.on_recovered || !recovery.summary_dir.empty()) {
    if (!report.has_value()) {
      report.emplace();
      report->cause = cause;
      report->detect = std::max(absl::ZeroDuration(), now - failed_at);
      report_decided_at = now;
    }
    ++report->recoveries;
    report_restored = false;
  }

  // A ps task is stopping (evicted, docs/cluster.md): it refuses updates
  // but still serves reads, so the chief's checkpoint now, at the cluster's
  // global_step, is what its restore brings back (no step lost).
  if (session != nullptr && IsPsEviction(cause)) SaveForPsEviction();
  if (!recovery_pending) {
    recovery_pending = true;
    step_before_error.reset();
    if (session != nullptr) {
      // A lost ps task (issue 13): the step the session last saw, taken
      // before the read below (a restarted, uninitialized ps has none).
      const std::optional<int64_t> seen = internal::SessionAccess::mirrored_global_step(*session);
      if (waiting_for_ps && seen.has_value()) {
        // Not read from the ps: that read reconnects to the lost task, and a
        // silent one (partitioned, frozen) holds the connect for the whole
        // request timeout (10 s before the wait began, not the heartbeats'
        // ~1 s: tests/cluster_partition_test.sh).
        step_before_error = seen;
      } else {
        StatusOr<int64_t> step = session->GlobalStep();
        step_before_error = step.ok() ? std::optional<int64_t>(*step) : seen;
      }
    }
  }
  const int64_t n = recoveries.fetch_add(1, std::memory_order_relaxed) + 1;
  FOREMAN_LOG_WARN(
      "An error was raised. This may be due to a preemption in a connected worker or parameter server. The "
      "current session will be closed and a new session will be created (recovery {}; {} within {}). "
      "Error: {}",
      n, k, FormatSeconds(recovery.window), cause.ToString());

  // The restore must see the newest checkpoint (B49 loses only what follows it).
  if (runtime) {
    Status w = runtime->WaitForPendingSaves(runtime_options.shutdown_timeout);
    if (!w.ok()) FOREMAN_LOG_WARN("Recovery: pending checkpoint saves: {}", w.ToString());
  }
  FOREMAN_RETURN_IF_ERROR(TeardownSession(/*recovering=*/true));

  if (!waiting_for_ps) ps_wait_since.reset();  // another error ends a wait
  if (waiting_for_ps) {
    ps_wait_since = failed_at;
    ps_wait_logged_at = now;
    FOREMAN_LOG_WARN("Recovery: waiting up to {} for the ps tasks (--ps-wait-secs), reconnecting every {}.",
                     FormatSeconds(ps_wait->wait), FormatSeconds(ps_wait->retry_interval));
    MutexLock l(coord_mu);
    clock->WaitUntil(coord_mu, backoff_cv, clock->MonotonicNow() + ps_wait->retry_interval,
                     [this] { return stop->stop_requested(); });
  } else if (!recovery.unbounded) {
    const absl::Duration wait = Backoff(k);
    if (wait > absl::ZeroDuration()) {
      FOREMAN_LOG_INFO("Recovery: waiting {} before creating a new session.", FormatSeconds(wait));
      // A request_stop() ends the wait; the new session is still created,
      // so that close() can run end() (and save) on a restored one.
      MutexLock l(coord_mu);
      clock->WaitUntil(coord_mu, backoff_cv, clock->MonotonicNow() + wait, [this] { return stop->stop_requested(); });
    }
  }
  return absl::OkStatus();
}

// B52-B53: stop and join the coordinator (stragglers only logged), close the
// raw session ignoring its errors. Returns the coordinator's recorded error
// (a preemption error is the recovery's business, not an error here).
Status MonitoredSession::Impl::TeardownSession(bool recovering) {
  Status result;
  Coordinator* c = nullptr;
  {
    MutexLock l(coord_mu);
    c = coord.exchange(nullptr, std::memory_order_acq_rel);
  }
  if (runtime) runtime->SetCoordinator(nullptr);
  if (c != nullptr) {
    c->request_stop().IgnoreError();  // OK unless join() already ran
    Status j = c->join(RemainingGrace(), /*ignore_live_threads=*/true);
    if (!j.ok() && !(recovering && IsPreemption(j))) result = j;
  }
  if (session != nullptr) {
    Status s = session->Close();
    if (!s.ok()) {
      if (IsPreemption(s)) {
        FOREMAN_LOG_WARN("An error occurred while closing the session: {}", s.ToString());
      } else if (recovering) {
        FOREMAN_LOG_WARN("Closing the session before recovery: {}", s.ToString());
      }
    }
    session.reset();
  }
  return result;
}

// A run that returned `s` ends training: OUT_OF_RANGE cleanly (H-09), anything
// else with an error close() returns and no end() (B39).
Status MonitoredSession::Impl::EndWith(const Status& s) {
  if (absl::IsOutOfRange(s)) {
    FOREMAN_LOG_INFO("Training ends: {}", s.ToString());
  } else {
    PollBackgroundError();
    RecordError(s);
    run_failed = true;
  }
  ended.store(true, std::memory_order_release);
  return s;
}

// _RecoverableSession.run / run_step_fn.
template <class Attempt>
Status MonitoredSession::Impl::RunRecoverably(const Attempt& attempt) {
  bool recovered = false;  // this call re-created the session
  for (;;) {
    Status s = EnsureSession();
    if (!s.ok()) return EndWith(s);
    // request_stop() before this run's step (e.g. during a recovery): a clean
    // end without a step.
    if (stop->stop_requested()) {
      ended.store(true, std::memory_order_release);
      return StoppedBeforeStep();
    }
    if (recoverable) {
      // B50: a preemption a thread reported recovers before this run.
      Coordinator* c = coord.load(std::memory_order_acquire);
      if (c != nullptr && c->should_stop()) {
        Status cs = c->status();
        if (RecoverableCoordinatorError(cs)) {
          Status r = BeginRecovery(cs, clock->MonotonicNow());
          if (!r.ok()) return EndWith(r);
          recovered = true;
          continue;
        }
      }
    }
    // The recovery's new session was told to stop as it was created (its
    // hooks: StopAtStepHook finds global_step at last_step because other
    // workers trained on meanwhile): a clean end without the step, where
    // TF's _RecoverableSession reruns the call into B27's RuntimeError.
    if (recovered) {
      Coordinator* c = coord.load(std::memory_order_acquire);
      if (hook_stop.load(std::memory_order_acquire) || (c != nullptr && c->should_stop() && c->status().ok())) {
        if (report.has_value() && report_restored) FinishReport(std::nullopt);
        ended.store(true, std::memory_order_release);
        return StoppedBeforeStep();
      }
    }
    stopped_before_step = false;
    s = attempt();
    if (s.ok()) {
      if (report.has_value() && report_restored) FinishReport(clock->MonotonicNow() - report_restored_at);
      return s;
    }
    const absl::Duration failed_at = clock->MonotonicNow();
    if (stopped_before_step) {
      ended.store(true, std::memory_order_release);
      return s;
    }
    if (!IsPreemption(s)) {
      // B51: a preemption a thread reported is the root cause.
      Coordinator* c = coord.load(std::memory_order_acquire);
      if (c != nullptr) {
        Status cs = c->status();
        if (IsPreemption(cs) && (runtime == nullptr || runtime->error().ok())) s = cs;
      }
    }
    // A service's failure (e.g. a save that could not be written, whatever
    // its code) is local: a new session would not cure it (B50's rule).
    if (!RecoverableCoordinatorError(s)) return EndWith(s);
    Status r = BeginRecovery(s, failed_at);
    if (!r.ok()) return EndWith(r);
    recovered = true;
  }
}

// Hands the pending RecoveryReport to RecoveryOptions::on_recovered.
void MonitoredSession::Impl::FinishReport(std::optional<absl::Duration> next_good_step) {
  RecoveryReport done = *std::move(report);
  report.reset();
  report_restored = false;
  done.next_good_step = next_good_step;
  if (!recovery.summary_dir.empty()) WriteRecoverySummary(done);
  if (!recovery.on_recovered) return;
  Status s = InvokeUserCode("RecoveryOptions::on_recovered", [&] { recovery.on_recovered(done); });
  if (!s.ok()) FOREMAN_LOG_WARN("{}", s.ToString());
}

// RecoveryOptions::summary_dir: the report as recovery/... scalars, through
// the logdir's summary_writer actor (fire-and-forget, file order = add order).
void MonitoredSession::Impl::WriteRecoverySummary(const RecoveryReport& r) {
  if (runtime == nullptr) return;
  StatusOr<std::shared_ptr<internal::SummaryWriterService>> writer = runtime->SummaryWriter(recovery.summary_dir);
  if (!writer.ok()) {
    FOREMAN_LOG_WARN("RecoveryOptions::summary_dir: the recovery summary is dropped: {}", writer.status().ToString());
    return;
  }
  std::vector<std::string> values = {
      ScalarSummary("recovery/detect_secs", static_cast<float>(absl::ToDoubleSeconds(r.detect))),
      ScalarSummary("recovery/restore_secs", static_cast<float>(absl::ToDoubleSeconds(r.restore))),
  };
  if (r.next_good_step.has_value()) {
    values.push_back(
        ScalarSummary("recovery/next_good_step_secs", static_cast<float>(absl::ToDoubleSeconds(*r.next_good_step))));
  }
  values.push_back(ScalarSummary("recovery/steps_lost", static_cast<float>(r.steps_lost)));
  values.push_back(ScalarSummary("recovery/recoveries", static_cast<float>(r.recoveries)));
  // At the first good step's post-run step: the step of the restored
  // session's START, so a later recovery to the same checkpoint purges this
  // one with the rest of its timeline (each step's value appears once).
  int64_t step = std::max<int64_t>(0, r.restored_global_step);
  if (r.next_good_step.has_value()) {
    StatusOr<int64_t> now = session != nullptr ? session->GlobalStep() : StatusOr<int64_t>(step + 1);
    step = now.ok() ? *now : step + 1;
  }
  (*writer)->AddSummary(MergeSummaries(values), step);
}

// _HookedSession.run: BeforeRun, the step, AfterRun, and the caller's
// fetches out of the results.
StatusOr<TensorMap> MonitoredSession::Impl::HookedRun(const std::vector<std::string>& fetches,
                                                      const TensorMap& feeds, const RunOptions& options,
                                                      RunMetadata* run_metadata) {
  Coordinator* c = coord.load(std::memory_order_acquire);
  if (session == nullptr || c == nullptr) {
    return absl::FailedPreconditionError("Attempted to use a closed MonitoredSession.");
  }
  if (stop->stop_requested()) return StoppedBeforeStep();
  // B27.
  if (hook_stop.load(std::memory_order_acquire) || c->should_stop()) {
    return absl::FailedPreconditionError("Run called even after should_stop requested.");
  }

  std::optional<RunScratch> nested;
  if (scratch_in_use) nested.emplace();
  RunScratch& sc = nested.has_value() ? *nested : scratch;
  struct Release {
    bool* flag;
    ~Release() {
      if (flag != nullptr) *flag = false;
    }
  } release{&sc == &scratch ? &scratch_in_use : nullptr};
  scratch_in_use = true;
  if (sc.hook_args.size() != hooks.size()) {
    sc.hook_args.resize(hooks.size());
    sc.hook_fetches.resize(hooks.size());
    sc.hook_results.resize(hooks.size());
    sc.hook_slots.resize(hooks.size());
  }

  // B28: one context for every hook of this run. (The kept args are assigned
  // only when the caller's fetches change; that also re-plans.)
  if (sc.original_args.fetches != fetches) {
    sc.original_args.fetches = fetches;
    sc.planned = false;
  }
  sc.original_args.feeds = feeds;
  sc.original_args.options = options;
  SessionRunContext ctx(&sc.original_args, session.get());

  TensorMap merged_feeds;
  const TensorMap* run_feeds = &feeds;
  RunOptions merged_options = options;
  FOREMAN_RETURN_IF_ERROR(BeforeRun(ctx, sc, feeds, &merged_feeds, &run_feeds, &merged_options));
  if (!sc.planned) Plan(sc);

  RunMetadata local_metadata;
  RunMetadata* metadata = run_metadata != nullptr ? run_metadata : &local_metadata;
  // B34 / B40: no after_run for a failed run.
  FOREMAN_RETURN_IF_ERROR(internal::SessionAccess::RunInto(*session, sc.all_fetches, *run_feeds, merged_options,
                                                           metadata, &sc.values, &sc.answered));

  FOREMAN_RETURN_IF_ERROR(AfterRun(ctx, sc, merged_options, metadata));
  if (ctx.stop_requested()) hook_stop.store(true, std::memory_order_release);
  // The caller's fetches: their results are not needed any more, so they
  // move out (a name listed twice is returned once, as before).
  TensorMap out;
  for (const auto& [index, slot] : sc.caller_out) out.emplace(fetches[index], std::move(sc.values[slot]));
  return out;
}

// B29-B33: every hook's before_run (into its kept args), in order; their
// feeds (disjoint from each other's and the caller's) and options merged into
// the run's. A hook whose fetch names differ from the plan's voids the plan.
Status MonitoredSession::Impl::BeforeRun(SessionRunContext& ctx, RunScratch& sc, const TensorMap& feeds,
                                         TensorMap* merged_feeds, const TensorMap** run_feeds,
                                         RunOptions* merged_options) {
  TensorMap hook_feeds;
  for (std::size_t i = 0; i < hooks.size(); ++i) {
    SessionRunArgs& request = sc.hook_args[i];
    request.feeds.clear();  // a hook starts with none, also after a failed call left some
    FOREMAN_RETURN_IF_ERROR(CallHook(before_run_where[i], [&] { return hooks[i]->before_run_into(ctx, request); }));
    if (request.fetches != sc.hook_fetches[i]) {
      sc.hook_fetches[i] = request.fetches;
      sc.planned = false;
    }
    if (!request.feeds.empty()) {
      FOREMAN_RETURN_IF_ERROR(CheckFeedsDisjoint(hook_feeds, request.feeds, "Same tensor is fed by two hooks."));
      for (auto& [name, value] : request.feeds) hook_feeds.emplace(name, std::move(value));
      request.feeds.clear();
    }
    MergeRunOptions(request.options, merged_options);
  }
  if (!hook_feeds.empty()) {
    FOREMAN_RETURN_IF_ERROR(
        CheckFeedsDisjoint(feeds, hook_feeds, "Same tensor is fed by a SessionRunHook and user."));
    *merged_feeds = feeds;
    merged_feeds->insert(hook_feeds.begin(), hook_feeds.end());
    *run_feeds = merged_feeds;
  }
  return absl::OkStatus();
}

// The run's plan from the caller's and the hooks' fetch names: all of them
// sorted and unique, as Session::Run wants them, and the slot of each
// caller's and hook's fetch among them (hook_results get their keys here; the
// values are assigned in place every run).
void MonitoredSession::Impl::Plan(RunScratch& sc) {
  sc.all_fetches.clear();
  auto add = [&](const std::vector<std::string>& names) {
    sc.all_fetches.insert(sc.all_fetches.end(), names.begin(), names.end());
  };
  add(sc.original_args.fetches);
  for (const auto& f : sc.hook_fetches) add(f);
  std::sort(sc.all_fetches.begin(), sc.all_fetches.end());
  sc.all_fetches.erase(std::unique(sc.all_fetches.begin(), sc.all_fetches.end()), sc.all_fetches.end());
  auto slot_of = [&](const std::string& name) {
    return static_cast<std::size_t>(std::lower_bound(sc.all_fetches.begin(), sc.all_fetches.end(), name) -
                                    sc.all_fetches.begin());
  };
  const std::vector<std::string>& caller = sc.original_args.fetches;
  sc.caller_out.clear();
  for (std::size_t i = 0; i < caller.size(); ++i) {
    if (std::find(caller.begin(), caller.begin() + static_cast<std::ptrdiff_t>(i), caller[i]) !=
        caller.begin() + static_cast<std::ptrdiff_t>(i)) {
      continue;  // listed twice
    }
    sc.caller_out.emplace_back(i, slot_of(caller[i]));
  }
  for (std::size_t h = 0; h < sc.hook_fetches.size(); ++h) {
    sc.hook_results[h].clear();
    sc.hook_slots[h].clear();
    for (const std::string& name : sc.hook_fetches[h]) {
      auto [it, inserted] = sc.hook_results[h].try_emplace(name);
      if (inserted) sc.hook_slots[h].emplace_back(&it->second, slot_of(name));
    }
  }
  sc.planned = true;
}

// B31, B34-B36: every hook's after_run with its own results, copied from the
// run's slots into the hook's kept map (in place: no allocation once the
// tensors have their shapes).
Status MonitoredSession::Impl::AfterRun(SessionRunContext& ctx, RunScratch& sc, RunOptions& merged_options,
                                        RunMetadata* metadata) {
  for (std::size_t i = 0; i < hooks.size(); ++i) {
    SessionRunValues values;
    if (!sc.hook_fetches[i].empty()) {
      for (const auto& [value, slot] : sc.hook_slots[i]) *value = sc.values[slot];
      values.results = &sc.hook_results[i];
    }
    values.options = &merged_options;
    values.run_metadata = metadata;
    FOREMAN_RETURN_IF_ERROR(
        CallHook(after_run_where[i], [&] { return hooks[i]->after_run(ctx, values); }));
  }
  return absl::OkStatus();
}

// B38-B43, B52-B53, decisions 3-4.
Status MonitoredSession::Impl::Close() {
  if (close_status.has_value()) return *close_status;  // decision 4
  closed.store(true, std::memory_order_release);
  // A recovery with no good step after it (a stop during it, another error).
  if (report.has_value()) FinishReport(std::nullopt);
  PollBackgroundError();

  // request_stop(error) is an abort: like a failed run, no end().
  if (!stop->status().ok()) run_failed = true;
  // B38-B39: end() only when training did not end with an error. B42: an
  // end() that fails skips the later ones (TF's loop) but not the closing.
  if (!run_failed && session != nullptr) {
    for (std::size_t i = 0; i < hooks.size(); ++i) {
      Status s = CallHook(Where(i, "end"), [&] { return hooks[i]->end(session.get()); });
      if (!s.ok()) {
        RecordError(s);
        break;
      }
      // The CheckpointSaverHook's end() returns once the final save is
      // durable: that is the stop's work, so its grace period ends here, not
      // after the later hooks' end() (a final evaluation takes what it takes).
      if (dynamic_cast<const CheckpointSaverHook*>(hooks[i].get()) != nullptr) stop->Complete();
    }
  }

  // Every end() has run (a CheckpointSaverHook's completed the stop
  // already): a requested stop is done.
  if (stop->stop_requested()) stop->Complete();

  // Keep the raw session for the services' last words; close it last.
  std::unique_ptr<Session> raw = std::move(session);
  RecordError(TeardownSession(/*recovering=*/false));
  if (runtime) RecordError(runtime->Shutdown(runtime_options.shutdown_timeout));
  runtime_options.held_lock.reset();  // RuntimeOptions::held_lock: kept until close()
  if (raw != nullptr) {
    Status s = raw->Close();
    if (!s.ok()) FOREMAN_LOG_WARN("An error occurred while closing the session: {}", s.ToString());
  }
  // B22.
  if (!graph_was_finalized) graph->Unfinalize();
  StopListening();
  close_status = first_error;
  return *close_status;
}

// -- MonitoredSession -------------------------------------------------------------

MonitoredSession::MonitoredSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MonitoredSession::~MonitoredSession() {
  if (impl_ == nullptr || impl_->close_status.has_value()) return;
  Status s = close();
  if (!s.ok()) FOREMAN_LOG_WARN("MonitoredSession closed by its destructor: {}", s.ToString());
}

namespace {

Status CheckGraphMatches(const std::shared_ptr<Graph>& graph, const std::shared_ptr<Scaffold>& scaffold,
                         const char* what) {
  if (graph != nullptr && scaffold != nullptr && scaffold->graph() != graph) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": `graph` is not the graph of the ", "scaffold/session creator; give one of them"));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<MonitoredSession>> MonitoredSession::Create(MonitoredSessionOptions options) {
  auto impl = std::make_unique<Impl>();
  if (options.session_creator != nullptr) {
    FOREMAN_RETURN_IF_ERROR(CheckGraphMatches(options.graph, options.session_creator->scaffold(), "MonitoredSession"));
    impl->creator = std::move(options.session_creator);
  } else if (options.graph != nullptr) {
    // B18: a ChiefSessionCreator that never restores.
    impl->creator = std::make_shared<ChiefSessionCreator>(std::make_shared<Scaffold>(std::move(options.graph)));
  } else {
    return absl::InvalidArgumentError("MonitoredSession needs a session_creator or a graph");
  }
  impl->hooks = std::move(options.hooks);
  FOREMAN_ASSIGN_OR_RETURN(impl->stop_grace_period,
                           StopGracePeriod(options.stop_grace_period_secs, options.runtime.stop.get()));
  impl->recovery = options.recovery;
  impl->runtime_options = options.runtime;
  impl->stop = options.runtime.stop;
  impl->recoverable = true;
  FOREMAN_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<MonitoredSession>(new MonitoredSession(std::move(impl)));
}

StatusOr<TensorMap> MonitoredSession::run(const std::vector<std::string>& fetches, const TensorMap& feeds,
                                          const RunOptions& options, RunMetadata* run_metadata) {
  Impl& m = *impl_;
  if (m.closed.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError("Attempted to use a closed MonitoredSession.");
  }
  if (should_stop()) return absl::FailedPreconditionError("Run called even after should_stop requested.");
  TensorMap out;
  Status s = m.RunRecoverably([&]() -> Status {
    // Hooks may add to the caller's metadata; a retried run starts afresh.
    if (run_metadata != nullptr) run_metadata->step_stats.clear();
    StatusOr<TensorMap> r = m.HookedRun(fetches, feeds, options, run_metadata);
    if (!r.ok()) return r.status();
    out = std::move(r).value();
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

Status MonitoredSession::run_step_fn(const StepCallable& step_fn) {
  Impl& m = *impl_;
  if (m.closed.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError("Attempted to use a closed MonitoredSession.");
  }
  if (should_stop()) return absl::FailedPreconditionError("Run called even after should_stop requested.");
  if (!step_fn) return absl::InvalidArgumentError("run_step_fn: step_fn is empty");
  bool stop_requested = false;
  // B45: a preemption error anywhere inside re-runs the whole function.
  Status s = m.RunRecoverably([&]() -> Status {
    MonitoredStepContext ctx(this, m.session.get());
    Status r = InvokeUserCode("step function of run_step_fn", [&] { return step_fn(ctx); });
    stop_requested = ctx.stop_requested();
    return r;
  });
  // B44: request_stop() is TF's StopIteration: a clean stop.
  if (s.ok() && stop_requested) m.ended.store(true, std::memory_order_release);
  return s;
}

bool MonitoredSession::should_stop() const { return impl_->ShouldStop(); }

void MonitoredSession::request_stop(const Status& status) {
  if (impl_->closed.load(std::memory_order_acquire)) return;
  impl_->stop->request_stop(status);
}

const std::shared_ptr<StopRequest>& MonitoredSession::stop_request() const { return impl_->stop; }

Status MonitoredSession::close() { return impl_->Close(); }

int64_t MonitoredSession::recoveries() const { return impl_->recoveries.load(std::memory_order_relaxed); }
int64_t MonitoredSession::steps_lost() const { return impl_->steps_lost.load(std::memory_order_relaxed); }

std::vector<ServiceRestart> MonitoredSession::service_restarts() const {
  return impl_->runtime ? impl_->runtime->restarts() : std::vector<ServiceRestart>{};
}

StatusOr<std::unique_ptr<data::InputPipeline>> MonitoredSession::NewInputPipeline(
    std::shared_ptr<const data::Dataset> dataset, data::InputPipelineOptions options) {
  if (!impl_->runtime) return absl::FailedPreconditionError("NewInputPipeline: the session has no services");
  if (impl_->closed.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError("NewInputPipeline: the session is closed");
  }
  return impl_->runtime->NewInputPipeline(std::move(dataset), std::move(options));
}

// The latest: between sessions and after close() too (kept alive by
// `coordinators` until the session is destroyed).
Coordinator* MonitoredSession::coordinator() const { return impl_->last_coord.load(std::memory_order_acquire); }

StatusOr<TensorMap> MonitoredStepContext::run_with_hooks(const std::vector<std::string>& fetches,
                                                         const TensorMap& feeds, const RunOptions& options) {
  // TF: the step context's run_with_hooks is the coordinated session's run:
  // hooks, no recovery (the whole step function is retried instead, B45).
  return owner_->impl_->HookedRun(fetches, feeds, options, nullptr);
}

// -- SingularMonitoredSession ------------------------------------------------------

StatusOr<std::unique_ptr<SingularMonitoredSession>> SingularMonitoredSession::Create(
    SingularMonitoredSessionOptions options) {
  FOREMAN_RETURN_IF_ERROR(CheckGraphMatches(options.graph, options.scaffold, "SingularMonitoredSession"));
  std::shared_ptr<Scaffold> scaffold = options.scaffold;
  if (scaffold == nullptr) {
    if (options.graph == nullptr) {
      return absl::InvalidArgumentError("SingularMonitoredSession needs a graph or a scaffold");
    }
    scaffold = std::make_shared<Scaffold>(options.graph);
  }
  auto impl = std::make_unique<Impl>();
  impl->creator = std::make_shared<ChiefSessionCreator>(scaffold, options.master, options.config,
                                                        options.checkpoint_dir,
                                                        options.checkpoint_filename_with_path);
  impl->hooks = std::move(options.hooks);
  FOREMAN_ASSIGN_OR_RETURN(impl->stop_grace_period,
                           StopGracePeriod(options.stop_grace_period_secs, options.runtime.stop.get()));
  impl->runtime_options = options.runtime;
  impl->stop = options.runtime.stop;
  impl->recoverable = false;  // B23
  FOREMAN_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<SingularMonitoredSession>(new SingularMonitoredSession(std::move(impl)));
}

Session* SingularMonitoredSession::raw_session() const { return impl_->session.get(); }

Status SingularMonitoredSession::stop_error() const {
  Coordinator* c = impl_->last_coord.load(std::memory_order_acquire);
  return c != nullptr ? c->status() : absl::OkStatus();
}

// -- MonitoredTrainingSession ---------------------------------------------------------

namespace {

template <class T>
std::optional<T> Resolve(const Defaultable<T>& d) {
  if (d.kind == Defaultable<T>::Kind::kValue) return d.value;
  return std::nullopt;
}

// B7: enabled only when set and > 0.
template <class T>
bool Enabled(const std::optional<T>& v) {
  return v.has_value() && *v > 0;
}

template <class A, class B>
Status CheckAtMostOne(const char* name_a, const std::optional<A>& a, const char* name_b,
                      const std::optional<B>& b) {
  if (!a.has_value() || !b.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "MonitoredTrainingSession: both ", name_a, " (", *a, ") and ", name_b, " (", *b,
      ") are set; give at most one of them (TF: \"Can not provide both every_secs and every_steps.\")"));
}

}  // namespace

StatusOr<MonitoredTrainingSessionPlan> PlanMonitoredTrainingSession(const MonitoredTrainingSessionOptions& options) {
  if (options.graph == nullptr && options.scaffold == nullptr) {
    return absl::InvalidArgumentError("MonitoredTrainingSession needs a graph or a scaffold");
  }
  FOREMAN_RETURN_IF_ERROR(CheckGraphMatches(options.graph, options.scaffold, "MonitoredTrainingSession"));
  if (options.recovery_wait_secs < 0 || std::isnan(options.recovery_wait_secs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MonitoredTrainingSession: recovery_wait_secs must be >= 0, got ", options.recovery_wait_secs));
  }
  MonitoredTrainingSessionPlan plan;

  // B1-B3.
  const auto& sum_steps = options.save_summaries_steps;
  const auto& sum_secs = options.save_summaries_secs;
  if (sum_steps.use_default() && sum_secs.use_default()) {
    plan.save_summaries_steps = 100;
    plan.save_summaries_secs = std::nullopt;
  } else {
    plan.save_summaries_steps = Resolve(sum_steps);
    plan.save_summaries_secs = Resolve(sum_secs);
  }
  // B4-B5.
  const auto& ckpt_steps = options.save_checkpoint_steps;
  const auto& ckpt_secs = options.save_checkpoint_secs;
  if (ckpt_steps.use_default() && ckpt_secs.use_default()) {
    plan.save_checkpoint_steps = std::nullopt;
    plan.save_checkpoint_secs = 600;
  } else {
    plan.save_checkpoint_steps = Resolve(ckpt_steps);
    plan.save_checkpoint_secs = Resolve(ckpt_secs);
  }
  // B8 / decision 1: TF's timer refuses both (its docstring is wrong).
  FOREMAN_RETURN_IF_ERROR(CheckAtMostOne("save_checkpoint_secs", plan.save_checkpoint_secs, "save_checkpoint_steps",
                                         plan.save_checkpoint_steps));
  FOREMAN_RETURN_IF_ERROR(CheckAtMostOne("save_summaries_secs", plan.save_summaries_secs, "save_summaries_steps",
                                         plan.save_summaries_steps));

  // B10: TF's default is 100.
  plan.log_step_count_steps =
      options.log_step_count_steps.use_default() ? std::optional<int64_t>(100) : Resolve(options.log_step_count_steps);

  // B9-B13.
  plan.summary_dir = options.summary_dir.empty() ? options.checkpoint_dir : options.summary_dir;
  if (options.is_chief) {
    if (!plan.summary_dir.empty()) {
      plan.step_counter_hook = Enabled(plan.log_step_count_steps);
      plan.summary_saver_hook = Enabled(plan.save_summaries_steps) || Enabled(plan.save_summaries_secs);
    }
    if (!options.checkpoint_dir.empty()) {
      plan.checkpoint_saver_hook = Enabled(plan.save_checkpoint_steps) || Enabled(plan.save_checkpoint_secs);
    }
  }
  return plan;
}

StatusOr<std::unique_ptr<MonitoredSession>> MonitoredTrainingSession(MonitoredTrainingSessionOptions options) {
  FOREMAN_ASSIGN_OR_RETURN(MonitoredTrainingSessionPlan plan, PlanMonitoredTrainingSession(options));
  // B15: one scaffold for the creator and the default hooks.
  std::shared_ptr<Scaffold> scaffold =
      options.scaffold != nullptr ? options.scaffold : std::make_shared<Scaffold>(options.graph);
  SessionConfig config = options.config;
  if (config.env == nullptr) config.env = Env::Default();
  if (config.clock == nullptr) config.clock = Clock::Real();

  MonitoredSessionOptions ms;
  ms.stop_grace_period_secs = options.stop_grace_period_secs;  // B16
  ms.recovery = options.recovery;
  ms.runtime = options.runtime;
  // Recovery metrics go where the chief's other summaries go.
  if (options.is_chief && ms.recovery.summary_dir.empty() && (plan.summary_saver_hook || plan.step_counter_hook)) {
    ms.recovery.summary_dir = plan.summary_dir;
  }

  if (!options.is_chief) {
    // B13, B16: wait for the chief; only the caller's hooks; no restore.
    ms.session_creator = std::make_shared<WorkerSessionCreator>(
        scaffold, options.master, config, absl::Seconds(options.max_wait_secs),
        absl::Seconds(options.recovery_wait_secs));
    ms.hooks = std::move(options.hooks);
    return MonitoredSession::Create(std::move(ms));
  }

  // B14: restores from checkpoint_dir whether or not a saver hook exists.
  ms.session_creator =
      std::make_shared<ChiefSessionCreator>(scaffold, options.master, config, options.checkpoint_dir);

  if (plan.summary_saver_hook || plan.checkpoint_saver_hook) {
    // TF's hooks read scaffold.saver / summary_op lazily; ours take them at
    // construction, so the scaffold is finalized now. The graph goes back to
    // the caller's hooks for their begin() (B21) when it was not finalized
    // before; the session creation finalizes it (B19).
    const std::shared_ptr<Graph>& graph = scaffold->graph();
    const bool was_finalized = graph == nullptr || graph->finalized();
    FOREMAN_RETURN_IF_ERROR(scaffold->finalize(config));
    if (!was_finalized) graph->Unfinalize();
  }

  // B12: chief_only_hooks, StepCounterHook, SummarySaverHook,
  // CheckpointSaverHook, hooks.
  HookList hooks = std::move(options.chief_only_hooks);
  if (plan.step_counter_hook) {
    StepCounterHook::Options o;
    o.every_n_steps = plan.log_step_count_steps;  // B10
    o.every_n_secs = std::nullopt;
    o.output_dir = plan.summary_dir;
    o.clock = config.clock;
    FOREMAN_ASSIGN_OR_RETURN(auto hook, StepCounterHook::Create(std::move(o)));
    hooks.push_back(std::move(hook));
  }
  if (plan.summary_saver_hook) {
    SummarySaverHook::Options o;
    o.save_steps = plan.save_summaries_steps;
    o.save_secs = plan.save_summaries_secs;
    o.output_dir = plan.summary_dir;
    o.summary_op = scaffold->summary_op();
    o.clock = config.clock;
    FOREMAN_ASSIGN_OR_RETURN(auto hook, SummarySaverHook::Create(std::move(o)));
    hooks.push_back(std::move(hook));
  }
  if (plan.checkpoint_saver_hook) {
    CheckpointSaverHook::Options o;  // B11
    o.checkpoint_dir = options.checkpoint_dir;
    o.save_secs = plan.save_checkpoint_secs;
    o.save_steps = plan.save_checkpoint_steps;
    o.saver = scaffold->saver();
    o.checkpoint_basename = "model.ckpt";
    o.listeners = std::move(options.checkpoint_listeners);
    o.clock = config.clock;
    o.env = config.env;
    FOREMAN_ASSIGN_OR_RETURN(auto hook, CheckpointSaverHook::Create(std::move(o)));
    hooks.push_back(std::move(hook));
  }
  if (!plan.checkpoint_saver_hook && !options.checkpoint_listeners.empty()) {
    FOREMAN_LOG_WARN(
        "MonitoredTrainingSession: checkpoint_listeners are ignored: no CheckpointSaverHook (checkpoint_dir "
        "empty or checkpoints disabled).");
  }
  for (auto& hook : options.hooks) hooks.push_back(std::move(hook));
  ms.hooks = std::move(hooks);
  // The checkpoint directory's lock comes first: the StepCounterHook's and
  // SummarySaverHook's begin() (earlier in the list, B12) open event files
  // in the same directory, and a busy directory must be refused before they
  // write there (not when the CheckpointSaverHook's begin() locks it). The
  // checkpoint saver then uses this lock (RuntimeOptions::held_lock); the
  // session drops it at close(). A caller's lock on that directory is used
  // as it is.
  if (plan.checkpoint_saver_hook) {
    const std::string dir = internal::NormalizeDirectory(options.checkpoint_dir);
    const RuntimeOptions& runtime = ms.runtime;
    if (runtime.held_lock == nullptr) {
      FOREMAN_ASSIGN_OR_RETURN(ms.runtime.held_lock, LockCheckpointDirectory(config.env, dir));
      ms.runtime.held_lock_directory = dir;
    } else if (internal::NormalizeDirectory(runtime.held_lock_directory) != dir) {
      FOREMAN_LOG_WARN(
          "MonitoredTrainingSession: runtime.held_lock is for {}, not the checkpoint_dir {}: the checkpoint saver "
          "locks {} when its hook begins",
          runtime.held_lock_directory, dir, dir);
    }
  }
  return MonitoredSession::Create(std::move(ms));
}

}  // namespace foreman
