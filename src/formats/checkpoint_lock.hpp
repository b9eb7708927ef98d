// Checkpoint directories whose lock a holder in this process is releasing
// (issue 30 bug 1). Internal.
//
// A training job ended with exit_reason::kill is gone at once (its down_msg
// sent), while its loop still closes the session that holds the directory's
// lock (tens of ms: to the step's end, then the close). A supervisor that
// restarts the job on the same directory at the down_msg (OTP's pattern)
// must not be refused by its own process's closing job: the killed job marks
// the directory "closing" until its loop released the lock, and
// LockCheckpointDirectory, finding the lock held while the directory is
// marked, waits for the release (at most kClosingLockWait) and tries again.
#pragma once

#include <string>

#include "absl/time/time.h"

namespace foreman::internal {

/// The longest LockCheckpointDirectory waits for a closing holder.
inline constexpr absl::Duration kClosingLockWait = absl::Seconds(30);

/// Marks `dir` closing (compared after NormalizeDirectory); counted: each mark needs its
/// unmark. Thread-safe.
void MarkCheckpointDirectoryClosing(const std::string& dir);
/// Ends a mark (after the holder released the lock) and wakes the waiters.
/// Thread-safe.
void UnmarkCheckpointDirectoryClosing(const std::string& dir);
/// Waits until `dir` is not marked closing, for at most `timeout`; true when
/// it was marked (the caller then tries the lock again). Thread-safe.
bool WaitWhileCheckpointDirectoryClosing(const std::string& dir, absl::Duration timeout);

}  // namespace foreman::internal
