// CUDA device discovery, compiled by nvcc when meson's `cuda` feature is on.
// Without a driver or a device every function returns UNAVAILABLE with the
// CUDA runtime's own message; nothing here aborts.
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "foreman/cuda.hpp"

namespace foreman::cuda {

namespace {

Status FromCuda(cudaError_t err, const char* what) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

__global__ void Saxpy(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

// Device memory freed when it goes out of scope.
struct DeviceBuffer {
  float* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

Status CheckIndex(int index) {
  auto count = DeviceCount();
  if (!count.ok()) return count.status();
  if (index < 0 || index >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device index ", index, " is outside [0, ", *count, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

bool BuiltWithCuda() { return true; }

StatusOr<int> DeviceCount() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return FromCuda(err, "cudaGetDeviceCount");
  }
  return n;
}

StatusOr<DeviceInfo> GetDeviceInfo(int index) {
  FOREMAN_RETURN_IF_ERROR(CheckIndex(index));
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) return FromCuda(err, "cudaGetDeviceProperties");
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.compute_capability_major = prop.major;
  info.compute_capability_minor = prop.minor;
  info.total_memory_bytes = prop.totalGlobalMem;
  info.multiprocessor_count = prop.multiProcessorCount;
  return info;
}

Status SelfTest(int index, int n) {
  FOREMAN_RETURN_IF_ERROR(CheckIndex(index));
  if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("SelfTest: n must be positive, got ", n));
  cudaError_t err = cudaSetDevice(index);
  if (err != cudaSuccess) return FromCuda(err, "cudaSetDevice");
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 1000);
    y[i] = 1.0f;
  }
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  DeviceBuffer dx, dy;
  if ((err = cudaMalloc(&dx.ptr, bytes)) != cudaSuccess) return FromCuda(err, "cudaMalloc");
  if ((err = cudaMalloc(&dy.ptr, bytes)) != cudaSuccess) return FromCuda(err, "cudaMalloc");
  if ((err = cudaMemcpy(dx.ptr, x.data(), bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
      (err = cudaMemcpy(dy.ptr, y.data(), bytes, cudaMemcpyHostToDevice)) != cudaSuccess) {
    return FromCuda(err, "cudaMemcpy to device");
  }
  Saxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, dx.ptr, dy.ptr);
  if ((err = cudaGetLastError()) != cudaSuccess) return FromCuda(err, "Saxpy launch");
  if ((err = cudaMemcpy(y.data(), dy.ptr, bytes, cudaMemcpyDeviceToHost)) != cudaSuccess) {
    return FromCuda(err, "cudaMemcpy to host");
  }
  for (int i = 0; i < n; ++i) {
    const float want = 2.0f * static_cast<float>(i % 1000) + 1.0f;
    if (y[i] != want) {
      return absl::InternalError(absl::StrCat("SelfTest on device ", index, ": y[", i, "] = ", y[i],
                                              ", want ", want));
    }
  }
  return absl::OkStatus();
}

}  // namespace foreman::cuda
