// What the bundle writer and reader share about TF's on-disk format
// (TF: tensorflow/core/util/tensor_bundle/tensor_bundle.cc).
#pragma once

#include <cstdint>
#include <cstring>

#include "foreman/crc32c.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "bundles are little-endian; a big-endian host would need byte swaps");

namespace foreman::internal {

/// The index key of the BundleHeaderProto; it sorts before every tensor name.
inline constexpr char kBundleHeaderKey[] = "";

/// TF's bundle format version (VersionDef.producer), and the oldest reader
/// version that can read what this writer writes.
inline constexpr int kBundleVersion = 1;

/// Extends `crc` by one string length the way TF checksums it: as a uint32
/// when it fits (what older checkpoints used), else as a uint64, both
/// little-endian. The file itself holds the length as a varint64.
inline uint32_t ExtendStringLength(uint32_t crc, uint64_t length) {
  if (length <= UINT32_MAX) {
    const uint32_t l32 = static_cast<uint32_t>(length);
    char buf[sizeof(l32)];
    std::memcpy(buf, &l32, sizeof(l32));
    return crc32c::Extend(crc, buf, sizeof(buf));
  }
  char buf[sizeof(length)];
  std::memcpy(buf, &length, sizeof(length));
  return crc32c::Extend(crc, buf, sizeof(buf));
}

}  // namespace foreman::internal
