// The two small hashes whose values Foreman's seeded draws are defined by:
// FaultDraw (foreman/fault.hpp) and `foreman chaos`'s preset plans. Both are
// fixed by their definitions, so a seed names the same draw on every
// platform and library version: changing a value here changes every
// recorded plan and draw (docs/reliability.md's soak table among them).
// Header-only, so that the foreman CLI can use it without exporting it from
// libforeman.
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

/// SplitMix64's output function (Steele, Lea, Flood 2014) for the state
/// `x`: adds kSplitMix64Gamma, then mixes. A SplitMix64
/// stream from state s is SplitMix64(s), SplitMix64(s + gamma), ...
/// Thread-safe (a pure function).
constexpr uint64_t SplitMix64(uint64_t x) {
  x += kSplitMix64Gamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace foreman::internal
