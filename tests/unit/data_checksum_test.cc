// CRC32C: published test vectors (RFC 3720 B.4 and the "123456789" check value) and the
// chaining / alignment behaviour of the slicing-by-8 implementation.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/checksum.h"

namespace forge {
namespace {

TEST(DataChecksumTest, KnownVectors) {
  EXPECT_EQ(Crc32c(std::string_view("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string_view("")), 0u);
  unsigned char buf[32];
  std::memset(buf, 0, sizeof(buf));
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x8A9136AAu);
  std::memset(buf, 0xFF, sizeof(buf));
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(Crc32c(buf, sizeof(buf)), 0x113FDB5Cu);
}

// Bit-at-a-time reference, to check the table-driven path on odd lengths and alignments.
uint32_t SlowCrc32c(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(DataChecksumTest, MatchesBitwiseReferenceAtEveryAlignmentAndSplit) {
  std::vector<unsigned char> data(1000);
  uint32_t x = 12345;
  for (auto& b : data) {
    x = x * 1103515245u + 12345u;
    b = static_cast<unsigned char>(x >> 16);
  }
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t len : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 65u, 500u}) {
      const unsigned char* p = data.data() + offset;
      const uint32_t want = SlowCrc32c(p, len);
      ASSERT_EQ(Crc32c(p, len), want) << "offset " << offset << " len " << len;
      for (size_t split = 0; split <= len; split += 13) {
        ASSERT_EQ(Crc32cExtend(Crc32c(p, split), p + split, len - split), want)
            << "offset " << offset << " len " << len << " split " << split;
      }
    }
  }
}

TEST(DataChecksumTest, HexFormat) {
  EXPECT_EQ(Crc32cHex(0xE3069283u), "0xe3069283");
  EXPECT_EQ(Crc32cHex(0x1u), "0x00000001");
}

}  // namespace
}  // namespace forge
