// Errors of user code that Foreman calls from inside one of its own hooks
// (TrainingJob::on_results inside the job's progress hook): the error names
// the user's callback, not the internal hook (issue 30 point 10).
// MonitoredSession, which prefixes a hook's error with "hook <Name>::<method>",
// leaves an error marked here as it is. Internal.
#pragma once

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/status.hpp"

namespace foreman::internal {

/// The payload type URL of the mark.
inline constexpr char kUserCodeErrorPayload[] = "foreman.internal.UserCodeError";

/// `s` (not OK) with "<where>: " before its message (unless it starts so
/// already: InvokeUserCode's exceptions) and marked; OK stays OK.
inline Status AttributeToUserCode(const Status& s, const std::string& where) {
  if (s.ok()) return s;
  Status out = absl::StartsWith(s.message(), absl::StrCat(where, ": ")) ? s : Annotate(s, where);
  out.SetPayload(kUserCodeErrorPayload, absl::Cord(where));
  return out;
}

/// Whether `s` was marked by AttributeToUserCode.
inline bool IsAttributedToUserCode(const Status& s) {
  return s.GetPayload(kUserCodeErrorPayload).has_value();
}

}  // namespace foreman::internal
