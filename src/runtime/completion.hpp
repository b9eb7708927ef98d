// Completion: a one-shot answer from an actor to a plain thread, without
// CAF, so that CAF-free code (services.hpp's seams, the hooks) can wait on an
// actor's answer. Internal: actors/ complete it, plain threads wait on it.
#pragma once

#include <condition_variable>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "foreman/mutex.hpp"
#include "foreman/status.hpp"

namespace foreman::internal {

/// A one-shot answer from an actor to a plain thread: the actor calls
/// Complete(), the thread Wait()s with a real-time timeout. The first
/// Complete() wins (a ChildLink also completes it with an error when the
/// actor dies first).
class Completion {
 public:
  void Complete(Status s) {
    {
      MutexLock l(mu_);
      if (done_) return;
      done_ = true;
      status_ = std::move(s);
    }
    cv_.notify_all();
  }
  bool IsDone() {
    MutexLock l(mu_);
    return done_;
  }
  /// The completed status; DEADLINE_EXCEEDED "<what> did not complete within
  /// <timeout>" when `timeout` (real time) passes first.
  Status Wait(absl::Duration timeout, const std::string& what) {
    MutexLock lock(mu_);
    const bool done = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                                   [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; });
    if (!done) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not complete within ", absl::FormatDuration(timeout)));
    }
    return status_;
  }

 private:
  Mutex mu_;
  std::condition_variable_any cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace foreman::internal
