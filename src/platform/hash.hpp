// The small hashes, and the one SplitMix64 stream, whose values Foreman's
// seeded draws are defined by: FaultDraw (foreman/fault.hpp), `foreman
// chaos`'s preset plans (src/fault) and the MLP's initial weights (src/nn).
// All are fixed by their definitions, so a seed names the same draw on every
// platform and library version: changing a value here changes every
// recorded plan and draw (docs/reliability.md's soak table among them).
// Header-only (internal).
#pragma once

#include <cstdint>

#include "absl/strings/string_view.h"

namespace foreman::internal {

/// FNV-1a, 64 bits (Fowler, Noll, Vo): offset basis 0xcbf29ce484222325,
/// prime 0x100000001b3, one byte at a time. Thread-safe (a pure function).
constexpr uint64_t Fnv1a64(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

/// SplitMix64's golden gamma: the step between a stream's states.
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

/// SplitMix64's mixing function (Steele, Lea, Flood 2014; Stafford's
/// "Mix13" constants): a bijection on 64-bit words. Thread-safe (a pure
/// function).
constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// SplitMix64's output function for the state `x`: adds kSplitMix64Gamma,
/// then mixes (Mix64). A SplitMix64 stream from state s is SplitMix64(s),
/// SplitMix64(s + gamma), ... Thread-safe (a pure function).
constexpr uint64_t SplitMix64(uint64_t x) { return Mix64(x + kSplitMix64Gamma); }

/// A SplitMix64 stream from a state: Next() returns SplitMix64(s),
/// SplitMix64(s + gamma), ... Fixed by its definition (unlike the std::
/// distributions), so a seed names the same draws everywhere. Not
/// thread-safe (one stream per user).
class SplitMix64Stream {
 public:
  explicit constexpr SplitMix64Stream(uint64_t state) : state_(state) {}
  constexpr uint64_t Next() {
    const uint64_t out = SplitMix64(state_);
    state_ += kSplitMix64Gamma;
    return out;
  }
  /// lo + Next() % (hi - lo + 1): in [lo, hi] (REQUIRES lo <= hi); the
  /// modulo bias (< 2^-50 for ranges below 2^14) is part of the definition.
  constexpr int64_t Uniform(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }

 private:
  uint64_t state_;
};

}  // namespace foreman::internal
