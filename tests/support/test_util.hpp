// Helpers shared by the doctest binaries.
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <doctest/doctest.h>

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

}  // namespace foreman::testing
