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

/// `s` with every payload of `from` added (replacing those of the same
/// URL): a Status that quotes `from`'s message keeps its marks, the injected
/// fault's among them. OK stays OK. Thread-safe.
Status WithPayloadsOf(Status s, const Status& from);

/// INVALID_ARGUMENT "id \"<id, C-escaped>\" has a control character (0x0a)
/// at byte <i> (ids are logged and recorded as they are)" when `id` holds a
/// byte below 0x20 or 0x7f (a newline, a tab, an escape, ...); else OK. The
/// caller puts where the fault is before the message. Thread-safe.
Status CheckFaultIdCharacters(absl::string_view id);

}  // namespace foreman
