// VariableStore: the model's state as named tensors, and TF's global_step.
//
// Names follow TF's variable names ("dense/kernel", "dense/kernel/Adam",
// "global_step"): a checkpoint saves exactly these names, so a store saved by
// Foreman restores in TensorFlow and the other way round. A name matches
// TF's op-name pattern [A-Za-z0-9.][A-Za-z0-9_.\-/]*.
//
// Usage:
//   ```cpp
//   foreman::VariableStore vars;
//   FOREMAN_RETURN_IF_ERROR(vars.Create("dense/kernel", foreman::Tensor(foreman::DataType::kFloat, {784, 10})));
//   FOREMAN_RETURN_IF_ERROR(foreman::CreateGlobalStep(vars));      // int64 scalar, 0
//   FOREMAN_ASSIGN_OR_RETURN(int64_t step, foreman::GetGlobalStep(vars));
//   ```
//
// Pointers returned by Get() stay valid until that variable is deleted or the
// store destroyed. Thread-compatible: the training thread owns the store; a
// checkpoint copies it with Snapshot() at a step boundary on that thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "foreman/status.hpp"
#include "foreman/tensor.hpp"

namespace foreman {

class VariableStore {
 public:
  VariableStore() = default;
  VariableStore(const VariableStore&) = delete;
  VariableStore& operator=(const VariableStore&) = delete;

  /// Adds a variable holding `initial`. `trainable` is TF's flag: optimizers
  /// update trainable variables only (global_step and slots are not).
  /// INVALID_ARGUMENT for a malformed name or a kInvalid tensor;
  /// ALREADY_EXISTS when the name is taken.
  Status Create(const std::string& name, Tensor initial, bool trainable = true);

  /// The variable's tensor, owned by the store. NOT_FOUND naming the variable.
  StatusOr<Tensor*> Get(const std::string& name);
  StatusOr<const Tensor*> Get(const std::string& name) const;

  /// Replaces the value; INVALID_ARGUMENT unless dtype and shape match the
  /// current ones (message names the variable, expected and actual);
  /// NOT_FOUND when missing.
  Status Assign(const std::string& name, const Tensor& value);

  /// NOT_FOUND when missing.
  Status Delete(const std::string& name);

  bool Contains(const std::string& name) const { return vars_.count(name) != 0; }
  /// NOT_FOUND when missing.
  StatusOr<bool> IsTrainable(const std::string& name) const;
  std::size_t size() const { return vars_.size(); }

  /// All names, sorted bytewise (the order of a checkpoint's index).
  std::vector<std::string> Names() const;
  /// The trainable names, sorted (TF: tf.trainable_variables()).
  std::vector<std::string> TrainableNames() const;

  /// A deep copy of every value, keyed by name (what a checkpoint writes).
  std::map<std::string, Tensor> Snapshot() const;

  /// Sum of TotalBytes() over all variables.
  std::size_t TotalBytes() const;

  /// INVALID_ARGUMENT "invalid variable name '<name>'" unless `name` matches
  /// TF's pattern above.
  static Status ValidateName(const std::string& name);

 private:
  struct Variable {
    Tensor value;
    bool trainable = true;
  };
  // unique_ptr keeps Tensor addresses stable across inserts.
  std::map<std::string, std::unique_ptr<Variable>> vars_;
};

// -- training_util (TF: tf.compat.v1.train.*global_step*) -----------------------

/// The global step variable's name.
inline constexpr char kGlobalStepName[] = "global_step";

/// Creates `global_step`, an int64 scalar, non-trainable, initial 0 (TF:
/// create_global_step).
/// ALREADY_EXISTS "global_step already exists." when present.
Status CreateGlobalStep(VariableStore& vars);

/// The value of `global_step` (TF: global_step(sess, get_global_step())).
/// NOT_FOUND when it does not exist (a stock hook reports FAILED_PRECONDITION
/// "Global step should be created to use <Hook>.");
/// INVALID_ARGUMENT when it is not an integer (int32/int64) scalar.
StatusOr<int64_t> GetGlobalStep(const VariableStore& vars);

/// GetGlobalStep(), creating the variable first when it is missing (TF:
/// get_or_create_global_step).
StatusOr<int64_t> GetOrCreateGlobalStep(VariableStore& vars);

/// Sets `global_step` to `value`; errors as GetGlobalStep().
Status SetGlobalStep(VariableStore& vars, int64_t value);

/// Adds `delta` to `global_step` (what optimizer.minimize(global_step=...)
/// does after an update) and returns the new value; errors as GetGlobalStep(),
/// and FAILED_PRECONDITION when the sum overflows int64 (the step is
/// unchanged; not OUT_OF_RANGE, which a step returns to stop cleanly).
StatusOr<int64_t> IncrementGlobalStep(VariableStore& vars, int64_t delta = 1);

}  // namespace foreman
