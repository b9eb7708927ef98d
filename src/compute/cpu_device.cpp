// The CPU device: checks each operation's arguments, then runs the kernels of
// the instruction set it chose (cpu_kernels.hpp, cpu_kernels_impl.inc).
#include "compute/cpu_device.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <new>
#include <string>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>

#include "absl/strings/str_cat.h"
#include "platform/log.hpp"

namespace foreman::compute {

namespace {

constexpr std::size_t kAlignment = 64;

Status NegativeSize(const char* op, const char* what, int64_t value) {
  return absl::InvalidArgumentError(absl::StrCat("/cpu:0 ", op, ": ", what, " must be >= 0, got ", value));
}

Status NullPointer(const char* op, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("/cpu:0 ", op, ": ", what, " is null"));
}

/// INVALID_ARGUMENT for n < 0 or a null pointer among `ptrs` when n > 0.
Status CheckUpdate(const char* op, int64_t n, std::initializer_list<std::pair<const char*, const void*>> ptrs) {
  if (n < 0) return NegativeSize(op, "n", n);
  if (n == 0) return absl::OkStatus();
  for (const auto& [what, p] : ptrs) {
    if (p == nullptr) return NullPointer(op, what);
  }
  return absl::OkStatus();
}

Status CheckXent(const char* op, const SoftmaxXentArgs& args) {
  if (args.rows < 0) return NegativeSize(op, "rows", args.rows);
  if (args.classes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("/cpu:0 ", op, ": classes must be >= 1, got ", args.classes));
  }
  if (args.rows > 0 && args.logits == nullptr) return NullPointer(op, "logits");
  if (args.rows > 0 && args.labels == nullptr) return NullPointer(op, "labels");
  return absl::OkStatus();
}

/// The cap from FOREMAN_MAX_ISA; an invalid value means baseline (warned
/// about once per process).
CpuIsa MaxIsaOrBaseline() {
  StatusOr<CpuIsa> max = MaxCpuIsaFromEnv();
  if (max.ok()) return *max;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) FOREMAN_LOG_WARN("{}; using the baseline CPU kernels", std::string(max.status().message()));
  return CpuIsa::kBaseline;
}

/// The kernels at most `max_isa`; the first choice of each instruction set
/// in the process is logged.
const CpuKernels* Choose(CpuIsa max_isa, CpuIsa* chosen) {
  const CpuKernels* kernels = SelectCpuKernels(max_isa, chosen);
  static std::atomic<int> logged{0};
  const int bit = 1 << static_cast<int>(*chosen);
  if ((logged.fetch_or(bit) & bit) == 0) {
    FOREMAN_LOG_INFO("CPU kernels: {} (this CPU supports up to {}; cap {})", CpuIsaName(*chosen),
                     CpuIsaName(DetectCpuIsa()), CpuIsaName(max_isa));
  }
  return kernels;
}

}  // namespace

// `threads` intra-op threads: the calling (training) thread and threads - 1
// pool workers. The caller always takes a share of a parallel kernel (Gemm's
// first row block, parallelFor's first range), so a pool of `threads`
// workers would leave one spinning for work on a core the caller needs
// (on 2 cores, --threads 2 was slower than 1).
struct CpuDevice::Pool {
  explicit Pool(int threads) : pool(std::max(1, threads - 1)), device(&pool, threads) {}
  Eigen::ThreadPool pool;
  Eigen::ThreadPoolDevice device;
};

CpuDevice::CpuDevice(int threads) : CpuDevice(threads, MaxIsaOrBaseline()) {}
CpuDevice::CpuDevice(int threads, CpuIsa max_isa)
    : owned_(std::make_unique<Pool>(std::max(1, threads))),
      eigen_(&owned_->device),
      kernels_(Choose(max_isa, &isa_)) {}
CpuDevice::CpuDevice(const Eigen::ThreadPoolDevice* eigen) : CpuDevice(eigen, MaxIsaOrBaseline()) {}
CpuDevice::CpuDevice(const Eigen::ThreadPoolDevice* eigen, CpuIsa max_isa)
    : eigen_(eigen), kernels_(Choose(max_isa, &isa_)) {}
CpuDevice::~CpuDevice() {
  // Device's contract: what is still allocated goes with the device.
  for (void* p : allocations_) ::operator delete(p, std::align_val_t(kAlignment));
}

int CpuDevice::num_threads() const { return eigen_->numThreads(); }

StatusOr<void*> CpuDevice::Allocate(int64_t bytes) {
  if (bytes < 0) return NegativeSize("Allocate", "bytes", bytes);
  // Rounded up to the alignment, and never 0 bytes, so the pointer is unique.
  const std::size_t size = (static_cast<std::size_t>(bytes) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = ::operator new(std::max(size, kAlignment), std::align_val_t(kAlignment), std::nothrow);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("/cpu:0: out of memory allocating ", bytes, " bytes"));
  }
  allocations_.insert(p);
  return p;
}

void CpuDevice::Deallocate(void* ptr) {
  if (ptr == nullptr || allocations_.erase(ptr) == 0) return;
  ::operator delete(ptr, std::align_val_t(kAlignment));
}

Status CpuDevice::CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) {
  FOREMAN_RETURN_IF_ERROR(CheckUpdate("CopyToDevice", bytes, {{"destination", device_dst}, {"source", host_src}}));
  if (bytes > 0) std::memcpy(device_dst, host_src, static_cast<std::size_t>(bytes));
  return absl::OkStatus();
}

Status CpuDevice::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  FOREMAN_RETURN_IF_ERROR(CheckUpdate("CopyToHost", bytes, {{"destination", host_dst}, {"source", device_src}}));
  if (bytes > 0) std::memcpy(host_dst, device_src, static_cast<std::size_t>(bytes));
  return absl::OkStatus();
}

Status CpuDevice::Gemm(const GemmArgs& g) {
  if (g.m < 0) return NegativeSize("Gemm", "m", g.m);
  if (g.n < 0) return NegativeSize("Gemm", "n", g.n);
  if (g.k < 0) return NegativeSize("Gemm", "k", g.k);
  const bool has_output = g.m > 0 && g.n > 0;
  const bool has_sums = g.column_sums != nullptr && g.n > 0;
  if (has_output && g.c == nullptr) return NullPointer("Gemm", "c");
  if (has_output && g.k > 0 && (g.a == nullptr || g.b == nullptr)) return NullPointer("Gemm", g.a ? "b" : "a");
  if (has_sums && g.k > 0 && g.b == nullptr) return NullPointer("Gemm", "b");
  const bool needs_bias = g.epilogue == Epilogue::kBias || g.epilogue == Epilogue::kBiasRelu;
  if (has_output && needs_bias && g.bias == nullptr) return NullPointer("Gemm", "bias (epilogue kBias/kBiasRelu)");
  if (has_output && g.epilogue == Epilogue::kReluGradMask) {
    if (g.relu_output == nullptr) return NullPointer("Gemm", "relu_output (epilogue kReluGradMask)");
    if (g.relu_output == g.c) return absl::InvalidArgumentError("/cpu:0 Gemm: relu_output must not be c");
  }
  if (g.column_sums != nullptr && g.epilogue != Epilogue::kNone) {
    return absl::InvalidArgumentError("/cpu:0 Gemm: column_sums is only for the epilogue kNone");
  }
  if (has_sums) {
    // op(B)'s column sums in k order, as ColumnSums: B stored [k, n] is its
    // input as is; stored [n, k] (transpose_b), each column is a stored row.
    if (!g.transpose_b) {
      kernels_->column_sums(g.b, g.k, g.n, g.column_sums);
    } else {
      for (int64_t col = 0; col < g.n; ++col) {
        float sum = 0.0f;
        for (int64_t kk = 0; kk < g.k; ++kk) sum += g.b[col * g.k + kk];
        g.column_sums[col] = sum;
      }
    }
  }
  if (!has_output) return absl::OkStatus();

  if (g.k == 0) {
    // No products: the epilogue of zeros (Eigen does not contract empty dims).
    for (int64_t r = 0; r < g.m; ++r) {
      float* row = g.c + r * g.n;
      for (int64_t col = 0; col < g.n; ++col) {
        row[col] = !needs_bias ? 0.0f : g.epilogue == Epilogue::kBiasRelu ? std::max(g.bias[col], 0.0f) : g.bias[col];
      }
    }
    return absl::OkStatus();
  }
  kernels_->gemm(eigen_, &g);
  return absl::OkStatus();
}

Status CpuDevice::ColumnSums(const float* delta, int64_t rows, int64_t cols, float* out) {
  if (rows < 0) return NegativeSize("ColumnSums", "rows", rows);
  if (cols < 0) return NegativeSize("ColumnSums", "cols", cols);
  if (cols == 0) return absl::OkStatus();
  if (out == nullptr) return NullPointer("ColumnSums", "out");
  if (rows > 0 && delta == nullptr) return NullPointer("ColumnSums", "delta");
  kernels_->column_sums(delta, rows, cols, out);
  return absl::OkStatus();
}

Status CpuDevice::SoftmaxXentForward(const SoftmaxXentArgs& args, SoftmaxXentStats* stats) {
  FOREMAN_RETURN_IF_ERROR(CheckXent("SoftmaxXentForward", args));
  if (stats == nullptr) return NullPointer("SoftmaxXentForward", "stats");
  kernels_->softmax_xent(&args, stats, 0.0f, nullptr);
  return absl::OkStatus();
}

Status CpuDevice::SoftmaxXentBackward(const SoftmaxXentArgs& args, float scale, float* grad) {
  FOREMAN_RETURN_IF_ERROR(CheckXent("SoftmaxXentBackward", args));
  if (args.rows > 0 && grad == nullptr) return NullPointer("SoftmaxXentBackward", "grad");
  kernels_->softmax_xent(&args, nullptr, scale, grad);
  return absl::OkStatus();
}

Status CpuDevice::SoftmaxXent(const SoftmaxXentArgs& args, SoftmaxXentStats* stats, float scale, float* grad) {
  FOREMAN_RETURN_IF_ERROR(CheckXent("SoftmaxXent", args));
  if (stats == nullptr) return NullPointer("SoftmaxXent", "stats");
  if (args.rows > 0 && grad == nullptr) return NullPointer("SoftmaxXent", "grad");
  kernels_->softmax_xent(&args, stats, scale, grad);
  return absl::OkStatus();
}

Status CpuDevice::ApplyGradientDescent(float* var_p, const float* grad_p, int64_t n, float lr) {
  FOREMAN_RETURN_IF_ERROR(CheckUpdate("ApplyGradientDescent", n, {{"var", var_p}, {"grad", grad_p}}));
  kernels_->apply_gradient_descent(eigen_, var_p, grad_p, n, lr);
  return absl::OkStatus();
}

Status CpuDevice::ApplyMomentum(float* var_p, float* accum_p, const float* grad_p, int64_t n,
                                const MomentumParams& p) {
  FOREMAN_RETURN_IF_ERROR(
      CheckUpdate("ApplyMomentum", n, {{"var", var_p}, {"accum", accum_p}, {"grad", grad_p}}));
  kernels_->apply_momentum(eigen_, var_p, accum_p, grad_p, n, &p);
  return absl::OkStatus();
}

Status CpuDevice::ApplyAdam(float* var_p, float* m_p, float* v_p, const float* grad_p, int64_t n,
                            const AdamParams& p) {
  FOREMAN_RETURN_IF_ERROR(CheckUpdate("ApplyAdam", n, {{"var", var_p}, {"m", m_p}, {"v", v_p}, {"grad", grad_p}}));
  kernels_->apply_adam(eigen_, var_p, m_p, v_p, grad_p, n, &p);
  return absl::OkStatus();
}

// -- the device-scalar forms -----------------------------------------------------

Status CpuDevice::ApplyGradientDescent(float* var, const float* grad, int64_t n, DeviceScalar learning_rate) {
  if (learning_rate.ptr == nullptr) return NullPointer("ApplyGradientDescent", "learning_rate");
  return ApplyGradientDescent(var, grad, n, *learning_rate.ptr);
}

Status CpuDevice::ApplyMomentum(float* var, float* accum, const float* grad, int64_t n, DeviceScalar learning_rate,
                                float momentum, bool use_nesterov) {
  if (learning_rate.ptr == nullptr) return NullPointer("ApplyMomentum", "learning_rate");
  MomentumParams p;
  p.learning_rate = *learning_rate.ptr;
  p.momentum = momentum;
  p.use_nesterov = use_nesterov;
  return ApplyMomentum(var, accum, grad, n, p);
}

Status CpuDevice::ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n, DeviceScalar step_size,
                            float beta1, float beta2, float epsilon) {
  if (step_size.ptr == nullptr) return NullPointer("ApplyAdam", "step_size");
  AdamParams p;
  p.step_size = *step_size.ptr;
  p.beta1 = beta1;
  p.beta2 = beta2;
  p.epsilon = epsilon;
  return ApplyAdam(var, m, v, grad, n, p);
}

Status CpuDevice::AdamStepSize(DeviceScalar learning_rate, DeviceScalar beta1_power, DeviceScalar beta2_power,
                               float* step_size) {
  if (learning_rate.ptr == nullptr) return NullPointer("AdamStepSize", "learning_rate");
  if (beta1_power.ptr == nullptr) return NullPointer("AdamStepSize", "beta1_power");
  if (beta2_power.ptr == nullptr) return NullPointer("AdamStepSize", "beta2_power");
  if (step_size == nullptr) return NullPointer("AdamStepSize", "step_size");
  // nn::internal::AdamStepSize's expression (apply_adam's lr_t), in float.
  *step_size = *learning_rate.ptr * std::sqrt(1.0f - *beta2_power.ptr) / (1.0f - *beta1_power.ptr);
  return absl::OkStatus();
}

Status CpuDevice::AdamFinish(float* beta1_power, float* beta2_power, float beta1, float beta2) {
  if (beta1_power == nullptr) return NullPointer("AdamFinish", "beta1_power");
  if (beta2_power == nullptr) return NullPointer("AdamFinish", "beta2_power");
  *beta1_power = *beta1_power * beta1;
  *beta2_power = *beta2_power * beta2;
  return absl::OkStatus();
}

Status CpuDevice::SoftmaxXentToDevice(const SoftmaxXentArgs& args, float scale, float* grad,
                                      SoftmaxXentStats* device_stats) {
  if (device_stats == nullptr) return NullPointer("SoftmaxXentToDevice", "device_stats");
  SoftmaxXentStats stats;
  FOREMAN_RETURN_IF_ERROR(SoftmaxXent(args, &stats, scale, grad));
  *device_stats = stats;
  return absl::OkStatus();
}

Status CpuDevice::SoftmaxXentForwardToDevice(const SoftmaxXentArgs& args, SoftmaxXentStats* device_stats) {
  if (device_stats == nullptr) return NullPointer("SoftmaxXentForwardToDevice", "device_stats");
  return SoftmaxXentForward(args, device_stats);
}

Status CpuDevice::GatherExamples(const GatherArgs& a) {
  if (a.rows < 0) return NegativeSize("GatherExamples", "rows", a.rows);
  if (a.feature_dim < 0) return NegativeSize("GatherExamples", "feature_dim", a.feature_dim);
  if (a.rows == 0) return absl::OkStatus();
  if (a.indices == nullptr) return NullPointer("GatherExamples", "indices");
  if (a.labels == nullptr) return NullPointer("GatherExamples", "labels");
  if (a.example_labels == nullptr) return NullPointer("GatherExamples", "example_labels");
  if (a.feature_dim > 0 && (a.images == nullptr || a.features == nullptr)) {
    return NullPointer("GatherExamples", a.images == nullptr ? "images" : "features");
  }
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t i = a.indices[r];
    const uint8_t* src = a.images + i * a.feature_dim;
    float* dst = a.features + r * a.feature_dim;
    // A division, not a multiplication by 1/255: data::Dataset's conversion.
    for (int64_t d = 0; d < a.feature_dim; ++d) dst[d] = static_cast<float>(src[d]) / 255.0f;
    a.labels[r] = static_cast<int32_t>(a.example_labels[i]);
  }
  return absl::OkStatus();
}

}  // namespace foreman::compute
