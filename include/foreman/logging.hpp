// Logging: one place configures Foreman's logger (spdlog underneath). Log
// lines TF prints (for example "Saving checkpoints for 100 into ...") go
// through it with the same wording.
//
//   ```cpp
//   foreman::LogOptions o;
//   o.level = foreman::LogLevel::kDebug;
//   o.file_path = "foreman.log";              // in addition to stderr
//   FOREMAN_RETURN_IF_ERROR(foreman::ConfigureLogging(o));
//   ```
#pragma once

#include <string>

#include "foreman/status.hpp"

namespace foreman {

enum class LogLevel { kTrace, kDebug, kInfo, kWarning, kError, kOff };

struct LogOptions {
  /// Messages below this level are dropped.
  LogLevel level = LogLevel::kInfo;
  /// Write to stderr.
  bool to_stderr = true;
  /// stderr gets only messages at or above both `level` and this one (for
  /// example kWarning while a progress bar owns the terminal and the file
  /// gets everything at `level`).
  LogLevel stderr_level = LogLevel::kTrace;
  /// When non-empty, also append to this file (created if missing; its
  /// directory must exist).
  std::string file_path;
};

/// Replaces the logger's sinks and level. When the log file cannot be opened
/// returns the error (NOT_FOUND for a missing directory, PERMISSION_DENIED,
/// otherwise INTERNAL) naming the path, and the previous configuration stays.
/// Thread-safe.
Status ConfigureLogging(const LogOptions& options);

/// Parses "trace", "debug", "info", "warning" (or "warn"), "error", "off".
/// INVALID_ARGUMENT naming the text otherwise.
StatusOr<LogLevel> ParseLogLevel(const std::string& text);

/// The current level.
LogLevel GetLogLevel();

}  // namespace foreman
