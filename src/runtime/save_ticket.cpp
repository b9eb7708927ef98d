#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/services.hpp"

namespace foreman::internal {

void SaveTicket::Complete(Status s, std::string saved_prefix, absl::Duration took) {
  {
    MutexLock l(mu);
    // The first completion wins: the actor's, or the runtime's error when the
    // actor died first.
    if (done) return;
    done = true;
    status = std::move(s);
    prefix = std::move(saved_prefix);
    write_time = took;
  }
  cv.notify_all();
}

bool SaveTicket::IsDone() {
  MutexLock l(mu);
  return done;
}

Status SaveTicket::Wait(absl::Duration timeout) {
  MutexLock lock(mu);
  if (!cv.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                   [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done; })) {
    return absl::DeadlineExceededError(absl::StrCat("the checkpoint save of step ", step,
                                                    " did not complete within ", absl::FormatDuration(timeout)));
  }
  return status;
}

}  // namespace foreman::internal
