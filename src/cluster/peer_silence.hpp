// PeerSilenceLog: one log line when a watched task stops updating the ps
// and one when it returns (issue 31 point 4: deaths are logged). CAF-free:
// the ps shard feeds it the ms since each worker's last apply arrived, a
// worker's Server the same as ps 0's stats tell it.
//
// A task is "lost" once it had updated and then sent no update for more
// than silence_ms (--connection-timeout-ms: a killed, stopped or partitioned
// task, or one whose connection dropped); it has "returned" when an update
// arrives again. Each change is logged once (WARNING for a loss, INFO for a
// return). A loss is logged at least min_line_interval_ms after the task's
// previous line (one that comes sooner is logged at the first observation
// after that, if it still holds); a return at the first observation that
// sees it, so that every logged loss is followed by its return when the task
// comes back (a task flapping faster is logged at most twice per interval).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace foreman::internal {

class PeerSilenceLog {
 public:
  /// `observer` starts each line ("ps task 0", "/job:worker/task:1");
  /// silence_ms > 0; min_line_interval_ms >= 0.
  PeerSilenceLog(std::string observer, int64_t silence_ms, int64_t min_line_interval_ms = 1000);

  /// One observation of worker task `worker` at `now_ms` (any monotonic ms
  /// clock, non-decreasing): `ms_since_update` ms since its last update
  /// arrived, -1 if none ever did. Returns the line it logged, if any. Not
  /// thread-safe (one caller: the shard's actor or the Server's watch thread).
  std::optional<std::string> Observe(int worker, int64_t ms_since_update, int64_t now_ms);

  /// "the chief (/job:worker/task:0)" or "worker K (/job:worker/task:K)".
  static std::string TaskName(int worker);

 private:
  struct Peer {
    bool lost = false;                   // as last logged
    int64_t last_update_ms = 0;          // when its last update before the loss arrived (now_ms's clock)
    int64_t last_line_ms = INT64_MIN / 2;
  };
  const std::string observer_;
  const int64_t silence_ms_;
  const int64_t min_line_interval_ms_;
  std::map<int, Peer> peers_;
};

}  // namespace foreman::internal
