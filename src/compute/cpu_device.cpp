// The CPU device: Eigen Tensor contractions on a ThreadPoolDevice, with the
// epilogue (bias, ReLU, ReLU's gradient mask) as the contraction's output
// kernel, run on each output block while it is in cache (TF's fused
// MatMul+BiasAdd+Relu does the same). Eigen's parallel contraction gives
// every output block to one thread and adds partial sums in a fixed order, so
// for a fixed thread count a GEMM is bitwise reproducible. The optimizer
// updates are TF1's training_ops.cc kernels in their operation order, so the
// float results round as TF's do.
#include "compute/cpu_device.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>

#include "absl/strings/str_cat.h"

namespace foreman::compute {

namespace {

using Index = Eigen::Index;
using Matrix = Eigen::TensorMap<Eigen::Tensor<float, 2, Eigen::RowMajor, Index>>;
using ConstMatrix = Eigen::TensorMap<Eigen::Tensor<const float, 2, Eigen::RowMajor, Index>>;
using ContractDims = Eigen::array<Eigen::IndexPair<Index>, 1>;

constexpr std::size_t kAlignment = 64;

// Row-major operands reach the output kernel swapped (params.swapped_arguments):
// the block's rows are our columns (starting at i) and its columns our rows
// (starting at j).
template <class Scalar, class I>
using OutputMapper = Eigen::internal::blas_data_mapper<Scalar, I, Eigen::ColMajor>;

/// The GEMM's epilogue on one output block.
struct EpilogueKernel {
  Epilogue kind;
  const float* bias;         // [n]
  const float* relu_output;  // [m, ld], row-major
  Index ld;

  template <class I, class Scalar>
  EIGEN_ALWAYS_INLINE void operator()(const OutputMapper<Scalar, I>& output, const Eigen::TensorContractionParams& params,
                                      I i, I j, I num_rows, I num_cols) const {
    eigen_assert(params.swapped_arguments);
    EIGEN_UNUSED_VARIABLE(params);
    switch (kind) {
      case Epilogue::kNone:
        return;
      case Epilogue::kBias:
      case Epilogue::kBiasRelu: {
        // out = out + bias, then ReLU.
        Eigen::Map<const Eigen::ArrayXf> b(bias + i, num_rows);
        for (I col = 0; col < num_cols; ++col) {
          Eigen::Map<Eigen::ArrayXf> out(&output(0, col), num_rows);
          if (kind == Epilogue::kBiasRelu) {
            out = (out + b).cwiseMax(0.0f);
          } else {
            out += b;
          }
        }
        return;
      }
      case Epilogue::kReluGradMask:
        // out = out * (relu_output > 0).
        for (I col = 0; col < num_cols; ++col) {
          Eigen::Map<Eigen::ArrayXf> out(&output(0, col), num_rows);
          Eigen::Map<const Eigen::ArrayXf> act(relu_output + (j + col) * ld + i, num_rows);
          out = (act > 0.0f).select(out, 0.0f);
        }
        return;
    }
  }
};

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

int64_t LabelAt(const SoftmaxXentArgs& args, int64_t row) {
  return args.label_type == LabelType::kInt32 ? static_cast<const int32_t*>(args.labels)[row]
                                              : static_cast<const int64_t*>(args.labels)[row];
}

// Within one shard, the elements go in chunks that stay in L1 between the
// statements of a kernel (TF's ApplyAdamNonCuda does the same).
constexpr Index kChunk = 1024;

using Array = Eigen::Map<Eigen::ArrayXf>;
using ConstArray = Eigen::Map<const Eigen::ArrayXf>;

/// Runs `chunk(begin, len)` over [0, n) on the pool, in chunks of at most
/// kChunk. `slots` and `cycles` describe the per-element cost for Eigen's
/// sharding decision (small variables run inline on the calling thread).
/// Elementwise, so the result does not depend on the split.
template <class Chunk>
void ParallelChunks(const Eigen::ThreadPoolDevice& device, int64_t n, int slots, int cycles, Chunk chunk) {
  if (n <= 0) return;
  const Eigen::TensorOpCost cost(sizeof(float) * (2 + slots), sizeof(float) * (1 + slots), cycles);
  device.parallelFor(static_cast<Index>(n), cost, [&](Index first, Index last) {
    for (Index begin = first; begin < last; begin += kChunk) chunk(begin, std::min(kChunk, last - begin));
  });
}

}  // namespace

struct CpuDevice::Pool {
  explicit Pool(int threads) : pool(threads), device(&pool, threads) {}
  Eigen::ThreadPool pool;
  Eigen::ThreadPoolDevice device;
};

CpuDevice::CpuDevice(int threads) : owned_(std::make_unique<Pool>(std::max(1, threads))), eigen_(&owned_->device) {}
CpuDevice::CpuDevice(const Eigen::ThreadPoolDevice* eigen) : eigen_(eigen) {}
CpuDevice::~CpuDevice() = default;

int CpuDevice::num_threads() const { return eigen_->numThreads(); }

StatusOr<void*> CpuDevice::Allocate(int64_t bytes) {
  if (bytes < 0) return NegativeSize("Allocate", "bytes", bytes);
  // Rounded up to the alignment, and never 0 bytes, so the pointer is unique.
  const std::size_t size = (static_cast<std::size_t>(bytes) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = ::operator new(std::max(size, kAlignment), std::align_val_t(kAlignment), std::nothrow);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("/cpu:0: out of memory allocating ", bytes, " bytes"));
  }
  return p;
}

void CpuDevice::Deallocate(void* ptr) {
  if (ptr != nullptr) ::operator delete(ptr, std::align_val_t(kAlignment));
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
  if (has_output && g.c == nullptr) return NullPointer("Gemm", "c");
  if (has_output && g.k > 0 && (g.a == nullptr || g.b == nullptr)) return NullPointer("Gemm", g.a ? "b" : "a");
  const bool needs_bias = g.epilogue == Epilogue::kBias || g.epilogue == Epilogue::kBiasRelu;
  if (has_output && needs_bias && g.bias == nullptr) return NullPointer("Gemm", "bias (epilogue kBias/kBiasRelu)");
  if (has_output && g.epilogue == Epilogue::kReluGradMask) {
    if (g.relu_output == nullptr) return NullPointer("Gemm", "relu_output (epilogue kReluGradMask)");
    if (g.relu_output == g.c) return absl::InvalidArgumentError("/cpu:0 Gemm: relu_output must not be c");
  }
  if (!has_output) return absl::OkStatus();

  // a [m, k] or [k, m]; b [k, n] or [n, k]: contract a's k with b's k.
  const ContractDims dims = {Eigen::IndexPair<Index>(g.transpose_a ? 0 : 1, g.transpose_b ? 1 : 0)};
  ConstMatrix a(g.a, g.transpose_a ? g.k : g.m, g.transpose_a ? g.m : g.k);
  ConstMatrix b(g.b, g.transpose_b ? g.n : g.k, g.transpose_b ? g.k : g.n);
  Matrix c(g.c, g.m, g.n);
  if (g.k == 0) {
    // No products: the epilogue of zeros (Eigen does not contract empty dims).
    c.setZero();
    for (int64_t r = 0; r < g.m; ++r) {
      float* row = g.c + r * g.n;
      for (int64_t col = 0; col < g.n; ++col) {
        if (needs_bias) row[col] = g.epilogue == Epilogue::kBiasRelu ? std::max(g.bias[col], 0.0f) : g.bias[col];
      }
    }
    return absl::OkStatus();
  }
  c.device(*eigen_) = a.contract(b, dims, EpilogueKernel{g.epilogue, g.bias, g.relu_output, g.n});
  return absl::OkStatus();
}

Status CpuDevice::ColumnSums(const float* delta, int64_t rows, int64_t cols, float* out) {
  if (rows < 0) return NegativeSize("ColumnSums", "rows", rows);
  if (cols < 0) return NegativeSize("ColumnSums", "cols", cols);
  if (cols == 0) return absl::OkStatus();
  if (out == nullptr) return NullPointer("ColumnSums", "out");
  if (rows > 0 && delta == nullptr) return NullPointer("ColumnSums", "delta");
  Eigen::Map<Eigen::ArrayXf> db(out, cols);
  db.setZero();
  for (int64_t r = 0; r < rows; ++r) db += Eigen::Map<const Eigen::ArrayXf>(delta + r * cols, cols);
  return absl::OkStatus();
}

Status CpuDevice::SoftmaxXentForward(const SoftmaxXentArgs& args, SoftmaxXentStats* stats) {
  FOREMAN_RETURN_IF_ERROR(CheckXent("SoftmaxXentForward", args));
  if (stats == nullptr) return NullPointer("SoftmaxXentForward", "stats");
  // TF's SparseXentEigenImpl, in float.
  const int64_t classes = args.classes;
  for (int64_t r = 0; r < args.rows; ++r) {
    const float* z = args.logits + r * classes;
    const int64_t label = LabelAt(args, r);
    float max = z[0];
    int64_t argmax = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (z[c] > max) {
        max = z[c];
        argmax = c;
      }
    }
    float sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - max);
    stats->loss_sum += static_cast<double>(std::log(sum) - (z[label] - max));
    stats->correct += argmax == label ? 1 : 0;
  }
  return absl::OkStatus();
}

Status CpuDevice::SoftmaxXentBackward(const SoftmaxXentArgs& args, float scale, float* grad) {
  FOREMAN_RETURN_IF_ERROR(CheckXent("SoftmaxXentBackward", args));
  if (args.rows > 0 && grad == nullptr) return NullPointer("SoftmaxXentBackward", "grad");
  const int64_t classes = args.classes;
  for (int64_t r = 0; r < args.rows; ++r) {
    const float* z = args.logits + r * classes;
    const int64_t label = LabelAt(args, r);
    float max = z[0];
    for (int64_t c = 1; c < classes; ++c) max = z[c] > max ? z[c] : max;
    float sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - max);
    float* d = grad + r * classes;
    for (int64_t c = 0; c < classes; ++c) d[c] = (std::exp(z[c] - max) / sum - (c == label ? 1.0f : 0.0f)) * scale;
  }
  return absl::OkStatus();
}

Status CpuDevice::ApplyGradientDescent(float* var_p, const float* grad_p, int64_t n, float lr) {
  FOREMAN_RETURN_IF_ERROR(CheckUpdate("ApplyGradientDescent", n, {{"var", var_p}, {"grad", grad_p}}));
  ParallelChunks(*eigen_, n, 0, 4, [&](Index begin, Index len) {
    Array var(var_p + begin, len);
    ConstArray grad(grad_p + begin, len);
    var -= grad * lr;
  });
  return absl::OkStatus();
}

Status CpuDevice::ApplyMomentum(float* var_p, float* accum_p, const float* grad_p, int64_t n,
                                const MomentumParams& p) {
  FOREMAN_RETURN_IF_ERROR(
      CheckUpdate("ApplyMomentum", n, {{"var", var_p}, {"accum", accum_p}, {"grad", grad_p}}));
  const float lr = p.learning_rate;
  ParallelChunks(*eigen_, n, 1, 4, [&](Index begin, Index len) {
    Array var(var_p + begin, len);
    ConstArray grad(grad_p + begin, len);
    Array accum(accum_p + begin, len);
    accum = accum * p.momentum + grad;
    if (p.use_nesterov) {
      var -= grad * lr + accum * p.momentum * lr;
    } else {
      var -= accum * lr;
    }
  });
  return absl::OkStatus();
}

Status CpuDevice::ApplyAdam(float* var_p, float* m_p, float* v_p, const float* grad_p, int64_t n,
                            const AdamParams& p) {
  FOREMAN_RETURN_IF_ERROR(CheckUpdate("ApplyAdam", n, {{"var", var_p}, {"m", m_p}, {"v", v_p}, {"grad", grad_p}}));
  const float lr = p.step_size;
  ParallelChunks(*eigen_, n, 2, 30, [&](Index begin, Index len) {
    Array var(var_p + begin, len);
    ConstArray grad(grad_p + begin, len);
    Array m(m_p + begin, len);
    Array v(v_p + begin, len);
    m += (grad - m) * (1.0f - p.beta1);
    v += (grad.square() - v) * (1.0f - p.beta2);
    var -= (m * lr) / (v.sqrt() + p.epsilon);
  });
  return absl::OkStatus();
}

}  // namespace foreman::compute
