// Foreman's logger (include/foreman/logging.hpp, src/log.hpp).
//
// One spdlog::logger named "foreman" with a single dist_sink. Reconfiguring
// swaps the dist_sink's children under its mutex, so each message goes
// either wholly to the old sinks or wholly to the new ones, and a logging
// thread never sees a half-built configuration.
#include "foreman/logging.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "platform/log.hpp"

namespace foreman {

namespace {

// -- levels and patterns ------------------------------------------------------

/// "[2026-11-29 18:30:00.123] [I] message"; the level letter is coloured on a
/// colour terminal. The message was escaped by FOREMAN_LOG_AT_
/// (EscapeForTerminal) before it got here.
constexpr char kPattern[] = "[%Y-%m-%d %H:%M:%S.%e] [%^%L%$] %v";

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarning: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::info;
}

LogLevel FromSpdlog(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace: return LogLevel::kTrace;
    case spdlog::level::debug: return LogLevel::kDebug;
    case spdlog::level::info: return LogLevel::kInfo;
    case spdlog::level::warn: return LogLevel::kWarning;
    case spdlog::level::err:
    case spdlog::level::critical: return LogLevel::kError;
    default: return LogLevel::kOff;
  }
}

// -- the logger ---------------------------------------------------------------

struct LoggerState {
  /// The logger's only sink; its children are the configured sinks.
  std::shared_ptr<spdlog::sinks::dist_sink_mt> dist;
  /// Never destroyed.
  spdlog::logger* logger = nullptr;
  /// Serialises ConfigureLogging() so that sinks and level change together.
  std::mutex config_mu;
};

std::shared_ptr<spdlog::sinks::sink> MakeStderrSink() {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(spdlog::color_mode::automatic);
  sink->set_pattern(kPattern);
  return sink;
}

LoggerState& State() {
  static LoggerState* const state = [] {
    auto* s = new LoggerState;
    s->dist = std::make_shared<spdlog::sinks::dist_sink_mt>(
        std::vector<std::shared_ptr<spdlog::sinks::sink>>{MakeStderrSink()});
    s->logger = new spdlog::logger("foreman", s->dist);
    s->logger->set_level(spdlog::level::info);
    // Flush every message: a crash must not lose the last lines.
    s->logger->flush_on(spdlog::level::trace);
    return s;
  }();
  return *state;
}

// -- errors -------------------------------------------------------------------

Status LogFileError(const std::string& path, int err) {
  std::string message = absl::StrCat("cannot open log file ", path, ": ",
                                     std::generic_category().message(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

/// Opens (creating if missing) `path` for appending and closes it again, to
/// get a precise errno: spdlog's file sink creates missing directories, which
/// the contract forbids, and reports failures only as text.
Status CheckLogFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
  if (fd < 0) return LogFileError(path, errno);
  ::close(fd);
  return absl::OkStatus();
}

StatusOr<std::vector<std::shared_ptr<spdlog::sinks::sink>>> MakeSinks(const LogOptions& options) {
  std::vector<std::shared_ptr<spdlog::sinks::sink>> sinks;
  if (options.to_stderr) {
    sinks.push_back(MakeStderrSink());
    sinks.back()->set_level(ToSpdlog(options.stderr_level));
  }
  if (!options.file_path.empty()) {
    FOREMAN_RETURN_IF_ERROR(CheckLogFile(options.file_path));
    try {
      auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(options.file_path,
                                                                      /*truncate=*/false);
      file->set_pattern(kPattern);
      sinks.push_back(std::move(file));
    } catch (const spdlog::spdlog_ex& e) {
      return absl::InternalError(
          absl::StrCat("cannot open log file ", options.file_path, ": ", e.what()));
    }
  }
  return sinks;
}

}  // namespace

namespace internal {

spdlog::logger& Logger() { return *State().logger; }

}  // namespace internal

// -- escaping -----------------------------------------------------------------

namespace {

/// The code point of the valid UTF-8 sequence at s[i] and its length, or
/// length 0 when none starts there.
std::pair<uint32_t, std::size_t> DecodeUtf8(absl::string_view s, std::size_t i) {
  static constexpr uint32_t kMinCodePoint[] = {0, 0, 0x80, 0x800, 0x10000};
  const auto lead = static_cast<unsigned char>(s[i]);
  if (lead < 0x80) return {lead, 1};
  const std::size_t n = (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3 : (lead & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return {0, 0};
  uint32_t cp = lead & (0x7Fu >> n);
  for (std::size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return {0, 0};
    cp = cp << 6 | (c & 0x3Fu);
  }
  if (cp < kMinCodePoint[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, n};
}

/// C1 controls and the format characters that hide or reorder text.
bool IsInvisibleControl(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) ||
         (cp >= 0x2060 && cp <= 0x2069) || cp == 0xFEFF;
}

void AppendHex(char prefix, uint32_t value, int digits, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('\\');
  out->push_back(prefix);
  for (int d = digits - 1; d >= 0; --d) out->push_back(kHex[(value >> (4 * d)) & 15]);
}

}  // namespace

std::string EscapeForTerminal(absl::string_view text) {
  std::string out;
  std::size_t copied = 0;  // text[copied, i) goes out as it is
  bool escaped = false;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {  // printable ASCII: the common case
      ++i;
      continue;
    }
    auto [cp, n] = DecodeUtf8(text, i);
    if (n > 1 && !IsInvisibleControl(cp)) {
      i += n;
      continue;
    }
    if (!escaped) out.reserve(text.size() + 16);
    escaped = true;
    out.append(text.data() + copied, i - copied);
    if (n == 0) {  // not part of valid UTF-8: the byte
      AppendHex('x', c, 2, &out);
      n = 1;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < 0x80) {
      AppendHex('x', cp, 2, &out);
    } else {
      AppendHex('u', cp, 4, &out);
    }
    i += n;
    copied = i;
  }
  if (!escaped) return std::string(text);
  out.append(text.data() + copied, text.size() - copied);
  return out;
}

// -- public API ---------------------------------------------------------------

Status ConfigureLogging(const LogOptions& options) {
  try {
    LoggerState& state = State();
    // Build everything that can fail before touching the current setup.
    FOREMAN_ASSIGN_OR_RETURN(auto sinks, MakeSinks(options));
    std::lock_guard<std::mutex> l(state.config_mu);
    state.dist->set_sinks(std::move(sinks));  // the old sinks close here
    state.logger->set_level(ToSpdlog(options.level));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("ConfigureLogging: ", e.what()));
  } catch (...) {
    return absl::InternalError("ConfigureLogging: unknown exception");
  }
}

StatusOr<LogLevel> ParseLogLevel(const std::string& text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "trace") return LogLevel::kTrace;
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning" || lower == "warn") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  if (lower == "off") return LogLevel::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level \"", text,
                   "\" (expected trace, debug, info, warning, error or off)"));
}

LogLevel GetLogLevel() { return FromSpdlog(internal::Logger().level()); }

}  // namespace foreman
