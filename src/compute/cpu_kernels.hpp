// The CPU device's math, compiled once per instruction set: baseline x86-64
// inside libforeman, AVX2+FMA and AVX-512 as the shared modules
// libforeman_cpu_avx2.so and libforeman_cpu_avx512.so next to it. Each
// module exports one C function, foreman_cpu_kernels_<isa>(), returning a
// table of these kernels; everything else in it (its Eigen and std template
// instantiations) is local to it (-fvisibility=hidden and a version script),
// so no AVX code can be bound to a caller elsewhere. A module is dlopen()ed
// only once the CPU is known to support it, so even its static initializers
// never run on an older CPU.
//
// Only plain structs, raw pointers and the Eigen::ThreadPoolDevice (three
// pointers and an int, whose ThreadPoolInterface is called through its
// vtable) cross the boundary: the modules' EIGEN_MAX_ALIGN_BYTES differs from
// libforeman's, so no Eigen object with alignment-dependent layout does.
// Arguments reach the kernels checked (CpuDevice validates them).
#pragma once

#include <cstdint>

#include "foreman/compute.hpp"
#include "foreman/status.hpp"

namespace Eigen {
struct ThreadPoolDevice;
}

namespace foreman::compute {

/// The instruction sets there are kernels for, in increasing order.
enum class CpuIsa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

/// "baseline", "avx2", "avx512".
const char* CpuIsaName(CpuIsa isa);

/// The kernels of one instruction set. Bump kCpuKernelsAbi on any change to
/// this struct or to the argument structs in foreman/compute.hpp: 2 added
/// GemmArgs::column_sums.
constexpr int kCpuKernelsAbi = 2;
struct CpuKernels {
  int abi;  // kCpuKernelsAbi
  /// C = op(A)·op(B) with its epilogue; m, n, k > 0.
  void (*gemm)(const Eigen::ThreadPoolDevice* device, const GemmArgs* args);
  /// out[cols] = column sums of delta [rows, cols], in row order.
  void (*column_sums)(const float* delta, int64_t rows, int64_t cols, float* out);
  /// Softmax cross-entropy: adds to *stats when stats is not null, writes
  /// grad [rows, classes] (scaled by scale) when grad is not null; the
  /// exponentials are computed once per element for both.
  void (*softmax_xent)(const SoftmaxXentArgs* args, SoftmaxXentStats* stats, float scale, float* grad);
  void (*apply_gradient_descent)(const Eigen::ThreadPoolDevice* device, float* var, const float* grad, int64_t n,
                                 float lr);
  void (*apply_momentum)(const Eigen::ThreadPoolDevice* device, float* var, float* accum, const float* grad,
                         int64_t n, const MomentumParams* params);
  void (*apply_adam)(const Eigen::ThreadPoolDevice* device, float* var, float* m, float* v, const float* grad,
                     int64_t n, const AdamParams* params);
};

/// The best instruction set this CPU supports (__builtin_cpu_supports;
/// AVX-512 means F, VL, BW and DQ; AVX2 means AVX2 and FMA).
CpuIsa DetectCpuIsa();

/// Parses FOREMAN_MAX_ISA's value: "baseline", "avx2" or "avx512" (case
/// insensitive). INVALID_ARGUMENT naming the variable, the value and the
/// allowed values otherwise.
StatusOr<CpuIsa> ParseCpuIsa(const char* value);

/// The cap from the environment: FOREMAN_MAX_ISA unset or empty -> kAvx512
/// (no cap); otherwise ParseCpuIsa's result.
StatusOr<CpuIsa> MaxCpuIsaFromEnv();

/// The kernels for `isa`, or null when the CPU lacks it or its module cannot
/// be loaded (logged once, naming the module and dlerror()). Loaded once per
/// process, never unloaded; thread-safe.
const CpuKernels* LoadCpuKernels(CpuIsa isa);

/// The best kernels available at most `max_isa`: falls back one instruction
/// set at a time, down to the baseline (always available). *chosen gets the
/// one used.
const CpuKernels* SelectCpuKernels(CpuIsa max_isa, CpuIsa* chosen);

}  // namespace foreman::compute
