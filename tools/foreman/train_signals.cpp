// `foreman train`'s signals (train_signals.hpp).
#include "train_signals.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <utility>

#include "command.hpp"

namespace foreman::cli {
namespace {

sigset_t WatchedSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGUSR1);  // wakes the watcher (the destructor)
  return set;
}

}  // namespace

const char* SignalName(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

// -- RunPhase -------------------------------------------------------------------------

void RunPhase::SetDir(const std::string& dir) {
  MutexLock lock(mu_);
  dir_ = dir;
}

std::string RunPhase::dir() {
  MutexLock lock(mu_);
  return dir_;
}

void RunPhase::SetRunDirectory(std::shared_ptr<RunDirectory> run) {
  MutexLock lock(mu_);
  run_ = std::move(run);
}

bool RunPhase::StartTraining(const StopRequest& stop) {
  MutexLock lock(mu_);
  if (stop.stop_requested()) return false;
  if (run_ != nullptr && !run_->Commit()) return false;  // undone: a signal came first
  training_ = true;
  return true;
}

bool RunPhase::training() {
  MutexLock lock(mu_);
  return training_;
}

void RunPhase::SetTrainingRole(TrainingRole role, std::string who) {
  MutexLock lock(mu_);
  role_ = role;
  who_ = std::move(who);
}

void RunPhase::ServeAsPs(std::string who) {
  MutexLock lock(mu_);
  ps_task_ = std::move(who);
}

std::string RunPhase::ps_task() {
  MutexLock lock(mu_);
  return ps_task_;
}

void RunPhase::Undo() {
  MutexLock lock(mu_);
  if (training_ || run_ == nullptr) return;
  run_->Undo();
}

// -- SignalWatcher ----------------------------------------------------------------------

void SignalWatcher::BlockSignals() {
  sigset_t set = WatchedSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

SignalWatcher::SignalWatcher(std::shared_ptr<StopRequest> stop, std::shared_ptr<RunPhase> phase)
    : stop_(std::move(stop)), phase_(std::move(phase)) {
  thread_ = std::thread([this] { Watch(); });
}

SignalWatcher::~SignalWatcher() {
  done_.store(true);
  pthread_kill(thread_.native_handle(), SIGUSR1);
  thread_.join();
}

void SignalWatcher::Watch() {
  const sigset_t set = WatchedSignals();
  int sig = 0;
  bool first = true;
  while (!done_.load()) {
    if (sigwait(&set, &sig) != 0 || done_.load()) return;
    if (sig == SIGUSR1) continue;
    if (first) {
      first = false;
      signal_.store(sig);
      if (const std::string ps = phase_->ps_task(); !ps.empty()) {
        std::fprintf(stderr,
                     "\nforeman train: %s received: %s refuses updates from now on (stopping, evicted), lets the "
                     "chief take a checkpoint of it (at most --ps-eviction-grace-secs; no wait when no chief is "
                     "applying) and exits 75; started again, the chief restores it from that checkpoint and the "
                     "workers wait for it until then (a second signal exits at once)\n",
                     SignalName(sig), ps.c_str());
        std::fflush(stderr);
        stop_->request_stop();
        continue;
      }
      phase_->WithPhase([&](bool training, RunPhase::TrainingRole role, const std::string& who) {
        using Role = RunPhase::TrainingRole;
        if (training && role == Role::kWorker) {
          std::fprintf(stderr,
                       "\nforeman train: %s received: %s stops at the next step boundary; it writes no checkpoint "
                       "(the chief does) and the others train on; exits %d, not finished (a second signal exits "
                       "at once)\n",
                       SignalName(sig), who.c_str(), kExitStopped);
        } else if (training && role == Role::kChief) {
          std::fprintf(stderr,
                       "\nforeman train: %s received: the chief stops at the next step boundary and saves a final "
                       "checkpoint; training goes on on the ps tasks (a chief started again re-attaches; "
                       "--signal-ends-training would end it); exits %d, not finished (a second signal exits at "
                       "once)\n",
                       SignalName(sig), kExitStopped);
        } else if (training && role == Role::kChiefEndsTraining) {
          std::fprintf(stderr,
                       "\nforeman train: %s received: the chief stops at the next step boundary, ends training on "
                       "the ps tasks (--signal-ends-training) and saves a final checkpoint (a second signal exits "
                       "at once)\n",
                       SignalName(sig));
        } else if (training) {
          std::fprintf(stderr,
                       "\nforeman train: %s received: stopping at the next step boundary and saving a final "
                       "checkpoint (a second signal exits at once)\n",
                       SignalName(sig));
        } else {
          // No session yet: there is no checkpoint to save.
          std::fprintf(stderr,
                       "\nforeman train: %s received before training started: stopping without training "
                       "(a second signal exits at once)\n",
                       SignalName(sig));
        }
        std::fflush(stderr);
        stop_->request_stop();
      });
      continue;
    }
    if (!phase_->training()) phase_->Undo();  // the main thread holds the lock
    std::fprintf(stderr, "foreman train: second signal (%s): exiting now, %s\n", SignalName(sig),
                 !phase_->ps_task().empty() ? "a ps task"
                 : !phase_->training()      ? "before training started"
                 : stop_->completed() ? "after the final checkpoint"
                                      : "without a final checkpoint");
    std::fflush(stderr);
    _exit(kExitSecondSignal);
  }
}

// -- the grace period ---------------------------------------------------------------------

void GraceExpired(absl::Duration grace, RunPhase& phase) {
  if (!phase.training()) {
    phase.Undo();  // the main thread holds the lock
    std::fprintf(stderr,
                 "foreman train: training had not started within --stop-grace-period-secs=%g of the signal "
                 "(still loading the data or building the model); exiting without training, nothing written to "
                 "%s\n",
                 absl::ToDoubleSeconds(grace), phase.dir().c_str());
    std::fflush(stderr);
    _exit(kExitFailed);
  }
  std::fprintf(stderr,
               "foreman train: the final checkpoint was not saved within --stop-grace-period-secs=%g; "
               "exiting (the checkpoints saved before are intact)\n",
               absl::ToDoubleSeconds(grace));
  std::fflush(stderr);
  _exit(kExitFailed);
}

}  // namespace foreman::cli
