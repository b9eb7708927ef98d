// FaultInjectionHook: step faults (an injected Status, a NaN loss), hook
// faults (a callback that throws), process faults (a signal) and actor faults
// (a service actor killed, delayed or dropping work), fired at a global_step,
// a Clock time or with a keyed probability, and their record.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "foreman/fault.hpp"
#include "foreman/mutex.hpp"
#include "foreman/variable_store.hpp"
#include "fault/injected_fault.hpp"
#include "platform/log.hpp"
#include "runtime/services.hpp"

namespace foreman {

namespace {

constexpr const char* kActorServices[] = {"summary_writer", "checkpoint_saver", "step_counter", "input_pipeline"};

constexpr const char* kCallbacks[] = {"begin", "after_create_session", "before_run", "after_run", "end"};

bool KnownCallback(const std::string& c) {
  for (const char* k : kCallbacks) {
    if (c == k) return true;
  }
  return false;
}

// How long (real time) an actor kill waits for the supervisor to apply the
// policy before the run goes on (with a WARNING).
constexpr absl::Duration kKillAppliedTimeout = absl::Seconds(5);

// The longest ProcessFault::at_time: a later one is a mistake, not a plan.
constexpr absl::Duration kMaxProcessFaultTime = absl::Hours(24 * 30);

}  // namespace

std::string SignalName(int signal) {
  switch (signal) {
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    default: return absl::StrCat("signal ", signal);
  }
}

struct FaultInjectionHook::State {
  std::vector<StepFault> steps;
  std::vector<HookFault> hooks;
  std::vector<ProcessFault> processes;
  uint64_t seed = 0;
  FaultObserver on_fire;
  std::function<void(int)> raise_signal;
  Clock* clock = nullptr;
  bool timed = false;  // a process fault with at_time (needs the session's start time)
  // Training thread only: when the hook's first session of this process was
  // created (clock time); the process faults this process already fired.
  std::optional<absl::Duration> session_start;  // MonotonicNow()
  std::set<std::string> process_fired_here;
  std::vector<ActorFault> actors;
  // Training thread only (AttachServices, before_run): the actor faults'
  // seam and the services' Clock time they started at.
  internal::Services* services = nullptr;
  internal::ServiceFaults* service_faults = nullptr;
  Clock* service_clock = nullptr;
  absl::Duration services_start;
  bool needs_step = false;  // a step fault, or a before_run / after_run hook fault
  bool probabilistic = false;  // a step fault with a probability (its draws need the sessions' ranges)

  mutable Mutex mu;
  std::set<std::string> fired_ids ABSL_GUARDED_BY(mu);  // non-repeat faults that fired (here or before)
  std::vector<FiredFault> fired ABSL_GUARDED_BY(mu);

  // Training thread only: the global_step the current run started at.
  int64_t run_step = -1;

  // The global_steps each session of this hook ran (after_create_session
  // starts one): [first, last] run steps, in order; the last is the current
  // one. A step's attempt is 1 + the earlier sessions whose range holds it.
  struct Range {
    int64_t first = -1;
    int64_t last = -1;
  };
  std::vector<Range> sessions ABSL_GUARDED_BY(mu);

  // Notes that a run starts at `step` in the current session (the first run
  // without after_create_session, e.g. outside a MonitoredSession, opens one).
  void RunStarts(int64_t step) {
    MutexLock l(mu);
    if (sessions.empty()) sessions.emplace_back();
    Range& r = sessions.back();
    if (r.first < 0 || step < r.first) r.first = step;
    if (step > r.last) r.last = step;
  }

  // How many sessions of this hook, this one included, have run `step`.
  int64_t Attempt(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    int64_t attempt = 1;
    for (std::size_t i = 0; i + 1 < sessions.size(); ++i) {
      if (sessions[i].first >= 0 && sessions[i].first <= step && step <= sessions[i].last) ++attempt;
    }
    return attempt;
  }

  // Whether a fault triggers at `step`; records it (path "step", or
  // "hook:<callback>" when `callback` is not null) when it fires.
  bool Fire(const std::string& id, int64_t at_step, double probability, bool repeat, int64_t step,
            const char* callback) {
    bool hit = false;
    if (at_step >= 0) {
      hit = step == at_step;
    } else if (probability > 0) {
      MutexLock l(mu);
      hit = FaultDraw(seed, id, "step", EnvOp::kAny, StepDrawIndex(step, Attempt(step))) < probability;
    } else {
      hit = true;  // a hook fault with at_step -1: every call (once without repeat)
    }
    if (!hit) return false;
    return Record(id, repeat, callback == nullptr ? std::string("step") : absl::StrCat("hook:", callback), step);
  }

  // Records a firing unless a non-repeat fault fired before; true when it
  // fired. Outside mu the caller then Announce()s it.
  bool Record(const std::string& id, bool repeat, std::string path, int64_t step) {
    MutexLock l(mu);
    if (!repeat && fired_ids.count(id) != 0) return false;
    if (!repeat) fired_ids.insert(id);
    fired.push_back(FiredFault{id, std::move(path), EnvOp::kAny, step});
    return true;
  }

  // The WARNING and the observer of a firing, before it takes effect.
  void Announce(const std::string& id, const std::string& path, int64_t step, const std::string& what) {
    FOREMAN_LOG_WARN("injected fault {} fired at global_step {} ({})", id, step, what);
    if (on_fire) on_fire(FiredFault{id, path, EnvOp::kAny, step});
  }

  void MaybeThrow(const char* callback, int64_t step) {
    for (const HookFault& f : hooks) {
      if (f.callback != callback) continue;
      if (Fire(f.id, f.at_step, 0, f.repeat, step, callback)) {
        Announce(f.id, absl::StrCat("hook:", callback), step, absl::StrCat("hook ", callback, " throws"));
        // A StatusError (a std::runtime_error) keeps the injected-fault mark.
        throw StatusError(WithInjectedFault(
            absl::InternalError(absl::StrCat("injected hook fault ", f.id, " at global_step ", step)), f.id));
      }
    }
  }

  // Training thread: fires the process faults due at the run starting at
  // `step` (recorded and announced first, then the signal).
  void MaybeSignal(int64_t step) {
    for (const ProcessFault& f : processes) {
      if (process_fired_here.count(f.id) != 0) continue;  // once per process: the first signal ends it
      bool due = false;
      if (f.at_step >= 0) {
        due = step == f.at_step;
      } else if (session_start.has_value()) {
        due = clock->MonotonicNow() - *session_start >= f.at_time;
      }
      if (!due || !Record(f.id, f.repeat, "process", step)) continue;
      process_fired_here.insert(f.id);
      Announce(f.id, "process", step, absl::StrCat(SignalName(f.signal), " to this process"));
      if (raise_signal) {
        raise_signal(f.signal);
      } else {
        kill(getpid(), f.signal);
      }
    }
  }
};

int64_t FaultInjectionHook::StepDrawIndex(int64_t global_step, int64_t attempt) {
  return static_cast<int64_t>((static_cast<uint64_t>(global_step) << 20) + static_cast<uint64_t>(attempt));
}

StatusOr<std::shared_ptr<FaultInjectionHook>> FaultInjectionHook::Create(const Options& options) {
  auto state = std::make_shared<State>();
  std::set<std::string> ids;
  auto check_id = [&](const std::string& what, std::size_t i, const std::string& id) -> Status {
    if (id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("FaultInjectionHook: ", what, "[", i, "]: empty id"));
    }
    if (Status s = CheckFaultIdCharacters(id); !s.ok()) {
      return Annotate(s, absl::StrCat("FaultInjectionHook: ", what, "[", i, "]"));
    }
    if (!ids.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("FaultInjectionHook: ", what, "[", i, "] (\"", id, "\"): duplicate id"));
    }
    return absl::OkStatus();
  };
  for (std::size_t i = 0; i < options.steps.size(); ++i) {
    const StepFault& f = options.steps[i];
    FOREMAN_RETURN_IF_ERROR(check_id("steps", i, f.id));
    const std::string where = absl::StrCat("FaultInjectionHook: steps[", i, "] (\"", f.id, "\"): ");
    if (f.kind != StepFault::Kind::kStatus && f.kind != StepFault::Kind::kNanLoss) {
      return absl::InvalidArgumentError(absl::StrCat(where, "kind out of range"));
    }
    if (f.kind == StepFault::Kind::kStatus && f.code == absl::StatusCode::kOk) {
      return absl::InvalidArgumentError(absl::StrCat(where, "code must not be OK"));
    }
    if (f.kind == StepFault::Kind::kNanLoss && f.loss_tensor.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "empty loss_tensor"));
    }
    if (f.at_step < -1) return absl::InvalidArgumentError(absl::StrCat(where, "at_step must be >= -1"));
    if (!(f.probability >= 0 && f.probability <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "probability must be in [0, 1]"));
    }
    state->needs_step = true;
    if (f.at_step < 0 && f.probability > 0) state->probabilistic = true;
  }
  for (std::size_t i = 0; i < options.hooks.size(); ++i) {
    const HookFault& f = options.hooks[i];
    FOREMAN_RETURN_IF_ERROR(check_id("hooks", i, f.id));
    const std::string where = absl::StrCat("FaultInjectionHook: hooks[", i, "] (\"", f.id, "\"): ");
    if (!KnownCallback(f.callback)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "callback must be begin, after_create_session, before_run, after_run or end, got \"", f.callback,
          "\""));
    }
    if (f.at_step < -1) return absl::InvalidArgumentError(absl::StrCat(where, "at_step must be >= -1"));
    if (f.callback == "begin" && f.at_step != -1) {
      return absl::InvalidArgumentError(absl::StrCat(where, "at_step must be -1 for begin (no session yet)"));
    }
    if (f.callback == "before_run" || f.callback == "after_run") state->needs_step = true;
  }
  for (std::size_t i = 0; i < options.processes.size(); ++i) {
    const ProcessFault& f = options.processes[i];
    FOREMAN_RETURN_IF_ERROR(check_id("processes", i, f.id));
    const std::string where = absl::StrCat("FaultInjectionHook: processes[", i, "] (\"", f.id, "\"): ");
    if (f.signal != SIGKILL && f.signal != SIGTERM) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "signal must be SIGKILL or SIGTERM, got ", SignalName(f.signal)));
    }
    const bool by_time = f.at_time != absl::InfiniteDuration();
    if (f.at_step < -1) return absl::InvalidArgumentError(absl::StrCat(where, "at_step must be >= -1"));
    if ((f.at_step >= 0) == by_time) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "needs exactly one of at_step >= 0 or at_time (the other -1 / InfiniteDuration)"));
    }
    if (by_time && (f.at_time < absl::ZeroDuration() || f.at_time > kMaxProcessFaultTime)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "at_time must be in [0, 30 days], got ", absl::FormatDuration(f.at_time)));
    }
    state->needs_step = true;
    if (by_time) state->timed = true;
  }
  for (std::size_t i = 0; i < options.actors.size(); ++i) {
    const ActorFault& f = options.actors[i];
    FOREMAN_RETURN_IF_ERROR(check_id("actors", i, f.id));
    const std::string where = absl::StrCat("FaultInjectionHook: actors[", i, "] (\"", f.id, "\"): ");
    bool known = false;
    for (const char* k : kActorServices) known = known || f.service == k;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "service must be summary_writer, checkpoint_saver, step_counter or input_pipeline, got \"", f.service, "\""));
    }
    const int kind = static_cast<int>(f.kind);
    if (kind < 0 || kind > static_cast<int>(ActorFault::Kind::kDrop)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "kind out of range"));
    }
    const bool has_step = f.at_step >= 0;
    const bool has_time = f.at_time >= absl::ZeroDuration() && f.at_time != absl::InfiniteDuration();
    if (f.at_step < -1) return absl::InvalidArgumentError(absl::StrCat(where, "at_step must be >= -1"));
    if (has_step == has_time) {
      return absl::InvalidArgumentError(absl::StrCat(where, "exactly one of at_step (>= 0) and at_time (>= 0) must be set"));
    }
    if (f.delay < absl::ZeroDuration()) return absl::InvalidArgumentError(absl::StrCat(where, "delay must be >= 0"));
    if (f.count < 1) return absl::InvalidArgumentError(absl::StrCat(where, "count must be >= 1, got ", f.count));
    state->needs_step = true;
  }
  state->actors = options.actors;
  state->steps = options.steps;
  state->hooks = options.hooks;
  state->processes = options.processes;
  state->seed = options.seed;
  state->on_fire = options.on_fire;
  state->raise_signal = options.raise_signal;
  state->clock = options.clock != nullptr ? options.clock : Clock::Real();
  return std::shared_ptr<FaultInjectionHook>(new FaultInjectionHook(std::move(state)));
}

FaultInjectionHook::FaultInjectionHook(std::shared_ptr<State> state) : state_(std::move(state)) {}
FaultInjectionHook::~FaultInjectionHook() = default;

Status FaultInjectionHook::begin() {
  state_->MaybeThrow("begin", -1);
  return absl::OkStatus();
}

Status FaultInjectionHook::after_create_session(Session* session, Coordinator* /*coord*/) {
  if (state_->probabilistic) {
    MutexLock l(state_->mu);
    state_->sessions.emplace_back();
  }
  if (state_->timed && !state_->session_start.has_value()) state_->session_start = state_->clock->MonotonicNow();
  int64_t step = -1;
  for (const HookFault& f : state_->hooks) {
    if (f.callback == "after_create_session") {
      FOREMAN_ASSIGN_OR_RETURN(step, session->GlobalStep());
      break;
    }
  }
  state_->MaybeThrow("after_create_session", step);
  return absl::OkStatus();
}

StatusOr<SessionRunArgs> FaultInjectionHook::before_run(SessionRunContext& ctx) {
  State& st = *state_;
  st.run_step = -1;
  if (!st.needs_step) return SessionRunArgs{};
  StatusOr<int64_t> step = ctx.session()->GlobalStep();
  if (!step.ok()) return Annotate(step.status(), "FaultInjectionHook needs the global_step");
  st.run_step = *step;
  if (st.probabilistic) st.RunStarts(st.run_step);
  if (!st.processes.empty()) st.MaybeSignal(st.run_step);
  for (const StepFault& f : st.steps) {
    if (f.kind != StepFault::Kind::kStatus || (f.at_step < 0 && f.probability <= 0)) continue;
    if (st.Fire(f.id, f.at_step, f.probability, f.repeat, st.run_step, nullptr)) {
      st.Announce(f.id, "step", st.run_step, absl::StrCat("step returns ", absl::StatusCodeToString(f.code)));
      return WithInjectedFault(Status(f.code, absl::StrCat("injected step fault ", f.id, " at global_step ",
                                                           st.run_step, f.message.empty() ? "" : ": ", f.message)),
                               f.id);
    }
  }
  FOREMAN_RETURN_IF_ERROR(FireActorFaults(st.run_step));
  st.MaybeThrow("before_run", st.run_step);
  return SessionRunArgs{};
}

void FaultInjectionHook::AttachServices(internal::Services* services) {
  State& st = *state_;
  st.services = services;
  st.service_faults = services == nullptr ? nullptr : services->service_faults();
  st.service_clock = services == nullptr ? nullptr : services->clock();
  if (st.service_clock != nullptr) st.services_start = st.service_clock->MonotonicNow();
}

Status FaultInjectionHook::FireActorFaults(int64_t step) {
  State& st = *state_;
  if (st.actors.empty()) return absl::OkStatus();
  const absl::Duration elapsed =
      st.service_clock == nullptr ? absl::ZeroDuration() : st.service_clock->MonotonicNow() - st.services_start;
  for (const ActorFault& f : st.actors) {
    const bool due = f.at_step >= 0 ? step == f.at_step : (st.service_clock != nullptr && elapsed >= f.at_time);
    if (!due) continue;
    const std::string path = absl::StrCat("actor:", f.service);
    if (!st.Record(f.id, f.repeat, path, step)) continue;
    const char* kind =
        f.kind == ActorFault::Kind::kKill ? "kill" : f.kind == ActorFault::Kind::kDelay ? "delay" : "drop";
    st.Announce(f.id, path, step, absl::StrCat(kind, " ", f.service));
    if (st.service_faults == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "injected actor fault ", f.id, ": this session gave the FaultInjectionHook no services (AttachServices)"));
    }
    int n = 0;
    if (f.kind == ActorFault::Kind::kKill) {
      // A kill is asynchronous: the service takes it after its queued work,
      // then the supervisor applies the policy. Wait (real time, bounded)
      // until it has -- the run's error set (TF's default: the coordinator
      // is stopped at the same moment, so the run ends after this step), the
      // service restarted or removed, a normal exit forgotten -- so that the
      // same plan ends the run at the same step in every replay.
      std::vector<std::shared_ptr<internal::Completion>> applied;
      n = st.service_faults->Kill(f.service, f.id, f.exit_normally, &applied);
      const absl::Time deadline = absl::Now() + kKillAppliedTimeout;
      for (const auto& done : applied) {
        const Status s = done->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()), "");
        if (!done->IsDone()) {
          FOREMAN_LOG_WARN("injected fault {}: the supervisor did not apply the policy to the kill of {} within {}; "
                           "the run goes on",
                           f.id, f.service, absl::FormatDuration(kKillAppliedTimeout));
        } else if (!s.ok()) {
          FOREMAN_LOG_WARN("injected fault {}: the kill of {}: {}; the run goes on", f.id, f.service, s.ToString());
        }
      }
    } else {
      n = st.service_faults->DelayOrDrop(f.service, f.id, f.kind == ActorFault::Kind::kDrop, f.count, f.delay);
    }
    if (n == 0) FOREMAN_LOG_WARN("injected fault {}: no {} service is running: nothing to {}", f.id, f.service, kind);
  }
  return absl::OkStatus();
}

Status FaultInjectionHook::after_run(SessionRunContext& /*ctx*/, const SessionRunValues& /*values*/) {
  state_->MaybeThrow("after_run", state_->run_step);
  return absl::OkStatus();
}

Status FaultInjectionHook::end(Session* session) {
  int64_t step = -1;
  for (const HookFault& f : state_->hooks) {
    if (f.callback == "end") {
      FOREMAN_ASSIGN_OR_RETURN(step, session->GlobalStep());
      break;
    }
  }
  state_->MaybeThrow("end", step);
  return absl::OkStatus();
}

StepFn FaultInjectionHook::WrapStep(StepFn step) const {
  std::shared_ptr<State> st = state_;
  return [st, step = std::move(step)](StepContext& ctx) -> Status {
    bool any = false;
    for (const StepFault& f : st->steps) any = any || f.kind == StepFault::Kind::kNanLoss;
    if (!any) return step(ctx);
    FOREMAN_ASSIGN_OR_RETURN(const int64_t global_step, GetGlobalStep(ctx.variables()));
    FOREMAN_RETURN_IF_ERROR(step(ctx));
    for (const StepFault& f : st->steps) {
      if (f.kind != StepFault::Kind::kNanLoss || !ctx.requested(f.loss_tensor)) continue;
      if (f.at_step < 0 && f.probability <= 0) continue;
      if (st->Fire(f.id, f.at_step, f.probability, f.repeat, global_step, nullptr)) {
        st->Announce(f.id, "step", global_step, absl::StrCat("NaN ", f.loss_tensor));
        ctx.Set(f.loss_tensor, Tensor::Scalar<float>(std::numeric_limits<float>::quiet_NaN()));
      }
    }
    return absl::OkStatus();
  };
}

std::vector<FiredFault> FaultInjectionHook::fired() const {
  MutexLock l(state_->mu);
  return state_->fired;
}

void FaultInjectionHook::MarkFired(const std::vector<FiredFault>& fired) {
  MutexLock l(state_->mu);
  for (const FiredFault& f : fired) state_->fired_ids.insert(f.id);
}

}  // namespace foreman
