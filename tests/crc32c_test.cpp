// CRC-32C: published check values, TF's masking, and the SSE4.2 and portable
// paths agreeing on every length 0-1024 at every alignment.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "foreman/crc32c.hpp"

namespace crc = foreman::crc32c;

TEST_CASE("the check value of \"123456789\" is 0xE3069283 on both paths") {
  CHECK(crc::Value("123456789", 9) == 0xE3069283u);
  CHECK(crc::ExtendPortable(0, "123456789", 9) == 0xE3069283u);
  if (crc::HardwareAccelerated()) CHECK(crc::ExtendHardware(0, "123456789", 9) == 0xE3069283u);
}

TEST_CASE("RFC 3720 (iSCSI) test vectors") {
  std::string zeros(32, '\0');
  std::string ones(32, '\xff');
  std::string ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  CHECK(crc::Value(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(crc::Value(ones.data(), ones.size()) == 0x62A8AB43u);
  CHECK(crc::Value(ascending.data(), ascending.size()) == 0x46DD794Eu);
  CHECK(crc::Value(descending.data(), descending.size()) == 0x113FDB5Cu);
  CHECK(crc::Value("", 0) == 0u);
}

TEST_CASE("Extend over pieces equals Value of the whole") {
  const std::string s = "hello world, this is a longer buffer for crc32c";
  for (std::size_t cut = 0; cut <= s.size(); ++cut) {
    uint32_t a = crc::Value(s.data(), cut);
    CHECK(crc::Extend(a, s.data() + cut, s.size() - cut) == crc::Value(s.data(), s.size()));
  }
}

TEST_CASE("Mask and Unmask are inverses and masking changes the value") {
  uint32_t c = crc::Value("foo", 3);
  CHECK(crc::Mask(c) != c);
  CHECK(crc::Mask(crc::Mask(c)) != c);
  CHECK(crc::Unmask(crc::Mask(c)) == c);
  CHECK(crc::Unmask(crc::Unmask(crc::Mask(crc::Mask(c)))) == c);
  // TF's record for an empty payload: masked crc32c of "" is the mask delta
  // applied to 0.
  CHECK(crc::Mask(0) == 0xa282ead8u);
}

TEST_CASE("hardware and portable paths agree on random buffers of every length 0-1024 and alignment") {
  if (!crc::HardwareAccelerated()) {
    MESSAGE("no SSE4.2 on this CPU: only the portable path exists");
    return;
  }
  std::mt19937_64 rng(20261129);
  std::vector<char> buf(1024 + 8);
  for (auto& b : buf) b = static_cast<char>(rng());
  for (std::size_t len = 0; len <= 1024; ++len) {
    for (std::size_t offset = 0; offset < 8; ++offset) {
      const uint32_t init = static_cast<uint32_t>(rng());
      const char* p = buf.data() + offset;
      REQUIRE(crc::ExtendHardware(init, p, len) == crc::ExtendPortable(init, p, len));
    }
  }
}
