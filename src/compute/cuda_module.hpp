// The seam between libforeman and its CUDA plug-in, libforeman_cuda.so
// (cuda_device.cu, built when meson's `cuda` feature finds nvcc): libforeman
// has no link-time dependency on the CUDA runtime; foreman::cuda's functions
// and CreateCudaDevice (cuda_module.cpp) dlopen() the module from
// libforeman's directory on first use — a session asking for "/gpu:N",
// `foreman devices`, `--device auto`'s probe — so a program that never
// touches a GPU starts and runs on a machine without libcudart.
//
// The module follows the CPU kernel modules' rules (cpu_kernels.hpp): hidden
// visibility and a version script, so its one exported symbol is
// foreman_cuda_module_v1, and an ABI check: the table it returns must carry
// kCudaModuleAbi and the FOREMAN_VERSION libforeman was built with (the
// table passes C++ types, Status and std::unique_ptr<Device>, so module and
// library must come from one build). The module links libforeman itself
// (compute::Device, Status), resolved to the copy that loaded it.
#pragma once

#include <cstdint>
#include <memory>

#include "foreman/compute.hpp"
#include "foreman/cuda.hpp"
#include "foreman/status.hpp"

namespace foreman::compute {

/// Bumped whenever CudaModule's layout, a function's meaning or compute::Device's
/// layout (its virtual functions, its members) or an argument struct of
/// foreman/compute.hpp changes: 2 added Device's pipelining (asynchronous, the
/// async copies, markers), 3 GemmArgs::column_sums.
inline constexpr int kCudaModuleAbi = 3;

/// What libforeman_cuda.so provides; each function as foreman/cuda.hpp's or
/// cuda_device.hpp's of the same name documents it (with the module loaded).
struct CudaModule {
  int abi;                      // kCudaModuleAbi
  const char* foreman_version;  // FOREMAN_VERSION of the module's build
  StatusOr<int> (*device_count)();
  StatusOr<cuda::DeviceInfo> (*get_device_info)(int index);
  Status (*self_test)(int index, int n);
  StatusOr<std::unique_ptr<Device>> (*create_device)(int index, int64_t memory_limit_bytes);
  Status (*launch_faulting_kernel)(Device& device);
};

/// The module's file name, installed next to libforeman.
inline constexpr char kCudaModuleFile[] = "libforeman_cuda.so";

/// Loads the module once per process and returns its table, or the reason it
/// cannot be used, again at every call: UNIMPLEMENTED when this libforeman
/// was built without CUDA ("CUDA support was not built ..."), else
/// FAILED_PRECONDITION naming the module's path and dlerror()'s message (the
/// file is missing, or the CUDA runtime it needs, libcudart.so.13, is not on
/// the loader's path), or the ABI/version that does not match. Thread-safe.
StatusOr<const CudaModule*> LoadCudaModule();

}  // namespace foreman::compute

extern "C" {
/// The module's only exported symbol: its table (static storage; never null).
const foreman::compute::CudaModule* foreman_cuda_module_v1();
}
