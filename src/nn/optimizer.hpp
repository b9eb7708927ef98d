// TF1's dense update kernels (tensorflow/core/kernels/training_ops.cc), on
// raw float buffers. Internal to the nn module; tests use it directly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "foreman/nn.hpp"

namespace Eigen {
struct ThreadPoolDevice;
}

namespace foreman::nn::internal {

inline constexpr char kBeta1PowerName[] = "beta1_power";
inline constexpr char kBeta2PowerName[] = "beta2_power";

/// The slot names TF1 gives a variable's slots, as suffixes of "<var>/":
/// {} (SGD), {"Momentum"}, {"Adam", "Adam_1"} (m, v).
std::vector<std::string> SlotSuffixes(OptimizerKind kind);
/// Every optimizer's slot suffixes, each once ("Momentum", "Adam",
/// "Adam_1"): what names a slot whatever the optimizer (placement, shards).
const std::vector<std::string>& AllSlotSuffixes();
/// Whether `name` is TF1's name of a slot ("<var>/<suffix>" for a suffix of
/// AllSlotSuffixes() and a non-empty <var>); if so and `primary` is not
/// null, sets it to <var>.
bool IsSlotName(const std::string& name, std::string* primary = nullptr);
/// Whether `name` is kBeta1PowerName or kBeta2PowerName.
bool IsBetaPowerName(const std::string& name);

/// Adam's step size for the current beta powers, computed in float as
/// apply_adam does: lr * sqrt(1 - beta2_power) / (1 - beta1_power).
float AdamStepSize(float learning_rate, float beta1_power, float beta2_power);

/// One update of `n` elements of a variable with gradient `grad`:
///   kSgd      var -= grad * lr                         (slots unused)
///   kMomentum slot0 = accum (apply_momentum)            (slot1 unused)
///   kAdam     slot0 = m, slot1 = v, lr = the step size (AdamStepSize)
/// Elementwise, so the result does not depend on how `device` splits it.
/// Runs the device's ApplyGradientDescent / ApplyMomentum / ApplyAdam; the
/// second form on a CPU device around `device`.
Status ApplyDense(const OptimizerOptions& optimizer, float lr, float* var, const float* grad, float* slot0,
                  float* slot1, int64_t n, compute::Device& device);
void ApplyDense(const OptimizerOptions& optimizer, float lr, float* var, const float* grad, float* slot0,
                float* slot1, int64_t n, const Eigen::ThreadPoolDevice& device);

}  // namespace foreman::nn::internal
