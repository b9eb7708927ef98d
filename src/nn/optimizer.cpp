// TF1's optimizers: option checks, slot names, and the dense updates
// (training_ops.cc ApplyGradientDescent, ApplyMomentum, ApplyAdam) on a
// compute::Device (the CPU kernels are in compute/cpu_device.cpp).
#include "nn/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "compute/cpu_device.hpp"

namespace foreman::nn {

StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "adam") return OptimizerKind::kAdam;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown optimizer '", name, "' (choices: sgd, momentum, adam)"));
}

std::string OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kMomentum: return "momentum";
    case OptimizerKind::kAdam: return "adam";
  }
  return absl::StrCat("invalid(", static_cast<int>(kind), ")");
}

Status ValidateOptimizerOptions(const OptimizerOptions& o) {
  const std::string what = absl::StrCat("optimizer ", OptimizerKindName(o.kind), ": ");
  if (o.kind != OptimizerKind::kSgd && o.kind != OptimizerKind::kMomentum && o.kind != OptimizerKind::kAdam) {
    return absl::InvalidArgumentError(absl::StrCat("invalid optimizer kind ", static_cast<int>(o.kind)));
  }
  // Written as !(x > 0) so that NaN is rejected too.
  if (!(o.learning_rate > 0) || !std::isfinite(o.learning_rate)) {
    return absl::InvalidArgumentError(absl::StrCat(what, "learning_rate must be > 0 and finite, got ", o.learning_rate));
  }
  if (o.kind == OptimizerKind::kMomentum && (!(o.momentum >= 0) || !std::isfinite(o.momentum))) {
    return absl::InvalidArgumentError(absl::StrCat(what, "momentum must be >= 0 and finite, got ", o.momentum));
  }
  if (o.kind == OptimizerKind::kAdam) {
    if (!(o.beta1 >= 0 && o.beta1 < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(what, "beta1 must be in [0, 1), got ", o.beta1));
    }
    if (!(o.beta2 >= 0 && o.beta2 < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(what, "beta2 must be in [0, 1), got ", o.beta2));
    }
    if (!(o.epsilon > 0) || !std::isfinite(o.epsilon)) {
      return absl::InvalidArgumentError(absl::StrCat(what, "epsilon must be > 0 and finite, got ", o.epsilon));
    }
  }
  return absl::OkStatus();
}

namespace internal {

std::vector<std::string> SlotSuffixes(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return {};
    case OptimizerKind::kMomentum: return {"Momentum"};
    case OptimizerKind::kAdam: return {"Adam", "Adam_1"};
  }
  return {};
}

const std::vector<std::string>& AllSlotSuffixes() {
  static const auto* all = [] {
    auto* v = new std::vector<std::string>;
    for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
      for (std::string& suffix : SlotSuffixes(kind)) {
        if (std::find(v->begin(), v->end(), suffix) == v->end()) v->push_back(std::move(suffix));
      }
    }
    return v;
  }();
  return *all;
}

bool IsSlotName(const std::string& name, std::string* primary) {
  for (const std::string& suffix : AllSlotSuffixes()) {
    // "<var>/<suffix>" with a non-empty <var>.
    if (name.size() < suffix.size() + 2) continue;
    const std::size_t slash = name.size() - suffix.size() - 1;
    if (name[slash] != '/' || name.compare(slash + 1, std::string::npos, suffix) != 0) continue;
    if (primary != nullptr) *primary = name.substr(0, slash);
    return true;
  }
  return false;
}

bool IsBetaPowerName(const std::string& name) { return name == kBeta1PowerName || name == kBeta2PowerName; }

float AdamStepSize(float learning_rate, float beta1_power, float beta2_power) {
  return learning_rate * std::sqrt(1.0f - beta2_power) / (1.0f - beta1_power);
}

Status ApplyDense(const OptimizerOptions& optimizer, float lr, float* var, const float* grad, float* slot0,
                  float* slot1, int64_t n, compute::Device& device) {
  switch (optimizer.kind) {
    case OptimizerKind::kSgd:
      return device.ApplyGradientDescent(var, grad, n, lr);
    case OptimizerKind::kMomentum:
      return device.ApplyMomentum(var, slot0, grad, n,
                                  compute::MomentumParams{lr, optimizer.momentum, optimizer.use_nesterov});
    case OptimizerKind::kAdam:
      return device.ApplyAdam(var, slot0, slot1, grad, n,
                              compute::AdamParams{lr, optimizer.beta1, optimizer.beta2, optimizer.epsilon});
  }
  return absl::InvalidArgumentError(absl::StrCat("invalid optimizer kind ", static_cast<int>(optimizer.kind)));
}

void ApplyDense(const OptimizerOptions& optimizer, float lr, float* var, const float* grad, float* slot0,
                float* slot1, int64_t n, const Eigen::ThreadPoolDevice& device) {
  compute::CpuDevice cpu(&device);
  // The CPU device fails only for bad arguments, which callers of this form
  // (tests) do not pass.
  ApplyDense(optimizer, lr, var, grad, slot0, slot1, n, cpu).IgnoreError();
}

}  // namespace internal
}  // namespace foreman::nn

namespace foreman {

bool IsOptimizerSlotName(const std::string& name) { return nn::internal::IsSlotName(name); }

}  // namespace foreman
