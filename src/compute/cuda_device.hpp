// The CUDA compute::Device ("/gpu:N"), internal to libforeman: made by
// CreateDevice (device_factory.cpp) for SessionConfig.device "/gpu:N". It
// lives in the plug-in libforeman_cuda.so (cuda_module.hpp); the functions
// below, in libforeman, load it on first use.
//
// What it is (cuda_device.cu):
//   - Device memory from cudaMalloc, counted against a limit
//     (SessionConfig.device_memory_limit_bytes; RESOURCE_EXHAUSTED naming the
//     device and the size, also when cudaMalloc itself runs out).
//   - One compute stream for every operation and a copy stream for
//     CopyToHostBatch (a checkpoint's snapshot): the compute stream waits
//     only for those copies.
//   - Own kernels, no cuBLAS: a tiled SGEMM summing each output in k order
//     with explicit fmaf, column sums one thread per column, softmax
//     cross-entropy one thread per row (its loss summed in double in row
//     order by one thread), elementwise optimizer updates sharing their
//     expressions with the host (kernel_math.hpp). No atomics: every result
//     is a function of the inputs.
//   - Capture (BeginCapture/EndCapture) records a CUDA graph of the compute
//     stream; CapturedOps::Replay launches it. Refused while capturing
//     (FAILED_PRECONDITION, spoiling the capture): Allocate, CopyToHost,
//     CopyToHostBatch, SoftmaxXentForward / SoftmaxXent (host statistics),
//     AllocateHostTensor, Synchronize, Replay, RecordMarker, WaitForMarker —
//     and CopyToDevice, whose
//     recorded copy would read the caller's host buffer at every replay
//     after the caller was told it may reuse it. A step's inputs come in
//     with CopyToDeviceAsync instead, which may be captured: it reads a
//     page-locked buffer when it runs (the Mlp's step by indices: its
//     graph's first node copies {learning rate, indices} in, its last
//     CopyToHostAsync copies {loss, correct} out).
//   - asynchronous() is true: CopyToDeviceAsync / CopyToHostAsync
//     (cudaMemcpyAsync on the compute stream, page-locked memory only:
//     INVALID_ARGUMENT otherwise) and a replay return at once;
//     RecordMarker records one of a ring of 4 CUDA events on the compute
//     stream and WaitForMarker synchronises on it (a marker older than the
//     ring waits on the oldest event held, which comes after it): the
//     step's own statistics need no other wait (the copies below do).
//   - CopyToDevice of up to 1 MiB goes through one of two page-locked
//     staging buffers and returns at once; larger copies wait for the copy.
//     CopyToHost and CopyToHostBatch wait for everything queued before
//     them on the compute stream (a step in flight included).
//   - Errors are INTERNAL naming the device, the operation, the CUDA call or
//     kernel and the CUDA error; a sticky error (the context is lost: an
//     illegal address, a kernel trap) is remembered and every later
//     operation fails at once with it.
//
// Thread-safety: one thread at a time (compute::Device's rule); the device is
// made current (cudaSetDevice) on the calling thread by every operation.
#pragma once

#include <cstdint>
#include <memory>

#include "foreman/compute.hpp"
#include "foreman/status.hpp"

namespace foreman::compute {

/// The CUDA device "/gpu:<index>" with at most `memory_limit_bytes` of
/// device memory in Allocate (0: only the device's own limit).
/// FAILED_PRECONDITION when libforeman was built without CUDA ("built
/// without CUDA"), when the plug-in cannot be loaded (naming it and
/// dlerror()'s message), when the driver is missing or `index` is not a device
/// (naming "/gpu:<index>" and the number present); RESOURCE_EXHAUSTED when
/// the device's own buffers do not fit; INVALID_ARGUMENT for
/// memory_limit_bytes < 0; INTERNAL for another CUDA failure.
StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int index, int64_t memory_limit_bytes);

/// Tests only: launches a kernel that writes to an invalid device address on
/// `device` (made by CreateCudaDevice) and waits for it, which leaves the
/// CUDA context with a sticky error (cudaErrorIllegalAddress): the call
/// returns that INTERNAL error and so does every later operation of the
/// device. The process's CUDA context stays unusable afterwards, so a test
/// calls it last. FAILED_PRECONDITION for another kind of device or a build
/// without CUDA.
Status LaunchFaultingKernelForTesting(Device& device);

}  // namespace foreman::compute
