// The global step as the stock hooks see it: the check in begin(), the stale
// value a run answered and the real value read after it. One place, one error
// code: a global step that is missing or unusable is FAILED_PRECONDITION, as
// TF's hooks raise RuntimeError("Global step should be created to use <Hook>.")
// (RuntimeError, misuse, maps to FAILED_PRECONDITION). Everything here runs
// on the training thread.
#pragma once

#include <cstdint>
#include <string>

#include "foreman/hooks.hpp"
#include "foreman/session.hpp"
#include "foreman/status.hpp"

namespace foreman::internal {

/// kGlobalStepName as a std::string, built once: the stock hooks compare and
/// look it up every step.
const std::string& GlobalStepFetchName();

/// OK when `session`'s graph has a global step; otherwise FAILED_PRECONDITION
/// "Global step should be created to use <hook.name()>." (TF's message, from
/// the hooks' begin()/after_create_session()). `session` may be null (then
/// the same error).
Status RequireGlobalStep(Session* session, const SessionRunHook& hook);

/// The stale global step: the value before the run's step, which the run
/// answered for the built-in "global_step" fetch the hook asked for (an int64
/// or int32 scalar, returned as int64). FAILED_PRECONDITION "<hook>: ..." when
/// the run answered no such value or not an integer scalar. hook.name() is
/// called only to build an error: this runs every step.
StatusOr<int64_t> StaleGlobalStep(const SessionRunValues& values, const SessionRunHook& hook);

/// The real global step now (TF re-reads the global step tensor after the
/// run). FAILED_PRECONDITION "<hook>: reading global_step: ..." when the
/// session holds no global_step or one that is not an integer scalar; any
/// other error of Session::GlobalStep() is returned with its code, annotated
/// the same way.
StatusOr<int64_t> RealGlobalStep(Session* session, const SessionRunHook& hook);

}  // namespace foreman::internal
