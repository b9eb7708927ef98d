// The asynchronous part of compute::Device's contract (foreman/compute.hpp,
// "Pipelining"), checked the same way on every asynchronous device: the fake
// test device in its asynchronous mode (fake_device_test) and CUDA's /gpu:0
// (cuda_step_test, the gpu suite). Header-only, for doctest binaries.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "foreman/compute.hpp"

namespace foreman::testing {

/// More steps in flight than CUDA's ring of marker events (4,
/// cuda_device.cu): waiting for the oldest marker takes the branch where its
/// event was re-recorded by a newer one.
inline constexpr int kStepsInFlight = 10;

/// Ten steps queued without a wait — each copies its own page-locked input
/// in (CopyToDeviceAsync), applies it to one variable (var -= grad) and
/// copies the variable out into its own page-locked output
/// (CopyToHostAsync), then records a marker. A wait for marker i makes
/// outputs 0..i final, whichever marker the device's ring still holds. Then,
/// where the device captures, one captured step replayed twice reads its
/// input buffer and writes its output buffer as they are at each replay.
/// Ends with the device synchronized and its memory freed.
inline void CheckAsyncCopiesAndMarkers(compute::Device& d) {
  REQUIRE(d.asynchronous());
  // 4 MiB a buffer: on a GPU the steps are still running when the host
  // starts waiting, so that a wait returning early is seen.
  constexpr int64_t n = 1 << 20;
  constexpr int64_t bytes = n * 4;
  StatusOr<void*> var_block = d.Allocate(bytes);
  StatusOr<void*> grad_block = d.Allocate(bytes);
  REQUIRE(var_block.ok());
  REQUIRE(grad_block.ok());
  auto* var = static_cast<float*>(*var_block);
  auto* grad = static_cast<float*>(*grad_block);
  const std::vector<float> zeros(static_cast<std::size_t>(n), 0.0f);
  REQUIRE(d.CopyToDevice(var, zeros.data(), bytes).ok());

  std::vector<Tensor> in, out;
  std::vector<uint64_t> markers;
  for (int i = 0; i < kStepsInFlight; ++i) {
    StatusOr<Tensor> a = d.AllocateHostTensor(DataType::kFloat, TensorShape{n});
    StatusOr<Tensor> b = d.AllocateHostTensor(DataType::kFloat, TensorShape{n});
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    for (int64_t k = 0; k < n; ++k) {
      a->data<float>()[k] = static_cast<float>(i + 1);
      b->data<float>()[k] = 1.0f;  // no step writes a positive value
    }
    in.push_back(*std::move(a));
    out.push_back(*std::move(b));
  }
  for (int i = 0; i < kStepsInFlight; ++i) {
    REQUIRE(d.CopyToDeviceAsync(grad, in[i].raw_data(), bytes).ok());
    REQUIRE(d.ApplyGradientDescent(var, grad, n, 1.0f).ok());
    REQUIRE(d.CopyToHostAsync(out[i].raw_data(), var, bytes).ok());
    StatusOr<uint64_t> m = d.RecordMarker();
    REQUIRE(m.ok());
    if (!markers.empty()) CHECK(*m > markers.back());
    markers.push_back(*m);
  }
  // Step i leaves var = -(1 + 2 + ... + (i + 1)) < 0, exact in float.
  auto expected = [](int i) { return -static_cast<float>((i + 1) * (i + 2) / 2); };
  auto landed = [&](int i) {
    const float* o = out[i].data<float>();
    for (int64_t k = 0; k < n; ++k) {
      if (o[k] != expected(i)) {
        FAIL_CHECK("output of step " << i << "[" << k << "] is " << o[k] << ", want " << expected(i));
        return false;
      }
    }
    return true;
  };
  // The oldest marker first: its event (on CUDA) stands for a newer marker now.
  REQUIRE(d.WaitForMarker(markers[0]).ok());
  CHECK(landed(0));
  REQUIRE(d.WaitForMarker(markers[4]).ok());
  for (int i = 0; i <= 4; ++i) CHECK(landed(i));
  REQUIRE(d.WaitForMarker(markers.back()).ok());
  for (int i = 0; i < kStepsInFlight; ++i) CHECK(landed(i));
  CHECK(d.WaitForMarker(0).ok());
  CHECK(d.WaitForMarker(markers.back() + 1).code() == absl::StatusCode::kInvalidArgument);

  // Pageable host memory cannot take part in an asynchronous copy.
  std::vector<float> pageable(static_cast<std::size_t>(n));
  const Status unpinned = d.CopyToDeviceAsync(grad, pageable.data(), bytes);
  CHECK(unpinned.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(unpinned.message()).find("page-locked") != std::string::npos);

  if (d.supports_capture()) {
    REQUIRE(d.BeginCapture().ok());
    REQUIRE(d.CopyToDeviceAsync(grad, in[0].raw_data(), bytes).ok());
    REQUIRE(d.ApplyGradientDescent(var, grad, n, 1.0f).ok());
    REQUIRE(d.CopyToHostAsync(out[0].raw_data(), var, bytes).ok());
    StatusOr<std::unique_ptr<compute::CapturedOps>> step = d.EndCapture();
    REQUIRE_MESSAGE(step.ok(), step.status().ToString());
    float value = expected(kStepsInFlight - 1);
    for (float g : {5.0f, 7.0f}) {
      CAPTURE(g);
      for (int64_t k = 0; k < n; ++k) in[0].data<float>()[k] = g;  // between replays: read at the next one
      REQUIRE((*step)->Replay().ok());
      StatusOr<uint64_t> m = d.RecordMarker();
      REQUIRE(m.ok());
      REQUIRE(d.WaitForMarker(*m).ok());
      value -= g;
      CHECK(out[0].data<float>()[0] == value);
      CHECK(out[0].data<float>()[n - 1] == value);
    }
  }
  REQUIRE(d.Synchronize().ok());
  d.Deallocate(var);
  d.Deallocate(grad);
}

}  // namespace foreman::testing
