#include "cluster/peer_silence.hpp"

#include <utility>

#include "absl/strings/str_cat.h"
#include "platform/log.hpp"

namespace foreman::internal {

PeerSilenceLog::PeerSilenceLog(std::string observer, int64_t silence_ms, int64_t min_line_interval_ms)
    : observer_(std::move(observer)), silence_ms_(silence_ms), min_line_interval_ms_(min_line_interval_ms) {}

std::string PeerSilenceLog::TaskName(int worker) {
  if (worker == 0) return "the chief (/job:worker/task:0)";
  return absl::StrCat("worker ", worker, " (/job:worker/task:", worker, ")");
}

std::optional<std::string> PeerSilenceLog::Observe(int worker, int64_t ms_since_update, int64_t now_ms) {
  if (ms_since_update < 0) return std::nullopt;  // never updated: not started yet, nothing to lose
  Peer& p = peers_[worker];
  const bool silent = ms_since_update > silence_ms_;
  if (silent == p.lost) return std::nullopt;
  // Rate limit on losses only: a loss that comes sooner after the task's
  // last line is logged later, if it holds; a return is logged when seen (a
  // run that ends right after it must not leave the loss as the last word).
  if (silent && now_ms - p.last_line_ms < min_line_interval_ms_) return std::nullopt;
  std::string line;
  if (silent) {
    p.last_update_ms = now_ms - ms_since_update;
    line = absl::StrCat(observer_, ": ", TaskName(worker), " lost: no update from it for ", ms_since_update,
                        " ms (more than --connection-timeout-ms=", silence_ms_,
                        "; killed, stopped or cut off?)");
    FOREMAN_LOG_WARN("{}", line);
  } else {
    const int64_t silent_ms = (now_ms - ms_since_update) - p.last_update_ms;
    line = absl::StrCat(observer_, ": ", TaskName(worker), " returned: updating again after ", silent_ms,
                        " ms without an update");
    FOREMAN_LOG_INFO("{}", line);
  }
  p.lost = silent;
  p.last_line_ms = now_ms;
  return line;
}

}  // namespace foreman::internal
