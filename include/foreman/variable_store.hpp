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

namespace compute {
class Device;
}
namespace internal {
class VariableStoreAccess;
}

class VariableStore {
 public:
  VariableStore();
  ~VariableStore();
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
  /// Newer device values are copied back first; a failed copy (the device's
  /// INTERNAL) leaves that name out and is logged (use SnapshotOrError).
  std::map<std::string, Tensor> Snapshot() const;
  /// As Snapshot(), with the device's error instead of a partial map.
  StatusOr<std::map<std::string, Tensor>> SnapshotOrError() const;

  // -- Device residency (a session on a GPU) ----------------------------------
  // A variable a step uses on a device whose memory is not host memory gets a
  // device copy; whichever copy was written last is the value. Get(),
  // Assign() and Snapshot() first copy a newer device value back (so hooks,
  // fetches and checkpoints see it); a non-const Get() and Assign() make the
  // host copy the newer one, which DeviceData() copies to the device before
  // the device uses it. Variables no step asks for stay on the host.
  // On a host-memory device (the CPU) DeviceData() is the host Tensor's
  // buffer and nothing is copied.

  /// The variable's buffer in `device`'s memory for a step that reads and
  /// writes it there: allocated on first use, filled from the host copy when
  /// that is newer; afterwards the device copy counts as the newer one.
  /// Stays valid until the variable is deleted, ReleaseDevice(device), or
  /// the store is destroyed. One device at a time holds copies: asking with
  /// another device first releases the first one's (copying back).
  /// NOT_FOUND naming the variable; INVALID_ARGUMENT for a string variable;
  /// the device's RESOURCE_EXHAUSTED / INTERNAL.
  StatusOr<void*> DeviceData(const std::string& name, compute::Device& device);
  /// For a step that only reads it: the host copy stays current too.
  StatusOr<const void*> DeviceData(const std::string& name, compute::Device& device) const;
  /// Copies every value `device` holds newer than the host back, then frees
  /// its copies. Call before destroying the device (Session::Close does);
  /// a no-op for a device holding nothing. The device's INTERNAL when a copy
  /// fails (the copies are freed; those host values stay stale-but-last-known).
  /// A device destroyed without it took its newer values along: the next
  /// DeviceData, Get, Snapshot or ReleaseDevice returns FAILED_PRECONDITION
  /// naming those variables and the device, once (the copies are dropped,
  /// nothing is read from the freed memory); then the host values count.
  Status ReleaseDevice(compute::Device& device);
  /// The device holding copies, or null.
  compute::Device* resident_device() const;

  /// Sum of TotalBytes() over all variables.
  std::size_t TotalBytes() const;

  /// INVALID_ARGUMENT "invalid variable name '<name>'" unless `name` matches
  /// TF's pattern above.
  static Status ValidateName(const std::string& name);

 private:
  friend class internal::VariableStoreAccess;  // the checkpoint snapshot's direct copies
  struct DeviceCopy;                             // a variable's device copy
  struct Variable {
    Tensor value;
    bool trainable = true;
    mutable std::unique_ptr<DeviceCopy> device;  // null: host only
    ~Variable();
  };
  /// Copies a newer device value of `var` back to its host tensor.
  Status SyncToHost(const Variable& var) const;
  mutable compute::Device* resident_ = nullptr;
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
