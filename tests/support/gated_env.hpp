// GatedEnv: an EnvWrapper (foreman/env.hpp) that forwards to another Env,
// except that creating a writable file whose path contains a chosen
// substring can be held until the test releases it, fail with a chosen
// Status, or throw. For tests of
// asynchronous writers (checkpoint_saver, summary_writer): "the save is
// in flight" becomes a state the test controls instead of a race.
//
//   GatedEnv env(&mem_env);
//   env.Hold(".data-");                       // every bundle data file waits
//   ... start a save ...
//   REQUIRE(env.WaitUntilHeld(1, absl::Seconds(10)));
//   env.Release();
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "foreman/env.hpp"
#include "foreman/fault.hpp"
#include "foreman/mutex.hpp"

namespace foreman::testing {

class GatedEnv : public EnvWrapper {
 public:
  explicit GatedEnv(Env* base) : EnvWrapper(base) {}
  ~GatedEnv() override { Release(); }

  /// From now on, NewWritableFile of a path containing `substring` blocks
  /// until Release() (or 30 s of real time, so that a broken test fails
  /// instead of hanging).
  void Hold(std::string substring) {
    MutexLock l(mu_);
    hold_ = std::move(substring);
    released_ = false;
  }
  /// Lets every held and future call through.
  void Release() {
    {
      MutexLock l(mu_);
      released_ = true;
      hold_.clear();
    }
    cv_.notify_all();
  }
  /// Waits (real time) until `n` calls are held right now.
  bool WaitUntilHeld(int n, absl::Duration timeout) {
    MutexLock lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_ >= n; });
  }
  /// Calls held so far (in total).
  int times_held() {
    MutexLock l(mu_);
    return times_held_;
  }
  /// NewWritableFile of a path containing `substring` returns `status`.
  void Fail(std::string substring, Status status) {
    MutexLock l(mu_);
    fail_ = std::move(substring);
    fail_status_ = std::move(status);
  }
  /// NewWritableFile of a path containing `substring` throws std::runtime_error.
  void Throw(std::string substring) {
    MutexLock l(mu_);
    throw_ = std::move(substring);
  }

  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    {
      MutexLock lock(mu_);
      if (!throw_.empty() && path.find(throw_) != std::string::npos) {
        throw std::runtime_error("GatedEnv: injected exception creating " + path);
      }
      if (!fail_.empty() && path.find(fail_) != std::string::npos) return fail_status_;
      if (!hold_.empty() && path.find(hold_) != std::string::npos) {
        ++held_;
        ++times_held_;
        cv_.notify_all();
        cv_.wait_for(lock, std::chrono::seconds(30),
                     [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return released_; });
        --held_;
      }
    }
    return EnvWrapper::NewWritableFile(path);
  }

 private:
  Mutex mu_;
  std::condition_variable_any cv_;
  std::string hold_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
  int times_held_ ABSL_GUARDED_BY(mu_) = 0;
  std::string fail_ ABSL_GUARDED_BY(mu_);
  Status fail_status_ ABSL_GUARDED_BY(mu_);
  std::string throw_ ABSL_GUARDED_BY(mu_);
};

}  // namespace foreman::testing
