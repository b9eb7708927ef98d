// CapturedLog: what Foreman logs while it lives, for tests that check a
// warning or error was written (white-box: uses src/log.hpp).
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>

#include <spdlog/sinks/base_sink.h>

#include "platform/log.hpp"

namespace foreman::testing {

/// A sink whose text a test may read while other threads log: base_sink
/// writes under its mutex, and text() reads under the same one.
class StringSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string text() {
    std::lock_guard<std::mutex> lock(mutex_);
    return text_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    text_.append(formatted.data(), formatted.size());
  }
  void flush_() override {}

 private:
  std::string text_;
};

class CapturedLog {
 public:
  CapturedLog() : sink_(std::make_shared<StringSink>()) {
    internal::Logger().sinks().push_back(sink_);
  }
  ~CapturedLog() {
    auto& sinks = internal::Logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  /// Everything logged so far; safe while other threads log.
  std::string text() const { return sink_->text(); }

 private:
  std::shared_ptr<StringSink> sink_;
};

}  // namespace foreman::testing
