// libforeman_cuda.so, libforeman's CUDA plug-in (cuda_module.hpp): CUDA
// device discovery (foreman/cuda.hpp) and the CUDA compute::Device
// (cuda_device.hpp), compiled by nvcc when meson's `cuda` feature is on, and
// reached only through the table foreman_cuda_module_v1 returns.
// Discovery: without a driver or a device every function returns UNAVAILABLE
// with the CUDA runtime's own message; nothing here aborts.
// Eigen (through foreman/tensor.hpp) is host code here: without this it
// compiles itself for the device too (slower, and noisy).
#define EIGEN_NO_CUDA 1

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "compute/cuda_module.hpp"
#include "compute/kernel_math.hpp"
#include "foreman/cuda.hpp"
#include "foreman/version.hpp"

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

StatusOr<int> CountDevices() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return FromCuda(err, "cudaGetDeviceCount");
  }
  return n;
}

Status CheckIndex(int index) {
  auto count = CountDevices();
  if (!count.ok()) return count.status();
  if (index < 0 || index >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device index ", index, " is outside [0, ", *count, ")"));
  }
  return absl::OkStatus();
}

StatusOr<DeviceInfo> DeviceInfoOf(int index) {
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

Status RunSelfTest(int index, int n) {
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

}  // namespace
}  // namespace foreman::cuda

// ============================================================================
// The CUDA compute::Device.
//
// Kernels (all launched on the device's compute stream; the launch
// configuration is a function of the sizes only, and no kernel uses atomics,
// so every result is a function of the inputs):
//   GemmKernel<P>    16P x 16P output tiles, 256 threads, each thread P x P
//                    outputs (P = 4 for large outputs, 1 for small ones);
//                    A and B tiles of depth 16 staged through shared memory
//                    (the layout, NN / TN / NT / TT, only changes how a tile
//                    is loaded), the next tile's global loads in flight
//                    while this one is summed; each output is summed by one
//                    thread in k order with explicit fmaf (math::GemmFma)
//                    from 0, then the epilogue. So an output is bitwise the
//                    sequential fmaf dot product. With column_sums, op(A)
//                    has an extra row of ones whose outputs are op(B)'s
//                    column sums: the bias gradient in the kernel
//                    gradient's launch, bitwise ColumnSumsKernel's.
//   ColumnSumsKernel one thread per column adds the rows in order from 0;
//                    blocks of 32 columns stage 128 rows at a time through
//                    shared memory.
//   XentRowsKernel   SoftmaxXentBackward: one thread per row (math::SoftmaxXentRow).
//   XentStatsKernel  with statistics: ONE block of 512 threads, thread t
//                    rows t, t + 512, ... (and their gradients), its losses
//                    added in double; then a fixed tree over the threads
//                    (math::xent_stats) for the loss sum and correct count.
//   the updates      elementwise grid-stride loops over math::GradientDescent /
//                    Momentum / Adam, reading a DeviceScalar rate at execution.
//   AdamStepSize / AdamFinish: one thread.
//   GatherKernel     one thread per feature (and per label).
// ============================================================================

namespace foreman::compute {

namespace {

constexpr int kGemmDepth = math::gemm::kDepth;      // k per shared-memory stage
constexpr int kGemmThreads = math::gemm::kThreads;  // 16 x 16, each P x P outputs
constexpr int kXentStatsThreads = math::xent_stats::kThreads;
constexpr int kElementwiseThreads = 256;
constexpr int64_t kMaxElementwiseBlocks = 8192;
constexpr int64_t kStagingBytes = int64_t{1} << 20;  // CopyToDevice through pinned staging up to this size
constexpr int kStagingSlots = 2;

// kPipelined (the default): the next k step's global loads are issued
// before this step's sums, into registers (math::gemm::FetchTiles), so that
// their latency hides behind the arithmetic; without it (the kernel before
// issue 29, kept as kernel_bench's baseline: FOREMAN_CUDA_BASELINE_KERNELS=1)
// each step loads, waits, then sums. The same outputs, bit for bit.
template <int P, bool kPipelined>
__global__ void __launch_bounds__(kGemmThreads) GemmKernel(GemmArgs g) {
  constexpr int kTile = math::gemm::kTileOf<P>;
  constexpr int kFetch = math::gemm::kFetchOf<P>;
  __shared__ math::gemm::SharedTile<P> as;
  __shared__ math::gemm::SharedTile<P> bs;
  const int tid = threadIdx.x;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[P][P];
#pragma unroll
  for (int i = 0; i < P; ++i) {
#pragma unroll
    for (int j = 0; j < P; ++j) acc[i][j] = 0.0f;
  }
  float fa[kFetch], fb[kFetch];
  if (kPipelined && g.k > 0) math::gemm::FetchTiles<P>(g, row0, col0, 0, tid, fa, fb);
  for (int64_t k0 = 0; k0 < g.k; k0 += kGemmDepth) {
    if (!kPipelined) math::gemm::FetchTiles<P>(g, row0, col0, k0, tid, fa, fb);
    math::gemm::StageTiles<P>(g, tid, fa, fb, as, bs);
    __syncthreads();
    if (kPipelined && k0 + kGemmDepth < g.k) math::gemm::FetchTiles<P>(g, row0, col0, k0 + kGemmDepth, tid, fa, fb);
    const int depth = static_cast<int>(g.k - k0 < kGemmDepth ? g.k - k0 : kGemmDepth);
    math::gemm::AccumulateTiles<P>(tid, depth, as, bs, acc);
    __syncthreads();
  }
  math::gemm::StoreOutputs<P>(g, row0, col0, tid, acc);
}

// Column sums, each column added by one thread in row order from 0 (the
// CPU's order): a block owns kSumCols columns; its threads stage kSumRows
// rows of them through shared memory (coalesced, many loads in flight),
// then the first warp adds them up, one column per thread.
constexpr int kSumCols = 32;
constexpr int kSumRows = 128;
constexpr int kSumThreads = 256;

__global__ void __launch_bounds__(kSumThreads) ColumnSumsKernel(const float* delta, int64_t rows, int64_t cols,
                                                                  float* out) {
  __shared__ float tile[kSumRows][kSumCols + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kSumCols;
  const int lane = threadIdx.x % kSumCols, row_in_step = threadIdx.x / kSumCols;
  const int64_t c = c0 + lane;
  float sum = 0.0f;
  for (int64_t r0 = 0; r0 < rows; r0 += kSumRows) {
    const int64_t count = rows - r0 < kSumRows ? rows - r0 : kSumRows;
    for (int r = row_in_step; r < count; r += kSumThreads / kSumCols) {
      tile[r][lane] = c < cols ? delta[(r0 + r) * cols + c] : 0.0f;
    }
    __syncthreads();
    if (threadIdx.x < kSumCols) {
      for (int r = 0; r < count; ++r) sum += tile[r][threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.x < kSumCols && c < cols) out[c] = sum;
}

// SoftmaxXentBackward: the gradient only, one thread per row.
__global__ void XentRowsKernel(SoftmaxXentArgs args, float scale, float* grad) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= args.rows) return;
  float loss;
  bool correct;
  math::SoftmaxXentRow(args.logits + r * args.classes, args.classes, math::LabelOf(args, r), scale,
                       grad + r * args.classes, &loss, &correct);
}

// The statistics (and the gradient when grad is not null), in one block
// (math::xent_stats): *out = (accumulate ? *out : init) + the rows' losses
// summed in double in the block's fixed tree order, and the correct count.
__global__ void __launch_bounds__(kXentStatsThreads)
    XentStatsKernel(SoftmaxXentArgs args, float scale, float* grad, SoftmaxXentStats* out, bool accumulate,
                    double init_loss, long long init_correct) {
  __shared__ double losses[kXentStatsThreads];
  __shared__ long long corrects[kXentStatsThreads];
  const int tid = threadIdx.x;
  math::xent_stats::ThreadRows(args, scale, grad, tid, losses, corrects);
  __syncthreads();
  for (int half = kXentStatsThreads / 2; half > 0; half /= 2) {
    math::xent_stats::TreeLevel(tid, half, losses, corrects);
    __syncthreads();
  }
  // Only thread 0 reads *out, and writes it after.
  if (tid == 0) {
    const double base_loss = accumulate ? out->loss_sum : init_loss;
    const long long base_correct = accumulate ? out->correct : init_correct;
    out->loss_sum = base_loss + losses[0];
    out->correct = base_correct + corrects[0];
  }
}

// kernel_bench's baseline for XentStatsKernel (FOREMAN_CUDA_BASELINE_KERNELS=1):
// the kernel before issue 29, 256 threads over chunks of 256 rows, thread 0
// adding each chunk's losses in row order. The same gradient and count; the
// loss sum in row order.
constexpr int kXentSerialThreads = 256;
__global__ void __launch_bounds__(kXentSerialThreads)
    XentStatsSerialKernel(SoftmaxXentArgs args, float scale, float* grad, SoftmaxXentStats* out, bool accumulate,
                          double init_loss, long long init_correct) {
  __shared__ float losses[kXentSerialThreads];
  __shared__ unsigned char corrects[kXentSerialThreads];
  double loss_sum = init_loss;
  long long correct_sum = init_correct;
  if (threadIdx.x == 0 && accumulate) {
    loss_sum = out->loss_sum;
    correct_sum = out->correct;
  }
  for (int64_t base = 0; base < args.rows; base += kXentSerialThreads) {
    const int64_t r = base + threadIdx.x;
    if (r < args.rows) {
      float loss;
      bool correct;
      math::SoftmaxXentRow(args.logits + r * args.classes, args.classes, math::LabelOf(args, r), scale,
                           grad == nullptr ? nullptr : grad + r * args.classes, &loss, &correct);
      losses[threadIdx.x] = loss;
      corrects[threadIdx.x] = correct ? 1 : 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int64_t count = args.rows - base < kXentSerialThreads ? args.rows - base : kXentSerialThreads;
      for (int64_t i = 0; i < count; ++i) {
        loss_sum += static_cast<double>(losses[i]);
        correct_sum += corrects[i];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out->loss_sum = loss_sum;
    out->correct = correct_sum;
  }
}

__global__ void GradientDescentKernel(float* var, const float* grad, int64_t n, const float* lr_ptr, float lr) {
  if (lr_ptr != nullptr) lr = *lr_ptr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    var[i] = math::GradientDescent(var[i], grad[i], lr);
  }
}

__global__ void MomentumKernel(float* var, float* accum, const float* grad, int64_t n, const float* lr_ptr, float lr,
                               float momentum, bool use_nesterov) {
  if (lr_ptr != nullptr) lr = *lr_ptr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    math::Momentum(var + i, accum + i, grad[i], lr, momentum, use_nesterov);
  }
}

__global__ void AdamKernel(float* var, float* m, float* v, const float* grad, int64_t n, const float* step_ptr,
                           float step_size, float beta1, float beta2, float epsilon) {
  if (step_ptr != nullptr) step_size = *step_ptr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    math::Adam(var + i, m + i, v + i, grad[i], step_size, beta1, beta2, epsilon);
  }
}

// Device::ApplyAdamGroup's updates (math::adam_group): block b updates
// variable VariableOfBlock(b); every thread computes the step size from the
// device scalars (as AdamStepSizeKernel does: the same float), block 0's
// thread 0 also stores it.
struct AdamGroupArgs {
  int count = 0;
  AdamVariable variables[math::adam_group::kMaxVariables];
  int64_t block_start[math::adam_group::kMaxVariables + 1] = {};
  const float* learning_rate = nullptr;
  const float* beta1_power = nullptr;
  const float* beta2_power = nullptr;
  float* step_size = nullptr;
  float beta1 = 0, beta2 = 0, epsilon = 0;
};

__global__ void AdamGroupKernel(AdamGroupArgs a) {
  const int j = math::adam_group::VariableOfBlock(a.block_start, a.count, blockIdx.x);
  const AdamVariable& x = a.variables[j];
  const int64_t first = a.block_start[j], blocks = a.block_start[j + 1] - first;
  const float step_size = math::AdamStepSize(*a.learning_rate, *a.beta1_power, *a.beta2_power);
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.step_size = step_size;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) - first) * blockDim.x + threadIdx.x; i < x.n;
       i += blocks * blockDim.x) {
    math::Adam(x.var + i, x.m + i, x.v + i, x.grad[i], step_size, a.beta1, a.beta2, a.epsilon);
  }
}

__global__ void AdamStepSizeKernel(const float* lr, const float* beta1_power, const float* beta2_power,
                                   float* step_size) {
  *step_size = math::AdamStepSize(*lr, *beta1_power, *beta2_power);
}

__global__ void AdamFinishKernel(float* beta1_power, float* beta2_power, float beta1, float beta2) {
  *beta1_power = *beta1_power * beta1;
  *beta2_power = *beta2_power * beta2;
}

__global__ void GatherKernel(GatherArgs a) {
  const int64_t total = a.rows * a.feature_dim > a.rows ? a.rows * a.feature_dim : a.rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < a.rows) a.labels[i] = static_cast<int32_t>(a.example_labels[a.indices[i]]);
    if (a.feature_dim > 0 && i < a.rows * a.feature_dim) {
      const int64_t r = i / a.feature_dim, d = i % a.feature_dim;
      a.features[i] = math::PixelToFeature(a.images[static_cast<int64_t>(a.indices[r]) * a.feature_dim + d]);
    }
  }
}

// Tests only (LaunchFaultingKernelForTesting): a write to an address no
// allocation holds.
__global__ void FaultingKernel(int* bogus) { *bogus = 1; }

/// Blocks of kElementwiseThreads for n elements (grid-stride beyond the cap).
unsigned ElementwiseBlocks(int64_t n) {
  const int64_t blocks = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(blocks, kMaxElementwiseBlocks)));
}

/// Errors after which the CUDA context cannot be used again.
bool IsSticky(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

// AllocateHostTensor's page-locked buffers carry their device's index in a
// header of kPinnedHeader bytes before the tensor's data (which stays
// 64-byte aligned: cudaMallocHost returns page-aligned memory), so that
// FreePinned, called on whichever thread drops the tensor (a checkpoint
// writer's), makes that device current first: a CUDA call on a thread
// without a current device would create a context on device 0.
constexpr size_t kPinnedHeader = 64;

// Null, with *err set, when cudaMallocHost fails.
char* AllocatePinned(int device_index, size_t bytes, cudaError_t* err) {
  void* p = nullptr;
  if ((*err = cudaMallocHost(&p, bytes + kPinnedHeader)) != cudaSuccess) return nullptr;
  std::memcpy(p, &device_index, sizeof device_index);
  return static_cast<char*>(p) + kPinnedHeader;
}

void FreePinned(char* data) {
  char* block = data - kPinnedHeader;
  int device_index = 0;
  std::memcpy(&device_index, block, sizeof device_index);
  cudaSetDevice(device_index);
  cudaFreeHost(block);
}

class CudaDevice;

class CudaCapturedOps final : public CapturedOps {
 public:
  CudaCapturedOps(CudaDevice* device, int device_index, cudaGraphExec_t exec)
      : device_(device), device_index_(device_index), exec_(exec) {}
  // On the device's own context, whichever thread drops the recording.
  ~CudaCapturedOps() override {
    cudaSetDevice(device_index_);
    cudaGraphExecDestroy(exec_);
  }
  Status Replay() override;

 private:
  CudaDevice* device_;
  int device_index_;
  cudaGraphExec_t exec_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, int64_t memory_limit_bytes)
      : index_(index), name_(absl::StrCat("/gpu:", index)), limit_(memory_limit_bytes) {}

  ~CudaDevice() override {
    cudaSetDevice(index_);
    if (capturing_) {
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(compute_, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
    if (compute_ != nullptr) cudaStreamSynchronize(compute_);
    if (copy_ != nullptr) cudaStreamSynchronize(copy_);
    for (const auto& [ptr, bytes] : allocations_) cudaFree(ptr);
    for (void* p : deferred_frees_) cudaFree(p);
    if (stats_scratch_ != nullptr) cudaFree(stats_scratch_);
    if (host_stats_ != nullptr) cudaFreeHost(host_stats_);
    for (int i = 0; i < kStagingSlots; ++i) {
      if (staging_[i] != nullptr) cudaFreeHost(staging_[i]);
      if (staging_done_[i] != nullptr) cudaEventDestroy(staging_done_[i]);
    }
    for (cudaEvent_t e : marker_events_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
    if (copy_done_ != nullptr) cudaEventDestroy(copy_done_);
    if (copy_ != nullptr) cudaStreamDestroy(copy_);
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
    cudaGetLastError();
  }

  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  /// Streams, events and the small buffers of its own. A device that cannot
  /// be used at all (another process holds it in exclusive mode, the driver
  /// refuses it) is FAILED_PRECONDITION, like a missing device.
  Status Init() {
    Status s = InitStreams();
    if (s.code() == absl::StatusCode::kInternal && sticky_.ok() &&
        (init_error_ == cudaErrorDevicesUnavailable || init_error_ == cudaErrorNoDevice ||
         init_error_ == cudaErrorInsufficientDriver || init_error_ == cudaErrorInvalidDevice ||
         init_error_ == cudaErrorSystemNotReady || init_error_ == cudaErrorNotPermitted)) {
      return absl::FailedPreconditionError(s.message());
    }
    return s;
  }

  Status InitStreams() {
    cudaError_t err;
    if ((err = cudaSetDevice(index_)) != cudaSuccess) return Fail("create", "cudaSetDevice", err);
    if ((err = cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, index_)) != cudaSuccess) {
      return Fail("create", "cudaDeviceGetAttribute (multiprocessors)", err);
    }
    // kernel_bench's baseline: the GEMM and statistics kernels before issue 29.
    const char* baseline = std::getenv("FOREMAN_CUDA_BASELINE_KERNELS");
    baseline_kernels_ = baseline != nullptr && std::string_view(baseline) == "1";
    if ((err = cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking)) != cudaSuccess) {
      return Fail("create", "cudaStreamCreateWithFlags (compute stream)", err);
    }
    if ((err = cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking)) != cudaSuccess) {
      return Fail("create", "cudaStreamCreateWithFlags (copy stream)", err);
    }
    if ((err = cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming)) != cudaSuccess ||
        (err = cudaEventCreateWithFlags(&copy_done_, cudaEventDisableTiming)) != cudaSuccess) {
      return Fail("create", "cudaEventCreateWithFlags", err);
    }
    for (cudaEvent_t& e : marker_events_) {
      if ((err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming)) != cudaSuccess) {
        return Fail("create", "cudaEventCreateWithFlags (markers)", err);
      }
    }
    for (int i = 0; i < kStagingSlots; ++i) {
      if ((err = cudaEventCreateWithFlags(&staging_done_[i], cudaEventDisableTiming)) != cudaSuccess) {
        return Fail("create", "cudaEventCreateWithFlags", err);
      }
      if ((err = cudaMallocHost(&staging_[i], kStagingBytes)) != cudaSuccess) {
        return OutOfMemory("create", "cudaMallocHost (staging buffer)", kStagingBytes, err);
      }
    }
    if ((err = cudaMallocHost(&host_stats_, sizeof(SoftmaxXentStats))) != cudaSuccess) {
      return OutOfMemory("create", "cudaMallocHost (statistics)", sizeof(SoftmaxXentStats), err);
    }
    if ((err = cudaMalloc(&stats_scratch_, sizeof(SoftmaxXentStats))) != cudaSuccess) {
      return OutOfMemory("create", "cudaMalloc (statistics)", sizeof(SoftmaxXentStats), err);
    }
    // Eager module loading: under CUDA's lazy loading (the default since
    // 12.2) a kernel's module is loaded at its first launch, which for the
    // training step is inside a stream capture; cudaFuncGetAttributes loads
    // it here instead, with no work, before any capture.
    const void* kernels[] = {
        reinterpret_cast<const void*>(&GemmKernel<4, true>),    reinterpret_cast<const void*>(&GemmKernel<1, true>),
        reinterpret_cast<const void*>(&GemmKernel<4, false>),   reinterpret_cast<const void*>(&GemmKernel<1, false>),
        reinterpret_cast<const void*>(&ColumnSumsKernel),       reinterpret_cast<const void*>(&XentRowsKernel),
        reinterpret_cast<const void*>(&XentStatsKernel),        reinterpret_cast<const void*>(&XentStatsSerialKernel),
        reinterpret_cast<const void*>(&GradientDescentKernel),
        reinterpret_cast<const void*>(&MomentumKernel),         reinterpret_cast<const void*>(&AdamKernel),
        reinterpret_cast<const void*>(&AdamStepSizeKernel),     reinterpret_cast<const void*>(&AdamFinishKernel),
        reinterpret_cast<const void*>(&AdamGroupKernel),
        reinterpret_cast<const void*>(&GatherKernel),           reinterpret_cast<const void*>(&FaultingKernel),
    };
    for (const void* kernel : kernels) {
      cudaFuncAttributes attributes{};
      if ((err = cudaFuncGetAttributes(&attributes, kernel)) != cudaSuccess) {
        return Fail("create", "cudaFuncGetAttributes (loading the kernels)", err);
      }
    }
    return absl::OkStatus();
  }

  const std::string& name() const override { return name_; }
  bool host_memory() const override { return false; }
  bool supports_capture() const override { return true; }

  StatusOr<void*> Allocate(int64_t bytes) override {
    void* p = nullptr;
    FOREMAN_RETURN_IF_ERROR(Track(AllocateImpl(bytes, &p)));
    return p;
  }

  void Deallocate(void* ptr) override {
    if (ptr == nullptr) return;
    auto it = allocations_.find(ptr);
    if (it == allocations_.end()) return;  // not ours (or freed already): nothing to free
    allocated_ -= it->second;
    allocations_.erase(it);
    if (capturing_) {
      deferred_frees_.push_back(ptr);  // cudaFree would synchronize inside the capture
      return;
    }
    cudaSetDevice(index_);
    const cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess) (void)Fail("Deallocate", "cudaFree", err);  // remembered when sticky
  }

  Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override {
    return Track(CopyToDeviceImpl(device_dst, host_src, bytes));
  }
  Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override {
    return Track(CopyToHostImpl(host_dst, device_src, bytes));
  }
  Status Gemm(const GemmArgs& args) override { return Track(GemmImpl(args)); }
  Status ColumnSums(const float* delta, int64_t rows, int64_t cols, float* out) override {
    return Track(ColumnSumsImpl(delta, rows, cols, out));
  }
  Status SoftmaxXentForward(const SoftmaxXentArgs& args, SoftmaxXentStats* stats) override {
    return Track(XentHostStats("SoftmaxXentForward", args, stats, 0.0f, nullptr, /*with_grad=*/false));
  }
  Status SoftmaxXentBackward(const SoftmaxXentArgs& args, float scale, float* grad) override {
    return Track(XentBackwardImpl(args, scale, grad));
  }
  Status SoftmaxXent(const SoftmaxXentArgs& args, SoftmaxXentStats* stats, float scale, float* grad) override {
    return Track(XentHostStats("SoftmaxXent", args, stats, scale, grad, /*with_grad=*/true));
  }
  Status ApplyGradientDescent(float* var, const float* grad, int64_t n, float learning_rate) override {
    return Track(GradientDescentImpl(var, grad, n, nullptr, learning_rate));
  }
  Status ApplyMomentum(float* var, float* accum, const float* grad, int64_t n, const MomentumParams& p) override {
    return Track(MomentumImpl(var, accum, grad, n, nullptr, p.learning_rate, p.momentum, p.use_nesterov));
  }
  Status ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n, const AdamParams& p) override {
    return Track(AdamImpl(var, m, v, grad, n, nullptr, p.step_size, p.beta1, p.beta2, p.epsilon));
  }
  Status ApplyGradientDescent(float* var, const float* grad, int64_t n, DeviceScalar learning_rate) override {
    if (learning_rate.ptr == nullptr) return Track(Null("ApplyGradientDescent", "learning_rate"));
    return Track(GradientDescentImpl(var, grad, n, learning_rate.ptr, 0.0f));
  }
  Status ApplyMomentum(float* var, float* accum, const float* grad, int64_t n, DeviceScalar learning_rate,
                       float momentum, bool use_nesterov) override {
    if (learning_rate.ptr == nullptr) return Track(Null("ApplyMomentum", "learning_rate"));
    return Track(MomentumImpl(var, accum, grad, n, learning_rate.ptr, 0.0f, momentum, use_nesterov));
  }
  Status ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n, DeviceScalar step_size, float beta1,
                   float beta2, float epsilon) override {
    if (step_size.ptr == nullptr) return Track(Null("ApplyAdam", "step_size"));
    return Track(AdamImpl(var, m, v, grad, n, step_size.ptr, 0.0f, beta1, beta2, epsilon));
  }
  Status AdamStepSize(DeviceScalar learning_rate, DeviceScalar beta1_power, DeviceScalar beta2_power,
                      float* step_size) override {
    return Track(AdamStepSizeImpl(learning_rate, beta1_power, beta2_power, step_size));
  }
  Status AdamFinish(float* beta1_power, float* beta2_power, float beta1, float beta2) override {
    return Track(AdamFinishImpl(beta1_power, beta2_power, beta1, beta2));
  }
  Status ApplyAdamGroup(const AdamVariable* variables, int64_t count, DeviceScalar learning_rate,
                        float* beta1_power, float* beta2_power, float beta1, float beta2, float epsilon,
                        float* step_size) override {
    return Track(AdamGroupImpl(variables, count, learning_rate, beta1_power, beta2_power, beta1, beta2, epsilon,
                               step_size));
  }
  Status SoftmaxXentToDevice(const SoftmaxXentArgs& args, float scale, float* grad,
                             SoftmaxXentStats* device_stats) override {
    return Track(XentDeviceStats("SoftmaxXentToDevice", args, scale, grad, device_stats, /*accumulate=*/false));
  }
  Status SoftmaxXentForwardToDevice(const SoftmaxXentArgs& args, SoftmaxXentStats* device_stats) override {
    return Track(XentDeviceStats("SoftmaxXentForwardToDevice", args, 0.0f, nullptr, device_stats,
                                 /*accumulate=*/true));
  }
  Status GatherExamples(const GatherArgs& args) override { return Track(GatherImpl(args)); }

  StatusOr<Tensor> AllocateHostTensor(DataType dtype, TensorShape shape) override {
    if (!IsSupportedDataType(static_cast<int>(dtype)) || dtype == DataType::kString || shape.num_elements() == 0) {
      return Tensor::Create(dtype, std::move(shape));
    }
    FOREMAN_RETURN_IF_ERROR(Track(Enter("AllocateHostTensor", /*capturable=*/false)));
    const uint64_t n = static_cast<uint64_t>(shape.num_elements());
    const uint64_t elem = DataTypeSize(dtype);
    if (n > (UINT64_MAX - kPinnedHeader) / elem) {  // the header of AllocatePinned too
      return absl::ResourceExhaustedError(absl::StrCat(name_, " AllocateHostTensor: cannot allocate ", n, " x ",
                                                       elem, " bytes for ", DataTypeName(dtype), shape.ToString()));
    }
    const size_t bytes = static_cast<size_t>(n * elem);
    cudaError_t err;
    char* p = AllocatePinned(index_, bytes, &err);
    if (err != cudaSuccess) {
      cudaGetLastError();
      if (err == cudaErrorMemoryAllocation) {
        return absl::ResourceExhaustedError(absl::StrCat(name_, " AllocateHostTensor: cannot allocate ", bytes,
                                                         " bytes of page-locked memory for ", DataTypeName(dtype),
                                                         shape.ToString(), " (cudaMallocHost: ",
                                                         cudaGetErrorString(err), ")"));
      }
      return Fail("AllocateHostTensor", "cudaMallocHost", err);
    }
    std::memset(p, 0, bytes);  // zero-filled, as Tensor::Create's
    return Tensor::FromBuffer(dtype, std::move(shape), p, &FreePinned);
  }

  Status CopyToHostBatch(const HostCopy* copies, int64_t count) override {
    return Track(CopyToHostBatchImpl(copies, count));
  }

  bool asynchronous() const override { return true; }
  Status CopyToDeviceAsync(void* device_dst, const void* host_src, int64_t bytes) override {
    return Track(CopyAsyncImpl(/*to_device=*/true, device_dst, host_src, bytes));
  }
  Status CopyToHostAsync(void* host_dst, const void* device_src, int64_t bytes) override {
    return Track(CopyAsyncImpl(/*to_device=*/false, host_dst, device_src, bytes));
  }
  StatusOr<uint64_t> RecordMarker() override {
    uint64_t marker = 0;
    FOREMAN_RETURN_IF_ERROR(Track(RecordMarkerImpl(&marker)));
    return marker;
  }
  Status WaitForMarker(uint64_t marker) override { return Track(WaitForMarkerImpl(marker)); }

  Status BeginCapture() override {
    if (!sticky_.ok()) return sticky_;
    if (capturing_) return absl::FailedPreconditionError(name_ + " BeginCapture: already capturing");
    cudaError_t err;
    if ((err = cudaSetDevice(index_)) != cudaSuccess) return Fail("BeginCapture", "cudaSetDevice", err);
    if ((err = cudaStreamBeginCapture(compute_, cudaStreamCaptureModeRelaxed)) != cudaSuccess) {
      return Fail("BeginCapture", "cudaStreamBeginCapture", err);
    }
    capturing_ = true;
    (void)std::exchange(capture_error_, Status());
    return absl::OkStatus();
  }

  StatusOr<std::unique_ptr<CapturedOps>> EndCapture() override {
    if (!capturing_) return absl::FailedPreconditionError(name_ + " EndCapture: not capturing");
    capturing_ = false;
    cudaSetDevice(index_);
    cudaGraph_t graph = nullptr;
    const cudaError_t end_err = cudaStreamEndCapture(compute_, &graph);
    for (void* p : deferred_frees_) cudaFree(p);
    deferred_frees_.clear();
    Status status = std::exchange(capture_error_, Status());
    if (status.ok() && end_err != cudaSuccess) status.Update(Fail("EndCapture", "cudaStreamEndCapture", end_err));
    if (status.ok() && !sticky_.ok()) status.Update(sticky_);
    cudaGraphExec_t exec = nullptr;
    if (status.ok()) {
      const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
      if (err != cudaSuccess) status.Update(Fail("EndCapture", "cudaGraphInstantiate", err));
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!status.ok()) {
      if (end_err != cudaSuccess) cudaGetLastError();
      return status;
    }
    return std::unique_ptr<CapturedOps>(std::make_unique<CudaCapturedOps>(this, index_, exec));
  }

  Status Synchronize() override {
    FOREMAN_RETURN_IF_ERROR(Track(Enter("Synchronize", /*capturable=*/false)));
    cudaError_t err;
    if ((err = cudaStreamSynchronize(compute_)) != cudaSuccess) return Fail("Synchronize", "cudaStreamSynchronize", err);
    if ((err = cudaStreamSynchronize(copy_)) != cudaSuccess) return Fail("Synchronize", "cudaStreamSynchronize", err);
    return absl::OkStatus();
  }

  Status ReplayGraph(cudaGraphExec_t exec) {
    FOREMAN_RETURN_IF_ERROR(Track(Enter("Replay", /*capturable=*/false)));
    const cudaError_t err = cudaGraphLaunch(exec, compute_);
    if (err != cudaSuccess) return Fail("Replay", "cudaGraphLaunch", err);
    return absl::OkStatus();
  }

  Status LaunchFaultingKernel() {
    FOREMAN_RETURN_IF_ERROR(Enter("LaunchFaultingKernelForTesting", /*capturable=*/false));
    // A misaligned, unmapped address far from any allocation.
    FaultingKernel<<<1, 1, 0, compute_>>>(reinterpret_cast<int*>(uintptr_t{0x10}));
    FOREMAN_RETURN_IF_ERROR(Launched("LaunchFaultingKernelForTesting", "FaultingKernel"));
    const cudaError_t err = cudaStreamSynchronize(compute_);
    if (err != cudaSuccess) return Fail("LaunchFaultingKernelForTesting", "cudaStreamSynchronize", err);
    return absl::InternalError(name_ + " LaunchFaultingKernelForTesting: the faulting kernel did not fault");
  }

 private:
  // -- errors --------------------------------------------------------------

  /// INTERNAL naming the device, the operation, the call and the CUDA error;
  /// remembered when the error is sticky. A non-sticky error is cleared.
  Status Fail(const char* op, const char* call, cudaError_t err) {
    init_error_ = err;
    const bool sticky = IsSticky(err);
    Status s = absl::InternalError(absl::StrCat(name_, " ", op, ": ", call, ": ", cudaGetErrorName(err), ": ",
                                                cudaGetErrorString(err),
                                                sticky ? " (a sticky error: the device can no longer be used)" : ""));
    if (sticky) {
      if (sticky_.ok()) sticky_ = s;
    } else {
      cudaGetLastError();
    }
    return s;
  }

  Status OutOfMemory(const char* op, const char* call, int64_t bytes, cudaError_t err) {
    if (err != cudaErrorMemoryAllocation) return Fail(op, call, err);
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(name_, " ", op, ": out of device memory allocating ", bytes,
                                                     " bytes (", call, ": ", cudaGetErrorName(err), ")"));
  }

  /// After a kernel launch: its launch error, if any.
  Status Launched(const char* op, const char* kernel) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return Fail(op, absl::StrCat("kernel ", kernel, " launch").c_str(), err);
    return absl::OkStatus();
  }

  Status Invalid(const char* op, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(name_, " ", op, ": ", what));
  }
  Status Negative(const char* op, const char* what, int64_t value) {
    return Invalid(op, absl::StrCat(what, " must be >= 0, got ", value));
  }
  Status Null(const char* op, const char* what) { return Invalid(op, absl::StrCat(what, " is null")); }

  /// The start of every operation: a sticky error fails it at once; one that
  /// must return a host value or wait is refused while capturing; the device
  /// is made current on this thread.
  Status Enter(const char* op, bool capturable) {
    if (!sticky_.ok()) return sticky_;
    if (capturing_ && !capturable) {
      return absl::FailedPreconditionError(absl::StrCat(
          name_, " ", op, ": not allowed while capturing (it gives the host a value or waits for the device)"));
    }
    const cudaError_t err = cudaSetDevice(index_);
    if (err != cudaSuccess) return Fail(op, "cudaSetDevice", err);
    return absl::OkStatus();
  }

  /// An operation's result; while capturing, its first error spoils the
  /// capture (EndCapture returns it).
  Status Track(Status s) {
    if (!s.ok() && capturing_ && capture_error_.ok()) capture_error_ = s;
    return s;
  }

  // -- memory ----------------------------------------------------------------

  Status AllocateImpl(int64_t bytes, void** out) {
    FOREMAN_RETURN_IF_ERROR(Enter("Allocate", /*capturable=*/false));
    if (bytes < 0) return Negative("Allocate", "bytes", bytes);
    if (limit_ > 0 && bytes > limit_ - allocated_) {
      return absl::ResourceExhaustedError(absl::StrCat(name_, " Allocate: out of device memory allocating ", bytes,
                                                       " bytes: ", allocated_, " of the limit of ", limit_,
                                                       " bytes (SessionConfig.device_memory_limit_bytes) in use"));
    }
    void* p = nullptr;
    // cudaMalloc aligns to 256 bytes; 0 bytes still gives a unique pointer.
    const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (err != cudaSuccess) return OutOfMemory("Allocate", "cudaMalloc", bytes, err);
    allocations_[p] = bytes;
    allocated_ += bytes;
    *out = p;
    return absl::OkStatus();
  }

  Status CopyToDeviceImpl(void* dst, const void* src, int64_t bytes) {
    static constexpr const char* kOp = "CopyToDevice";
    // Refused while capturing: a recorded copy would read the host buffer at
    // replay, after the caller was told it may reuse it.
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/false));
    if (bytes < 0) return Negative(kOp, "bytes", bytes);
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr) return Null(kOp, "destination");
    if (src == nullptr) return Null(kOp, "source");
    cudaError_t err;
    if (bytes <= kStagingBytes) {
      // Through a pinned staging slot: the copy runs asynchronously and the
      // caller's buffer is free at once. A slot is reused once its last copy
      // is done.
      const int slot = next_slot_;
      next_slot_ = (next_slot_ + 1) % kStagingSlots;
      if ((err = cudaEventSynchronize(staging_done_[slot])) != cudaSuccess) {
        return Fail(kOp, "cudaEventSynchronize (staging buffer)", err);
      }
      std::memcpy(staging_[slot], src, static_cast<size_t>(bytes));
      if ((err = cudaMemcpyAsync(dst, staging_[slot], static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                 compute_)) != cudaSuccess) {
        return Fail(kOp, "cudaMemcpyAsync", err);
      }
      if ((err = cudaEventRecord(staging_done_[slot], compute_)) != cudaSuccess) {
        return Fail(kOp, "cudaEventRecord", err);
      }
      return absl::OkStatus();
    }
    if ((err = cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, compute_)) !=
        cudaSuccess) {
      return Fail(kOp, "cudaMemcpyAsync", err);
    }
    if ((err = cudaStreamSynchronize(compute_)) != cudaSuccess) return Fail(kOp, "cudaStreamSynchronize", err);
    return absl::OkStatus();
  }

  Status CopyToHostImpl(void* dst, const void* src, int64_t bytes) {
    static constexpr const char* kOp = "CopyToHost";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/false));
    if (bytes < 0) return Negative(kOp, "bytes", bytes);
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr) return Null(kOp, "destination");
    if (src == nullptr) return Null(kOp, "source");
    cudaError_t err;
    if ((err = cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, compute_)) !=
        cudaSuccess) {
      return Fail(kOp, "cudaMemcpyAsync", err);
    }
    if ((err = cudaStreamSynchronize(compute_)) != cudaSuccess) return Fail(kOp, "cudaStreamSynchronize", err);
    return absl::OkStatus();
  }

  Status CopyToHostBatchImpl(const HostCopy* copies, int64_t count) {
    static constexpr const char* kOp = "CopyToHostBatch";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/false));
    if (count < 0) return Negative(kOp, "count", count);
    if (count == 0) return absl::OkStatus();
    if (copies == nullptr) return Null(kOp, "copies");
    for (int64_t i = 0; i < count; ++i) {
      if (copies[i].bytes < 0) return Negative(kOp, absl::StrCat("copies[", i, "].bytes").c_str(), copies[i].bytes);
      if (copies[i].bytes > 0 && (copies[i].host_dst == nullptr || copies[i].device_src == nullptr)) {
        return Null(kOp, absl::StrCat("copies[", i, "].", copies[i].host_dst == nullptr ? "host_dst" : "device_src")
                             .c_str());
      }
    }
    // Only into page-locked memory (AllocateHostTensor's): a
    // cudaMemcpyAsync into pageable memory is staged through the driver and
    // blocks this thread, so the copy stream would overlap nothing.
    cudaError_t err;
    for (int64_t i = 0; i < count; ++i) {
      FOREMAN_RETURN_IF_ERROR(
          CheckPageLocked(kOp, absl::StrCat("copies[", i, "].host_dst"), copies[i].host_dst, copies[i].bytes));
    }
    // The copy stream starts after everything called so far; the compute
    // stream's later work waits only for these copies.
    if ((err = cudaEventRecord(compute_done_, compute_)) != cudaSuccess) return Fail(kOp, "cudaEventRecord", err);
    if ((err = cudaStreamWaitEvent(copy_, compute_done_, 0)) != cudaSuccess) {
      return Fail(kOp, "cudaStreamWaitEvent (copy stream)", err);
    }
    for (int64_t i = 0; i < count; ++i) {
      if (copies[i].bytes == 0) continue;
      if ((err = cudaMemcpyAsync(copies[i].host_dst, copies[i].device_src, static_cast<size_t>(copies[i].bytes),
                                 cudaMemcpyDeviceToHost, copy_)) != cudaSuccess) {
        return Fail(kOp, "cudaMemcpyAsync (copy stream)", err);
      }
    }
    if ((err = cudaEventRecord(copy_done_, copy_)) != cudaSuccess) return Fail(kOp, "cudaEventRecord", err);
    if ((err = cudaStreamWaitEvent(compute_, copy_done_, 0)) != cudaSuccess) {
      return Fail(kOp, "cudaStreamWaitEvent (compute stream)", err);
    }
    if ((err = cudaEventSynchronize(copy_done_)) != cudaSuccess) return Fail(kOp, "cudaEventSynchronize", err);
    return absl::OkStatus();
  }

  /// INVALID_ARGUMENT unless [ptr, ptr + bytes) is page-locked host memory
  /// (AllocateHostTensor's). Both ends are checked: an allocation is one
  /// region.
  Status CheckPageLocked(const char* op, const std::string& what, const void* ptr, int64_t bytes) {
    if (bytes <= 0) return absl::OkStatus();
    const char* ends[] = {static_cast<const char*>(ptr), static_cast<const char*>(ptr) + bytes - 1};
    for (const char* end : ends) {
      cudaPointerAttributes attributes{};
      const cudaError_t err = cudaPointerGetAttributes(&attributes, end);
      if (err != cudaSuccess) return Fail(op, "cudaPointerGetAttributes", err);
      if (attributes.type != cudaMemoryTypeHost) {
        return Invalid(op, absl::StrCat(what, " (", bytes, " bytes at 0x", absl::Hex(reinterpret_cast<uintptr_t>(ptr)),
                                        ") is not page-locked host memory (a tensor from AllocateHostTensor)"));
      }
    }
    return absl::OkStatus();
  }

  /// CopyToDeviceAsync (to_device) and CopyToHostAsync: one cudaMemcpyAsync
  /// on the compute stream, which a capture records (its replay reads or
  /// writes the page-locked buffer when it runs).
  Status CopyAsyncImpl(bool to_device, void* dst, const void* src, int64_t bytes) {
    const char* op = to_device ? "CopyToDeviceAsync" : "CopyToHostAsync";
    FOREMAN_RETURN_IF_ERROR(Enter(op, /*capturable=*/true));
    if (bytes < 0) return Negative(op, "bytes", bytes);
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr) return Null(op, "destination");
    if (src == nullptr) return Null(op, "source");
    FOREMAN_RETURN_IF_ERROR(
        CheckPageLocked(op, to_device ? "the source" : "the destination", to_device ? src : dst, bytes));
    const cudaError_t err = cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                            to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, compute_);
    if (err != cudaSuccess) return Fail(op, "cudaMemcpyAsync", err);
    return absl::OkStatus();
  }

  Status RecordMarkerImpl(uint64_t* marker) {
    FOREMAN_RETURN_IF_ERROR(Enter("RecordMarker", /*capturable=*/false));
    const uint64_t next = newest_marker_ + 1;
    const cudaError_t err = cudaEventRecord(marker_events_[next % kMarkerEvents], compute_);
    if (err != cudaSuccess) return Fail("RecordMarker", "cudaEventRecord", err);
    newest_marker_ = next;
    *marker = next;
    return absl::OkStatus();
  }

  Status WaitForMarkerImpl(uint64_t marker) {
    FOREMAN_RETURN_IF_ERROR(Enter("WaitForMarker", /*capturable=*/false));
    if (marker == 0) return absl::OkStatus();
    if (marker > newest_marker_) return MarkerNotRecorded(marker, newest_marker_);
    // An event re-recorded since stands for a later marker: the stream runs
    // in order, so waiting for the oldest one still held covers `marker`.
    const uint64_t oldest_held = newest_marker_ >= kMarkerEvents ? newest_marker_ - kMarkerEvents + 1 : 1;
    const uint64_t wait_for = std::max(marker, oldest_held);
    const cudaError_t err = cudaEventSynchronize(marker_events_[wait_for % kMarkerEvents]);
    if (err != cudaSuccess) return Fail("WaitForMarker", "cudaEventSynchronize", err);
    return absl::OkStatus();
  }

  // -- kernels ---------------------------------------------------------------

  Status GemmImpl(const GemmArgs& g) {
    static constexpr const char* kOp = "Gemm";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/true));
    if (g.m < 0) return Negative(kOp, "m", g.m);
    if (g.n < 0) return Negative(kOp, "n", g.n);
    if (g.k < 0) return Negative(kOp, "k", g.k);
    if (g.column_sums != nullptr && g.epilogue != Epilogue::kNone) {
      return Invalid(kOp, "column_sums is only for the epilogue kNone");
    }
    const int64_t rows = math::gemm::RowsWithSums(g);  // m, and the row of ones for column_sums
    const bool has_output = rows > 0 && g.n > 0;
    if (!has_output) return absl::OkStatus();
    if (g.m > 0 && g.c == nullptr) return Null(kOp, "c");
    if (g.k > 0 && (g.a == nullptr || g.b == nullptr)) {
      if (g.b == nullptr) return Null(kOp, "b");
      if (g.m > 0) return Null(kOp, "a");
    }
    const bool needs_bias = g.epilogue == Epilogue::kBias || g.epilogue == Epilogue::kBiasRelu;
    if (needs_bias && g.bias == nullptr) return Null(kOp, "bias (epilogue kBias/kBiasRelu)");
    if (g.epilogue == Epilogue::kReluGradMask) {
      if (g.relu_output == nullptr) return Null(kOp, "relu_output (epilogue kReluGradMask)");
      if (g.relu_output == g.c) return Invalid(kOp, "relu_output must not be c");
    }
    // 64 x 64 tiles (P = 4) when they give every multiprocessor two blocks,
    // else 16 x 16 (P = 1): more blocks for the small outputs of a small
    // batch. Bitwise the same outputs either way (math::gemm).
    constexpr int64_t kBig = math::gemm::kTileOf<4>, kSmall = math::gemm::kTileOf<1>;
    const bool big = ((rows + kBig - 1) / kBig) * ((g.n + kBig - 1) / kBig) >= 2 * int64_t{multiprocessors_};
    const int64_t tile = big ? kBig : kSmall;
    const int64_t grid_y = (rows + tile - 1) / tile;
    const int64_t grid_x = (g.n + tile - 1) / tile;
    if (grid_y > 65535 || grid_x > INT32_MAX) {
      return Invalid(kOp, absl::StrCat("m = ", g.m, g.column_sums != nullptr ? " (and the row of column sums)" : "",
                                       " exceeds this kernel's ", int64_t{65535} * tile, " rows"));
    }
    const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
    if (big) {
      if (!baseline_kernels_) {
        GemmKernel<4, true><<<grid, kGemmThreads, 0, compute_>>>(g);
      } else {
        GemmKernel<4, false><<<grid, kGemmThreads, 0, compute_>>>(g);
      }
    } else if (!baseline_kernels_) {
      GemmKernel<1, true><<<grid, kGemmThreads, 0, compute_>>>(g);
    } else {
      GemmKernel<1, false><<<grid, kGemmThreads, 0, compute_>>>(g);
    }
    return Launched(kOp, "GemmKernel");
  }

  Status ColumnSumsImpl(const float* delta, int64_t rows, int64_t cols, float* out) {
    static constexpr const char* kOp = "ColumnSums";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/true));
    if (rows < 0) return Negative(kOp, "rows", rows);
    if (cols < 0) return Negative(kOp, "cols", cols);
    if (cols == 0) return absl::OkStatus();
    if (out == nullptr) return Null(kOp, "out");
    if (rows > 0 && delta == nullptr) return Null(kOp, "delta");
    const int64_t blocks = (cols + kSumCols - 1) / kSumCols;
    if (blocks > INT32_MAX) return Invalid(kOp, absl::StrCat("cols = ", cols, " is too many for this kernel"));
    ColumnSumsKernel<<<static_cast<unsigned>(blocks), kSumThreads, 0, compute_>>>(delta, rows, cols, out);
    return Launched(kOp, "ColumnSumsKernel");
  }

  /// Blocks covering n threads exactly (one per column / row).
  static unsigned ElementwiseBlocksFor(int64_t n) {
    return static_cast<unsigned>(std::max<int64_t>(1, (n + kElementwiseThreads - 1) / kElementwiseThreads));
  }

  Status CheckXent(const char* op, const SoftmaxXentArgs& args) {
    if (args.rows < 0) return Negative(op, "rows", args.rows);
    if (args.classes < 1) return Invalid(op, absl::StrCat("classes must be >= 1, got ", args.classes));
    if (args.rows > 0 && args.logits == nullptr) return Null(op, "logits");
    if (args.rows > 0 && args.labels == nullptr) return Null(op, "labels");
    return absl::OkStatus();
  }

  Status XentBackwardImpl(const SoftmaxXentArgs& args, float scale, float* grad) {
    static constexpr const char* kOp = "SoftmaxXentBackward";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/true));
    FOREMAN_RETURN_IF_ERROR(CheckXent(kOp, args));
    if (args.rows == 0) return absl::OkStatus();
    if (grad == nullptr) return Null(kOp, "grad");
    XentRowsKernel<<<ElementwiseBlocksFor(args.rows), kElementwiseThreads, 0, compute_>>>(args, scale, grad);
    return Launched(kOp, "XentRowsKernel");
  }

  /// The statistics kernel into *out (device memory).
  Status LaunchXentStats(const char* op, const SoftmaxXentArgs& args, float scale, float* grad, SoftmaxXentStats* out,
                         bool accumulate, double init_loss, int64_t init_correct) {
    if (baseline_kernels_) {
      XentStatsSerialKernel<<<1, kXentSerialThreads, 0, compute_>>>(args, scale, grad, out, accumulate, init_loss,
                                                                     static_cast<long long>(init_correct));
      return Launched(op, "XentStatsSerialKernel");
    }
    XentStatsKernel<<<1, kXentStatsThreads, 0, compute_>>>(args, scale, grad, out, accumulate, init_loss,
                                                            static_cast<long long>(init_correct));
    return Launched(op, "XentStatsKernel");
  }

  Status XentHostStats(const char* op, const SoftmaxXentArgs& args, SoftmaxXentStats* stats, float scale,
                       float* grad, bool with_grad) {
    FOREMAN_RETURN_IF_ERROR(Enter(op, /*capturable=*/false));
    FOREMAN_RETURN_IF_ERROR(CheckXent(op, args));
    if (stats == nullptr) return Null(op, "stats");
    if (with_grad && args.rows > 0 && grad == nullptr) return Null(op, "grad");
    if (args.rows == 0) return absl::OkStatus();
    // Continues the host's sums: the rows' tree sum is added to them.
    FOREMAN_RETURN_IF_ERROR(LaunchXentStats(op, args, scale, with_grad ? grad : nullptr, stats_scratch_, false,
                                            stats->loss_sum, stats->correct));
    cudaError_t err;
    if ((err = cudaMemcpyAsync(host_stats_, stats_scratch_, sizeof(SoftmaxXentStats), cudaMemcpyDeviceToHost,
                               compute_)) != cudaSuccess) {
      return Fail(op, "cudaMemcpyAsync (statistics)", err);
    }
    if ((err = cudaStreamSynchronize(compute_)) != cudaSuccess) return Fail(op, "cudaStreamSynchronize", err);
    *stats = *host_stats_;
    return absl::OkStatus();
  }

  Status XentDeviceStats(const char* op, const SoftmaxXentArgs& args, float scale, float* grad,
                         SoftmaxXentStats* device_stats, bool accumulate) {
    FOREMAN_RETURN_IF_ERROR(Enter(op, /*capturable=*/true));
    FOREMAN_RETURN_IF_ERROR(CheckXent(op, args));
    if (device_stats == nullptr) return Null(op, "device_stats");
    if (!accumulate && args.rows > 0 && grad == nullptr) return Null(op, "grad");
    // Launched even for 0 rows: SoftmaxXentToDevice then writes zeros.
    return LaunchXentStats(op, args, scale, grad, device_stats, accumulate, 0.0, 0);
  }

  Status CheckUpdate(const char* op, int64_t n, std::initializer_list<std::pair<const char*, const void*>> ptrs) {
    if (n < 0) return Negative(op, "n", n);
    if (n == 0) return absl::OkStatus();
    for (const auto& [what, p] : ptrs) {
      if (p == nullptr) return Null(op, what);
    }
    return absl::OkStatus();
  }

  Status GradientDescentImpl(float* var, const float* grad, int64_t n, const float* lr_ptr, float lr) {
    static constexpr const char* kOp = "ApplyGradientDescent";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/true));
    FOREMAN_RETURN_IF_ERROR(CheckUpdate(kOp, n, {{"var", var}, {"grad", grad}}));
    if (n == 0) return absl::OkStatus();
    GradientDescentKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, compute_>>>(var, grad, n, lr_ptr, lr);
    return Launched(kOp, "GradientDescentKernel");
  }

  Status MomentumImpl(float* var, float* accum, const float* grad, int64_t n, const float* lr_ptr, float lr,
                      float momentum, bool use_nesterov) {
    static constexpr const char* kOp = "ApplyMomentum";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/true));
    FOREMAN_RETURN_IF_ERROR(CheckUpdate(kOp, n, {{"var", var}, {"accum", accum}, {"grad", grad}}));
    if (n == 0) return absl::OkStatus();
    MomentumKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, compute_>>>(var, accum, grad, n, lr_ptr, lr,
                                                                               momentum, use_nesterov);
    return Launched(kOp, "MomentumKernel");
  }

  Status AdamImpl(float* var, float* m, float* v, const float* grad, int64_t n, const float* step_ptr,
                  float step_size, float beta1, float beta2, float epsilon) {
    static constexpr const char* kOp = "ApplyAdam";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/true));
    FOREMAN_RETURN_IF_ERROR(CheckUpdate(kOp, n, {{"var", var}, {"m", m}, {"v", v}, {"grad", grad}}));
    if (n == 0) return absl::OkStatus();
    AdamKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, compute_>>>(var, m, v, grad, n, step_ptr, step_size,
                                                                           beta1, beta2, epsilon);
    return Launched(kOp, "AdamKernel");
  }

  Status AdamStepSizeImpl(DeviceScalar lr, DeviceScalar beta1_power, DeviceScalar beta2_power, float* step_size) {
    static constexpr const char* kOp = "AdamStepSize";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/true));
    if (lr.ptr == nullptr) return Null(kOp, "learning_rate");
    if (beta1_power.ptr == nullptr) return Null(kOp, "beta1_power");
    if (beta2_power.ptr == nullptr) return Null(kOp, "beta2_power");
    if (step_size == nullptr) return Null(kOp, "step_size");
    AdamStepSizeKernel<<<1, 1, 0, compute_>>>(lr.ptr, beta1_power.ptr, beta2_power.ptr, step_size);
    return Launched(kOp, "AdamStepSizeKernel");
  }

  Status AdamFinishImpl(float* beta1_power, float* beta2_power, float beta1, float beta2) {
    static constexpr const char* kOp = "AdamFinish";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/true));
    if (beta1_power == nullptr) return Null(kOp, "beta1_power");
    if (beta2_power == nullptr) return Null(kOp, "beta2_power");
    AdamFinishKernel<<<1, 1, 0, compute_>>>(beta1_power, beta2_power, beta1, beta2);
    return Launched(kOp, "AdamFinishKernel");
  }

  Status AdamGroupImpl(const AdamVariable* variables, int64_t count, DeviceScalar lr, float* beta1_power,
                       float* beta2_power, float beta1, float beta2, float epsilon, float* step_size) {
    static constexpr const char* kOp = "ApplyAdamGroup";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/true));
    FOREMAN_RETURN_IF_ERROR(CheckAdamGroup(variables, count, lr, beta1_power, beta2_power, step_size));
    // Groups of at most kMaxVariables (one launch each; the variables with
    // no elements left out), all before AdamFinish.
    constexpr int kMax = math::adam_group::kMaxVariables;
    std::vector<AdamVariable> live;
    for (int64_t i = 0; i < count; ++i) {
      if (variables[i].n > 0) live.push_back(variables[i]);
    }
    std::size_t i = 0;
    do {
      AdamGroupArgs a;
      a.learning_rate = lr.ptr;
      a.beta1_power = beta1_power;
      a.beta2_power = beta2_power;
      a.step_size = step_size;
      a.beta1 = beta1;
      a.beta2 = beta2;
      a.epsilon = epsilon;
      while (i < live.size() && a.count < kMax) a.variables[a.count++] = live[i++];
      // With no elements at all, one block of an empty variable still
      // writes *step_size.
      if (a.count == 0) a.variables[a.count++] = AdamVariable{};
      int64_t blocks = math::adam_group::PlanBlocks(a.variables, a.count, kElementwiseThreads, kMaxElementwiseBlocks,
                                                    a.block_start);
      if (blocks == 0) blocks = a.block_start[a.count] = 1;
      if (blocks > INT32_MAX) return Invalid(kOp, "too many elements for one launch");
      AdamGroupKernel<<<static_cast<unsigned>(blocks), kElementwiseThreads, 0, compute_>>>(a);
      FOREMAN_RETURN_IF_ERROR(Launched(kOp, "AdamGroupKernel"));
    } while (i < live.size());
    return AdamFinishImpl(beta1_power, beta2_power, beta1, beta2);
  }

  Status GatherImpl(const GatherArgs& a) {
    static constexpr const char* kOp = "GatherExamples";
    FOREMAN_RETURN_IF_ERROR(Enter(kOp, /*capturable=*/true));
    if (a.rows < 0) return Negative(kOp, "rows", a.rows);
    if (a.feature_dim < 0) return Negative(kOp, "feature_dim", a.feature_dim);
    if (a.rows == 0) return absl::OkStatus();
    if (a.indices == nullptr) return Null(kOp, "indices");
    if (a.labels == nullptr) return Null(kOp, "labels");
    if (a.example_labels == nullptr) return Null(kOp, "example_labels");
    if (a.feature_dim > 0 && (a.images == nullptr || a.features == nullptr)) {
      return Null(kOp, a.images == nullptr ? "images" : "features");
    }
    const int64_t total = std::max(a.rows, a.rows * a.feature_dim);
    GatherKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, compute_>>>(a);
    return Launched(kOp, "GatherKernel");
  }

  const int index_;
  const std::string name_;
  const int64_t limit_;  // 0: none
  int multiprocessors_ = 1;
  // FOREMAN_CUDA_BASELINE_KERNELS=1 (kernel_bench): GemmKernel<P, false> and
  // XentStatsSerialKernel instead of GemmKernel<P, true> and XentStatsKernel.
  bool baseline_kernels_ = false;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;
  cudaEvent_t copy_done_ = nullptr;
  char* staging_[kStagingSlots] = {};
  cudaEvent_t staging_done_[kStagingSlots] = {};
  int next_slot_ = 0;
  static constexpr uint64_t kMarkerEvents = 4;
  cudaEvent_t marker_events_[kMarkerEvents] = {};  // marker m is event m % kMarkerEvents
  uint64_t newest_marker_ = 0;
  SoftmaxXentStats* host_stats_ = nullptr;     // pinned
  SoftmaxXentStats* stats_scratch_ = nullptr;  // device
  std::map<void*, int64_t> allocations_;       // Allocate's, with their requested sizes
  int64_t allocated_ = 0;
  std::vector<void*> deferred_frees_;  // Deallocate'd while capturing
  bool capturing_ = false;
  Status capture_error_;
  Status sticky_;  // the first sticky CUDA error: every later operation returns it
  cudaError_t init_error_ = cudaSuccess;  // the last error Fail saw (for Init)
};

Status CudaCapturedOps::Replay() { return device_->ReplayGraph(exec_); }

StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int index, int64_t memory_limit_bytes) {
  const std::string name = absl::StrCat("/gpu:", index);
  if (memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": the device memory limit must be >= 0 bytes, got ", memory_limit_bytes));
  }
  StatusOr<int> count = cuda::CountDevices();
  if (!count.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(name, ": no usable CUDA device: ", count.status().message()));
  }
  if (index < 0 || index >= *count) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, ": no such device, only ", *count, " CUDA device(s) present"));
  }
  auto device = std::make_unique<CudaDevice>(index, memory_limit_bytes);
  FOREMAN_RETURN_IF_ERROR(device->Init());
  return std::unique_ptr<Device>(std::move(device));
}

Status LaunchFaultingKernel(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (cuda == nullptr) {
    return absl::FailedPreconditionError(device.name() + " LaunchFaultingKernelForTesting: not a CUDA device");
  }
  return cuda->LaunchFaultingKernel();
}

constexpr CudaModule kModule = {
    kCudaModuleAbi, FOREMAN_VERSION, &cuda::CountDevices, &cuda::DeviceInfoOf, &cuda::RunSelfTest,
    &MakeCudaDevice, &LaunchFaultingKernel,
};

}  // namespace
}  // namespace foreman::compute

extern "C" __attribute__((visibility("default"))) const foreman::compute::CudaModule* foreman_cuda_module_v1() {
  return &foreman::compute::kModule;
}
