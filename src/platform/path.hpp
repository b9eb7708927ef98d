// Path spelling shared inside libforeman; the public path helpers (JoinPath,
// Dirname, Basename) are in foreman/env.hpp and use this one too.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace foreman::internal {

/// The one spelling of a directory name that Foreman keeps, compares and
/// joins: `dir` without its trailing slashes. "a/b/" and "a/b//" -> "a/b";
/// "/" and "//" -> "/"; "" -> "". Nothing else changes ("a//b" and "./a"
/// stay as given; no file system access). Thread-safe (a pure function).
std::string NormalizeDirectory(absl::string_view dir);

}  // namespace foreman::internal
