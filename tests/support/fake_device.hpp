// A compute::Device for tests that pretends not to have host memory: the
// device-resident paths (a GPU session's variables, the Mlp's gathered and
// captured step) get real tests on a machine without a GPU.
//
// FakeDevice runs the math on a CpuDevice (1 thread, baseline kernels: its
// results are bitwise those of CpuDevice(1, CpuIsa::kBaseline)), but
//   - host_memory() is false, and every operation checks that each device
//     pointer it is given lies, with the bytes the operation reads or writes,
//     inside one live block that this device's Allocate returned
//     (INVALID_ARGUMENT naming the device, the operation and the operand
//     otherwise): a host pointer passed where device memory is needed — which
//     a real GPU would crash on — is an error here, and so is another
//     device's block. Host operands (a copy's host side, SoftmaxXentForward's
//     stats) must not lie in its blocks, and CopyToHostBatch's destinations
//     must lie in the buffer of a live tensor from AllocateHostTensor (of any
//     FakeDevice: "page-locked", as CUDA's; INVALID_ARGUMENT otherwise).
//   - Allocate keeps its own 64-byte-aligned blocks, counts the bytes, and
//     honours a memory limit (RESOURCE_EXHAUSTED naming the device and size).
//   - supports_capture(): between BeginCapture and EndCapture operations are
//     checked and recorded, not run; an operation that needs the host
//     (Allocate, AllocateHostTensor, CopyToDevice, CopyToHost,
//     CopyToHostBatch, SoftmaxXentForward, SoftmaxXent with host stats,
//     Synchronize) is
//     FAILED_PRECONDITION and spoils the capture (EndCapture returns that
//     error). Replay runs the recorded operations in order, checking their
//     pointers again (a block freed since is caught) and reading
//     DeviceScalars when each runs.
//   - Options::asynchronous: asynchronous() is true and the device runs as a
//     CUDA stream would, late: every operation that does not need the host
//     (the math, replays, CopyToDeviceAsync, CopyToHostAsync) is checked and
//     queued, and the queue runs, in call order, only when the host waits:
//     WaitForMarker (up to that marker), or an operation that must see the
//     device's results (CopyToHost, CopyToHostBatch, SoftmaxXentForward and
//     SoftmaxXent into host statistics, Synchronize, Deallocate: cudaFree
//     waits too). Where CUDA may or may not wait, the fake does not, so that
//     code which needs a wait and leaves it out fails here: Allocate and
//     AllocateHostTensor return at once (after a sticky error, with it), and
//     CopyToDevice copies the caller's bytes (its buffer may be reused on
//     return) and queues their copy to the device behind the earlier
//     operations (CUDA's waits only for a staging slot, or for everything
//     above 1 MiB). CopyToDeviceAsync
//     reads its host buffer and CopyToHostAsync writes its own when they
//     run, so a caller that changes an input or reads a result before
//     waiting for it sees what it would on a GPU. The first queued
//     operation that fails drops the rest of the queue; its error is returned
//     by that wait and every later operation (a sticky CUDA error) until
//     ClearFailure(). Without the option every operation runs when called.
//   - CopyToDeviceAsync / CopyToHostAsync need page-locked host memory (a
//     tensor from AllocateHostTensor of any FakeDevice), INVALID_ARGUMENT
//     otherwise; they may be captured (a replay copies the buffer's bytes as
//     they are when it runs).
//   - Errors can be injected: the operation executed after `after`
//     successful ones fails with a given status; in sticky mode every later
//     operation fails too (a CUDA sticky error).
// Like every Device, used by one thread at a time; the counters are read on
// that thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compute/cpu_device.hpp"
#include "compute/device_factory.hpp"
#include "foreman/compute.hpp"

namespace foreman::testing {

class FakeDevice final : public compute::Device {
 public:
  struct Options {
    std::string name = "/fake:0";
    /// Most bytes allocated at once (0: no limit).
    int64_t memory_limit_bytes = 0;
    /// supports_capture()'s value (false: a device that runs eagerly only).
    bool capture = true;
    /// asynchronous()'s value: operations queued until the host waits (above).
    bool asynchronous = false;
  };
  FakeDevice() : FakeDevice(Options()) {}
  explicit FakeDevice(Options options);
  /// Frees the blocks still allocated.
  ~FakeDevice() override;
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;

  // -- compute::Device ----------------------------------------------------------
  const std::string& name() const override { return options_.name; }
  bool host_memory() const override { return false; }
  StatusOr<void*> Allocate(int64_t bytes) override;
  void Deallocate(void* ptr) override;
  Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override;
  Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override;
  Status Gemm(const compute::GemmArgs& args) override;
  Status ColumnSums(const float* delta, int64_t rows, int64_t cols, float* out) override;
  Status SoftmaxXentForward(const compute::SoftmaxXentArgs& args, compute::SoftmaxXentStats* stats) override;
  Status SoftmaxXentBackward(const compute::SoftmaxXentArgs& args, float scale, float* grad) override;
  Status SoftmaxXent(const compute::SoftmaxXentArgs& args, compute::SoftmaxXentStats* stats, float scale,
                     float* grad) override;
  Status ApplyGradientDescent(float* var, const float* grad, int64_t n, float learning_rate) override;
  Status ApplyMomentum(float* var, float* accum, const float* grad, int64_t n,
                       const compute::MomentumParams& params) override;
  Status ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n,
                   const compute::AdamParams& params) override;
  Status ApplyGradientDescent(float* var, const float* grad, int64_t n, compute::DeviceScalar learning_rate) override;
  Status ApplyMomentum(float* var, float* accum, const float* grad, int64_t n, compute::DeviceScalar learning_rate,
                       float momentum, bool use_nesterov) override;
  Status ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n, compute::DeviceScalar step_size,
                   float beta1, float beta2, float epsilon) override;
  Status AdamStepSize(compute::DeviceScalar learning_rate, compute::DeviceScalar beta1_power,
                      compute::DeviceScalar beta2_power, float* step_size) override;
  Status AdamFinish(float* beta1_power, float* beta2_power, float beta1, float beta2) override;
  Status SoftmaxXentToDevice(const compute::SoftmaxXentArgs& args, float scale, float* grad,
                             compute::SoftmaxXentStats* device_stats) override;
  Status SoftmaxXentForwardToDevice(const compute::SoftmaxXentArgs& args,
                                    compute::SoftmaxXentStats* device_stats) override;
  Status GatherExamples(const compute::GatherArgs& args) override;
  Status CopyToHostBatch(const compute::HostCopy* copies, int64_t count) override;
  /// Tensor::Create's host memory, counted (host_tensors()); FAILED_PRECONDITION
  /// while capturing (a capture records device work only, as CUDA's).
  StatusOr<Tensor> AllocateHostTensor(DataType dtype, TensorShape shape) override;
  bool supports_capture() const override { return options_.capture; }
  Status BeginCapture() override;
  StatusOr<std::unique_ptr<compute::CapturedOps>> EndCapture() override;
  Status Synchronize() override;
  bool asynchronous() const override { return options_.asynchronous; }
  Status CopyToDeviceAsync(void* device_dst, const void* host_src, int64_t bytes) override;
  Status CopyToHostAsync(void* host_dst, const void* device_src, int64_t bytes) override;
  StatusOr<uint64_t> RecordMarker() override;
  Status WaitForMarker(uint64_t marker) override;

  // -- for tests ------------------------------------------------------------------
  /// Whether [ptr, ptr + bytes) lies inside one live block (bytes >= 1).
  bool Contains(const void* ptr, int64_t bytes = 1) const;
  /// Makes the operation executed after `after` more successful ones
  /// (Allocate, copies, math, Synchronize; a replayed operation counts when
  /// it runs; recording does not) return `status` without running. Sticky:
  /// every operation after it fails with `status` too, until ClearFailure().
  void InjectFailure(int64_t after, Status status, bool sticky = false);
  /// The next operation fails with `status` (INTERNAL if omitted), once.
  void FailNextOperation(Status status);
  void ClearFailure();

  bool capturing() const { return capturing_; }
  int64_t allocated_bytes() const { return allocated_bytes_; }
  int64_t peak_allocated_bytes() const { return peak_bytes_; }
  int64_t live_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  /// Deallocate calls with a pointer that is not a live block (a double free).
  int64_t bad_deallocations() const { return bad_deallocations_; }
  int64_t copies_to_device() const { return copies_to_device_; }
  int64_t bytes_to_device() const { return bytes_to_device_; }
  /// CopyToHost calls, and CopyToHostBatch calls (one each) with their bytes.
  int64_t copies_to_host() const { return copies_to_host_; }
  int64_t bytes_to_host() const { return bytes_to_host_; }
  int64_t host_batches() const { return host_batches_; }
  /// AllocateHostTensor calls that succeeded (a checkpoint's pinned buffers).
  int64_t host_tensors() const { return host_tensors_; }
  /// Operations executed successfully (eager or replayed).
  int64_t operations() const { return operations_; }
  /// CopyToDeviceAsync and CopyToHostAsync copies executed (eager or replayed).
  int64_t async_copies_to_device() const { return async_copies_to_device_; }
  int64_t async_copies_to_host() const { return async_copies_to_host_; }
  /// Operations queued and not yet run (asynchronous mode).
  int64_t queued_operations() const { return static_cast<int64_t>(queue_.size()); }
  /// Successful EndCapture calls, and Replay calls.
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

  /// The CPU device doing the math.
  compute::CpuDevice& cpu() { return cpu_; }

 private:
  class Recording;
  using Op = std::function<Status()>;
  /// Checks a device operand: null or outside the live blocks is
  /// INVALID_ARGUMENT (nothing to check when bytes <= 0).
  Status CheckDevice(const char* op, const char* what, const void* ptr, int64_t bytes) const;
  /// Checks a host operand: null, or overlapping a live block.
  Status CheckHost(const char* op, const char* what, const void* ptr, int64_t bytes) const;
  /// Runs `op` now (counting it, applying injected failures), or records it
  /// when capturing. `check` runs first in both cases and again at replay.
  Status Launch(const char* name, Op check, Op op);
  /// An operation that needs the device's results: FAILED_PRECONDITION while
  /// capturing (spoiling the capture), else the queue runs, then Execute.
  Status HostOp(const char* name, const Op& op);
  /// An operation that needs the host but not the device's results (Allocate,
  /// AllocateHostTensor): refused while capturing, the sticky asynchronous
  /// error if there is one, else run at once without running the queue.
  Status HostCall(const char* name, const Op& op);
  Status Execute(const Op& op);
  Status Replay(const std::vector<Op>& ops);
  /// Runs the queued operations recorded before marker `marker` (all of
  /// them for UINT64_MAX); the first failure drops the rest and sticks.
  Status RunQueued(uint64_t marker);
  /// A page-locked host operand of an asynchronous copy.
  Status CheckPinned(const char* op, const char* what, const void* ptr, int64_t bytes) const;
  /// CopyToDevice's copy itself, counted (copies_to_device, bytes_to_device).
  Status StoreOnDevice(void* device_dst, const void* host_src, int64_t bytes);
  /// CopyToDeviceAsync (to_device) or CopyToHostAsync: checked, then launched.
  Status AsyncCopy(bool to_device, void* dst, const void* src, int64_t bytes);

  Options options_;
  compute::CpuDevice cpu_;
  std::map<uintptr_t, int64_t> blocks_;  // begin -> bytes requested
  int64_t allocated_bytes_ = 0;
  int64_t peak_bytes_ = 0;
  int64_t bad_deallocations_ = 0;
  int64_t copies_to_device_ = 0;
  int64_t bytes_to_device_ = 0;
  int64_t copies_to_host_ = 0;
  int64_t bytes_to_host_ = 0;
  int64_t host_batches_ = 0;
  int64_t host_tensors_ = 0;
  int64_t operations_ = 0;
  int64_t async_copies_to_device_ = 0;
  int64_t async_copies_to_host_ = 0;
  int64_t captures_ = 0;
  int64_t replays_ = 0;

  bool capturing_ = false;
  std::vector<Op> recorded_;
  Status capture_error_;

  struct Queued {
    Op op;
    uint64_t markers_before = 0;  // markers recorded when it was queued
  };
  std::deque<Queued> queue_;  // asynchronous mode: queued, not yet run
  uint64_t newest_marker_ = 0;
  Status async_error_;  // a queued operation's failure, sticky

  int64_t fail_after_ = -1;  // < 0: no failure armed
  Status fail_status_;
  bool fail_sticky_ = false;
  bool sticky_failed_ = false;
};

/// A factory for compute::SetFakeDeviceFactoryForTesting: each "/fake:N"
/// device string gets a FakeDevice of that name with the session's memory
/// limit (and `capture`, `asynchronous`). When `last` is not null, *last points to the most
/// recent device made (owned by its session).
compute::DeviceFactoryForTesting FakeDeviceFactory(FakeDevice** last = nullptr, bool capture = true,
                                                   bool asynchronous = false);

}  // namespace foreman::testing
