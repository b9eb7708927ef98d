// The stock hooks' global-step helpers (runtime/hooks/global_step.hpp).
#include "runtime/hooks/global_step.hpp"

#include <string>

#include "absl/strings/str_cat.h"
#include "foreman/graph.hpp"
#include "foreman/tensor.hpp"
#include "foreman/variable_store.hpp"

namespace foreman::internal {

const std::string& GlobalStepFetchName() {
  static const std::string name(kGlobalStepName);
  return name;
}

Status RequireGlobalStep(Session* session, const SessionRunHook& hook) {
  if (session == nullptr || session->graph() == nullptr || !session->graph()->has_global_step()) {
    return absl::FailedPreconditionError(absl::StrCat("Global step should be created to use ", hook.name(), "."));
  }
  return absl::OkStatus();
}

StatusOr<int64_t> StaleGlobalStep(const SessionRunValues& values, const SessionRunHook& hook) {
  const TensorMap* results = values.results;
  const std::string& name = GlobalStepFetchName();
  // A stock hook's results hold global_step alone: one compare, no search.
  const auto it = results == nullptr                                           ? TensorMap::const_iterator()
                  : results->size() == 1 && results->begin()->first == name ? results->begin()
                                                                               : results->find(name);
  if (results == nullptr || it == results->end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(hook.name(), ": the run returned no value for the \"", kGlobalStepName, "\" fetch"));
  }
  const Tensor& t = it->second;
  // The Session's answer, every step: an int64 scalar, read without building
  // a StatusOr.
  if (t.dtype() == DataType::kInt64 && t.shape().rank() == 0) return *t.data<int64_t>();
  if (t.dtype() == DataType::kInt64) {
    if (StatusOr<int64_t> v = t.scalar<int64_t>(); v.ok()) return *v;
  } else if (t.dtype() == DataType::kInt32) {
    if (StatusOr<int32_t> v = t.scalar<int32_t>(); v.ok()) return static_cast<int64_t>(*v);
  }
  return absl::FailedPreconditionError(absl::StrCat(hook.name(), ": the \"", kGlobalStepName, "\" fetch is ",
                                                    DataTypeName(t.dtype()), t.shape().ToString(),
                                                    ", not an int32/int64 scalar"));
}

StatusOr<int64_t> RealGlobalStep(Session* session, const SessionRunHook& hook) {
  StatusOr<int64_t> step = session->GlobalStep();
  if (step.ok()) return step;
  const std::string context = absl::StrCat(hook.name(), ": reading ", kGlobalStepName);
  // NOT_FOUND (no variable) and INVALID_ARGUMENT (not an integer scalar): no usable global step.
  if (absl::IsNotFound(step.status()) || absl::IsInvalidArgument(step.status())) {
    return absl::FailedPreconditionError(absl::StrCat(context, ": ", step.status().message()));
  }
  return Annotate(step.status(), context);
}

}  // namespace foreman::internal
