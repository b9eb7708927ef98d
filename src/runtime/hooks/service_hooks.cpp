// The stock hooks whose work is I/O: CheckpointSaverHook (B102-B108,
// decision 11), StepCounterHook (B109-B111), SummarySaverHook (B112-B116).
// (TF: basic_session_run_hooks.py.) They decide *when* on the training
// thread, with TF's exact schedules (decision 6), and hand the work to the
// session's service actors through internal::Services (design.md §2).
#include <cxxabi.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "foreman/hooks.hpp"
#include "foreman/mutex.hpp"
#include "foreman/summary.hpp"
#include "foreman/variable_store.hpp"
#include "formats/saver.hpp"
#include "platform/log.hpp"
#include "platform/path.hpp"
#include "runtime/hooks/global_step.hpp"
#include "runtime/services.hpp"

namespace foreman {

namespace {

Status NoServices(const std::string& hook) {
  return absl::FailedPreconditionError(
      absl::StrCat(hook, " needs a MonitoredSession or Supervisor (no services attached)"));
}

std::string Demangle(const char* name) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && demangled != nullptr ? demangled : name;
  std::free(demangled);
  return out;
}

// Leaves exactly {global_step} + *extra as args' fetches, default options and
// no feeds; assigns the fetches only when they differ, so that a hook asking
// for the same names every step allocates nothing. `args` holds what this
// function left in it the previous run (SessionRunHook::before_run_into), so
// the lengths tell the two lists a hook leaves apart without comparing
// characters.
void LeaveFetches(SessionRunArgs& args, const std::vector<std::string>* extra = nullptr) {
  const std::string& global_step = internal::GlobalStepFetchName();
  const std::size_t n = 1 + (extra == nullptr ? 0 : extra->size());
  bool same = args.fetches.size() == n && args.fetches[0].size() == global_step.size();
  for (std::size_t i = 1; same && i < n; ++i) same = args.fetches[i].size() == (*extra)[i - 1].size();
  if (!same) {
    args.fetches.clear();
    args.fetches.push_back(global_step);
    if (extra != nullptr) args.fetches.insert(args.fetches.end(), extra->begin(), extra->end());
  }
  args.feeds.clear();
  args.options = RunOptions{};
}

}  // namespace

// -- CheckpointSaverHook ----------------------------------------------------------------

struct CheckpointSaverHook::Impl {
  Impl(CheckpointSaverHook::Options o, SecondOrStepTimer t) : options(std::move(o)), timer(std::move(t)) {
    // Room for the first saves' steps, so that taking up a completed save on
    // the training thread (after_run) allocates nothing for a long while.
    MutexLock l(mu);
    saved_steps.reserve(64);
  }

  CheckpointSaverHook::Options options;
  SecondOrStepTimer timer;
  std::string save_path;  // "<dir>/<basename>"
  internal::Services* services = nullptr;
  std::shared_ptr<internal::CheckpointService> service;
  Coordinator* coord = nullptr;

  // The save in flight: its after_save has not run yet.
  std::shared_ptr<internal::SaveTicket> in_flight;
  // The previous save's snapshot, handed back by the checkpoint_saver with
  // its completed ticket: the next save copies into these buffers in place
  // (internal::SnapshotInto). Fresh buffers would cost a page fault per 4 KiB
  // once glibc returns a freed snapshot above its trim threshold to the
  // kernel (every save of a state above ~32 MB), on the training thread, and
  // again when the kernel first reads them in the write. The price: a second
  // copy of the variables held between saves (until end()). A save in flight
  // still owns its buffers (they come back only with its completed ticket),
  // so they are never overwritten while it writes them; when none came back
  // (the first save, a ticket the runtime failed), new ones are allocated.
  std::map<std::string, Tensor> spare;
  // The step of the last save lost with a restarted checkpoint_saver (-1:
  // none): end() saves the final step again when its save was lost.
  int64_t last_lost_step = -1;

  mutable Mutex mu;  // for the accessors below (read from other threads)
  std::vector<int64_t> saved_steps ABSL_GUARDED_BY(mu);
  int64_t waited_saves ABSL_GUARDED_BY(mu) = 0;

  /// Takes up a completed save: its error ends training; otherwise the
  /// listeners' after_save. Sets *stop when one asks for it.
  Status Finish(Session* session, bool* stop) {
    std::shared_ptr<internal::SaveTicket> ticket = std::move(in_flight);
    in_flight = nullptr;
    Status s = ticket->Wait(absl::ZeroDuration());
    spare = ticket->TakeBuffers();
    if (!s.ok() && ticket->IsLost()) {
      // The restart policy restarts the checkpoint_saver (or escalates, and
      // the run fails with its error): this save is lost, the next one goes
      // to the new incarnation.
      FOREMAN_LOG_WARN("The checkpoint of step {} was lost: {}; the checkpoint_saver is restarted by the "
                       "session's restart policy and training goes on",
                       ticket->step, s.ToString());
      last_lost_step = ticket->step;
      return absl::OkStatus();
    }
    if (!s.ok()) return s;
    {
      MutexLock l(mu);
      saved_steps.push_back(ticket->step);
    }
    if (options.listeners.empty()) return absl::OkStatus();
    FOREMAN_LOG_INFO("Calling checkpoint listeners after saving checkpoint {}...", ticket->step);
    for (const auto& listener : options.listeners) {
      FOREMAN_ASSIGN_OR_RETURN(bool wants_stop,
                               InvokeUserCode("CheckpointSaverListener::after_save",
                                              [&] { return listener->after_save(session, ticket->step); }));
      if (wants_stop) {
        FOREMAN_LOG_INFO("A CheckpointSaverListener requested that training be stopped. listener: {}",
                         Demangle(typeid(*listener).name()));
        *stop = true;
      }
    }
    return absl::OkStatus();
  }

  /// Waits (bounded) for the save in flight, then Finish()es it.
  Status WaitAndFinish(Session* session, bool* stop) {
    if (in_flight == nullptr) return absl::OkStatus();
    Status s = in_flight->Wait(options.save_timeout);
    if (s.code() == absl::StatusCode::kDeadlineExceeded && !in_flight->IsDone()) return s;
    return Finish(session, stop);
  }

  /// Finish()es the save in flight if it has completed (a step boundary).
  Status PollInFlight(Session* session, bool* stop) {
    if (in_flight == nullptr || !in_flight->IsDone()) return absl::OkStatus();
    return Finish(session, stop);
  }

  /// One save of `step` (B106): waits for the one in flight (decision 11),
  /// before_save, copy, hand to the actor. With listeners, also waits for it
  /// and runs after_save (see the class comment).
  Status Save(Session* session, int64_t step, bool* stop) {
    if (in_flight != nullptr) {
      if (!in_flight->IsDone()) {
        MutexLock l(mu);
        ++waited_saves;
      }
      FOREMAN_RETURN_IF_ERROR(WaitAndFinish(session, stop));
    }
    if (!options.listeners.empty()) {
      FOREMAN_LOG_INFO("Calling checkpoint listeners before saving checkpoint {}...", step);
    }
    for (const auto& listener : options.listeners) {
      FOREMAN_RETURN_IF_ERROR(InvokeUserCode("CheckpointSaverListener::before_save",
                                             [&] { return listener->before_save(session, step); }));
    }
    FOREMAN_LOG_INFO("Saving checkpoints for {} into {}.", step, save_path);
    std::map<std::string, Tensor> snapshot = std::move(spare);
    spare.clear();
    FOREMAN_RETURN_IF_ERROR(internal::SnapshotInto(*session, &snapshot).status());
    in_flight = service->StartSave(std::move(snapshot), step);
    if (!options.listeners.empty()) return WaitAndFinish(session, stop);
    return absl::OkStatus();
  }
};

StatusOr<std::shared_ptr<CheckpointSaverHook>> CheckpointSaverHook::Create(const Options& options_in) {
  Options options = options_in;
  FOREMAN_ASSIGN_OR_RETURN(SecondOrStepTimer timer,
                           SecondOrStepTimer::Create(options.save_secs, options.save_steps, options.clock));
  if (options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("CheckpointSaverHook: checkpoint_dir must not be empty");
  }
  if (options.checkpoint_basename.empty()) {
    return absl::InvalidArgumentError("CheckpointSaverHook: checkpoint_basename must not be empty");
  }
  if (options.steps_per_run < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CheckpointSaverHook: steps_per_run must be >= 1, got ", options.steps_per_run));
  }
  if (options.save_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("CheckpointSaverHook: save_timeout must be > 0");
  }
  for (const auto& listener : options.listeners) {
    if (listener == nullptr) return absl::InvalidArgumentError("CheckpointSaverHook: a listener is null");
  }
  if (options.env == nullptr || options.clock == nullptr) {
    return absl::InvalidArgumentError("CheckpointSaverHook: env and clock must not be null");
  }
  if (options.saver == nullptr) {
    FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<Saver> saver, internal::NewDefaultSaver(options.env, options.clock));
    options.saver = std::move(saver);
  }
  options.checkpoint_dir = internal::NormalizeDirectory(options.checkpoint_dir);
  auto impl = std::make_unique<Impl>(std::move(options), std::move(timer));
  impl->save_path = JoinPath(impl->options.checkpoint_dir, impl->options.checkpoint_basename);
  return std::shared_ptr<CheckpointSaverHook>(new CheckpointSaverHook(std::move(impl)));
}

CheckpointSaverHook::CheckpointSaverHook(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointSaverHook::~CheckpointSaverHook() = default;

void CheckpointSaverHook::AttachServices(internal::Services* services) { impl_->services = services; }

Status CheckpointSaverHook::begin() {
  Impl& m = *impl_;
  if (m.services == nullptr) return NoServices(name());
  FOREMAN_ASSIGN_OR_RETURN(m.service, m.services->CheckpointSaver(m.options.checkpoint_dir, m.options.saver,
                                                                  m.options.checkpoint_basename));
  for (const auto& listener : m.options.listeners) {
    FOREMAN_RETURN_IF_ERROR(InvokeUserCode("CheckpointSaverListener::begin", [&] { return listener->begin(); }));
  }
  return absl::OkStatus();
}

Status CheckpointSaverHook::after_create_session(Session* session, Coordinator* coord) {
  Impl& m = *impl_;
  FOREMAN_RETURN_IF_ERROR(internal::RequireGlobalStep(session, *this));
  if (m.service == nullptr) return absl::FailedPreconditionError("CheckpointSaverHook: begin() was not called");
  m.coord = coord;
  // B103: the state at the current step, on every session creation.
  FOREMAN_ASSIGN_OR_RETURN(int64_t step, internal::RealGlobalStep(session, *this));
  bool stop = false;
  FOREMAN_RETURN_IF_ERROR(m.Save(session, step, &stop));
  m.timer.update_last_triggered_step(step);
  // TF ignores a stop asked for here; Foreman honours it (before the first
  // step of this session).
  if (stop && coord != nullptr) coord->request_stop().IgnoreError();
  return absl::OkStatus();
}

StatusOr<SessionRunArgs> CheckpointSaverHook::before_run(SessionRunContext& ctx) {
  SessionRunArgs args;
  FOREMAN_RETURN_IF_ERROR(CheckpointSaverHook::before_run_into(ctx, args));
  return args;
}

Status CheckpointSaverHook::before_run_into(SessionRunContext& ctx, SessionRunArgs& args) {
  bool stop = false;
  FOREMAN_RETURN_IF_ERROR(impl_->PollInFlight(ctx.session(), &stop));
  if (stop) ctx.request_stop();
  LeaveFetches(args);
  return absl::OkStatus();
}

Status CheckpointSaverHook::after_run(SessionRunContext& ctx, const SessionRunValues& values) {
  Impl& m = *impl_;
  bool stop = false;
  FOREMAN_RETURN_IF_ERROR(m.PollInFlight(ctx.session(), &stop));
  FOREMAN_ASSIGN_OR_RETURN(int64_t stale, internal::StaleGlobalStep(values, *this));
  // B104.
  if (m.timer.should_trigger_for_step(stale + m.options.steps_per_run)) {
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, internal::RealGlobalStep(ctx.session(), *this));
    if (m.timer.should_trigger_for_step(step)) {
      m.timer.update_last_triggered_step(step);
      FOREMAN_RETURN_IF_ERROR(m.Save(ctx.session(), step, &stop));
    }
  }
  if (stop) ctx.request_stop();
  return absl::OkStatus();
}

Status CheckpointSaverHook::end(Session* session) {
  Impl& m = *impl_;
  bool stop = false;  // Too late to matter.
  FOREMAN_ASSIGN_OR_RETURN(int64_t last_step, internal::RealGlobalStep(session, *this));
  // B105: no second save of a step just saved. The final save (like any
  // other) first waits for the one in flight; then it is waited for.
  if (!m.timer.last_triggered_step().has_value() || last_step != *m.timer.last_triggered_step()) {
    m.timer.update_last_triggered_step(last_step);
    FOREMAN_RETURN_IF_ERROR(m.Save(session, last_step, &stop));
  }
  FOREMAN_RETURN_IF_ERROR(m.WaitAndFinish(session, &stop));
  // The final checkpoint lost with a restarted checkpoint_saver (restart
  // policy): no later save would replace it, so save it again on the new
  // incarnation. Bounded: each loss is a restart, and once the restart
  // intensity is exceeded the save fails with the escalated error.
  constexpr int kFinalSaveTries = 10;
  for (int tries = 1; m.last_lost_step == last_step && tries < kFinalSaveTries; ++tries) {
    FOREMAN_LOG_WARN("Saving the final checkpoint of step {} again: its save was lost with a restarted "
                     "checkpoint_saver",
                     last_step);
    m.last_lost_step = -1;
    FOREMAN_RETURN_IF_ERROR(m.Save(session, last_step, &stop));
    FOREMAN_RETURN_IF_ERROR(m.WaitAndFinish(session, &stop));
  }
  if (m.last_lost_step == last_step) {
    return absl::InternalError(absl::StrCat("CheckpointSaverHook: the final checkpoint of step ", last_step,
                                               " was lost ", kFinalSaveTries, " times"));
  }
  m.spare.clear();  // No save until the next session: give the copy back.
  for (const auto& listener : m.options.listeners) {
    FOREMAN_RETURN_IF_ERROR(
        InvokeUserCode("CheckpointSaverListener::end", [&] { return listener->end(session, last_step); }));
  }
  return absl::OkStatus();
}

Status CheckpointSaverHook::SaveNow(Session* session) {
  Impl& m = *impl_;
  if (m.service == nullptr) return absl::FailedPreconditionError("CheckpointSaverHook: begin() was not called");
  bool stop = false;  // a listener's stop: the session is being recovered anyway
  FOREMAN_ASSIGN_OR_RETURN(int64_t step, internal::RealGlobalStep(session, *this));
  if (!m.timer.last_triggered_step().has_value() || step != *m.timer.last_triggered_step()) {
    m.timer.update_last_triggered_step(step);
    FOREMAN_RETURN_IF_ERROR(m.Save(session, step, &stop));
  }
  return m.WaitAndFinish(session, &stop);
}

std::vector<int64_t> CheckpointSaverHook::saved_steps() const {
  MutexLock l(impl_->mu);
  return impl_->saved_steps;
}

int64_t CheckpointSaverHook::waited_saves() const {
  MutexLock l(impl_->mu);
  return impl_->waited_saves;
}

// -- StepCounterHook --------------------------------------------------------------------

namespace {
// B110: "<global step op name>/sec".
constexpr char kStepsPerSecTag[] = "global_step/sec";
// B111: TF's logging.log_first_n(..., 5, ...).
constexpr int kStaleStepWarnings = 5;
}  // namespace

struct StepCounterHook::Impl {
  Impl(StepCounterHook::Options o, SecondOrStepTimer t) : options(std::move(o)), timer(std::move(t)) {}
  StepCounterHook::Options options;
  SecondOrStepTimer timer;
  int64_t steps_per_run = 1;
  internal::Services* services = nullptr;
  std::shared_ptr<internal::StepCounterService> counter;
  std::optional<int64_t> last_global_step;  // the previous run's stale step
  int warnings = 0;
};

StatusOr<std::shared_ptr<StepCounterHook>> StepCounterHook::Create(const Options& options_in) {
  Options options = options_in;
  // B109, TF's message.
  if (options.every_n_steps.has_value() == options.every_n_secs.has_value()) {
    return absl::InvalidArgumentError("exactly one of every_n_steps and every_n_secs should be provided.");
  }
  FOREMAN_ASSIGN_OR_RETURN(SecondOrStepTimer timer, SecondOrStepTimer::Create(options.every_n_secs,
                                                                              options.every_n_steps, options.clock));
  return std::shared_ptr<StepCounterHook>(
      new StepCounterHook(std::make_unique<Impl>(std::move(options), std::move(timer))));
}

StepCounterHook::StepCounterHook(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StepCounterHook::~StepCounterHook() = default;

void StepCounterHook::AttachServices(internal::Services* services) { impl_->services = services; }

Status StepCounterHook::begin() {
  Impl& m = *impl_;
  if (m.services == nullptr) return NoServices(name());
  FOREMAN_ASSIGN_OR_RETURN(m.counter, m.services->StepCounter(m.options.output_dir, kStepsPerSecTag));
  return absl::OkStatus();
}

Status StepCounterHook::after_create_session(Session* session, Coordinator* /*coord*/) {
  return internal::RequireGlobalStep(session, *this);
}

StatusOr<SessionRunArgs> StepCounterHook::before_run(SessionRunContext& ctx) {
  SessionRunArgs args;
  FOREMAN_RETURN_IF_ERROR(StepCounterHook::before_run_into(ctx, args));
  return args;
}

Status StepCounterHook::before_run_into(SessionRunContext& /*ctx*/, SessionRunArgs& args) {
  LeaveFetches(args);
  return absl::OkStatus();
}

Status StepCounterHook::after_run(SessionRunContext& ctx, const SessionRunValues& values) {
  Impl& m = *impl_;
  FOREMAN_ASSIGN_OR_RETURN(int64_t stale, internal::StaleGlobalStep(values, *this));
  if (m.timer.should_trigger_for_step(stale + m.steps_per_run)) {
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, internal::RealGlobalStep(ctx.session(), *this));
    if (m.timer.should_trigger_for_step(step)) {
      // B110: the first trigger only primes the timer.
      auto elapsed = m.timer.update_last_triggered_step(step);
      if (elapsed.has_value()) {
        const auto [elapsed_secs, elapsed_steps] = *elapsed;
        if (elapsed_secs > 0) {
          if (m.counter != nullptr) m.counter->Record(step, static_cast<double>(elapsed_steps) / elapsed_secs);
        } else {
          FOREMAN_LOG_DEBUG("StepCounterHook: no time elapsed over {} steps; no global_step/sec at step {}",
                            elapsed_steps, step);
        }
      }
    }
  }
  // B111: compares stale steps, not the timer's (TF's comment: the timer may
  // hold another value).
  if (m.last_global_step.has_value() && stale == *m.last_global_step && m.warnings < kStaleStepWarnings) {
    ++m.warnings;
    FOREMAN_LOG_WARN(
        "It seems that global step (tf.train.get_global_step) has not been increased. Current value (could be "
        "stable): {} vs previous value: {}. You could increase the global step by passing "
        "tf.train.get_global_step() to Optimizer.apply_gradients or Optimizer.minimize.",
        stale, *m.last_global_step);
  }
  m.last_global_step = stale;
  return absl::OkStatus();
}

// -- SummarySaverHook ---------------------------------------------------------------------

struct SummarySaverHook::Impl {
  Impl(SummarySaverHook::Options o, SecondOrStepTimer t) : options(std::move(o)), timer(std::move(t)) {}
  SummarySaverHook::Options options;
  SecondOrStepTimer timer;
  internal::Services* services = nullptr;
  std::shared_ptr<internal::SummaryWriterService> writer;  // null: no output_dir (B112)
  std::optional<int64_t> next_step;  // B113: the predicted next global step
  bool request_summary = false;
  int64_t sessions = 0;  // after_create_session calls since begin()
};

StatusOr<std::shared_ptr<SummarySaverHook>> SummarySaverHook::Create(const Options& options_in) {
  Options options = options_in;
  FOREMAN_ASSIGN_OR_RETURN(SecondOrStepTimer timer,
                           SecondOrStepTimer::Create(options.save_secs, options.save_steps, options.clock));
  for (const std::string& op : options.summary_op) {
    if (op.empty()) return absl::InvalidArgumentError("SummarySaverHook: a summary_op fetch name is empty");
  }
  if (options.flush_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("SummarySaverHook: flush_timeout must be > 0");
  }
  return std::shared_ptr<SummarySaverHook>(
      new SummarySaverHook(std::make_unique<Impl>(std::move(options), std::move(timer))));
}

SummarySaverHook::SummarySaverHook(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SummarySaverHook::~SummarySaverHook() = default;

void SummarySaverHook::AttachServices(internal::Services* services) { impl_->services = services; }

Status SummarySaverHook::begin() {
  Impl& m = *impl_;
  m.next_step.reset();
  m.sessions = 0;
  if (m.options.output_dir.empty()) return absl::OkStatus();  // B112: no writer, nothing to do.
  if (m.services == nullptr) return NoServices(name());
  FOREMAN_ASSIGN_OR_RETURN(m.writer, m.services->SummaryWriter(m.options.output_dir));
  return absl::OkStatus();
}

Status SummarySaverHook::after_create_session(Session* session, Coordinator* /*coord*/) {
  // A recovery's restored session: start over (a START at its first run).
  if (++impl_->sessions > 1) impl_->next_step.reset();
  return internal::RequireGlobalStep(session, *this);
}

StatusOr<SessionRunArgs> SummarySaverHook::before_run(SessionRunContext& ctx) {
  SessionRunArgs args;
  FOREMAN_RETURN_IF_ERROR(SummarySaverHook::before_run_into(ctx, args));
  return args;
}

Status SummarySaverHook::before_run_into(SessionRunContext& /*ctx*/, SessionRunArgs& args) {
  Impl& m = *impl_;
  if (m.writer == nullptr) {  // B112 (TF would still fetch the summary)
    args = SessionRunArgs{};
    return absl::OkStatus();
  }
  // B113.
  m.request_summary = !m.next_step.has_value() || m.timer.should_trigger_for_step(*m.next_step);
  LeaveFetches(args, m.request_summary ? &m.options.summary_op : nullptr);
  return absl::OkStatus();
}

Status SummarySaverHook::after_run(SessionRunContext& ctx, const SessionRunValues& values) {
  Impl& m = *impl_;
  if (m.writer == nullptr) return absl::OkStatus();  // B112
  FOREMAN_ASSIGN_OR_RETURN(int64_t stale, internal::StaleGlobalStep(values, *this));
  int64_t global_step = stale + 1;
  if (!m.next_step.has_value() || m.request_summary) {
    FOREMAN_ASSIGN_OR_RETURN(global_step, internal::RealGlobalStep(ctx.session(), *this));
  }
  // B114: START at the post-run real step after the first run.
  if (!m.next_step.has_value()) m.writer->AddSessionLog(SessionLogStatus::kStart, global_step);
  if (m.request_summary) {
    m.timer.update_last_triggered_step(global_step);
    if (!m.options.summary_op.empty()) {
      std::vector<std::string> summaries;
      for (const std::string& op : m.options.summary_op) {
        auto it = values.results->find(op);
        if (it == values.results->end()) {
          return absl::InternalError(absl::StrCat("SummarySaverHook: no result for summary_op '", op, "'"));
        }
        StatusOr<std::string> serialized = it->second.scalar<std::string>();
        if (!serialized.ok()) {
          return Annotate(serialized.status(),
                          absl::StrCat("SummarySaverHook: summary_op '", op, "' must be a serialized Summary"));
        }
        summaries.push_back(*std::move(serialized));
      }
      // B115: at the post-run real step.
      m.writer->AddSummary(summaries.size() == 1 ? std::move(summaries[0]) : MergeSummaries(summaries),
                           global_step);
    }
  }
  m.next_step = global_step + 1;
  return absl::OkStatus();
}

Status SummarySaverHook::end(Session* /*session*/) {
  Impl& m = *impl_;
  if (m.writer == nullptr) return absl::OkStatus();
  return m.writer->Flush(m.options.flush_timeout);  // B116
}

}  // namespace foreman
