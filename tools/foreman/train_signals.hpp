// `foreman train`'s signals: SIGINT, SIGTERM and SIGHUP are blocked in every
// thread and taken by one watcher thread with sigwait (so no
// async-signal-safety concerns). The first goes to the run's StopRequest,
// which the session obeys at the next step boundary (or, before the session
// exists, RunTrain sees at its next check); the StopRequest also enforces
// --stop-grace-period-secs (GraceExpired). A second signal exits at once
// (130). Before training starts, the run directory's Undo() removes what
// the refused start created.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "foreman/run_directory.hpp"
#include "foreman/stop.hpp"
#include "foreman/mutex.hpp"

namespace foreman::cli {

inline constexpr int kExitSecondSignal = 130;

/// "SIGINT", "SIGTERM", "SIGHUP", else "a signal".
const char* SignalName(int sig);

/// Where the job is (preparing, or training), for the messages after a
/// signal and after the grace period, and the run directory whose refused
/// start must be undone. Shared by the main thread, the signal watcher and
/// the StopRequest's watchdog; thread-safe.
class RunPhase {
 public:
  /// The directory the job writes (named in the grace period's message).
  void SetDir(const std::string& dir);
  std::string dir();
  /// The run directory, once it is open (its Undo() is what a refused start
  /// removes).
  void SetRunDirectory(std::shared_ptr<RunDirectory> run);

  /// The main thread, once nothing can refuse the start any more: true when
  /// training starts (the run directory is committed); false when a signal
  /// came first (the job then ends). Under the same mutex as the signal's
  /// message, so that the message says what the job will do.
  bool StartTraining(const StopRequest& stop);
  bool training();

  /// Runs `f(training, role, who)` under the mutex (the first signal's message and stop).
  template <class F>
  void WithPhase(F&& f) {
    MutexLock lock(mu_);
    f(training_, role_, who_);
  }

  /// A training task of a cluster: what a signal does to it (its message).
  enum class TrainingRole {
    kSingleProcess,     // the final checkpoint, exit 0
    kChief,             // the final checkpoint, training goes on, exit 75
    kChiefEndsTraining, // --signal-ends-training: the final checkpoint ends training, exit 0
    kWorker,            // a non-chief worker ("worker 1"): no checkpoint, exit 75
  };
  void SetTrainingRole(TrainingRole role, std::string who);

  /// A ps task ("ps task 0") serves and never trains: a signal's message
  /// says what it does instead.
  void ServeAsPs(std::string who);
  std::string ps_task();

  /// The run directory's Undo(); nothing once training started. The caller
  /// holds the directory's lock (the main thread does until it returns).
  void Undo();

 private:
  Mutex mu_;
  std::string dir_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<RunDirectory> run_ ABSL_GUARDED_BY(mu_);
  bool training_ ABSL_GUARDED_BY(mu_) = false;
  std::string ps_task_ ABSL_GUARDED_BY(mu_);  // ServeAsPs: "ps task K"
  TrainingRole role_ ABSL_GUARDED_BY(mu_) = TrainingRole::kSingleProcess;
  std::string who_ ABSL_GUARDED_BY(mu_);  // SetTrainingRole: "worker K"
};

/// The watcher thread (see the top of this file).
class SignalWatcher {
 public:
  /// Before any other thread exists, so that they all inherit the mask.
  static void BlockSignals();

  SignalWatcher(std::shared_ptr<StopRequest> stop, std::shared_ptr<RunPhase> phase);
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  bool signalled() const { return signal_.load() != 0; }
  int signal_number() const { return signal_.load(); }

 private:
  void Watch();

  const std::shared_ptr<StopRequest> stop_;
  const std::shared_ptr<RunPhase> phase_;
  std::atomic<bool> done_{false};
  std::atomic<int> signal_{0};
  std::thread thread_;
};

/// The run's stop grace period ran out before the final checkpoint was
/// saved (on the StopRequest's watchdog thread): a process cannot interrupt
/// a save stuck in the file system, so it exits 1; the checkpoints saved
/// before are intact (the commit protocol never leaves a half-written one
/// listed). Before training started (the data still loading, say) there is
/// no checkpoint: the job removes what it created and says so.
[[noreturn]] void GraceExpired(absl::Duration grace, RunPhase& phase);

}  // namespace foreman::cli
