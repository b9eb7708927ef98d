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

#include "absl/strings/string_view.h"
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

/// `text` made safe to print as part of one line on a terminal or in a log:
/// what came from a file or a peer (a summary's tag, a tensor name in a
/// checkpoint, a host name, an error message quoting them) can neither break
/// the line nor send a control sequence to the terminal. Valid UTF-8 that
/// prints stays as it is; escaped are newline, tab and carriage return
/// (\n, \t, \r), every other C0 control and DEL (\x1b),
/// C1 controls and the invisible format characters that reorder or hide text
/// (U+0080..U+009F, U+200B..U+200F, U+2028..U+202E, U+2060..U+2069, U+FEFF,
/// as \u202e), and each byte that is not part of valid UTF-8 (\xff). Text
/// with none of these comes back unchanged (a backslash too: the result is
/// for reading, not for parsing back; text already escaped stays as it
/// is, so escaping twice changes nothing). Foreman's log lines pass every
/// message through it; JSON output is escaped by JSON's rules instead.
/// Thread-safe.
std::string EscapeForTerminal(absl::string_view text);

}  // namespace foreman
