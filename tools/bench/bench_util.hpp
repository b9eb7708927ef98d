// Shared bits of the plain benchmark programs (tools/bench): a scratch
// directory, a monotonic stopwatch, the RESULT lines run.sh collects, and
// DieOn for a library error.
//
// Every figure is printed as one line
//   RESULT <name> median=<v> min=<v> max=<v> n=<runs> unit=<unit>
// so that run.sh (report.py) can build the table; other output is free text.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "foreman/status.hpp"

namespace foreman_bench {

/// Prints "<what>: <status>" on stderr and exits 1.
[[noreturn]] inline void DieOn(const std::string& what, const foreman::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

/// Seconds on the steady clock since an arbitrary origin.
inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Stats {
  double median = 0, min = 0, max = 0;
  std::size_t n = 0;
};

inline Stats Summarize(std::vector<double> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  const std::size_t mid = v.size() / 2;
  s.median = v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
  return s;
}

inline void PrintResult(const std::string& name, const std::vector<double>& values, const std::string& unit) {
  const Stats s = Summarize(values);
  std::printf("RESULT %s median=%.6g min=%.6g max=%.6g n=%zu unit=%s\n", name.c_str(), s.median, s.min, s.max, s.n,
              unit.c_str());
  std::fflush(stdout);
}

/// A fresh directory under `parent` (or $TMPDIR, /tmp), removed with its
/// contents on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& parent = "", const std::string& prefix = "foreman_bench") {
    std::string base = parent;
    if (base.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
    std::error_code ec;
    std::filesystem::create_directories(base, ec);
    std::string templ = base + "/" + prefix + ".XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) {
      std::fprintf(stderr, "cannot create a scratch directory under %s\n", base.c_str());
      std::exit(1);
    }
    path_ = buf.data();
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace foreman_bench
