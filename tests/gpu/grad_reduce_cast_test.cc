// The casts around parallel.grad_reduce bf16 (cuda_data_parallel.cu: CastFloatToBf16 into the
// comm buffer, CastBf16ToFloat back into the fp32 gradient) against the host reference
// (round to nearest even, test::FloatToBf16Bits) bit for bit, on what gradients hold: values
// over the whole exponent range, fp32 subnormals, ties, signed zeros, and Inf/NaN, which must
// survive both ways so an overflowed rank still makes the step's norm non-finite. Both the
// 8-element vector path (16-byte aligned) and the scalar path (offset by one) run; outputs are
// poisoned first.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cuda/adamw.h"

namespace forge {
namespace {

using test::bf16;
using test::DeviceBuffer;

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Gradient-like values: signed, exponents from fp32 subnormals up to FLT_MAX, plus the edges.
std::vector<float> GradientValues(size_t n, uint64_t seed) {
  std::vector<float> x;
  const uint32_t edges[] = {
      0x00000000u, 0x80000000u,              // +-0
      0x00000001u, 0x80000001u, 0x00008000u,  // smallest subnormals; a subnormal tie
      0x00018000u, 0x007fffffu, 0x00800000u,  // a tie rounding up; largest subnormal; FLT_MIN
      0x3f808000u, 0x3f818000u, 0x3f808001u,  // tie (even stays), tie (odd rounds up), above
      0xbf808000u, 0xbf818000u,              // the same negative
      0x7f7f0000u, 0x7f7f7fffu, 0x7f7fffffu,  // max bf16; just below its tie; FLT_MAX -> Inf
      0xff7fffffu, 0x7f800000u, 0xff800000u,  // -FLT_MAX -> -Inf; +-Inf
      0x7fc00000u, 0xffc00000u, 0x7f800001u,  // NaNs (quiet, negative, signalling)
  };
  for (uint32_t e : edges) x.push_back(FromBits(e));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
  std::uniform_int_distribution<int> exponent(-149, 127);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  while (x.size() < n) {
    // Half random bit patterns (every exponent, NaNs included), half signed m * 2^e.
    if (x.size() % 2 == 0) {
      x.push_back(FromBits(bits(rng)));
    } else {
      const float v = std::ldexp(mantissa(rng), exponent(rng));
      x.push_back((bits(rng) & 1u) ? -v : v);
    }
  }
  return x;
}

// Bitwise equal, except that a NaN reference accepts any NaN (the GPU's NaN encoding is the
// hardware's business).
::testing::AssertionResult SameOrBothNan(const std::vector<float>& got,
                                         const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (BitsOf(got[i]) == BitsOf(want[i])) continue;
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " differ, first at " << first << ": input got 0x"
         << std::hex << BitsOf(got[first]) << " want 0x" << BitsOf(want[first]);
}

TEST(GpuGradReduceCast, MatchesHostRoundingBothWays) {
  FORGE_SKIP_WITHOUT_GPU();
  const int64_t n = 8 * 4099 + 5;  // vector path plus a scalar tail
  for (int offset : {0, 1}) {     // 1: misaligned, the scalar path throughout
    SCOPED_TRACE("offset " + std::to_string(offset));
    const std::vector<float> x = GradientValues(size_t(n + offset), 77 + offset);
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<bf16> d_b(n + offset);
    d_b.Poison();
    ASSERT_STATUS_OK(cuda::CastFloatToBf16(d_b.data() + offset, d_x.data() + offset, n, nullptr));
    DeviceBuffer<float> d_back(n + offset);
    d_back.Poison();
    ASSERT_STATUS_OK(
        cuda::CastBf16ToFloat(d_back.data() + offset, d_b.data() + offset, n, nullptr));
    ASSERT_CUDA_OK(cudaDeviceSynchronize());

    std::vector<float> want(x.begin() + offset, x.end());
    test::RoundBf16InPlace(want);
    const std::vector<float> b = test::ToFloat(d_b.Download());
    EXPECT_TRUE(SameOrBothNan(std::vector<float>(b.begin() + offset, b.end()), want)) << "bf16";
    const std::vector<float> back = d_back.Download();
    EXPECT_TRUE(SameOrBothNan(std::vector<float>(back.begin() + offset, back.end()), want))
        << "widened";
    // The edges that matter for the step's overflow check, spelled out.
    const size_t inf_from_max = 15, nan_quiet = 19;
    if (offset == 0) {
      EXPECT_TRUE(std::isinf(back[inf_from_max]) && back[inf_from_max] > 0) << back[inf_from_max];
      EXPECT_TRUE(std::isnan(back[nan_quiet]));
      EXPECT_EQ(BitsOf(back[1]), 0x80000000u) << "-0 kept its sign";
    }
  }
}

TEST(GpuGradReduceCast, EmptyAndBadSizes) {
  FORGE_SKIP_WITHOUT_GPU();
  EXPECT_TRUE(cuda::CastFloatToBf16(nullptr, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(cuda::CastBf16ToFloat(nullptr, nullptr, 0, nullptr).ok());
  EXPECT_FALSE(cuda::CastFloatToBf16(nullptr, nullptr, -1, nullptr).ok());
  EXPECT_FALSE(cuda::CastBf16ToFloat(nullptr, nullptr, -1, nullptr).ok());
}

}  // namespace
}  // namespace forge
