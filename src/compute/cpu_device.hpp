// The CPU compute::Device: the Eigen code the MLP has always run (Tensor
// contractions with fused output kernels, TF1's update kernels), on an
// Eigen::ThreadPoolDevice. Device memory is host memory: Tensors are used in
// place. The kernels are compiled per instruction set (cpu_kernels.hpp); each
// device uses the best this CPU supports, capped by FOREMAN_MAX_ISA
// (baseline|avx2|avx512). For a given thread count the baseline kernels'
// results are bitwise those of the Eigen code before the device seam existed;
// AVX2 and AVX-512 are bitwise reproducible too, but their GEMMs round
// differently (FMA, other blocking).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>

#include "compute/cpu_kernels.hpp"
#include "foreman/compute.hpp"

namespace Eigen {
struct ThreadPoolDevice;
}

namespace foreman::compute {

class CpuDevice final : public Device {
 public:
  /// Owns an intra-op pool of `threads` threads (values < 1 mean 1). Uses
  /// the best kernels at most FOREMAN_MAX_ISA (an invalid value is logged
  /// once as a warning and means baseline; CreateDevice rejects it instead).
  explicit CpuDevice(int threads);
  /// As above, with the kernels at most `max_isa` (the environment ignored).
  CpuDevice(int threads, CpuIsa max_isa);
  /// Runs on `eigen` (not owned; must outlive this device and be non-null).
  explicit CpuDevice(const Eigen::ThreadPoolDevice* eigen);
  CpuDevice(const Eigen::ThreadPoolDevice* eigen, CpuIsa max_isa);
  ~CpuDevice() override;
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  /// The Eigen device the operations run on (for users' own Eigen code).
  const Eigen::ThreadPoolDevice& eigen_device() const { return *eigen_; }
  int num_threads() const;
  /// The instruction set of the kernels this device runs.
  CpuIsa isa() const { return isa_; }

  const std::string& name() const override { return name_; }
  bool host_memory() const override { return true; }
  StatusOr<void*> Allocate(int64_t bytes) override;
  void Deallocate(void* ptr) override;
  Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override;
  Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override;
  Status Gemm(const GemmArgs& args) override;
  Status ColumnSums(const float* delta, int64_t rows, int64_t cols, float* out) override;
  Status SoftmaxXentForward(const SoftmaxXentArgs& args, SoftmaxXentStats* stats) override;
  Status SoftmaxXentBackward(const SoftmaxXentArgs& args, float scale, float* grad) override;
  Status SoftmaxXent(const SoftmaxXentArgs& args, SoftmaxXentStats* stats, float scale, float* grad) override;
  Status ApplyGradientDescent(float* var, const float* grad, int64_t n, float learning_rate) override;
  Status ApplyMomentum(float* var, float* accum, const float* grad, int64_t n, const MomentumParams& params) override;
  Status ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n, const AdamParams& params) override;
  // Device scalars are host floats here: read at the call, which is when the
  // operation executes.
  Status ApplyGradientDescent(float* var, const float* grad, int64_t n, DeviceScalar learning_rate) override;
  Status ApplyMomentum(float* var, float* accum, const float* grad, int64_t n, DeviceScalar learning_rate,
                       float momentum, bool use_nesterov) override;
  Status ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n, DeviceScalar step_size, float beta1,
                   float beta2, float epsilon) override;
  Status AdamStepSize(DeviceScalar learning_rate, DeviceScalar beta1_power, DeviceScalar beta2_power,
                      float* step_size) override;
  Status AdamFinish(float* beta1_power, float* beta2_power, float beta1, float beta2) override;
  Status SoftmaxXentToDevice(const SoftmaxXentArgs& args, float scale, float* grad,
                             SoftmaxXentStats* device_stats) override;
  Status SoftmaxXentForwardToDevice(const SoftmaxXentArgs& args, SoftmaxXentStats* device_stats) override;
  Status GatherExamples(const GatherArgs& args) override;

 private:
  struct Pool;
  std::unique_ptr<Pool> owned_;  // null when borrowing
  const Eigen::ThreadPoolDevice* eigen_;
  CpuIsa isa_ = CpuIsa::kBaseline;
  const CpuKernels* kernels_;
  std::string name_ = "/cpu:0";
  std::unordered_set<void*> allocations_;  // Allocate's, freed with the device
};

}  // namespace foreman::compute
