// Appending len_b bytes to a message multiplies its CRC register by x^(8*len_b) modulo the
// polynomial; the pre/post inversions of CRC32C cancel between the two parts, so
// crc(a+b) = crc(a) * x^(8*len_b) mod P  xor  crc(b). Polynomials are in the reflected bit order
// of the CRC itself (bit 31 is x^0).
#include "common/crc32c_combine.h"

#include <array>

namespace forge {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

constexpr uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPolyReflected : b >> 1;
  }
  return product;
}

// kPowers[k] = x^(2^k) mod P, for shifting by any 64-bit bit count.
constexpr std::array<uint32_t, 64> MakePowers() {
  std::array<uint32_t, 64> t{};
  t[0] = 1u << 30;  // x^1
  for (int k = 1; k < 64; ++k) t[k] = MultModP(t[k - 1], t[k - 1]);
  return t;
}

constexpr std::array<uint32_t, 64> kPowers = MakePowers();

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // x^(8 * len_b): bit k of len_b contributes x^(2^(k + 3)).
  uint32_t shift = 1u << 31;  // x^0
  for (int k = 0; len_b != 0 && k + 3 < 64; ++k, len_b >>= 1) {
    if (len_b & 1) shift = MultModP(kPowers[k + 3], shift);
  }
  return MultModP(shift, crc_a) ^ crc_b;
}

}  // namespace forge
