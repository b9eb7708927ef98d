// Errors as values: absl::Status with TensorFlow's canonical codes.
//
// TF's error_codes.proto and absl::StatusCode share their numbers (OK=0,
// CANCELLED=1, ..., DATA_LOSS=15), so a foreman::Status *is* a TF status.
// The codes drive supervision, mapping TF's exception classes:
//   OUT_OF_RANGE        a step's clean stop (end of input data)
//   ABORTED/UNAVAILABLE preemption: recreate the session, restore, retry
//   DATA_LOSS           a checksum mismatch in a file
//   FAILED_PRECONDITION misuse, or a state someone has to fix first
//   INVALID_ARGUMENT    bad arguments, shapes or dtypes
//   INTERNAL            anything else a user's code threw
//
// No exception crosses Foreman's public API. User code (steps, hooks,
// listeners) may throw; the boundary calls InvokeUserCode() which turns the
// exception into a Status the way TF's exception classes map to codes:
//
//   foreman::StatusError(s)         -> s (any code, message kept; an OK s
//                                      -> INTERNAL: an exception is a failure)
//   std::invalid_argument,
//   std::domain_error               -> INVALID_ARGUMENT   (TF ValueError/TypeError)
//   std::bad_alloc                  -> RESOURCE_EXHAUSTED
//   any other std::exception        -> INTERNAL, what() kept
//   anything else (throw 42)        -> INTERNAL "unknown exception"
//
// std::out_of_range is deliberately *not* OUT_OF_RANGE: the standard library
// throws it for indexing bugs (vector::at), and OUT_OF_RANGE would turn such a
// bug into a silent clean stop. A step signals end of data by returning
// absl::OutOfRangeError(...) or throwing StatusError(absl::OutOfRangeError(...)).
#pragma once

#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace foreman {

using Status = absl::Status;
template <class T>
using StatusOr = absl::StatusOr<T>;

/// An exception that carries a Status, for user code that prefers to throw.
/// InvokeUserCode() turns it back into exactly that Status.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status status)
      : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const Status& status() const noexcept { return status_; }

 private:
  Status status_;
};

/// Maps the exception in `ep` to a Status (table at the top of this file).
/// `where` names the user code that threw ("step function", "hook
/// CheckpointSaverHook::after_run") and prefixes the message, unless the
/// exception was a StatusError, whose Status is returned unchanged.
/// REQUIRES: ep != nullptr.
Status StatusFromException(std::exception_ptr ep, const std::string& where = "");

/// Calls `fn()` and returns its Status; an exception becomes a Status as
/// StatusFromException() says. `fn` returns Status, StatusOr<T> or void.
/// For StatusOr<T> the result is returned as StatusOr<T>.
template <class Fn>
auto InvokeUserCode(const std::string& where, Fn&& fn) {
  using R = std::invoke_result_t<Fn>;
  if constexpr (std::is_void_v<R>) {
    try {
      std::forward<Fn>(fn)();
      return absl::OkStatus();
    } catch (...) {
      return StatusFromException(std::current_exception(), where);
    }
  } else {
    try {
      return R(std::forward<Fn>(fn)());
    } catch (...) {
      return R(StatusFromException(std::current_exception(), where));
    }
  }
}

/// Returns `s` with "<context>: " put before its message; code and payloads
/// are kept. OK stays OK.
Status Annotate(const Status& s, const std::string& context);

// -- NanLossDuringTrainingError (TF: basic_session_run_hooks) ----------------

/// Payload type URL that marks an INTERNAL status as TF's
/// NanLossDuringTrainingError (INTERNAL carrying this payload).
inline constexpr char kNanLossPayload[] = "foreman.NanLossDuringTraining";

/// INTERNAL with the kNanLossPayload payload.
Status NanLossDuringTrainingError(const std::string& message);

/// True when `s` carries the kNanLossPayload payload.
bool IsNanLossDuringTraining(const Status& s);

}  // namespace foreman

// -- macros ------------------------------------------------------------------

#define FOREMAN_STATUS_CONCAT_INNER_(a, b) a##b
#define FOREMAN_STATUS_CONCAT_(a, b) FOREMAN_STATUS_CONCAT_INNER_(a, b)

/// Evaluates `expr` (a Status) and returns it from the enclosing function
/// when it is not OK.
#define FOREMAN_RETURN_IF_ERROR(expr)                                       \
  do {                                                                      \
    ::absl::Status foreman_status_ = (expr);                                \
    if (!foreman_status_.ok()) return foreman_status_;                      \
  } while (false)

/// `FOREMAN_ASSIGN_OR_RETURN(auto x, MakeX());` evaluates a StatusOr, returns
/// its status when not OK, otherwise moves the value into `lhs`.
#define FOREMAN_ASSIGN_OR_RETURN(lhs, rexpr)                                \
  FOREMAN_ASSIGN_OR_RETURN_IMPL_(                                           \
      FOREMAN_STATUS_CONCAT_(foreman_statusor_, __LINE__), lhs, rexpr)

#define FOREMAN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)                \
  auto statusor = (rexpr);                                                  \
  if (!statusor.ok()) return std::move(statusor).status();                  \
  lhs = std::move(statusor).value()
