// CapturedLog: what Foreman logs while it lives, for tests that check a
// warning or error was written (white-box: uses src/log.hpp).
#pragma once

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include <spdlog/sinks/ostream_sink.h>

#include "log.hpp"

namespace foreman::testing {

class CapturedLog {
 public:
  CapturedLog() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    internal::Logger().sinks().push_back(sink_);
  }
  ~CapturedLog() {
    auto& sinks = internal::Logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::sink> sink_;
};

}  // namespace foreman::testing
