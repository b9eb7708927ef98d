// FakeDevice (tests/support/fake_device.hpp), the test double for a device
// without host memory: its pointer checks, capture and replay (device scalars
// read at replay), memory limit, injected failures, and the asynchronous mode
// (work queued until the host waits, as on a CUDA stream).
#include "support/fake_device.hpp"

#include "support/async_contract.hpp"

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

FakeDevice::Options Asynchronous() {
  FakeDevice::Options o;
  o.name = "/fake:async";
  o.asynchronous = true;
  return o;
}

TEST_CASE("asynchronous: work runs only when the host waits, async copies read and write at run time") {
  FakeDevice d(Asynchronous());
  CHECK(d.asynchronous());
  CHECK_FALSE(FakeDevice().asynchronous());
  float* var = AllocFloats(d, 2);
  float* grad = AllocFloats(d, 2);
  StatusOr<Tensor> in = d.AllocateHostTensor(DataType::kFloat, TensorShape{2});
  StatusOr<Tensor> out = d.AllocateHostTensor(DataType::kFloat, TensorShape{2});
  REQUIRE(in.ok());
  REQUIRE(out.ok());
  const float v0[2] = {10, 20};
  REQUIRE(d.CopyToDevice(var, v0, 8).ok());
  REQUIRE(d.Synchronize().ok());
  in->data<float>()[0] = 1;
  in->data<float>()[1] = 2;
  out->data<float>()[0] = -1;
  out->data<float>()[1] = -1;

  REQUIRE(d.CopyToDeviceAsync(grad, in->raw_data(), 8).ok());
  REQUIRE(d.ApplyGradientDescent(var, grad, 2, 1.0f).ok());
  REQUIRE(d.CopyToHostAsync(out->raw_data(), var, 8).ok());
  StatusOr<uint64_t> m1 = d.RecordMarker();
  REQUIRE(m1.ok());
  // The input changed after the call, before the device ran: the copy reads it then.
  in->data<float>()[0] = 4;
  CHECK(d.queued_operations() == 3);
  CHECK(out->data<float>()[0] == -1);  // nothing ran yet
  CHECK(d.async_copies_to_device() == 0);

  REQUIRE(d.WaitForMarker(*m1).ok());
  CHECK(d.queued_operations() == 0);
  CHECK(out->data<float>()[0] == 6);  // 10 - 4
  CHECK(out->data<float>()[1] == 18);
  CHECK(d.async_copies_to_device() == 1);
  CHECK(d.async_copies_to_host() == 1);
  CHECK(d.copies_to_host() == 0);

  // A wait runs only the work before its marker; a host operation runs all of it.
  REQUIRE(d.ApplyGradientDescent(var, grad, 2, 1.0f).ok());
  StatusOr<uint64_t> m2 = d.RecordMarker();
  REQUIRE(m2.ok());
  REQUIRE(d.ApplyGradientDescent(var, grad, 2, 1.0f).ok());
  REQUIRE(d.WaitForMarker(*m2).ok());
  CHECK(d.queued_operations() == 1);
  CHECK(d.WaitForMarker(*m1).ok());  // an older marker: already reached
  CHECK(Read(d, var, 2) == std::vector<float>{-2, 14});  // both applied
  CHECK(d.queued_operations() == 0);

  // A marker never recorded is INVALID_ARGUMENT.
  Status s = d.WaitForMarker(*m2 + 1);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("asynchronous copies need page-locked memory; markers are refused inside a capture") {
  for (bool asynchronous : {false, true}) {
    CAPTURE(asynchronous);
    FakeDevice::Options o = Asynchronous();
    o.asynchronous = asynchronous;
    FakeDevice d(o);
    float* p = AllocFloats(d, 2);
    std::vector<float> pageable(2, 1.0f);
    Status s = d.CopyToDeviceAsync(p, pageable.data(), 8);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("is not page-locked host memory") != std::string::npos);
    CHECK(d.CopyToHostAsync(pageable.data(), p, 8).code() == absl::StatusCode::kInvalidArgument);
    StatusOr<Tensor> pinned = d.AllocateHostTensor(DataType::kFloat, TensorShape{2});
    REQUIRE(pinned.ok());
    CHECK(d.CopyToDeviceAsync(pinned->raw_data(), pinned->raw_data(), 8).code() ==
          absl::StatusCode::kInvalidArgument);  // a host pointer as the device side
    CHECK(d.CopyToDeviceAsync(p, pinned->raw_data(), 12).code() ==
          absl::StatusCode::kInvalidArgument);  // past the buffer's end

    // Captured async copies read the host buffer at each replay.
    float* q = AllocFloats(d, 2);
    const float zeros[2] = {0, 0};
    REQUIRE(d.CopyToDevice(q, zeros, 8).ok());
    REQUIRE(d.BeginCapture().ok());
    REQUIRE(d.CopyToDeviceAsync(p, pinned->raw_data(), 8).ok());
    REQUIRE(d.ApplyGradientDescent(q, p, 2, 1.0f).ok());
    auto ops = d.EndCapture();
    REQUIRE(ops.ok());
    for (float g : {1.0f, 3.0f}) {
      pinned->data<float>()[0] = g;
      pinned->data<float>()[1] = g;
      REQUIRE((*ops)->Replay().ok());
      StatusOr<uint64_t> m = d.RecordMarker();
      REQUIRE(m.ok());
      REQUIRE(d.WaitForMarker(*m).ok());
    }
    CHECK(Read(d, q, 2) == std::vector<float>{-4, -4});
    CHECK(d.async_copies_to_device() == 2);

    REQUIRE(d.BeginCapture().ok());
    CHECK(d.RecordMarker().status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(d.EndCapture().status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(d.BeginCapture().ok());
    CHECK(d.WaitForMarker(0).code() == absl::StatusCode::kFailedPrecondition);
    CHECK(d.EndCapture().status().code() == absl::StatusCode::kFailedPrecondition);
  }
}

// The contract cuda_step_test checks on /gpu:0, here on the fake.
TEST_CASE("asynchronous: ten steps in flight, waited for oldest first; a captured step reads its input at each replay") {
  FakeDevice d(Asynchronous());
  CheckAsyncCopiesAndMarkers(d);
  CHECK(d.async_copies_to_device() == kStepsInFlight + 2);
  CHECK(d.async_copies_to_host() == kStepsInFlight + 2);
  CHECK(d.queued_operations() == 0);
  CHECK(d.bad_deallocations() == 0);
}

// Where CUDA may or may not wait the fake does not, so that code missing a
// wait fails here: CopyToDevice goes through a staging buffer
// (cuda_device.cu: it waits at most for a slot, or for all work above
// 1 MiB), and neither allocation is a wait the step may rely on.
TEST_CASE("asynchronous: CopyToDevice, Allocate and AllocateHostTensor wait for nothing queued") {
  FakeDevice d(Asynchronous());
  float* var = AllocFloats(d, 2);
  float* grad = AllocFloats(d, 2);
  float host[2] = {10, 20};
  REQUIRE(d.CopyToDevice(var, host, 8).ok());
  host[0] = 99;  // the caller's buffer is free on return: its bytes were taken
  const float g[2] = {1, 2};
  REQUIRE(d.CopyToDevice(grad, g, 8).ok());
  REQUIRE(d.ApplyGradientDescent(var, grad, 2, 1.0f).ok());
  CHECK(d.queued_operations() == 3);
  CHECK(d.copies_to_device() == 0);  // nothing ran yet

  StatusOr<void*> more = d.Allocate(16);
  REQUIRE(more.ok());
  StatusOr<Tensor> pinned = d.AllocateHostTensor(DataType::kFloat, TensorShape{2});
  REQUIRE(pinned.ok());
  CHECK(d.queued_operations() == 3);  // neither ran the queue

  // A later CopyToDevice lands after the work queued before it.
  const float reset[2] = {0, 0};
  REQUIRE(d.CopyToDevice(grad, reset, 8).ok());
  CHECK(Read(d, var, 2) == std::vector<float>{9, 18});  // CopyToHost waits for all of it
  CHECK(Read(d, grad, 2) == std::vector<float>{0, 0});
  CHECK(d.copies_to_device() == 3);
  CHECK(d.queued_operations() == 0);

  // A negative size is refused at the call; a failure of a queued copy sticks.
  CHECK(d.CopyToDevice(var, host, -1).code() == absl::StatusCode::kInvalidArgument);
  d.InjectFailure(0, absl::InternalError("copy failed"));
  REQUIRE(d.CopyToDevice(var, host, 8).ok());
  CHECK(d.Synchronize().code() == absl::StatusCode::kInternal);
  CHECK(d.CopyToDevice(var, host, 8).code() == absl::StatusCode::kInternal);
  // The allocations run no queued work but still fail with a sticky error.
  CHECK(d.Allocate(16).status().code() == absl::StatusCode::kInternal);
  CHECK(d.AllocateHostTensor(DataType::kFloat, TensorShape{2}).status().code() == absl::StatusCode::kInternal);
  d.ClearFailure();
  d.Deallocate(*more);
}

TEST_CASE("asynchronous: a failure in queued work surfaces at the wait, drops the rest and sticks") {
  FakeDevice d(Asynchronous());
  float* var = AllocFloats(d, 1);
  float* grad = AllocFloats(d, 1);
  const float one = 1, ten = 10;
  REQUIRE(d.CopyToDevice(var, &ten, 4).ok());
  REQUIRE(d.CopyToDevice(grad, &one, 4).ok());
  REQUIRE(d.Synchronize().ok());
  d.InjectFailure(1, absl::InternalError("kernel 2 failed"));
  // Accepted when queued: the failure is only known when the device runs it.
  REQUIRE(d.ApplyGradientDescent(var, grad, 1, 1.0f).ok());
  REQUIRE(d.ApplyGradientDescent(var, grad, 1, 1.0f).ok());
  REQUIRE(d.ApplyGradientDescent(var, grad, 1, 1.0f).ok());
  StatusOr<uint64_t> m = d.RecordMarker();
  REQUIRE(m.ok());
  Status s = d.WaitForMarker(*m);
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(std::string(s.message()) == "kernel 2 failed");
  CHECK(d.queued_operations() == 0);  // the third never runs
  // Sticky, as a CUDA error: every later operation, wait and marker fails.
  CHECK(d.ApplyGradientDescent(var, grad, 1, 1.0f).code() == absl::StatusCode::kInternal);
  CHECK(d.RecordMarker().status().code() == absl::StatusCode::kInternal);
  CHECK(d.WaitForMarker(*m).code() == absl::StatusCode::kInternal);
  float host = 0;
  CHECK(d.CopyToHost(&host, var, 4).code() == absl::StatusCode::kInternal);
  d.ClearFailure();
  REQUIRE(d.CopyToHost(&host, var, 4).ok());
  CHECK(host == 9);  // the first apply only

  // A block freed while work on it is queued: Deallocate waits for the work first.
  float* tmp = AllocFloats(d, 1);
  REQUIRE(d.ApplyGradientDescent(tmp, grad, 1, 1.0f).ok());
  CHECK(d.queued_operations() == 1);
  d.Deallocate(tmp);
  CHECK(d.queued_operations() == 0);
  CHECK(d.bad_deallocations() == 0);
  m = d.RecordMarker();
  REQUIRE(m.ok());
  CHECK(d.WaitForMarker(*m).ok());
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
