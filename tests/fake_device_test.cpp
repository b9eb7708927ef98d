// FakeDevice (tests/support/fake_device.hpp), the test double for a device
// without host memory: its pointer checks, capture and replay (device scalars
// read at replay), memory limit and injected failures.
#include "support/fake_device.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

namespace foreman::testing {
namespace {

using compute::DeviceScalar;

float* AllocFloats(FakeDevice& d, int64_t n) {
  StatusOr<void*> p = d.Allocate(n * 4);
  REQUIRE(p.ok());
  return static_cast<float*>(*p);
}

std::vector<float> Read(FakeDevice& d, const float* p, int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  REQUIRE(d.CopyToHost(out.data(), p, n * 4).ok());
  return out;
}

TEST_CASE("a host pointer where device memory is needed is INVALID_ARGUMENT naming the op and operand") {
  FakeDevice d;
  CHECK_FALSE(d.host_memory());
  CHECK(d.name() == "/fake:0");
  float* var = AllocFloats(d, 4);
  std::vector<float> host_grad(4, 1.0f);
  Status s = d.ApplyGradientDescent(var, host_grad.data(), 4, 0.5f);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("ApplyGradientDescent: grad") != std::string::npos);
  CHECK(std::string(s.message()).find("/fake:0") != std::string::npos);

  // A range running past its block is caught too.
  float* grad = AllocFloats(d, 4);
  s = d.ApplyGradientDescent(var, grad, 5, 0.5f);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);

  // A copy's host side must be host memory.
  s = d.CopyToDevice(var, grad, 16);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("CopyToDevice: source") != std::string::npos);

  // A stats pointer of the host-stats forward must be host memory; the
  // device-stats form needs device memory.
  compute::SoftmaxXentArgs xent;
  int32_t* labels = static_cast<int32_t*>(*d.Allocate(4));
  xent.logits = var;
  xent.labels = labels;
  xent.rows = 1;
  xent.classes = 4;
  compute::SoftmaxXentStats host_stats;
  CHECK(d.SoftmaxXentForwardToDevice(xent, &host_stats).code() == absl::StatusCode::kInvalidArgument);
  auto* dev_stats = static_cast<compute::SoftmaxXentStats*>(*d.Allocate(sizeof(compute::SoftmaxXentStats)));
  CHECK(d.SoftmaxXentForward(xent, dev_stats).code() == absl::StatusCode::kInvalidArgument);

  // Freed memory is no longer device memory.
  d.Deallocate(grad);
  CHECK(d.ApplyGradientDescent(var, grad, 4, 0.5f).code() == absl::StatusCode::kInvalidArgument);
  d.Deallocate(grad);
  CHECK(d.bad_deallocations() == 1);
}

TEST_CASE("operations on device memory compute as the CPU device and copies are counted") {
  FakeDevice d;
  float* var = AllocFloats(d, 3);
  float* grad = AllocFloats(d, 3);
  const float v0[3] = {1, 2, 3}, g0[3] = {1, 1, 2};
  REQUIRE(d.CopyToDevice(var, v0, 12).ok());
  REQUIRE(d.CopyToDevice(grad, g0, 12).ok());
  REQUIRE(d.ApplyGradientDescent(var, grad, 3, 0.5f).ok());
  CHECK(Read(d, var, 3) == std::vector<float>{0.5f, 1.5f, 2.0f});
  CHECK(d.copies_to_device() == 2);
  CHECK(d.bytes_to_device() == 24);
  CHECK(d.copies_to_host() == 1);
  CHECK(d.bytes_to_host() == 12);
  float out[3] = {0, 0, 0};
  compute::HostCopy copy{out, var, 12};
  REQUIRE(d.CopyToHostBatch(&copy, 1).ok());
  CHECK(out[2] == 2.0f);
  CHECK(d.host_batches() == 1);
  CHECK(d.allocated_bytes() == 24);
  d.Deallocate(var);
  CHECK(d.allocated_bytes() == 12);
  CHECK(d.peak_allocated_bytes() == 24);
  CHECK(d.live_blocks() == 1);
}

TEST_CASE("capture records without running; replay runs with the device scalars' values at replay") {
  FakeDevice d;
  REQUIRE(d.supports_capture());
  float* var = AllocFloats(d, 2);
  float* grad = AllocFloats(d, 2);
  float* lr = AllocFloats(d, 1);
  const float v0[2] = {10, 20}, g0[2] = {1, 2}, lr0 = 1.0f;
  REQUIRE(d.CopyToDevice(var, v0, 8).ok());
  REQUIRE(d.CopyToDevice(grad, g0, 8).ok());
  REQUIRE(d.CopyToDevice(lr, &lr0, 4).ok());

  REQUIRE(d.BeginCapture().ok());
  CHECK(d.BeginCapture().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(d.ApplyGradientDescent(var, grad, 2, DeviceScalar{lr}).ok());
  // Argument checks still run while recording.
  std::vector<float> host(2);
  CHECK(d.ApplyGradientDescent(var, host.data(), 2, DeviceScalar{lr}).code() == absl::StatusCode::kInvalidArgument);
  StatusOr<std::unique_ptr<compute::CapturedOps>> ops = d.EndCapture();
  REQUIRE(ops.ok());
  CHECK(d.captures() == 1);
  CHECK(Read(d, var, 2) == std::vector<float>{10, 20});  // not run

  REQUIRE((*ops)->Replay().ok());
  CHECK(Read(d, var, 2) == std::vector<float>{9, 18});
  const float lr1 = 2.0f;
  REQUIRE(d.CopyToDevice(lr, &lr1, 4).ok());
  REQUIRE((*ops)->Replay().ok());
  CHECK(Read(d, var, 2) == std::vector<float>{7, 14});  // the rate read at replay
  CHECK(d.replays() == 2);

  // A block freed after the capture is caught at replay.
  d.Deallocate(grad);
  CHECK((*ops)->Replay().code() == absl::StatusCode::kInvalidArgument);
  CHECK(d.EndCapture().status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("an operation that needs the host spoils the capture") {
  FakeDevice d;
  float* p = AllocFloats(d, 1);
  float host = 0;
  for (int which = 0; which < 4; ++which) {
    CAPTURE(which);
    REQUIRE(d.BeginCapture().ok());
    Status s = which == 0   ? d.CopyToHost(&host, p, 4)
               : which == 1 ? d.Allocate(4).status()
               : which == 2 ? d.Synchronize()
                            : d.CopyToDevice(p, &host, 4);
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(d.EndCapture().status().code() == absl::StatusCode::kFailedPrecondition);
  }
  CHECK(d.captures() == 0);
  FakeDevice eager(FakeDevice::Options{"/fake:1", 0, /*capture=*/false});
  CHECK_FALSE(eager.supports_capture());
  CHECK(eager.BeginCapture().code() == absl::StatusCode::kUnimplemented);
}

TEST_CASE("the memory limit gives RESOURCE_EXHAUSTED naming the device and the size") {
  FakeDevice d(FakeDevice::Options{"/fake:3", 1000, true});
  StatusOr<void*> a = d.Allocate(600);
  REQUIRE(a.ok());
  StatusOr<void*> b = d.Allocate(500);
  CHECK(b.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(b.status().message()).find("/fake:3") != std::string::npos);
  CHECK(std::string(b.status().message()).find("500 bytes") != std::string::npos);
  d.Deallocate(*a);
  CHECK(d.Allocate(500).ok());
  CHECK(d.Allocate(-1).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("injected failures: once, after N operations, sticky, and in a replay") {
  FakeDevice d;
  float* var = AllocFloats(d, 1);
  float* grad = AllocFloats(d, 1);
  d.FailNextOperation(Status());
  Status s = d.ApplyGradientDescent(var, grad, 1, 1.0f);
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(d.ApplyGradientDescent(var, grad, 1, 1.0f).ok());  // once only

  d.InjectFailure(2, absl::InternalError("boom"), /*sticky=*/true);
  CHECK(d.ApplyGradientDescent(var, grad, 1, 1.0f).ok());
  CHECK(d.ApplyGradientDescent(var, grad, 1, 1.0f).ok());
  CHECK(d.ApplyGradientDescent(var, grad, 1, 1.0f).code() == absl::StatusCode::kInternal);
  float host = 0;
  CHECK(d.CopyToHost(&host, var, 4).code() == absl::StatusCode::kInternal);  // sticky
  CHECK(d.Allocate(4).status().code() == absl::StatusCode::kInternal);
  d.ClearFailure();
  CHECK(d.CopyToHost(&host, var, 4).ok());

  REQUIRE(d.BeginCapture().ok());
  REQUIRE(d.ApplyGradientDescent(var, grad, 1, 1.0f).ok());
  REQUIRE(d.ApplyGradientDescent(var, grad, 1, 1.0f).ok());
  auto ops = d.EndCapture();
  REQUIRE(ops.ok());
  d.InjectFailure(1, absl::InternalError("kernel 2 failed"));
  s = (*ops)->Replay();
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(std::string(s.message()) == "kernel 2 failed");
}

TEST_CASE("FakeDeviceFactory makes sessions' /fake:N devices") {
  FakeDevice* last = nullptr;
  compute::SetFakeDeviceFactoryForTesting(FakeDeviceFactory(&last));
  StatusOr<std::unique_ptr<compute::Device>> dev = compute::CreateDevice("/fake:2", 1, 4096);
  compute::SetFakeDeviceFactoryForTesting(nullptr);
  REQUIRE(dev.ok());
  CHECK((*dev)->name() == "/fake:2");
  REQUIRE(last == dev->get());
  CHECK(last->Allocate(8192).status().code() == absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace foreman::testing
