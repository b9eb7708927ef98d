// The per-element and per-row math of the compute kernels, shared by the
// CUDA kernels (cuda_device.cu, compiled by nvcc as __host__ __device__
// functions) and the host (plain inline C++ when not compiled by nvcc), so
// that the CPU unit tests (tests/kernel_math_test.cpp) check the very
// expressions the GPU runs against the CPU device's baseline kernels
// (cpu_kernels_impl.inc).
//
// Each function follows the CPU baseline kernels' operation order, so that
// without contraction of a multiply and an add into an FMA (nvcc -fmad=false;
// the baseline x86-64 ISA has no FMA) an update rounds exactly as the CPU's.
// The only FMAs are the GEMM's, explicit (GemmFma). Three things differ by
// device and are NOT bitwise shared:
//   - Adam's square root: Sqrt is IEEE (as TF's kernels); the CPU device's
//     vectorized sqrt is Eigen's fast approximation (EIGEN_FAST_MATH:
//     _mm_rsqrt_ps and a Newton step, 1-2 bits short), so Adam's var may
//     differ from the CPU's in its last bits; m and v do not.
//   - the softmax's exponential and logarithm: CUDA's expf/logf are within
//     2 ulp of glibc's, which the CPU calls.
//   - the GEMM's summation order: the CPU's Eigen blocks the sum; the GPU
//     sums each output in k order with FMA.
#pragma once

#include <cmath>
#include <cstdint>

#include "foreman/compute.hpp"

#ifdef __CUDACC__
#define FOREMAN_HD __host__ __device__ __forceinline__
#else
#define FOREMAN_HD inline
#endif

namespace foreman::compute::math {

/// exp and log in float: CUDA's expf/logf on the device, std::exp/std::log
/// (glibc's expf/logf, what the CPU device calls) on the host.
FOREMAN_HD float Exp(float x) {
#ifdef __CUDA_ARCH__
  return expf(x);
#else
  return std::exp(x);
#endif
}
FOREMAN_HD float Log(float x) {
#ifdef __CUDA_ARCH__
  return logf(x);
#else
  return std::log(x);
#endif
}
FOREMAN_HD float Sqrt(float x) {
#ifdef __CUDA_ARCH__
  return sqrtf(x);  // IEEE-rounded (nvcc's default -prec-sqrt=true)
#else
  return std::sqrt(x);
#endif
}

/// One step of a GEMM's dot product: acc + a·b rounded once (fmaf). The
/// GPU's GEMM sums each output element as acc = GemmFma(acc, a[k], b[k]) for
/// k = 0, 1, ..., starting from 0.
FOREMAN_HD float GemmFma(float acc, float a, float b) {
#ifdef __CUDA_ARCH__
  return fmaf(a, b, acc);
#else
  return std::fma(a, b, acc);
#endif
}

/// ReLU as Eigen's cwiseMax(0) computes it on the CPU (std::max(x, 0): NaN
/// and -0 pass through).
FOREMAN_HD float Relu(float x) { return x < 0.0f ? 0.0f : x; }

/// The GEMM epilogues (compute::Epilogue) on one output element.
FOREMAN_HD float EpilogueBias(float acc, float bias) { return acc + bias; }
FOREMAN_HD float EpilogueBiasRelu(float acc, float bias) { return Relu(acc + bias); }
FOREMAN_HD float EpilogueReluGradMask(float acc, float relu_output) { return relu_output > 0.0f ? acc : 0.0f; }

/// TF1's ApplyGradientDescent on one element: var - grad·lr.
FOREMAN_HD float GradientDescent(float var, float grad, float lr) { return var - grad * lr; }

/// TF1's ApplyMomentum on one element: accum = accum·momentum + grad, then
/// var - accum·lr, or with Nesterov var - (grad·lr + accum·momentum·lr).
FOREMAN_HD void Momentum(float* var, float* accum, float grad, float lr, float momentum, bool use_nesterov) {
  const float a = *accum * momentum + grad;
  *accum = a;
  if (use_nesterov) {
    *var = *var - (grad * lr + a * momentum * lr);
  } else {
    *var = *var - a * lr;
  }
}

/// TF1's ApplyAdam on one element with the step size lr_t:
///   m += (grad - m)·(1 - beta1); v += (grad² - v)·(1 - beta2);
///   var -= m·lr_t / (sqrt(v) + epsilon).
FOREMAN_HD void Adam(float* var, float* m, float* v, float grad, float step_size, float beta1, float beta2,
                     float epsilon) {
  const float one_minus_beta1 = 1.0f - beta1;
  const float one_minus_beta2 = 1.0f - beta2;
  const float mm = *m + (grad - *m) * one_minus_beta1;
  const float vv = *v + (grad * grad - *v) * one_minus_beta2;
  *m = mm;
  *v = vv;
  *var = *var - (mm * step_size) / (Sqrt(vv) + epsilon);
}

/// Adam's step size lr·sqrt(1 - beta2_power) / (1 - beta1_power), in float
/// (AdamOptimizer's lr_t as nn computes it on the host).
FOREMAN_HD float AdamStepSize(float lr, float beta1_power, float beta2_power) {
  return lr * Sqrt(1.0f - beta2_power) / (1.0f - beta1_power);
}

/// The GPU's one-kernel Adam update of several variables (cuda_device.cu's
/// AdamGroupKernel, Device::ApplyAdamGroup): the grid's blocks are split
/// among the variables, variable j owning blocks [block_start[j],
/// block_start[j + 1]) (as many as an ApplyAdam of it alone would launch:
/// ceil(n / threads), at most max_blocks, none for n = 0), each of its
/// blocks a grid-stride loop over its elements.
namespace adam_group {

constexpr int kMaxVariables = 8;  // per launch; more are launched in groups

/// Fills block_start[0..count] (block_start[0] = 0) and returns the grid's
/// blocks, block_start[count].
inline int64_t PlanBlocks(const AdamVariable* variables, int count, int threads, int64_t max_blocks,
                          int64_t* block_start) {
  block_start[0] = 0;
  for (int j = 0; j < count; ++j) {
    const int64_t n = variables[j].n;
    const int64_t blocks = n <= 0 ? 0 : ((n + threads - 1) / threads < max_blocks ? (n + threads - 1) / threads
                                                                                   : max_blocks);
    block_start[j + 1] = block_start[j] + blocks;
  }
  return block_start[count];
}

/// The variable that owns block `block` (< block_start[count]).
FOREMAN_HD int VariableOfBlock(const int64_t* block_start, int count, int64_t block) {
  int j = 0;
  while (j + 1 < count && block >= block_start[j + 1]) ++j;
  return j;
}

}  // namespace adam_group

/// A uint8 pixel as a feature: a division by 255 (data::Dataset's).
FOREMAN_HD float PixelToFeature(uint8_t pixel) { return static_cast<float>(pixel) / 255.0f; }

/// TF's sparse softmax cross-entropy on one row of `classes` logits z with
/// class `label` in [0, classes): the shifted log-sum-exp in float.
/// Writes the row's loss log(sum_c exp(z_c - max)) - (z_label - max) to
/// *loss and whether the first maximum is the label to *correct; with
/// `grad` not null also grad[c] = (exp(z_c - max) / sum - [c == label])·scale
/// (the exponentials are stored in grad and normalised in place, as the CPU
/// kernel does; the sum adds the same values in the same order either way).
FOREMAN_HD void SoftmaxXentRow(const float* z, int64_t classes, int64_t label, float scale, float* grad, float* loss,
                               bool* correct) {
  float max = z[0];
  int64_t argmax = 0;
  for (int64_t c = 1; c < classes; ++c) {
    if (z[c] > max) {
      max = z[c];
      argmax = c;
    }
  }
  float sum = 0;
  if (grad != nullptr) {
    for (int64_t c = 0; c < classes; ++c) {
      grad[c] = Exp(z[c] - max);
      sum += grad[c];
    }
    for (int64_t c = 0; c < classes; ++c) grad[c] = (grad[c] / sum - (c == label ? 1.0f : 0.0f)) * scale;
  } else {
    for (int64_t c = 0; c < classes; ++c) sum += Exp(z[c] - max);
  }
  *loss = Log(sum) - (z[label] - max);
  *correct = argmax == label;
}


/// Row `row`'s label as an int64 (SoftmaxXentArgs::label_type).
FOREMAN_HD int64_t LabelOf(const SoftmaxXentArgs& args, int64_t row) {
  return args.label_type == LabelType::kInt32 ? static_cast<const int32_t*>(args.labels)[row]
                                              : static_cast<const int64_t*>(args.labels)[row];
}

/// The GPU's statistics kernel (cuda_device.cu's XentStatsKernel), as
/// functions of the thread index for a host test: one block of kThreads
/// threads. Phase 1 (ThreadRows): thread t does rows t, t + kThreads, ...
/// (each SoftmaxXentRow, and its gradient when grad is not null), adding
/// their losses in double in that order and counting its correct rows into
/// losses[t] and corrects[t]. Phase 2 (TreeLevel, for half = kThreads / 2,
/// kThreads / 4, ..., 1, each level after the last has finished): thread
/// t < half adds element t + half into t. So the block's sum has the same
/// tree every run (deterministic, no atomics), and the work per thread grows
/// with rows / kThreads instead of rows.
namespace xent_stats {

// 512: at most 64 registers a thread, so that SoftmaxXentRow does not
// spill (at 1024 threads, 32 registers each, ptxas spilled 72 bytes).
constexpr int kThreads = 512;

FOREMAN_HD void ThreadRows(const SoftmaxXentArgs& args, float scale, float* grad, int tid, double* losses,
                           long long* corrects) {
  double loss_sum = 0.0;
  long long correct = 0;
  for (int64_t r = tid; r < args.rows; r += kThreads) {
    float loss;
    bool is_correct;
    SoftmaxXentRow(args.logits + r * args.classes, args.classes, LabelOf(args, r), scale,
                   grad == nullptr ? nullptr : grad + r * args.classes, &loss, &is_correct);
    loss_sum += static_cast<double>(loss);
    correct += is_correct ? 1 : 0;
  }
  losses[tid] = loss_sum;
  corrects[tid] = correct;
}

FOREMAN_HD void TreeLevel(int tid, int half, double* losses, long long* corrects) {
  if (tid >= half) return;
  losses[tid] += losses[tid + half];
  corrects[tid] += corrects[tid + half];
}

}  // namespace xent_stats

/// The GPU's tiled GEMM (cuda_device.cu's GemmKernel<P>), as functions of
/// the block and thread index so that a host test can run a block's threads
/// phase by phase (the kernel separates the phases with __syncthreads):
/// each block of kThreads = 16 x 16 threads computes a 16 P x 16 P output
/// tile (kTileOf<P>), each thread the P x P outputs (ty + 16 i,
/// tx + 16 j); k advances kDepth at a time through the shared tiles
/// as[kDepth][16 P + 1] (op(A) columns of the tile's rows) and
/// bs[kDepth][16 P + 1] (op(B) rows of its columns). P = 4 for large
/// outputs, P = 1 (more, smaller blocks) for small ones; every output is the
/// same k-ordered fmaf chain either way, so the choice never changes a bit.
///
/// A k step is FetchTiles (global memory into the thread's registers),
/// StageTiles (registers into the shared tiles), then AccumulateTiles. The
/// kernel fetches step s + 1 before it accumulates step s, so that the
/// global loads are in flight while the sums run; only the time changes,
/// never an output's chain.
///
/// With GemmArgs::column_sums, op(A) has one more row, m, of ones (for
/// k < K): its outputs are sum_k fmaf(1, op(B)[k, j], acc) = the k-ordered
/// sums of op(B)'s columns, bitwise ColumnSums' (fmaf(1, b, acc) rounds
/// once, as acc + b does), written to column_sums instead of C.
namespace gemm {

constexpr int kDepth = 16;
constexpr int kThreads = 256;
template <int P>
constexpr int kTileOf = 16 * P;
template <int P>
using SharedTile = float[kDepth][kTileOf<P> + 1];
/// Elements of op(A) (and of op(B)) each thread fetches per k step.
template <int P>
constexpr int kFetchOf = kTileOf<P> * kDepth / kThreads;

/// The rows of op(A) the kernel covers: m, and the row of ones.
FOREMAN_HD int64_t RowsWithSums(const GemmArgs& g) { return g.column_sums != nullptr ? g.m + 1 : g.m; }

/// Phase 1 of a k step: thread `tid` fetches its elements of op(A)[row0 +
/// r, k0 + kk] and op(B)[k0 + kk, col0 + c] (0 outside the matrices; 1 in
/// the row of ones) into a[] and b[]; consecutive threads read consecutive
/// addresses in either storage order.
template <int P>
FOREMAN_HD void FetchTiles(const GemmArgs& g, int64_t row0, int64_t col0, int64_t k0, int tid,
                           float (&a)[kFetchOf<P>], float (&b)[kFetchOf<P>]) {
  constexpr int kTile = kTileOf<P>;
  for (int e = 0; e < kFetchOf<P>; ++e) {
    const int idx = tid + e * kThreads;
    int r, kk;
    if (g.transpose_a) {  // A stored [k, m]
      kk = idx / kTile;
      r = idx % kTile;
    } else {  // A stored [m, k]
      r = idx / kDepth;
      kk = idx % kDepth;
    }
    const int64_t gr = row0 + r, gk = k0 + kk;
    float v = 0.0f;
    if (gk < g.k) {
      if (gr < g.m) {
        v = g.transpose_a ? g.a[gk * g.m + gr] : g.a[gr * g.k + gk];
      } else if (gr == g.m && g.column_sums != nullptr) {
        v = 1.0f;
      }
    }
    a[e] = v;
    int c;
    if (g.transpose_b) {  // B stored [n, k]
      c = idx / kDepth;
      kk = idx % kDepth;
    } else {  // B stored [k, n]
      kk = idx / kTile;
      c = idx % kTile;
    }
    const int64_t gc = col0 + c, gk2 = k0 + kk;
    float w = 0.0f;
    if (gc < g.n && gk2 < g.k) w = g.transpose_b ? g.b[gc * g.k + gk2] : g.b[gk2 * g.n + gc];
    b[e] = w;
  }
}

/// Phase 2: thread `tid` stores what FetchTiles gave it into the shared
/// tiles (the same element positions, computed from the layout).
template <int P>
FOREMAN_HD void StageTiles(const GemmArgs& g, int tid, const float (&a)[kFetchOf<P>], const float (&b)[kFetchOf<P>],
                           SharedTile<P>& as, SharedTile<P>& bs) {
  constexpr int kTile = kTileOf<P>;
  for (int e = 0; e < kFetchOf<P>; ++e) {
    const int idx = tid + e * kThreads;
    if (g.transpose_a) {
      as[idx / kTile][idx % kTile] = a[e];
    } else {
      as[idx % kDepth][idx / kDepth] = a[e];
    }
    if (g.transpose_b) {
      bs[idx % kDepth][idx / kDepth] = b[e];
    } else {
      bs[idx / kTile][idx % kTile] = b[e];
    }
  }
}

/// FetchTiles then StageTiles: a k step's loads without the pipelining.
template <int P>
FOREMAN_HD void LoadTiles(const GemmArgs& g, int64_t row0, int64_t col0, int64_t k0, int tid, SharedTile<P>& as,
                          SharedTile<P>& bs) {
  float a[kFetchOf<P>], b[kFetchOf<P>];
  FetchTiles<P>(g, row0, col0, k0, tid, a, b);
  StageTiles<P>(g, tid, a, b, as, bs);
}

/// Phase 3: thread `tid` adds the staged k in order to its P x P sums, only
/// the `depth` that exist (so each output is exactly its k-ordered chain).
template <int P>
FOREMAN_HD void AccumulateTiles(int tid, int depth, const SharedTile<P>& as, const SharedTile<P>& bs,
                                float (&acc)[P][P]) {
  const int tx = tid % 16, ty = tid / 16;
  if (depth == kDepth) {
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (int kk = 0; kk < kDepth; ++kk) {
      float a[P], b[P];
      for (int i = 0; i < P; ++i) a[i] = as[kk][ty + 16 * i];
      for (int j = 0; j < P; ++j) b[j] = bs[kk][tx + 16 * j];
      for (int i = 0; i < P; ++i) {
        for (int j = 0; j < P; ++j) acc[i][j] = GemmFma(acc[i][j], a[i], b[j]);
      }
    }
    return;
  }
  for (int kk = 0; kk < depth; ++kk) {
    for (int i = 0; i < P; ++i) {
      for (int j = 0; j < P; ++j) acc[i][j] = GemmFma(acc[i][j], as[kk][ty + 16 * i], bs[kk][tx + 16 * j]);
    }
  }
}

/// The last phase: thread `tid` writes its outputs inside C with the
/// epilogue, and the row of ones' outputs to column_sums (no epilogue).
template <int P>
FOREMAN_HD void StoreOutputs(const GemmArgs& g, int64_t row0, int64_t col0, int tid, const float (&acc)[P][P]) {
  const int tx = tid % 16, ty = tid / 16;
  for (int i = 0; i < P; ++i) {
    const int64_t r = row0 + ty + 16 * i;
    if (r > g.m || (r == g.m && g.column_sums == nullptr)) continue;
    for (int j = 0; j < P; ++j) {
      const int64_t c = col0 + tx + 16 * j;
      if (c >= g.n) continue;
      float v = acc[i][j];
      if (r == g.m) {
        g.column_sums[c] = v;
        continue;
      }
      switch (g.epilogue) {
        case Epilogue::kNone:
          break;
        case Epilogue::kBias:
          v = EpilogueBias(v, g.bias[c]);
          break;
        case Epilogue::kBiasRelu:
          v = EpilogueBiasRelu(v, g.bias[c]);
          break;
        case Epilogue::kReluGradMask:
          v = EpilogueReluGradMask(v, g.relu_output[r * g.n + c]);
          break;
      }
      g.c[r * g.n + c] = v;
    }
  }
}

}  // namespace gemm

}  // namespace foreman::compute::math
