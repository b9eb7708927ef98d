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

// What CUDA refuses, refused here too (issue 29 point 5): a block of
// another device, and a CopyToHostBatch into pageable host memory (on CUDA
// the copy stream's cudaMemcpyAsync would not be asynchronous; the CUDA
// device checks with cudaPointerGetAttributes).
TEST_CASE("another device's memory, and a CopyToHostBatch into pageable memory, are INVALID_ARGUMENT") {
  FakeDevice d, other(FakeDevice::Options{"/fake:1"});
  float* var = AllocFloats(d, 4);
  float* theirs = AllocFloats(other, 4);
  Status s = d.ApplyGradientDescent(var, theirs, 4, 0.5f);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("/fake:0 ApplyGradientDescent: grad") != std::string::npos);
  CHECK(d.CopyToHost(var, theirs, 16).code() == absl::StatusCode::kInvalidArgument);

  std::vector<float> pageable(4);
  compute::HostCopy copy{pageable.data(), var, 16};
  s = d.CopyToHostBatch(&copy, 1);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("CopyToHostBatch: copies[0].host_dst (16 bytes at 0x") != std::string::npos);
  CHECK(std::string(s.message()).find("is not page-locked host memory") != std::string::npos);
  CHECK(d.host_batches() == 0);

  // Page-locked memory of any device serves (CUDA's is process-wide), but a
  // range must lie inside one tensor's buffer, and only while it lives.
  StatusOr<Tensor> pinned = other.AllocateHostTensor(DataType::kFloat, TensorShape{4});
  REQUIRE(pinned.ok());
  copy.host_dst = pinned->raw_data();
  CHECK(d.CopyToHostBatch(&copy, 1).ok());
  copy.host_dst = pinned->data<float>() + 1;
  CHECK(d.CopyToHostBatch(&copy, 1).code() == absl::StatusCode::kInvalidArgument);
  compute::HostCopy two[] = {{pinned->raw_data(), var, 8}, {pageable.data(), var, 8}};
  s = d.CopyToHostBatch(two, 2);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("copies[1].host_dst") != std::string::npos);
  void* released = pinned->raw_data();
  *pinned = Tensor();
  copy.host_dst = released;
  CHECK(d.CopyToHostBatch(&copy, 1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(d.host_batches() == 1);

  // A string tensor or an empty one is Tensor::Create's: nothing is copied into it.
  StatusOr<Tensor> empty = d.AllocateHostTensor(DataType::kFloat, TensorShape{0});
  REQUIRE(empty.ok());
  CHECK(empty->TotalBytes() == 0);
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
  StatusOr<Tensor> pinned = d.AllocateHostTensor(DataType::kFloat, TensorShape{3});
  REQUIRE(pinned.ok());
  CHECK_FALSE(d.Contains(pinned->raw_data()));
  CHECK(d.host_tensors() == 1);
  compute::HostCopy copy{pinned->raw_data(), var, 12};
  REQUIRE(d.CopyToHostBatch(&copy, 1).ok());
  CHECK(pinned->data<float>()[2] == 2.0f);
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
  for (int which = 0; which < 5; ++which) {
    CAPTURE(which);
    REQUIRE(d.BeginCapture().ok());
    Status s = which == 0   ? d.CopyToHost(&host, p, 4)
               : which == 1 ? d.Allocate(4).status()
               : which == 2 ? d.Synchronize()
               : which == 3 ? d.AllocateHostTensor(DataType::kFloat, TensorShape{1}).status()
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
