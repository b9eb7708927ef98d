// foreman::cuda on machines with and without CUDA. The no-device cases are
// what CI sees (nvcc installed, no GPU); the device cases run on a GPU box.
#include <doctest/doctest.h>

#include <string>

#include "foreman/cuda.hpp"

namespace {

bool HasDevice() {
  auto n = foreman::cuda::DeviceCount();
  return n.ok() && *n > 0;
}

}  // namespace

TEST_CASE("without nvcc every query says CUDA support was not built") {
  if (foreman::cuda::BuiltWithCuda()) return;
  auto n = foreman::cuda::DeviceCount();
  REQUIRE_FALSE(n.ok());
  CHECK(n.status().code() == absl::StatusCode::kUnimplemented);
  CHECK(std::string(n.status().message()).find("CUDA support was not built") != std::string::npos);
  CHECK(foreman::cuda::GetDeviceInfo(0).status().code() == absl::StatusCode::kUnimplemented);
  CHECK(foreman::cuda::SelfTest(0).code() == absl::StatusCode::kUnimplemented);
}

TEST_CASE("built with CUDA but no device or driver, queries report UNAVAILABLE with the driver's message") {
  if (!foreman::cuda::BuiltWithCuda() || HasDevice()) return;
  auto n = foreman::cuda::DeviceCount();
  REQUIRE_FALSE(n.ok());
  CHECK(n.status().code() == absl::StatusCode::kUnavailable);
  const std::string msg(n.status().message());
  // The CUDA runtime's error name, e.g. cudaErrorNoDevice or cudaErrorInsufficientDriver.
  CHECK(msg.find("cudaGetDeviceCount: cudaError") != std::string::npos);
  auto info = foreman::cuda::GetDeviceInfo(0);
  REQUIRE_FALSE(info.ok());
  CHECK(info.status().code() == absl::StatusCode::kUnavailable);
  CHECK(foreman::cuda::SelfTest(0).code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("with a device, device info is sane and an out-of-range index is INVALID_ARGUMENT") {
  if (!HasDevice()) return;
  const int n = *foreman::cuda::DeviceCount();
  auto info = foreman::cuda::GetDeviceInfo(0);
  REQUIRE(info.ok());
  CHECK_FALSE(info->name.empty());
  CHECK(info->compute_capability_major > 0);
  CHECK(info->total_memory_bytes > 0);
  CHECK(info->multiprocessor_count > 0);
  CHECK(foreman::cuda::GetDeviceInfo(n).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(foreman::cuda::GetDeviceInfo(-1).status().code() == absl::StatusCode::kInvalidArgument);
}
