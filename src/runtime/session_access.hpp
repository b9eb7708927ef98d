// The runtime's allocation-free Session::Run, for MonitoredSession's hooked
// runs: fetch names sorted once per change of plan, results in slots kept
// between runs instead of a fresh std::map per step. Not a public API.
#pragma once

#include <string>
#include <vector>

#include "foreman/session.hpp"
#include "foreman/status.hpp"
#include "foreman/tensor.hpp"

namespace foreman::internal {

class SessionAccess {
 public:
  /// Session::Run() with `fetches` already sorted and unique (REQUIRED, not
  /// checked): on OK, (*values)[i] answers fetches[i]. Both vectors are
  /// resized to fetches.size() and their tensors' storage is reused from the
  /// previous call (an int64 scalar global_step is written in place). Same
  /// answers and errors as Run(); NOT_FOUND names the first unanswered fetch
  /// in sorted order. Thread-safety as Run(); the vectors are the caller's.
  static Status RunInto(Session& session, const std::vector<std::string>& fetches, const TensorMap& feeds,
                        const RunOptions& options, RunMetadata* metadata, std::vector<Tensor>* values,
                        std::vector<unsigned char>* answered);
};

}  // namespace foreman::internal
