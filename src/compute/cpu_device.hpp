// The CPU compute::Device: the Eigen code the MLP has always run (Tensor
// contractions with fused output kernels, TF1's update kernels), on an
// Eigen::ThreadPoolDevice. Device memory is host memory: Tensors are used in
// place. For a given thread count its results are bitwise those of the
// Eigen code before the device seam existed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "foreman/compute.hpp"

namespace Eigen {
struct ThreadPoolDevice;
}

namespace foreman::compute {

class CpuDevice final : public Device {
 public:
  /// Owns an intra-op pool of `threads` threads (values < 1 mean 1).
  explicit CpuDevice(int threads);
  /// Runs on `eigen` (not owned; must outlive this device and be non-null).
  explicit CpuDevice(const Eigen::ThreadPoolDevice* eigen);
  ~CpuDevice() override;
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  /// The Eigen device the operations run on (for users' own Eigen code).
  const Eigen::ThreadPoolDevice& eigen_device() const { return *eigen_; }
  int num_threads() const;

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
  Status ApplyGradientDescent(float* var, const float* grad, int64_t n, float learning_rate) override;
  Status ApplyMomentum(float* var, float* accum, const float* grad, int64_t n, const MomentumParams& params) override;
  Status ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n, const AdamParams& params) override;

 private:
  struct Pool;
  std::unique_ptr<Pool> owned_;  // null when borrowing
  const Eigen::ThreadPoolDevice* eigen_;
  std::string name_ = "/cpu:0";
};

}  // namespace foreman::compute
