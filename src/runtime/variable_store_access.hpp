// The runtime's own access to a VariableStore's device copies, for the
// checkpoint snapshot (internal::SnapshotInto): it copies the values a device
// holds newer than the host straight into the snapshot's buffers, in one
// batch, without refreshing the store's host copies (which stay as they
// are). Not a public API.
#pragma once

#include <string>

#include "foreman/tensor.hpp"
#include "foreman/variable_store.hpp"

namespace foreman::internal {

class VariableStoreAccess {
 public:
  /// The variable's device copy (on vars.resident_device()) when the device
  /// holds a value newer than the host copy, else null: no such variable,
  /// no device copy, or the host copy is current. Copies nothing.
  static const void* DeviceNewerData(const VariableStore& vars, const std::string& name);
  /// The variable's host tensor as it is, without copying a newer device
  /// value back (its dtype and shape are always current; its elements are
  /// stale when DeviceNewerData is not null). Null for no such variable.
  static const Tensor* HostTensor(const VariableStore& vars, const std::string& name);
  /// When the device holding the store's copies was destroyed without
  /// VariableStore::ReleaseDevice: drops every copy (the device freed their
  /// memory) and returns FAILED_PRECONDITION naming the variables whose newer
  /// values went with it and the device, once. OK otherwise (nothing held,
  /// or the device lives). VariableStore's own guard before it uses a copy.
  static Status ForgetDestroyedDevice(const VariableStore& vars);
};

}  // namespace foreman::internal
