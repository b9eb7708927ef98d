// A tiny stand-in for Fashion-MNIST (mlp_job_test, mlp_evaluator_test):
// 6x6 images whose class (i % 10) lights a pattern of pixels, plus a
// deterministic texture: learnable, and the same on every platform.
#pragma once

#include <cstdint>

#include "foreman/dataset.hpp"
#include "foreman/tensor.hpp"

namespace foreman::testing {

// `n` such images; `salt` varies the texture (train and test differ).
inline data::LabeledImages TinyImages(int64_t n, uint32_t salt) {
  data::LabeledImages d{Tensor(DataType::kUInt8, {n, 6, 6}), Tensor(DataType::kUInt8, {n})};
  uint8_t* pixels = d.images.data<uint8_t>();
  uint8_t* labels = d.labels.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i) {
    labels[i] = static_cast<uint8_t>(i % 10);
    for (int64_t p = 0; p < 36; ++p) {
      const uint32_t noise = (static_cast<uint32_t>(i) * 2654435761u + static_cast<uint32_t>(p) * 40503u + salt) >> 27;
      pixels[i * 36 + p] = static_cast<uint8_t>((p % 10 == i % 10 ? 180 : 20) + noise);
    }
  }
  return d;
}

// 450 training images and 120 test images.
inline data::FashionMnist TinyData() { return data::FashionMnist{TinyImages(450, 1), TinyImages(120, 2)}; }

}  // namespace foreman::testing
