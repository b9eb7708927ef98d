// Device strings and device creation (device_factory.hpp).
#include "compute/device_factory.hpp"

#include <algorithm>
#include <cctype>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "compute/cpu_device.hpp"
#include "compute/cuda_device.hpp"
#include "foreman/cuda.hpp"

namespace foreman::compute {

namespace {

std::string What(const std::string& device) { return "SessionConfig.device '" + device + "'"; }

DeviceFactoryForTesting& FakeFactory() {
  static auto* factory = new DeviceFactoryForTesting();
  return *factory;
}

}  // namespace

void SetFakeDeviceFactoryForTesting(DeviceFactoryForTesting factory) { FakeFactory() = std::move(factory); }

std::string DeviceSpec::canonical() const {
  return absl::StrCat(kind == Kind::kCpu ? "/cpu:" : "/gpu:", index);
}

StatusOr<DeviceSpec> ParseDeviceSpec(const std::string& device) {
  std::string lower = device;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (absl::StartsWith(lower, "/device:")) lower = "/" + lower.substr(8);
  DeviceSpec spec;
  if (lower.empty() || lower == "/cpu") return spec;
  std::string digits;
  if (absl::StartsWith(lower, "/cpu:")) {
    digits = lower.substr(5);
  } else if (absl::StartsWith(lower, "/gpu:")) {
    spec.kind = DeviceSpec::Kind::kGpu;
    digits = lower.substr(5);
  }
  const bool all_digits = !digits.empty() && digits.size() <= 9 &&
                          std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); });
  if (!all_digits || !absl::SimpleAtoi(digits, &spec.index)) {
    return absl::InvalidArgumentError(What(device) + " is not a device name (use \"\", \"/cpu:0\" or \"/gpu:N\")");
  }
  return spec;
}

StatusOr<std::unique_ptr<Device>> CreateDevice(const std::string& device, int intra_op_threads,
                                               int64_t memory_limit_bytes) {
  if (memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SessionConfig.device_memory_limit_bytes must be >= 0, got ", memory_limit_bytes));
  }
  if (FakeFactory() && absl::StartsWith(device, "/fake:")) return FakeFactory()(device, memory_limit_bytes);
  FOREMAN_ASSIGN_OR_RETURN(DeviceSpec spec, ParseDeviceSpec(device));
  if (spec.kind == DeviceSpec::Kind::kCpu) {
    if (spec.index != 0) {
      return absl::FailedPreconditionError(What(device) + ": no such device (the CPU is \"/cpu:0\")");
    }
    FOREMAN_ASSIGN_OR_RETURN(CpuIsa max_isa, MaxCpuIsaFromEnv());
    return std::unique_ptr<Device>(std::make_unique<CpuDevice>(intra_op_threads, max_isa));
  }
  if (!cuda::BuiltWithCuda()) {
    return absl::FailedPreconditionError(What(device) + " needs CUDA, but Foreman was built without it");
  }
  // Discovery reports a missing driver or device as UNAVAILABLE; for a
  // session that is a precondition, not a transient failure to recover from.
  StatusOr<int> count = cuda::DeviceCount();
  if (!count.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(What(device), ": no usable CUDA device: ", count.status().message()));
  }
  if (spec.index >= *count) {
    return absl::FailedPreconditionError(
        absl::StrCat(What(device), ": no such device, only ", *count, " CUDA device(s) present"));
  }
  StatusOr<std::unique_ptr<Device>> gpu = CreateCudaDevice(spec.index, memory_limit_bytes);
  if (!gpu.ok()) {
    // The device's own message names "/gpu:N"; the user's spelling too.
    return Status(gpu.status().code(), absl::StrCat(What(device), ": ", gpu.status().message()));
  }
  return gpu;
}

}  // namespace foreman::compute
