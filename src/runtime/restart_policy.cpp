// RestartPolicy helpers (include/foreman/restart_policy.hpp). The policy is
// applied by the session_supervisor actor (actors/session_supervisor.cpp).
#include "foreman/restart_policy.hpp"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "foreman/fault.hpp"

namespace foreman {

namespace {
constexpr const char* kServiceKinds[] = {"summary_writer", "checkpoint_saver", "step_counter", "input_pipeline"};
}  // namespace

const char* RestartTypeName(RestartType type) {
  switch (type) {
    case RestartType::kPermanent:
      return "permanent";
    case RestartType::kTransient:
      return "transient";
    case RestartType::kTemporary:
      return "temporary";
  }
  return "unknown";
}

const char* RestartStrategyName(RestartStrategy strategy) {
  switch (strategy) {
    case RestartStrategy::kOneForOne:
      return "one_for_one";
    case RestartStrategy::kOneForAll:
      return "one_for_all";
    case RestartStrategy::kRestForOne:
      return "rest_for_one";
  }
  return "unknown";
}

RestartType RestartPolicy::TypeOf(absl::string_view service) const {
  auto it = services.find(std::string(service));
  return it == services.end() ? type : it->second;
}

Status ValidateRestartPolicy(const RestartPolicy& policy) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat("RestartPolicy: ", what)); };
  auto valid_type = [](RestartType t) {
    return static_cast<int>(t) >= 0 && static_cast<int>(t) <= static_cast<int>(RestartType::kTemporary);
  };
  if (!valid_type(policy.type)) return bad(absl::StrCat("type out of range: ", static_cast<int>(policy.type)));
  for (const auto& [name, type] : policy.services) {
    if (std::find(std::begin(kServiceKinds), std::end(kServiceKinds), name) == std::end(kServiceKinds)) {
      return bad(absl::StrCat("services: unknown service \"", name,
                              "\" (expected summary_writer, checkpoint_saver, step_counter or input_pipeline)"));
    }
    if (!valid_type(type)) return bad(absl::StrCat("services[", name, "]: type out of range: ", static_cast<int>(type)));
  }
  const int strategy = static_cast<int>(policy.strategy);
  if (strategy < 0 || strategy > static_cast<int>(RestartStrategy::kRestForOne)) {
    return bad(absl::StrCat("strategy out of range: ", strategy));
  }
  if (policy.max_restarts < 0) return bad(absl::StrCat("max_restarts must be >= 0, got ", policy.max_restarts));
  if (policy.max_restarts > 0 && policy.period <= absl::ZeroDuration()) {
    return bad(absl::StrCat("period must be > 0 when max_restarts > 0, got ", absl::FormatDuration(policy.period)));
  }
  if (policy.initial_backoff < absl::ZeroDuration() || policy.max_backoff < absl::ZeroDuration()) {
    return bad(absl::StrCat("back-off must be >= 0, got initial_backoff ", absl::FormatDuration(policy.initial_backoff),
                            ", max_backoff ", absl::FormatDuration(policy.max_backoff)));
  }
  if (policy.initial_backoff > policy.max_backoff) {
    return bad(absl::StrCat("initial_backoff ", absl::FormatDuration(policy.initial_backoff), " exceeds max_backoff ",
                            absl::FormatDuration(policy.max_backoff)));
  }
  if (policy.max_backoff > kMaxRestartBackoff) {
    return bad(absl::StrCat("max_backoff must be <= ", absl::FormatDuration(kMaxRestartBackoff), ", got ",
                            absl::FormatDuration(policy.max_backoff)));
  }
  return absl::OkStatus();
}

absl::Duration RestartBackoff(const RestartPolicy& policy, const std::string& service, int64_t restart) {
  if (policy.initial_backoff <= absl::ZeroDuration() || restart < 1) return absl::ZeroDuration();
  absl::Duration base = policy.initial_backoff;
  for (int64_t k = 1; k < restart && base < policy.max_backoff; ++k) base *= 2;
  base = std::min(base, policy.max_backoff);
  const double jitter = 0.5 + FaultDraw(policy.seed, "restart", service, EnvOp::kAny, restart);
  return base * jitter;
}

}  // namespace foreman
