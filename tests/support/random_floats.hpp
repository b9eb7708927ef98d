// Random float data for the compute tests (compute, kernel_math, cuda_step)
// and kernel_bench: the same seed gives the same values in every binary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace foreman::testing {

/// `n` floats drawn uniformly from [lo, hi) by std::mt19937(seed).
inline std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace foreman::testing
