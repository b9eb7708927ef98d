#include "foreman/variable_store.hpp"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "foreman/compute.hpp"
#include "platform/log.hpp"
#include "runtime/variable_store_access.hpp"

namespace foreman {

namespace {

bool IsNameStart(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.';
}

bool IsNameChar(char c) { return IsNameStart(c) || c == '_' || c == '-' || c == '/'; }

Status NotFound(const std::string& name) {
  return absl::NotFoundError(absl::StrCat("variable '", name, "' not found"));
}

}  // namespace

// A variable's copy in a device's memory; whichever side was written last
// holds the value (variable_store.hpp, "Device residency").
struct VariableStore::DeviceCopy {
  compute::Device* device = nullptr;
  std::weak_ptr<const void> lifetime;  // the device's: a destroyed device freed `ptr` itself
  void* ptr = nullptr;
  bool device_newer = false;  // the device wrote it since the host copy was made
  bool host_newer = true;     // the host wrote it since the device copy was made
  std::string device_name;  // the device's, for an error after it is gone
  DeviceCopy(compute::Device* d, void* p) : device(d), lifetime(d->lifetime()), ptr(p), device_name(d->name()) {}
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  ~DeviceCopy() {
    if (!lifetime.expired()) device->Deallocate(ptr);
  }
};

VariableStore::Variable::~Variable() = default;
VariableStore::VariableStore() = default;
VariableStore::~VariableStore() = default;

Status VariableStore::SyncToHost(const Variable& var) const {
  if (var.device != nullptr && var.device->lifetime.expired()) {
    FOREMAN_RETURN_IF_ERROR(internal::VariableStoreAccess::ForgetDestroyedDevice(*this));
  }
  DeviceCopy* copy = var.device.get();
  if (copy == nullptr || !copy->device_newer) return absl::OkStatus();
  // const: the host copy is a cache of the value; refreshing it is not a change.
  Tensor& host = const_cast<Tensor&>(var.value);
  FOREMAN_RETURN_IF_ERROR(
      copy->device->CopyToHost(host.raw_data(), copy->ptr, static_cast<int64_t>(host.TotalBytes())));
  copy->device_newer = false;
  return absl::OkStatus();
}

StatusOr<void*> VariableStore::DeviceData(const std::string& name, compute::Device& device) {
  FOREMAN_ASSIGN_OR_RETURN(const void* p, static_cast<const VariableStore&>(*this).DeviceData(name, device));
  // The step writes it there: from now on the device holds the value.
  Variable& var = *vars_.find(name)->second;
  if (var.device != nullptr) var.device->device_newer = true;
  return const_cast<void*>(p);
}

StatusOr<const void*> VariableStore::DeviceData(const std::string& name, compute::Device& device) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return NotFound(name);
  Variable& var = *it->second;
  if (var.value.dtype() == DataType::kString) {
    return absl::InvalidArgumentError(
        absl::StrCat("variable '", name, "' holds strings, which cannot live on device ", device.name()));
  }
  // A resident device destroyed without ReleaseDevice (perhaps `device` is
  // a new one at its address): its copies are gone.
  if (var.device != nullptr ? var.device->lifetime.expired() : resident_ != nullptr) {
    FOREMAN_RETURN_IF_ERROR(internal::VariableStoreAccess::ForgetDestroyedDevice(*this));
  }
  if (resident_ != nullptr && resident_ != &device) {
    FOREMAN_RETURN_IF_ERROR(const_cast<VariableStore*>(this)->ReleaseDevice(*resident_));
  }
  if (device.host_memory()) return static_cast<const void*>(var.value.raw_data());
  const auto bytes = static_cast<int64_t>(var.value.TotalBytes());
  if (var.device == nullptr) {
    FOREMAN_ASSIGN_OR_RETURN(void* ptr, device.Allocate(bytes));
    var.device = std::make_unique<DeviceCopy>(&device, ptr);
    resident_ = &device;
  }
  DeviceCopy& copy = *var.device;
  if (copy.host_newer) {
    FOREMAN_RETURN_IF_ERROR(device.CopyToDevice(copy.ptr, var.value.raw_data(), bytes));
    copy.host_newer = false;
  }
  return static_cast<const void*>(copy.ptr);
}

Status VariableStore::ReleaseDevice(compute::Device& device) {
  if (resident_ != &device) return absl::OkStatus();
  FOREMAN_RETURN_IF_ERROR(internal::VariableStoreAccess::ForgetDestroyedDevice(*this));
  if (resident_ == nullptr) return absl::OkStatus();  // it was destroyed, nothing newer lost
  Status first;
  for (auto& [name, var] : vars_) {
    if (var->device == nullptr) continue;
    if (Status s = SyncToHost(*var); !s.ok() && first.ok()) {
      first = Annotate(s, absl::StrCat("copying variable '", name, "' back from ", device.name()));
    }
    var->device.reset();
  }
  resident_ = nullptr;
  return first;
}

compute::Device* VariableStore::resident_device() const { return resident_; }

namespace internal {

const void* VariableStoreAccess::DeviceNewerData(const VariableStore& vars, const std::string& name) {
  auto it = vars.vars_.find(name);
  if (it == vars.vars_.end()) return nullptr;
  const VariableStore::DeviceCopy* copy = it->second->device.get();
  return copy != nullptr && copy->device_newer ? copy->ptr : nullptr;
}

Status VariableStoreAccess::ForgetDestroyedDevice(const VariableStore& vars) {
  if (vars.resident_ == nullptr) return absl::OkStatus();
  // Every copy is on the one resident device: the first tells whether it lives.
  const VariableStore::DeviceCopy* first = nullptr;
  for (const auto& [name, var] : vars.vars_) {
    if (var->device != nullptr) {
      first = var->device.get();
      break;
    }
  }
  if (first != nullptr && !first->lifetime.expired()) return absl::OkStatus();
  const std::string device_name = first != nullptr ? first->device_name : std::string();
  std::string lost;
  for (const auto& [name, var] : vars.vars_) {
    if (var->device == nullptr) continue;
    if (var->device->device_newer) absl::StrAppend(&lost, lost.empty() ? "'" : ", '", name, "'");
    var->device.reset();  // frees nothing: the device freed its memory
  }
  vars.resident_ = nullptr;
  if (lost.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the newer values of variable(s) ", lost, " on ", device_name,
      " were lost: the device was destroyed before VariableStore::ReleaseDevice; the host copies keep older values"));
}

const Tensor* VariableStoreAccess::HostTensor(const VariableStore& vars, const std::string& name) {
  auto it = vars.vars_.find(name);
  return it == vars.vars_.end() ? nullptr : &it->second->value;
}

}  // namespace internal

Status VariableStore::ValidateName(const std::string& name) {
  bool ok = !name.empty() && IsNameStart(name[0]);
  for (std::size_t i = 1; ok && i < name.size(); ++i) ok = IsNameChar(name[i]);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid variable name '", name, "': expected [A-Za-z0-9.][A-Za-z0-9_.\\-/]*"));
}

Status VariableStore::Create(const std::string& name, Tensor initial, bool trainable) {
  FOREMAN_RETURN_IF_ERROR(ValidateName(name));
  if (initial.dtype() == DataType::kInvalid) {
    return absl::InvalidArgumentError(absl::StrCat("variable '", name, "': initial value has no dtype"));
  }
  auto [it, inserted] = vars_.try_emplace(name);
  if (!inserted) return absl::AlreadyExistsError(absl::StrCat("variable '", name, "' already exists"));
  it->second = std::make_unique<Variable>();
  it->second->value = std::move(initial);
  it->second->trainable = trainable;
  return absl::OkStatus();
}

StatusOr<Tensor*> VariableStore::Get(const std::string& name) {
  auto it = vars_.find(name);
  if (it == vars_.end()) return NotFound(name);
  Variable& var = *it->second;
  if (var.device != nullptr) {
    if (Status s = SyncToHost(var); !s.ok()) return Annotate(s, absl::StrCat("variable '", name, "'"));
    // The caller may write through the pointer (null: a destroyed device's
    // copy was just dropped).
    if (var.device != nullptr) var.device->host_newer = true;
  }
  return &var.value;
}

StatusOr<const Tensor*> VariableStore::Get(const std::string& name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return NotFound(name);
  if (Status s = SyncToHost(*it->second); !s.ok()) return Annotate(s, absl::StrCat("variable '", name, "'"));
  return &it->second->value;
}

Status VariableStore::Assign(const std::string& name, const Tensor& value) {
  auto it = vars_.find(name);
  if (it == vars_.end()) return NotFound(name);
  Variable& var = *it->second;
  Status s = value.CheckDataType(var.value.dtype());
  if (s.ok()) s = value.CheckShape(var.value.shape());
  if (!s.ok()) return Annotate(s, absl::StrCat("assigning to variable '", name, "'"));
  var.value = value;  // the whole value: a newer device copy is simply replaced
  if (var.device != nullptr) {
    var.device->device_newer = false;
    var.device->host_newer = true;
  }
  return absl::OkStatus();
}

Status VariableStore::Delete(const std::string& name) {
  if (vars_.erase(name) == 0) return NotFound(name);
  return absl::OkStatus();
}

StatusOr<bool> VariableStore::IsTrainable(const std::string& name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return NotFound(name);
  return it->second->trainable;
}

std::vector<std::string> VariableStore::Names() const {
  std::vector<std::string> names;
  names.reserve(vars_.size());
  for (const auto& [name, var] : vars_) names.push_back(name);
  return names;
}

std::vector<std::string> VariableStore::TrainableNames() const {
  std::vector<std::string> names;
  for (const auto& [name, var] : vars_) {
    if (var->trainable) names.push_back(name);
  }
  return names;
}

StatusOr<std::map<std::string, Tensor>> VariableStore::SnapshotOrError() const {
  std::map<std::string, Tensor> copy;
  for (const auto& [name, var] : vars_) {
    if (Status s = SyncToHost(*var); !s.ok()) return Annotate(s, absl::StrCat("variable '", name, "'"));
    copy.emplace(name, var->value);
  }
  return copy;
}

std::map<std::string, Tensor> VariableStore::Snapshot() const {
  std::map<std::string, Tensor> copy;
  for (const auto& [name, var] : vars_) {
    if (Status s = SyncToHost(*var); !s.ok()) {
      FOREMAN_LOG_WARN("VariableStore::Snapshot: variable '{}' left out: {}", name, s.ToString());
      continue;
    }
    copy.emplace(name, var->value);
  }
  return copy;
}

std::size_t VariableStore::TotalBytes() const {
  std::size_t n = 0;
  for (const auto& [name, var] : vars_) n += var->value.TotalBytes();
  return n;
}

// -- training_util --------------------------------------------------------------

namespace {

// The global step tensor, checked to be an integer scalar (B124). Through
// the non-const store the non-const Get(): a writer makes the host copy the
// newer one (a device copy is refreshed before a step uses it).
template <class Store>
auto GlobalStepTensor(Store& vars) -> decltype(vars.Get(std::string())) {
  static const std::string name(kGlobalStepName);  // no temporary string per lookup (every step)
  auto t = vars.Get(name);
  if (absl::IsNotFound(t.status())) {
    return absl::NotFoundError("global_step not found: create it with CreateGlobalStep()");
  }
  if (!t.ok()) return t.status();  // a device's failed copy back
  const Tensor& v = **t;
  if ((v.dtype() != DataType::kInt64 && v.dtype() != DataType::kInt32) || v.shape().rank() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("global_step must be an integer scalar, got ",
                                                   DataTypeName(v.dtype()), v.shape().ToString()));
  }
  return *t;
}

}  // namespace

Status CreateGlobalStep(VariableStore& vars) {
  if (vars.Contains(kGlobalStepName)) return absl::AlreadyExistsError("global_step already exists.");
  return vars.Create(kGlobalStepName, Tensor::Scalar<int64_t>(0), /*trainable=*/false);
}

StatusOr<int64_t> GetGlobalStep(const VariableStore& vars) {
  FOREMAN_ASSIGN_OR_RETURN(const Tensor* t, GlobalStepTensor(vars));
  if (t->dtype() == DataType::kInt32) return int64_t{*t->data<int32_t>()};
  return *t->data<int64_t>();
}

StatusOr<int64_t> GetOrCreateGlobalStep(VariableStore& vars) {
  if (!vars.Contains(kGlobalStepName)) FOREMAN_RETURN_IF_ERROR(CreateGlobalStep(vars));
  return GetGlobalStep(vars);
}

Status SetGlobalStep(VariableStore& vars, int64_t value) {
  FOREMAN_ASSIGN_OR_RETURN(Tensor * t, GlobalStepTensor(vars));
  if (t->dtype() == DataType::kInt32) {
    if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("global_step is int32 and cannot hold ", value));
    }
    *t->data<int32_t>() = static_cast<int32_t>(value);
  } else {
    *t->data<int64_t>() = value;
  }
  return absl::OkStatus();
}

StatusOr<int64_t> IncrementGlobalStep(VariableStore& vars, int64_t delta) {
  FOREMAN_ASSIGN_OR_RETURN(int64_t step, GetGlobalStep(vars));
  int64_t next = 0;
  if (__builtin_add_overflow(step, delta, &next)) {
    // Not OUT_OF_RANGE: from a step function that would read as a clean stop.
    return absl::FailedPreconditionError(absl::StrCat("global_step ", step, " + ", delta, " overflows int64"));
  }
  FOREMAN_RETURN_IF_ERROR(SetGlobalStep(vars, next));
  return next;
}

}  // namespace foreman
