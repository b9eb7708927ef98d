// CRC-32C (Castagnoli, polynomial 0x1EDC6F41 reflected: 0x82F63B78) and TF's
// masked form, as used by TFRecord framing and tensor-bundle checksums.
// (TF: tensorflow/core/lib/hash/crc32c.h; LevelDB: util/crc32c.h.)
//
// Uses the SSE4.2 crc32 instruction when the CPU has it, a portable
// slicing-by-8 table otherwise; both give identical results.
//
//   ```cpp
//   uint32_t c = foreman::crc32c::Value("123456789", 9);   // 0xE3069283
//   uint32_t stored = foreman::crc32c::Mask(c);            // what files hold
//   ```
#pragma once

#include <cstddef>
#include <cstdint>

namespace foreman::crc32c {

/// The CRC of concat(A, data[0, n)) where `init_crc` is the CRC of A.
uint32_t Extend(uint32_t init_crc, const char* data, std::size_t n);

/// The CRC of data[0, n).
inline uint32_t Value(const char* data, std::size_t n) { return Extend(0, data, n); }

/// TF's masking: a CRC stored next to data that itself contains CRCs is
/// rotated and offset so that CRCs of CRCs do not degenerate.
inline constexpr uint32_t kMaskDelta = 0xa282ead8u;
inline uint32_t Mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }
inline uint32_t Unmask(uint32_t masked) {
  uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

// -- the two implementations, exposed for tests and benchmarks ---------------

/// Table-driven, any CPU.
uint32_t ExtendPortable(uint32_t init_crc, const char* data, std::size_t n);
/// SSE4.2 crc32 instruction. REQUIRES: HardwareAccelerated().
uint32_t ExtendHardware(uint32_t init_crc, const char* data, std::size_t n);
/// True when this CPU has SSE4.2 (Extend uses ExtendHardware then).
bool HardwareAccelerated();

}  // namespace foreman::crc32c
