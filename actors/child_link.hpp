// ChildLink: a plain thread's handle on one actor of the supervision tree
// (a service facade's, the Runtime's), which survives the actor's restarts.
// Internal to actors/ (the only translation units that include CAF,
// design.md §1).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "atoms.hpp"
#include "foreman/mutex.hpp"
#include "foreman/status.hpp"
#include "runtime/services.hpp"
#include "status_error.hpp"

namespace foreman::internal {

/// A plain thread's handle on one actor of the tree (a service facade's, the
/// Runtime's): the service's stable address. Callers (hooks, through their
/// service objects) hold the link, never the actor, so when a supervisor
/// replaces the actor with a new incarnation (Rebind) they reach the new one
/// without noticing. Runtime::Shutdown() detaches every link, so that no handle
/// outlives the actor system (caf-0.17.md §8: a leaked handle hangs
/// ~actor_system) even when a hook keeps its service object longer. When
/// the actor exits, every tracked Completion and SaveTicket still open is
/// completed with UNAVAILABLE naming the actor, so no caller waits for an
/// answer that cannot come.
class ChildLink {
 public:
  /// `restartable`: the session's restart policy may bring the service back
  /// after it exits (its kind is not temporary and max_restarts > 0); then a
  /// request sent while it is down is parked for the next incarnation
  /// (SendTracked) and tickets lost with an incarnation are marked so
  /// (SaveTicket::lost), their steps kept for the restart record
  /// (TakeLostSaves).
  explicit ChildLink(std::string name, bool restartable = false)
      : name_(std::move(name)), restartable_(restartable) {}
  ChildLink(const ChildLink&) = delete;
  ChildLink& operator=(const ChildLink&) = delete;

  const std::string& name() const { return name_; }

  /// Holds `actor` and watches its exit. Call once; Rebind() for a restart.
  static void Attach(const std::shared_ptr<ChildLink>& link, caf::actor actor) { Bind(link, std::move(actor)); }

  /// Points the link at `actor`, a new incarnation of the same service (a
  /// restart): later Send()s reach it, and the old incarnation's exit, even
  /// one reported late, no longer counts. Requests tracked before were
  /// completed (UNAVAILABLE) when the old one exited. No-op after Detach().
  /// Requests parked while the service was down (SendTracked) are sent to
  /// `actor` now, before any later Send().
  static void Rebind(const std::shared_ptr<ChildLink>& link, caf::actor actor) {
    {
      MutexLock l(link->mu_);
      if (link->detached_) return;
    }
    Bind(link, std::move(actor));
  }

  /// Sends `xs` to the actor, fire-and-forget; false when it is gone or the
  /// link was detached.
  template <class... Ts>
  bool Send(Ts&&... xs) {
    MutexLock l(mu_);
    if (!alive_ || !handle_) return false;
    caf::anon_send(handle_, std::forward<Ts>(xs)...);
    return true;
  }

  /// Asks the actor to quit with `reason`; false when it is gone.
  bool SendExit(caf::exit_reason reason) {
    MutexLock l(mu_);
    if (!alive_ || !handle_) return false;
    caf::anon_send_exit(handle_, reason);
    return true;
  }

  /// Completes `c` (UNAVAILABLE) if the actor exits before answering; when it
  /// is gone already, completes it now and returns false.
  bool Track(const std::shared_ptr<Completion>& c) {
    MutexLock l(mu_);
    if (!alive_ || !handle_) {
      c->Complete(GoneLocked());
      return false;
    }
    Prune();
    completions_.push_back(c);
    return true;
  }
  bool Track(const std::shared_ptr<SaveTicket>& t) {
    MutexLock l(mu_);
    if (!alive_ || !handle_) {
      t->Complete(GoneLocked(), "", absl::ZeroDuration());
      return false;
    }
    Prune();
    tickets_.push_back(t);
    return true;
  }

  /// Tracks `t` and sends `xs` (a request that `t` answers). While the
  /// service is down and may still be restarted (restartable, neither
  /// removed, escalated nor detached), the request is parked instead: the
  /// next incarnation gets it once bound (Rebind), in the order parked;
  /// MarkRemoved completes `t` with FAILED_PRECONDITION naming the service
  /// (not a preemption code: nothing will take the request, so a
  /// MonitoredSession must not try to recover), Detach with UNAVAILABLE,
  /// MarkFailed with the escalated error's code. No wait here: the caller's bounded wait on `t` is the
  /// bound (the supervisor's back-off is at most kMaxRestartBackoff). When
  /// the service is gone for good, `t` is completed at once. Never blocks.
  template <class... Ts>
  void SendTracked(const std::shared_ptr<SaveTicket>& t, Ts... xs) {
    MutexLock l(mu_);
    auto send = [t, xs...](const caf::actor& actor) { caf::anon_send(actor, xs...); };
    if (alive_ && handle_) {
      Prune();
      tickets_.push_back(t);
      send(handle_);
      return;
    }
    if (ParkableLocked()) {
      parked_.push_back(Parked{t, std::move(send)});
      return;
    }
    // Removed (temporary, or transient after a normal exit) or escalated:
    // FAILED_PRECONDITION (or the escalated error's code) naming the
    // service, with the exit's payloads (the kill's fault id).
    t->Complete(removed_ || (restartable_ && failed_) ? ParkedGoneLocked() : GoneLocked(), "",
                absl::ZeroDuration());
  }

  /// Waits (real time, at most `timeout`) until the supervisor has decided
  /// about the incarnation `incarnation` (incarnation() when the caller saw
  /// it fail): kRestarted once a later incarnation is bound; kGone when the
  /// service was removed, escalated or detached; kPending on timeout.
  enum class Fate { kRestarted, kGone, kPending };
  Fate WaitDecided(int incarnation, absl::Duration timeout) {
    MutexLock lock(mu_);
    auto decided = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return (incarnation_ > incarnation && alive_) || removed_ || failed_ || detached_;
    };
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), decided);
    if (incarnation_ > incarnation && alive_) return Fate::kRestarted;
    if (removed_ || failed_ || detached_) return Fate::kGone;
    return Fate::kPending;
  }

  /// The supervisor will not restart the service (the restart intensity was
  /// exceeded, a restart failed, the tree shuts down): parked requests, and
  /// later ones, fail with `why`'s code naming the service and `why`.
  void MarkFailed(const Status& why) {
    std::vector<Parked> parked;
    {
      MutexLock l(mu_);
      if (failed_) return;
      failed_ = true;
      failed_why_ = why;
      parked.swap(parked_);
    }
    cv_.notify_all();
    FailParked(parked);
  }

  /// The steps of the save tickets lost with incarnations since the last
  /// call (restartable links only; for the supervisor's restart record).
  std::vector<int64_t> TakeLostSaves() {
    MutexLock l(mu_);
    return std::exchange(lost_saves_, {});
  }
  bool restartable() const { return restartable_; }

  /// A copy of the handle (for a sibling's spawn arguments); null when gone.
  caf::actor handle() {
    MutexLock l(mu_);
    return alive_ ? handle_ : caf::actor{};
  }
  /// Drops the handle for good; later Send()s return false.
  void Detach() { EndForGood(/*detach=*/true, absl::OkStatus()); }
  /// The supervisor's restart policy removed the service for good
  /// (temporary, or transient after a normal exit): the run goes on without
  /// it. Its handle then drops requests instead of failing them (summary
  /// writer, step counter); a save still fails (FAILED_PRECONDITION, with
  /// the payloads of `why`, the exit reason: OK for a normal exit, then
  /// those of the kill NoteKill() recorded), parked ones too.
  void MarkRemoved(const Status& why = absl::OkStatus()) { EndForGood(/*detach=*/false, why); }
  bool removed() {
    MutexLock l(mu_);
    return removed_;
  }
  /// Its owner stops the service for good (an input pipeline destroyed
  /// while the session runs): call before asking it to quit, so that the
  /// supervisor forgets its exit (no failure, no restart) and restarts no
  /// pending incarnation.
  void Retire() {
    MutexLock l(mu_);
    retired_ = true;
  }
  bool retired() {
    MutexLock l(mu_);
    return retired_;
  }
  /// How many actors this link has been bound to (1 after Attach).
  int incarnation() {
    MutexLock l(mu_);
    return incarnation_;
  }
  bool alive() {
    MutexLock l(mu_);
    return alive_;
  }
  /// Waits (real time) until the actor has exited; false on timeout.
  bool WaitExited(absl::Duration timeout) {
    MutexLock lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !alive_; });
  }
  /// Why the actor exited (OK: a normal exit or still running).
  Status exit_status() {
    MutexLock l(mu_);
    return exit_status_;
  }
  /// An injected kill (its exit reason, carrying the fault id as payload)
  /// is being sent to the current incarnation: when that incarnation exits,
  /// even normally, the errors for requests it cannot take carry the
  /// payloads of `kill` (ExitCause), so a run that fails with them is
  /// known to be an injected fault's.
  void NoteKill(const Status& kill) {
    MutexLock l(mu_);
    kill_ = kill;
    kill_incarnation_ = incarnation_;
  }
  /// The status whose payloads explain the last exit: the exit reason when
  /// abnormal, else the kill noted for that incarnation, else OK.
  Status ExitCause() {
    MutexLock l(mu_);
    return CauseLocked();
  }
  /// What a request to the service fails with now that it is not running:
  /// its exit error; FAILED_PRECONDITION when it is gone for good (not
  /// restartable, removed, escalated); UNAVAILABLE between incarnations
  /// or after the session's services shut down. Carries ExitCause()'s
  /// payloads.
  Status NotRunning() {
    MutexLock l(mu_);
    return GoneLocked();
  }

 private:
  static void Bind(const std::shared_ptr<ChildLink>& link, caf::actor actor) {
    int incarnation = 0;
    // Requests the previous incarnation took and never answered: its exit
    // may not have been seen here yet (the supervisor's down_msg can come
    // first), and once rebound it is ignored, so they are completed now.
    std::vector<std::weak_ptr<Completion>> completions;
    std::vector<std::weak_ptr<SaveTicket>> tickets;
    const Status restarted = absl::UnavailableError(absl::StrCat(link->name(), " restarted"));
    {
      MutexLock l(link->mu_);
      completions.swap(link->completions_);
      tickets.swap(link->tickets_);
      link->handle_ = actor;
      link->alive_ = true;
      link->exit_status_ = absl::OkStatus();
      incarnation = ++link->incarnation_;
      link->NoteLostLocked(tickets);
      // Parked requests first, under the lock: no later Send() overtakes them.
      for (Parked& p : link->parked_) {
        link->tickets_.push_back(p.ticket);
        p.send(actor);
      }
      link->parked_.clear();
    }
    link->cv_.notify_all();
    for (auto& weak : completions) {
      if (auto c = weak.lock()) c->Complete(restarted);
    }
    for (auto& weak : tickets) {
      if (auto t = weak.lock()) t->Complete(restarted, "", absl::ZeroDuration(), {}, link->restartable_);
    }
    std::weak_ptr<ChildLink> weak = link;
    // Runs at once when the actor is already gone.
    actor->attach_functor([weak, incarnation](const caf::error& reason) {
      if (auto strong = weak.lock()) strong->OnExit(incarnation, reason);
    });
  }

  void OnExit(int incarnation, const caf::error& reason) {
    std::vector<std::weak_ptr<Completion>> completions;
    std::vector<std::weak_ptr<SaveTicket>> tickets;
    Status gone;
    {
      MutexLock l(mu_);
      if (incarnation != incarnation_) return;  // an earlier incarnation
      alive_ = false;
      handle_ = nullptr;
      if (reason != caf::exit_reason::user_shutdown) exit_status_ = ErrorToStatus(reason, name_);
      completions.swap(completions_);
      tickets.swap(tickets_);
      gone = GoneLocked();
      NoteLostLocked(tickets);
    }
    cv_.notify_all();
    for (auto& weak : completions) {
      if (auto c = weak.lock()) c->Complete(gone);
    }
    // Under a policy that may restart the service these saves are lost
    // with the incarnation, not the run's failure (SaveTicket::lost): if
    // the supervisor escalates instead, the run fails with its error.
    for (auto& weak : tickets) {
      if (auto t = weak.lock()) t->Complete(gone, "", absl::ZeroDuration(), {}, restartable_);
    }
  }
  Status CauseLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!removed_why_.ok()) return removed_why_;
    if (!failed_why_.ok()) return failed_why_;
    if (!exit_status_.ok()) return exit_status_;
    if (!alive_ && kill_incarnation_ == incarnation_) return kill_;
    return absl::OkStatus();
  }
  // `s` with CauseLocked()'s payloads.
  Status WithCauseLocked(Status s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return WithPayloadsOf(std::move(s), CauseLocked());
  }
  Status GoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!exit_status_.ok()) return Annotate(exit_status_, absl::StrCat(name_, " stopped"));
    if (removed_ || failed_) return ParkedGoneLocked();
    // Not restartable (TF's default, or temporary) and exited normally:
    // nothing will take a request again. Not UNAVAILABLE, a preemption code.
    if (!restartable_ && !detached_) {
      return WithCauseLocked(absl::FailedPreconditionError(absl::StrCat(name_, " is not running")));
    }
    return WithCauseLocked(absl::UnavailableError(absl::StrCat(name_, " is not running")));
  }
  // What a parked request fails with.
  Status ParkedGoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (removed_) {
      // Gone for good: FAILED_PRECONDITION, not UNAVAILABLE (a preemption
      // code would make a MonitoredSession recover, again and again, from a
      // save that cannot succeed; as an input pipeline's Next()).
      return WithCauseLocked(absl::FailedPreconditionError(absl::StrCat(
          name_, " is not running: removed by the session's restart policy after ",
          removed_why_.ok() ? std::string("a normal exit")
                            : removed_why_.ToString(absl::StatusToStringMode::kWithNoExtraData))));
    }
    if (failed_) {
      // The escalated error's code, not UNAVAILABLE: a preemption code would
      // make a MonitoredSession try to recover from a run that is failing.
      const absl::StatusCode code =
          failed_why_.ok() ? absl::StatusCode::kUnavailable : failed_why_.code();
      return WithCauseLocked(Status(code, absl::StrCat(name_, " is not running: not restarted (",
                                                       failed_why_.ToString(absl::StatusToStringMode::kWithNoExtraData), ")")));
    }
    return absl::UnavailableError(absl::StrCat(name_, " is not running: the session's services shut down"));
  }
  bool ParkableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return restartable_ && !removed_ && !failed_ && !detached_;
  }
  struct Parked {
    std::shared_ptr<SaveTicket> ticket;
    std::function<void(const caf::actor&)> send;
  };
  // Detach() (detach) or MarkRemoved(why): the service is gone for good;
  // waiters wake and the parked saves fail.
  void EndForGood(bool detach, const Status& why) {
    std::vector<Parked> parked;
    {
      MutexLock l(mu_);
      if (detach) {
        handle_ = nullptr;
        detached_ = true;
      } else {
        removed_ = true;
        removed_why_ = why;
      }
      parked.swap(parked_);
    }
    cv_.notify_all();
    FailParked(parked);
  }
  void FailParked(std::vector<Parked>& parked) {
    if (parked.empty()) return;
    Status gone;
    {
      MutexLock l(mu_);
      gone = ParkedGoneLocked();
    }
    for (Parked& p : parked) p.ticket->Complete(gone, "", absl::ZeroDuration());
  }
  void NoteLostLocked(const std::vector<std::weak_ptr<SaveTicket>>& tickets) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!restartable_) return;
    for (const auto& weak : tickets) {
      if (auto t = weak.lock(); t && !t->IsDone()) lost_saves_.push_back(t->step);
    }
  }
  void Prune() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto gone_c = [](const std::weak_ptr<Completion>& w) {
      auto c = w.lock();
      return !c || c->IsDone();
    };
    completions_.erase(std::remove_if(completions_.begin(), completions_.end(), gone_c), completions_.end());
    auto gone_t = [](const std::weak_ptr<SaveTicket>& w) {
      auto t = w.lock();
      return !t || t->IsDone();
    };
    tickets_.erase(std::remove_if(tickets_.begin(), tickets_.end(), gone_t), tickets_.end());
  }

  const std::string name_;
  Mutex mu_;
  std::condition_variable_any cv_;
  caf::actor handle_ ABSL_GUARDED_BY(mu_);
  bool alive_ ABSL_GUARDED_BY(mu_) = true;
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
  bool removed_ ABSL_GUARDED_BY(mu_) = false;
  bool retired_ ABSL_GUARDED_BY(mu_) = false;
  const bool restartable_ = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  Status failed_why_ ABSL_GUARDED_BY(mu_);
  Status removed_why_ ABSL_GUARDED_BY(mu_);
  Status kill_ ABSL_GUARDED_BY(mu_);
  int kill_incarnation_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<Parked> parked_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> lost_saves_ ABSL_GUARDED_BY(mu_);
  int incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  Status exit_status_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<Completion>> completions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<SaveTicket>> tickets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace foreman::internal
