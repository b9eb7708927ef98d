#include "foreman/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define FOREMAN_CRC32C_X86 1
#endif

namespace foreman::crc32c {

namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, reflected

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zero
// bytes, so eight input bytes are folded with eight lookups.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    t[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (std::size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

inline uint32_t LoadLE32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

#if FOREMAN_CRC32C_X86
bool DetectSse42() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
const bool kHasSse42 = DetectSse42();
#endif

}  // namespace

uint32_t ExtendPortable(uint32_t init_crc, const char* data, std::size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint32_t crc = ~init_crc;
  // Bytes up to an 8-byte boundary, then 8 at a time, then the tail.
  while (n > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xFFu];
    --n;
  }
  while (n >= 8) {
    const uint32_t lo = LoadLE32(p) ^ crc;
    const uint32_t hi = LoadLE32(p + 4);
    crc = kTables[7][lo & 0xFFu] ^ kTables[6][(lo >> 8) & 0xFFu] ^ kTables[5][(lo >> 16) & 0xFFu] ^
          kTables[4][lo >> 24] ^ kTables[3][hi & 0xFFu] ^ kTables[2][(hi >> 8) & 0xFFu] ^
          kTables[1][(hi >> 16) & 0xFFu] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xFFu];
    --n;
  }
  return ~crc;
}

#if FOREMAN_CRC32C_X86

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t init_crc, const char* data, std::size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint64_t crc = ~init_crc;
  while (n > 0 && (reinterpret_cast<std::uintptr_t>(p) & 7u) != 0) {
    crc = _mm_crc32_u8(static_cast<uint32_t>(crc), *p++);
    --n;
  }
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, sizeof(word));
    crc = _mm_crc32_u64(crc, word);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    crc = _mm_crc32_u8(static_cast<uint32_t>(crc), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(crc);
}

bool HardwareAccelerated() { return kHasSse42; }

uint32_t Extend(uint32_t init_crc, const char* data, std::size_t n) {
  return kHasSse42 ? ExtendHardware(init_crc, data, n) : ExtendPortable(init_crc, data, n);
}

#else  // not x86

uint32_t ExtendHardware(uint32_t init_crc, const char* data, std::size_t n) {
  return ExtendPortable(init_crc, data, n);
}
bool HardwareAccelerated() { return false; }
uint32_t Extend(uint32_t init_crc, const char* data, std::size_t n) { return ExtendPortable(init_crc, data, n); }

#endif

}  // namespace foreman::crc32c
