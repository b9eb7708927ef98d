// CUDA device discovery. Built with nvcc when meson's `cuda` feature finds
// it; otherwise the same functions exist and say CUDA support was not
// built. Never aborts when there is no GPU or driver.
//
// libforeman links no CUDA library: the CUDA code is a plug-in,
// libforeman_cuda.so, installed next to libforeman and dlopen()ed by the
// first call below (or the first session on "/gpu:N"), so a program that
// never asks for a GPU starts on a machine without the CUDA runtime.
//
//   ```cpp
//   auto n = foreman::cuda::DeviceCount();   // StatusOr<int>
//   if (!n.ok()) std::fprintf(stderr, "no GPU: %s\n", n.status().ToString().c_str());  // the driver's message
//   ```
#pragma once

#include <cstdint>
#include <string>

#include "foreman/status.hpp"

namespace foreman::cuda {

/// True when this libforeman was compiled with nvcc.
bool BuiltWithCuda();

/// Number of visible CUDA devices.
///   - built without CUDA: UNIMPLEMENTED "CUDA support was not built ...".
///   - the plug-in cannot be loaded (libforeman_cuda.so missing, or the
///     CUDA runtime libcudart.so.13 it needs is not on the loader's path):
///     FAILED_PRECONDITION naming the module's path and dlerror()'s message.
///   - no driver, no device, or a driver error: UNAVAILABLE with the CUDA
///     runtime's error name and message (cudaErrorNoDevice,
///     cudaErrorInsufficientDriver, ...).
StatusOr<int> DeviceCount();

struct DeviceInfo {
  int index = 0;
  std::string name;                      // "NVIDIA H200"
  int compute_capability_major = 0;      // 9 for sm_90
  int compute_capability_minor = 0;
  uint64_t total_memory_bytes = 0;
  int multiprocessor_count = 0;
};

/// Properties of device `index`. INVALID_ARGUMENT when index is outside
/// [0, DeviceCount()); otherwise errors as DeviceCount().
StatusOr<DeviceInfo> GetDeviceInfo(int index);

/// Runs a tiny kernel on device `index` that computes y = a*x + y on `n`
/// floats and checks the result on the host; proves the device executes
/// Foreman's code. Errors as GetDeviceInfo(); INTERNAL on a wrong result.
Status SelfTest(int index, int n = 1 << 20);

}  // namespace foreman::cuda
