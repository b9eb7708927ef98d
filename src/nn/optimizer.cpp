// TF1's optimizers: option checks, slot names and the dense update kernels
// (training_ops.cc ApplyGradientDescent, ApplyMomentum, ApplyAdam), with
// TF's operation order so the float results round as TF's do.
#include "nn/optimizer.hpp"

#include <algorithm>
#include <cmath>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>

#include "absl/strings/str_cat.h"

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

float AdamStepSize(float learning_rate, float beta1_power, float beta2_power) {
  return learning_rate * std::sqrt(1.0f - beta2_power) / (1.0f - beta1_power);
}

namespace {

using Array = Eigen::Map<Eigen::ArrayXf>;
using ConstArray = Eigen::Map<const Eigen::ArrayXf>;

// Within one shard, the elements go in chunks that stay in L1 between the
// statements of a kernel (TF's ApplyAdamNonCuda does the same).
constexpr Eigen::Index kChunk = 1024;

void ApplyShard(const OptimizerOptions& o, float lr, float* var_p, const float* grad_p, float* s0_p, float* s1_p,
                Eigen::Index first, Eigen::Index last) {
  for (Eigen::Index begin = first; begin < last; begin += kChunk) {
    const Eigen::Index len = std::min(kChunk, last - begin);
    Array var(var_p + begin, len);
    ConstArray grad(grad_p + begin, len);
    switch (o.kind) {
      case OptimizerKind::kSgd:
        var -= grad * lr;
        break;
      case OptimizerKind::kMomentum: {
        Array accum(s0_p + begin, len);
        accum = accum * o.momentum + grad;
        if (o.use_nesterov) {
          var -= grad * lr + accum * o.momentum * lr;
        } else {
          var -= accum * lr;
        }
        break;
      }
      case OptimizerKind::kAdam: {
        Array m(s0_p + begin, len);
        Array v(s1_p + begin, len);
        m += (grad - m) * (1.0f - o.beta1);
        v += (grad.square() - v) * (1.0f - o.beta2);
        var -= (m * lr) / (v.sqrt() + o.epsilon);
        break;
      }
    }
  }
}

}  // namespace

void ApplyDense(const OptimizerOptions& optimizer, float lr, float* var, const float* grad, float* slot0,
                float* slot1, int64_t n, const Eigen::ThreadPoolDevice& device) {
  if (n <= 0) return;
  // Bytes in and out and cycles per element, for Eigen's sharding decision
  // (small variables run inline on the calling thread).
  const int slots = static_cast<int>(SlotSuffixes(optimizer.kind).size());
  const Eigen::TensorOpCost cost(sizeof(float) * (2 + slots), sizeof(float) * (1 + slots),
                                 optimizer.kind == OptimizerKind::kAdam ? 30 : 4);
  device.parallelFor(static_cast<Eigen::Index>(n), cost, [&](Eigen::Index first, Eigen::Index last) {
    ApplyShard(optimizer, lr, var, grad, slot0, slot1, first, last);
  });
}

}  // namespace internal
}  // namespace foreman::nn
