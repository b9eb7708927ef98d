// Helpers shared by the doctest binaries.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include <doctest/doctest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

/// The one scale every timing-based test multiplies its real-time settings
/// and bounds by (README.md, "Tests on a busy machine"): 3 in a
/// sanitizer build (every thread several times slower), times
/// $FOREMAN_TEST_TIME_SCALE (a number >= 1, default 1) for a loaded
/// machine. tests/support/cluster_test_lib.sh computes the same for the
/// shell tests. A malformed $FOREMAN_TEST_TIME_SCALE ends the test binary
/// (exit 2, naming it): it may be read before any test case runs.
inline double TimeScale() {
  static const double scale = [] {
    double user = 1;
    if (const char* env = std::getenv("FOREMAN_TEST_TIME_SCALE"); env != nullptr && *env != '\0') {
      char* end = nullptr;
      user = std::strtod(env, &end);
      if (*end != '\0' || !(user >= 1 && user <= 100)) {
        std::fprintf(stderr, "FOREMAN_TEST_TIME_SCALE must be a number from 1 to 100, not '%s'\n", env);
        std::exit(2);
      }
    }
    return (kSanitized ? 3.0 : 1.0) * user;
  }();
  return scale;
}
/// `ms` times TimeScale(), rounded up: for a timeout or bound in milliseconds.
inline int64_t ScaledMs(int64_t ms) { return static_cast<int64_t>(std::ceil(static_cast<double>(ms) * TimeScale())); }
/// `d` times TimeScale().
inline absl::Duration Scaled(absl::Duration d) { return d * TimeScale(); }

/// The Status of a Status or a StatusOr<T>, for REQUIRE_OK / CHECK_OK.
inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

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

/// REQUIRE_OK(expr) / CHECK_OK(expr): `expr`, a Status or StatusOr<T>, is
/// OK; a failure prints the expression and the Status it gave (a bare
/// REQUIRE(x.ok()) prints only "false"). `expr` is evaluated once.
#define FOREMAN_STATUS_ASSERT_(ASSERT, expr)                                               \
  do {                                                                                     \
    const auto& foreman_checked_status_ = (expr);                                          \
    ASSERT(::foreman::testing::StatusOf(foreman_checked_status_).ok(), #expr " -> ",       \
           ::foreman::testing::StatusOf(foreman_checked_status_).ToString());              \
  } while (false)
#define REQUIRE_OK(expr) FOREMAN_STATUS_ASSERT_(REQUIRE_MESSAGE, expr)
#define CHECK_OK(expr) FOREMAN_STATUS_ASSERT_(CHECK_MESSAGE, expr)
