// SessionConfig.device -> a compute::Device: the one place device strings are
// parsed and devices created (Session::Create calls it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "foreman/compute.hpp"
#include "foreman/status.hpp"

namespace foreman::compute {

/// A parsed device string.
struct DeviceSpec {
  enum class Kind { kCpu, kGpu };
  Kind kind = Kind::kCpu;
  int index = 0;
  /// "/cpu:N" or "/gpu:N".
  std::string canonical() const;
};

/// "" / "/cpu:0" / "/cpu" / "/device:CPU:0" -> CPU 0; "/gpu:N" /
/// "/device:GPU:N" -> GPU N (N decimal digits; letters in either case).
/// INVALID_ARGUMENT naming the string for anything else ("/tpu:0", "/gpu:x",
/// "gpu:0", "/gpu:-1").
StatusOr<DeviceSpec> ParseDeviceSpec(const std::string& device);

/// The device `device` names, with `intra_op_threads` threads for the CPU
/// (>= 1) and at most `memory_limit_bytes` of device memory for a GPU (0: no
/// limit but the device's own; SessionConfig.device_memory_limit_bytes).
/// Errors name the device string; none is UNAVAILABLE or ABORTED:
///   INVALID_ARGUMENT     a malformed device string (ParseDeviceSpec); for
///                        the CPU, an invalid FOREMAN_MAX_ISA (MaxCpuIsaFromEnv)
///   FAILED_PRECONDITION  no such device: "/cpu:N" with N > 0; "/gpu:N" in a
///                        build without CUDA, without a usable driver, or
///                        with fewer than N + 1 CUDA devices
///   RESOURCE_EXHAUSTED   the device's memory (or the limit) ran out while
///                        creating it, naming the device and the size
///   INVALID_ARGUMENT     memory_limit_bytes < 0
StatusOr<std::unique_ptr<Device>> CreateDevice(const std::string& device, int intra_op_threads,
                                               int64_t memory_limit_bytes = 0);

/// Tests only: devices named "/fake:N" (any N) are made by `factory`
/// (null: unregister). Not thread-safe against CreateDevice calls.
using DeviceFactoryForTesting =
    std::function<StatusOr<std::unique_ptr<Device>>(const std::string& device, int64_t memory_limit_bytes)>;
void SetFakeDeviceFactoryForTesting(DeviceFactoryForTesting factory);

}  // namespace foreman::compute
