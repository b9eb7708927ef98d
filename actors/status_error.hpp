// The Status <-> caf::error bridge of the supervision tree's actors: a
// Status as an exit reason (StatusToError) and back (StatusFromForemanError,
// ErrorToStatus), and MakeQuiet, which turns an actor's uncaught exception
// into such an exit reason. Internal to actors/ (the only translation units
// that include CAF, design.md §1).
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "absl/strings/str_cat.h"
#include "foreman/status.hpp"

namespace foreman::internal {

/// The error category of Foreman's Statuses inside CAF (exit reasons).
constexpr caf::atom_value kForemanErrorCategory = caf::atom("foreman");

/// An exit reason carrying `s` (code, message and payloads: the context is
/// (message) or (message, payloads), see PayloadsOf); none for OK.
inline caf::error StatusToError(const Status& s) {
  if (s.ok()) return caf::error{};
  std::vector<std::string> payloads = PayloadsOf(s);
  return caf::error{static_cast<uint8_t>(s.code()), kForemanErrorCategory,
                    payloads.empty() ? caf::make_message(std::string(s.message()))
                                     : caf::make_message(std::string(s.message()), std::move(payloads))};
}

/// The Status that StatusToError() packed into `e`: OK for no error,
/// std::nullopt when `e` is not in Foreman's category. The one way back from
/// a caf::error (ErrorToStatus and the actor API's StatusFromExitReason use it).
inline std::optional<Status> StatusFromForemanError(const caf::error& e) {
  if (!e) return absl::OkStatus();
  if (e.category() != kForemanErrorCategory) return std::nullopt;
  const caf::message& context = e.context();
  std::string message;
  if (context.size() >= 1 && context.match_element<std::string>(0)) message = context.get_as<std::string>(0);
  Status s(static_cast<absl::StatusCode>(e.code()), message);
  if (context.size() == 2 && context.match_element<std::vector<std::string>>(1)) {
    SetPayloads(&s, context.get_as<std::vector<std::string>>(1));
  }
  return s;
}

/// The Status an actor's exit reason stands for: OK for a normal exit; the
/// Status StatusToError() packed; otherwise INTERNAL "<who> stopped: <reason>".
inline Status ErrorToStatus(const caf::error& e, const std::string& who) {
  if (std::optional<Status> s = StatusFromForemanError(e)) return *std::move(s);
  return absl::InternalError(absl::StrCat(who, " stopped: ", caf::to_string(e)));
}

/// CAF prints unexpected messages and uncaught exceptions on stderr by
/// default; Foreman's actors drop the former and turn the latter into a
/// Status exit reason (the supervisor reports it to the failure_sink).
inline void MakeQuiet(caf::scheduled_actor* self, std::string name) {
  self->set_default_handler(caf::drop);
  self->set_exception_handler([name](caf::scheduled_actor*, std::exception_ptr& ep) -> caf::error {
    return StatusToError(StatusFromException(ep, name));
  });
}

}  // namespace foreman::internal
