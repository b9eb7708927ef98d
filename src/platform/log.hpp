// Foreman's internal logging macros (not installed). The logger itself is
// configured through include/foreman/logging.hpp.
//
//   FOREMAN_LOG_INFO("Saving checkpoints for {} into {}.", step, path);
//
// Formatting is fmt's ("{}" placeholders, checked at compile time). The
// arguments are evaluated only when the level is enabled.
#pragma once

#include <string>

#include <spdlog/logger.h>

#include "foreman/logging.hpp"

namespace foreman::internal {

/// The one logger, named "foreman". Created on first use (stderr, level info)
/// and never destroyed, so it may be used during static initialisation and
/// destruction. Not registered in spdlog's global registry. Reconfigure it
/// only through foreman::ConfigureLogging().
spdlog::logger& Logger();

}  // namespace foreman::internal

/// Logs at `level` (a spdlog::level::level_enum). Internal. The formatted
/// message goes through EscapeForTerminal (logging.hpp): one line, no
/// control characters, whatever the arguments held.
#define FOREMAN_LOG_AT_(level, ...)                                                    \
  do {                                                                                 \
    ::spdlog::logger& foreman_logger_ = ::foreman::internal::Logger();                 \
    if (foreman_logger_.should_log(level)) {                                           \
      const std::string foreman_message_ = ::fmt::format(__VA_ARGS__);                 \
      foreman_logger_.log(level, ::spdlog::string_view_t(::foreman::EscapeForTerminal( \
                                     foreman_message_)));                              \
    }                                                                                  \
  } while (false)

#define FOREMAN_LOG_TRACE(...) FOREMAN_LOG_AT_(::spdlog::level::trace, __VA_ARGS__)
#define FOREMAN_LOG_DEBUG(...) FOREMAN_LOG_AT_(::spdlog::level::debug, __VA_ARGS__)
#define FOREMAN_LOG_INFO(...) FOREMAN_LOG_AT_(::spdlog::level::info, __VA_ARGS__)
#define FOREMAN_LOG_WARN(...) FOREMAN_LOG_AT_(::spdlog::level::warn, __VA_ARGS__)
#define FOREMAN_LOG_ERROR(...) FOREMAN_LOG_AT_(::spdlog::level::err, __VA_ARGS__)
