// The baseline (default target) CPU kernels, inside libforeman.
#define FOREMAN_CPU_KERNELS_NS baseline
#include "compute/cpu_kernels_impl.inc"

namespace foreman::compute {
const CpuKernels* BaselineCpuKernels() { return &baseline::kKernels; }
}  // namespace foreman::compute
