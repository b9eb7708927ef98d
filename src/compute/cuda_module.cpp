// foreman::cuda (foreman/cuda.hpp) and CreateCudaDevice (cuda_device.hpp) in
// libforeman: each loads the CUDA plug-in, libforeman_cuda.so, on first use
// and calls it (cuda_module.hpp). libforeman itself links no CUDA library.
// FOREMAN_CUDA_MODULE is 1 when meson built the module (nvcc found).
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "compute/cuda_device.hpp"
#include "compute/cuda_module.hpp"
#include "compute/modules.hpp"
#include "foreman/cuda.hpp"
#include "foreman/version.hpp"

#ifndef FOREMAN_CUDA_MODULE
#error "src/meson.build defines FOREMAN_CUDA_MODULE (0 or 1)"
#endif

namespace foreman {

namespace compute {

namespace {

// The module's table, or why it cannot be used (LoadCudaModule, once).
StatusOr<const CudaModule*> OpenCudaModule() {
  std::string path, error;
  using Entry = const CudaModule* (*)();
  auto entry = reinterpret_cast<Entry>(OpenModuleEntry(kCudaModuleFile, "foreman_cuda_module_v1", &path, &error));
  const std::string what = absl::StrCat("the CUDA module ", path);
  if (entry == nullptr) {
    // The hint fits a library the module needs that the loader did not find
    // (dlerror() then starts with that library's name, not the module's).
    const bool missing_dependency = absl::StrContains(error, "cannot open shared object file") &&
                                    !absl::StartsWith(error, path) && !absl::StrContains(error, kCudaModuleFile);
    return absl::FailedPreconditionError(absl::StrCat(
        what, " cannot be loaded: ", error,
        missing_dependency ? " (the module needs the CUDA runtime, libcudart.so.13, on the loader's path)" : "",
        "; without it only the CPU can be used"));
  }
  const CudaModule* table = entry();
  if (table == nullptr || table->abi != kCudaModuleAbi) {
    // Nothing else of a table of another ABI is read: its layout may differ.
    return absl::FailedPreconditionError(absl::StrCat(what, " does not match this libforeman: ABI ",
                                                      table != nullptr ? table->abi : -1, ", want ABI ",
                                                      kCudaModuleAbi, " (install the module of the same build)"));
  }
  if (std::string(table->foreman_version) != FOREMAN_VERSION) {
    return absl::FailedPreconditionError(absl::StrCat(what, " does not match this libforeman: it is Foreman ",
                                                      table->foreman_version, "'s, want Foreman ", FOREMAN_VERSION,
                                                      " (install the module of the same build)"));
  }
  return table;
}

}  // namespace

StatusOr<const CudaModule*> LoadCudaModule() {
  if (!FOREMAN_CUDA_MODULE) {
    return absl::UnimplementedError(
        "CUDA support was not built into this libforeman (configure with -Dcuda=enabled and nvcc on PATH)");
  }
  // Leaked on purpose: read by any thread until the process exits.
  static const auto* loaded = new StatusOr<const CudaModule*>(OpenCudaModule());
  return *loaded;
}

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int index, int64_t memory_limit_bytes) {
  if (!FOREMAN_CUDA_MODULE) {
    return absl::FailedPreconditionError(absl::StrCat(
        "/gpu:", index, ": libforeman was built without CUDA (configure with -Dcuda=enabled and nvcc on PATH)"));
  }
  StatusOr<const CudaModule*> module = LoadCudaModule();
  if (!module.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("/gpu:", index, ": ", module.status().message()));
  }
  return (*module)->create_device(index, memory_limit_bytes);
}

Status LaunchFaultingKernelForTesting(Device& device) {
  StatusOr<const CudaModule*> module = LoadCudaModule();
  if (!module.ok()) return absl::FailedPreconditionError(absl::StrCat(device.name(), ": ", module.status().message()));
  return (*module)->launch_faulting_kernel(device);
}

}  // namespace compute

namespace cuda {

bool BuiltWithCuda() { return FOREMAN_CUDA_MODULE != 0; }

StatusOr<int> DeviceCount() {
  FOREMAN_ASSIGN_OR_RETURN(const compute::CudaModule* module, compute::LoadCudaModule());
  return module->device_count();
}

StatusOr<DeviceInfo> GetDeviceInfo(int index) {
  FOREMAN_ASSIGN_OR_RETURN(const compute::CudaModule* module, compute::LoadCudaModule());
  return module->get_device_info(index);
}

Status SelfTest(int index, int n) {
  FOREMAN_ASSIGN_OR_RETURN(const compute::CudaModule* module, compute::LoadCudaModule());
  return module->self_test(index, n);
}

}  // namespace cuda

}  // namespace foreman
