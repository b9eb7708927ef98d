// The gradient-apply seam between a step and the runtime (TF1:
// tf.compat.v1.train.Optimizer's apply_gradients half): a step computes
// Gradients and hands them, with an Optimizer, to
// StepContext::ApplyGradients; on a local session the Optimizer updates the
// session's variables on its compute device, on a cluster session the
// parameter servers apply them with their own. The runtime knows only these
// types: nn::Tf1Optimizer (nn.hpp) implements Optimizer with TF1's SGD,
// Momentum and Adam updates, and nn::Mlp::ComputeGradients fills Gradients.
#pragma once

#include <string>
#include <vector>

#include "foreman/compute.hpp"
#include "foreman/status.hpp"
#include "foreman/tensor.hpp"
#include "foreman/variable_store.hpp"

namespace foreman {

/// The gradients of one step and the arguments of their update: what a
/// worker of a cluster computes on the variables it read and sends to the
/// parameter servers (TF1: optimizer.compute_gradients's grads_and_vars, and
/// the learning-rate and lr_t tensors the apply ops read). A plain value:
/// owns its tensors (copies are deep); thread-compatible.
struct Gradients {
  struct GradAndVar {
    std::string variable;  // the trainable variable's name, "dense/kernel"
    Tensor grad;           // float32, shaped as the variable: d(mean loss)/d(variable)
  };
  /// One entry per trainable variable of the model, sorted by name
  /// ("dense/bias", "dense/kernel", "dense_1/bias", ...). A parameter
  /// server's share is the entries of the variables it holds.
  std::vector<GradAndVar> grads_and_vars;
  /// The rate the step was computed with (nn::Mlp::set_learning_rate's).
  float learning_rate = 0;
  /// Adam's lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power), from the
  /// beta powers read with the variables; 0 for the other optimizers.
  float adam_step_size = 0;
};

/// Applies a step's gradients to variables (TF1: Optimizer.apply_gradients
/// without the global-step increment, which StepContext::ApplyGradients
/// does). Implementations: nn::Tf1Optimizer.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Updates the variables of `vars` named by `grads` (and their slots) on
  /// `device`, the session's compute device (StepContext::compute()).
  /// Nothing is owned; `vars` is the caller's, used by one thread at a
  /// time. Errors are the implementation's (nn::ApplyGradients's for
  /// nn::Tf1Optimizer); an implementation must not update anything when it
  /// returns INVALID_ARGUMENT or NOT_FOUND.
  virtual Status ApplyGradients(const Gradients& grads, VariableStore& vars, compute::Device& device) const = 0;
};

/// Whether `name` is the name of an optimizer's slot variable, TF1's
/// "<var>/Momentum", "<var>/Adam" or "<var>/Adam_1" for a non-empty <var>
/// (the slots of the optimizers Foreman implements). A cluster session reads
/// slots from the parameter servers only for a run that fetches one.
/// Thread-safe.
bool IsOptimizerSlotName(const std::string& name);

}  // namespace foreman
