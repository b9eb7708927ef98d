// The POSIX Env's errno -> Status mapping, shared with FaultyEnv so that an
// injected error is the one a real failure would give.
#pragma once

#include <string>

#include "foreman/status.hpp"

namespace foreman::internal {

/// "<context>: <strerror(err)>" with the absl code for `err`: ENOENT
/// NOT_FOUND, EEXIST ALREADY_EXISTS, EACCES/EPERM PERMISSION_DENIED,
/// ENOTEMPTY FAILED_PRECONDITION, ENOSPC RESOURCE_EXHAUSTED, any other
/// INTERNAL. Thread-safe.
Status ErrnoError(const std::string& context, int err);

}  // namespace foreman::internal
