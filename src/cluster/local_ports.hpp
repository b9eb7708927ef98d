// Free TCP ports on 127.0.0.1 for the tasks of a local cluster (`foreman
// cluster local`, `foreman chaos --preset cluster`).
#pragma once

#include <vector>

#include "foreman/status.hpp"

namespace foreman::internal {

/// `n` distinct free TCP ports on 127.0.0.1: bound together (so distinct),
/// then released, so another process could take one before its task binds
/// it (that task then exits 1 naming the address). UNAVAILABLE when a
/// socket cannot be made or bound. Thread-safe.
StatusOr<std::vector<int>> FreeLoopbackPorts(int n);

}  // namespace foreman::internal
