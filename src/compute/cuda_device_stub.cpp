// foreman::cuda when libforeman was built without nvcc (meson -Dcuda=disabled
// or no nvcc found): the API exists and says why it cannot work.
#include "compute/cuda_device.hpp"

#include "absl/strings/str_cat.h"
#include "foreman/cuda.hpp"

namespace foreman::cuda {

namespace {

Status NotBuilt() {
  return absl::UnimplementedError(
      "CUDA support was not built into this libforeman (configure with -Dcuda=enabled and nvcc on PATH)");
}

}  // namespace

bool BuiltWithCuda() { return false; }
StatusOr<int> DeviceCount() { return NotBuilt(); }
StatusOr<DeviceInfo> GetDeviceInfo(int) { return NotBuilt(); }
Status SelfTest(int, int) { return NotBuilt(); }

}  // namespace foreman::cuda

namespace foreman::compute {

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int index, int64_t) {
  return absl::FailedPreconditionError(
      absl::StrCat("/gpu:", index, ": libforeman was built without CUDA (configure with -Dcuda=enabled and nvcc on PATH)"));
}

Status LaunchFaultingKernelForTesting(Device& device) {
  return absl::FailedPreconditionError(device.name() + ": libforeman was built without CUDA");
}

}  // namespace foreman::compute
