// The mark an injected fault's error carries (fault.hpp: kInjectedFaultPayload,
// InjectedFaultId): set by FaultyEnv and FaultInjectionHook, and by the
// runtime on an actor kill's exit reason. Internal.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "foreman/status.hpp"

namespace foreman {

/// `s` with the kInjectedFaultPayload payload set to `fault_id` (replacing
/// one already there). OK stays OK. Thread-safe.
Status WithInjectedFault(Status s, absl::string_view fault_id);

}  // namespace foreman
