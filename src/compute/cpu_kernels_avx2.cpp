// The avx2 CPU kernels: the shared module libforeman_cpu_avx2.so, compiled
// with -mavx2 -mfma; it exports only foreman_cpu_kernels_avx2()
// (cpu_kernels.map). libforeman dlopen()s it only on a CPU that has avx2.
#define FOREMAN_CPU_KERNELS_NS avx2
#include "compute/cpu_kernels_impl.inc"

extern "C" __attribute__((visibility("default"))) const foreman::compute::CpuKernels* foreman_cpu_kernels_avx2() {
  return &foreman::compute::avx2::kKernels;
}
