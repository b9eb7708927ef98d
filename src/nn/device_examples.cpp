// nn::DeviceExamples: labelled uint8 examples copied once into a device's
// memory, for steps that gather their batches there (nn.hpp).
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "foreman/nn.hpp"

namespace foreman::nn {

StatusOr<std::unique_ptr<DeviceExamples>> DeviceExamples::Upload(const Tensor& images, const Tensor& labels,
                                                                 compute::Device& device) {
  if (images.dtype() != DataType::kUInt8 || images.shape().rank() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceExamples: images must be uint8 [N, d1, ...] (rank >= 2), got ",
                                                   DataTypeName(images.dtype()), " ", images.shape().ToString()));
  }
  const int64_t n = images.shape().dim(0);
  if (labels.dtype() != DataType::kUInt8 || labels.shape().rank() != 1 || labels.shape().dim(0) != n) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceExamples: labels must be uint8 [", n, "] (one per image), got ",
                                                   DataTypeName(labels.dtype()), " ", labels.shape().ToString()));
  }
  if (n < 1 || n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceExamples: the number of examples must be in [1, 2^31 - 1], got ", n));
  }
  const int64_t feature_dim = images.num_elements() / n;
  if (feature_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceExamples: images have no features: shape ", images.shape().ToString()));
  }
  FOREMAN_ASSIGN_OR_RETURN(void* image_mem, device.Allocate(n * feature_dim));
  StatusOr<void*> label_mem = device.Allocate(n);
  if (!label_mem.ok()) {
    device.Deallocate(image_mem);
    return label_mem.status();
  }
  Status s = device.CopyToDevice(image_mem, images.raw_data(), n * feature_dim);
  if (s.ok()) s = device.CopyToDevice(*label_mem, labels.raw_data(), n);
  if (!s.ok()) {
    device.Deallocate(image_mem);
    device.Deallocate(*label_mem);
    return s;
  }
  const auto* l = reinterpret_cast<const uint8_t*>(labels.raw_data());
  return std::unique_ptr<DeviceExamples>(new DeviceExamples(&device, n, feature_dim, static_cast<uint8_t*>(image_mem),
                                                            static_cast<uint8_t*>(*label_mem),
                                                            std::vector<uint8_t>(l, l + n)));
}

DeviceExamples::DeviceExamples(compute::Device* device, int64_t num_examples, int64_t feature_dim, uint8_t* images,
                               uint8_t* labels, std::vector<uint8_t> host_labels)
    : device_(device),
      device_lifetime_(device->lifetime()),
      num_examples_(num_examples),
      feature_dim_(feature_dim),
      images_(images),
      labels_(labels),
      host_labels_(std::move(host_labels)) {}

DeviceExamples::~DeviceExamples() {
  if (device_lifetime_.expired()) return;  // the device freed them when it went
  device_->Deallocate(images_);
  device_->Deallocate(labels_);
}

}  // namespace foreman::nn
