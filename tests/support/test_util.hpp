// Helpers shared by the doctest binaries.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include <doctest/doctest.h>

#include "absl/time/time.h"
#include "foreman/clock.hpp"
#include "foreman/mutex.hpp"

namespace foreman::testing {

/// A fresh directory under $TEST_TMPDIR (meson sets it per build) or /tmp,
/// removed with its contents on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "foreman_test") {
    const char* env = std::getenv("TEST_TMPDIR");
    const std::string base = env != nullptr && *env != '\0' ? env : "/tmp";
    std::error_code ec;
    std::filesystem::create_directories(base, ec);
    std::string pattern = base + "/" + prefix + ".XXXXXX";
    REQUIRE_MESSAGE(::mkdtemp(pattern.data()) != nullptr, "mkdtemp under ", base);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  /// "<path>/<name>"
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif
#else
inline constexpr bool kAsan = false;
#endif

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kTsan = true;
#else
inline constexpr bool kTsan = false;
#endif
#else
inline constexpr bool kTsan = false;
#endif

/// A sanitizer build: timing-based tests widen their intervals (every thread
/// runs several times slower and is descheduled for longer).
inline constexpr bool kSanitized = kAsan || kTsan;

/// Whether a 16 TiB allocation fails here, as tests of RESOURCE_EXHAUSTED
/// need: under ASan (over its allocation limit; the binary's
/// __asan_default_options sets allocator_may_return_null) and wherever the
/// kernel does not overcommit blindly (vm.overcommit_memory != 1).
inline bool HugeAllocationsFail() {
  if (kAsan) return true;
  std::ifstream f("/proc/sys/vm/overcommit_memory");
  int mode = 0;
  return !(f >> mode) || mode != 1;
}

/// Bound on every real-time wait for another thread; generous, since it is
/// only reached when a test fails.
inline constexpr absl::Duration kRealTimeout = absl::Seconds(10);

/// Runs `fn` on a new thread; joins it on destruction. When `fn` sleeps in
/// `clock`, the destructor first moves the clock on until `fn` returns, so a
/// failed check does not leave the test hanging.
class Background {
 public:
  explicit Background(std::function<void()> fn, ManualClock* clock = nullptr)
      : clock_(clock), thread_([this, fn = std::move(fn)] {
          fn();
          MutexLock l(mu_);
          done_ = true;
          cv_.notify_all();
        }) {}
  ~Background() {
    for (int i = 0; clock_ != nullptr && i < 100000 && !WaitDone(absl::Milliseconds(1)); ++i) {
      clock_->Advance(absl::Hours(1));
    }
    thread_.join();
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  /// Whether `fn` has returned, waiting for it at most `timeout` (real time).
  bool WaitDone(absl::Duration timeout = kRealTimeout) {
    MutexLock l(mu_);
    return cv_.wait_for(l, absl::ToChronoMilliseconds(timeout),
                        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; });
  }
  /// Whether `fn` has returned, without waiting.
  bool Done() const {
    MutexLock l(mu_);
    return done_;
  }

 private:
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  ManualClock* const clock_;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace foreman::testing
