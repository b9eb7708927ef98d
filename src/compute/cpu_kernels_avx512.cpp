// The avx512 CPU kernels: the shared module libforeman_cpu_avx512.so, compiled
// with -mavx512f -mavx512vl -mavx512bw -mavx512dq -mavx2 -mfma; it exports only foreman_cpu_kernels_avx512()
// (cpu_kernels.map). libforeman dlopen()s it only on a CPU that has avx512.
#define FOREMAN_CPU_KERNELS_NS avx512
#include "compute/cpu_kernels_impl.inc"

extern "C" __attribute__((visibility("default"))) const foreman::compute::CpuKernels* foreman_cpu_kernels_avx512() {
  return &foreman::compute::avx512::kKernels;
}
