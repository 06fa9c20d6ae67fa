// FP8 formats on the host (kernels/cpu/fp8) and the reference cast (kernels/cpu/fp8_cast):
// known bit patterns (zero, subnormals, max, overflow with and without saturation, NaN,
// ties to even), every code decoding and re-encoding to itself, and random floats rounding
// to the nearest FP8 value by an independent search.
#include "kernels/cpu/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/fp8_cast.h"

namespace forge::cpu {
namespace {

constexpr auto kE4 = Fp8Format::kE4M3;
constexpr auto kE5 = Fp8Format::kE5M2;
constexpr auto kNoSat = Fp8Saturation::kNoSat;

int Bits(float x, Fp8Format f, Fp8Saturation s = Fp8Saturation::kSatFinite) {
  return FloatToFp8(x, f, s);
}

TEST(Fp8Test, E4M3KnownPatterns) {
  EXPECT_EQ(Bits(0.0f, kE4), 0x00);
  EXPECT_EQ(Bits(-0.0f, kE4), 0x80);
  EXPECT_EQ(Bits(1.0f, kE4), 0x38);
  EXPECT_EQ(Bits(-2.0f, kE4), 0xC0);
  EXPECT_EQ(Bits(240.0f, kE4), 0x77);
  EXPECT_EQ(Bits(256.0f, kE4), 0x78);
  EXPECT_EQ(Bits(448.0f, kE4), 0x7E);
  EXPECT_EQ(Bits(-448.0f, kE4), 0xFE);
  EXPECT_EQ(Bits(std::ldexp(1.0f, -6), kE4), 0x08);      // smallest normal
  EXPECT_EQ(Bits(std::ldexp(7.0f, -9), kE4), 0x07);      // largest subnormal
  EXPECT_EQ(Bits(std::ldexp(1.0f, -9), kE4), 0x01);      // smallest subnormal
  EXPECT_EQ(Bits(-std::ldexp(1.0f, -9), kE4), 0x81);
  EXPECT_EQ(Bits(std::ldexp(1.0f, -10), kE4), 0x00);     // half of it: tie, to even (0)
  EXPECT_EQ(Bits(std::nextafter(std::ldexp(1.0f, -10), 1.0f), kE4), 0x01);
  EXPECT_EQ(Bits(std::ldexp(3.0f, -10), kE4), 0x02);     // tie between 0x01 and 0x02
  EXPECT_EQ(Bits(std::numeric_limits<float>::denorm_min(), kE4), 0x00);
  EXPECT_EQ(Bits(-std::numeric_limits<float>::denorm_min(), kE4), 0x80);
}

TEST(Fp8Test, E4M3TiesToEven) {
  EXPECT_EQ(Bits(1.0625f, kE4), 0x38);  // 1 + 1/16: between 1.0 (even) and 1.125
  EXPECT_EQ(Bits(std::nextafter(1.0625f, 2.0f), kE4), 0x39);
  EXPECT_EQ(Bits(std::nextafter(1.0625f, 0.0f), kE4), 0x38);
  EXPECT_EQ(Bits(1.1875f, kE4), 0x3A);  // between 1.125 and 1.25 (even)
  EXPECT_EQ(Bits(-1.1875f, kE4), 0xBA);
  EXPECT_EQ(Bits(15.5f, kE4), 0x58);    // between 15 (odd) and 16: up into the next binade
}

TEST(Fp8Test, E4M3OverflowSaturatesOrGivesNaN) {
  // 464 = 448 + half an ulp: the tie goes to 448 (even; the odd neighbour would be NaN).
  EXPECT_EQ(Bits(464.0f, kE4), 0x7E);
  EXPECT_EQ(Bits(464.0f, kE4, kNoSat), 0x7E);
  EXPECT_EQ(Bits(465.0f, kE4), 0x7E);
  EXPECT_EQ(Bits(465.0f, kE4, kNoSat), 0x7F);
  EXPECT_EQ(Bits(-1e6f, kE4), 0xFE);
  EXPECT_EQ(Bits(-1e6f, kE4, kNoSat), 0xFF);
  EXPECT_EQ(Bits(INFINITY, kE4), 0x7E);
  EXPECT_EQ(Bits(-INFINITY, kE4), 0xFE);
  EXPECT_EQ(Bits(-INFINITY, kE4, kNoSat), 0xFF);
  EXPECT_EQ(Bits(std::numeric_limits<float>::max(), kE4), 0x7E);
}

TEST(Fp8Test, E5M2KnownPatterns) {
  EXPECT_EQ(Bits(0.0f, kE5), 0x00);
  EXPECT_EQ(Bits(-0.0f, kE5), 0x80);
  EXPECT_EQ(Bits(1.0f, kE5), 0x3C);
  EXPECT_EQ(Bits(-0.75f, kE5), 0xBA);
  EXPECT_EQ(Bits(57344.0f, kE5), 0x7B);
  EXPECT_EQ(Bits(std::ldexp(1.0f, -14), kE5), 0x04);     // smallest normal
  EXPECT_EQ(Bits(std::ldexp(3.0f, -16), kE5), 0x03);     // largest subnormal
  EXPECT_EQ(Bits(std::ldexp(1.0f, -16), kE5), 0x01);     // smallest subnormal
  EXPECT_EQ(Bits(std::ldexp(1.0f, -17), kE5), 0x00);     // tie, to even
  EXPECT_EQ(Bits(std::ldexp(3.0f, -17), kE5), 0x02);     // tie between 0x01 and 0x02
  EXPECT_EQ(Bits(1.125f, kE5), 0x3C);                    // between 1.0 (even) and 1.25
  EXPECT_EQ(Bits(1.375f, kE5), 0x3E);                    // between 1.25 and 1.5 (even)
}

TEST(Fp8Test, E5M2OverflowSaturatesOrGivesInf) {
  EXPECT_EQ(Bits(61439.0f, kE5), 0x7B);
  EXPECT_EQ(Bits(61439.0f, kE5, kNoSat), 0x7B);
  // 61440 = max + half an ulp: the tie goes to the even neighbour, which is Inf.
  EXPECT_EQ(Bits(61440.0f, kE5), 0x7B);
  EXPECT_EQ(Bits(61440.0f, kE5, kNoSat), 0x7C);
  EXPECT_EQ(Bits(INFINITY, kE5), 0x7B);
  EXPECT_EQ(Bits(INFINITY, kE5, kNoSat), 0x7C);
  EXPECT_EQ(Bits(-INFINITY, kE5), 0xFB);
  EXPECT_EQ(Bits(-INFINITY, kE5, kNoSat), 0xFC);
  EXPECT_EQ(Fp8ToFloat(0x7C, kE5), INFINITY);
  EXPECT_EQ(Fp8ToFloat(0xFC, kE5), -INFINITY);
}

TEST(Fp8Test, NaNIsCanonicalPositive) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  for (Fp8Format f : {kE4, kE5}) {
    for (Fp8Saturation s : {Fp8Saturation::kSatFinite, kNoSat}) {
      EXPECT_EQ(Bits(qnan, f, s), 0x7F) << Fp8FormatName(f);
      EXPECT_EQ(Bits(-qnan, f, s), 0x7F) << Fp8FormatName(f);
    }
  }
  EXPECT_TRUE(std::isnan(Fp8ToFloat(0x7F, kE4)));
  EXPECT_TRUE(std::isnan(Fp8ToFloat(0xFF, kE4)));
  EXPECT_TRUE(std::isnan(Fp8ToFloat(0x7D, kE5)));
  EXPECT_TRUE(std::isnan(Fp8ToFloat(0xFE, kE5)));
  EXPECT_FALSE(std::isnan(Fp8ToFloat(0x7E, kE4)));
}

TEST(Fp8Test, DecodesKnownValues) {
  EXPECT_EQ(Fp8ToFloat(0x7E, kE4), 448.0f);
  EXPECT_EQ(Fp8ToFloat(0xFE, kE4), -448.0f);
  EXPECT_EQ(Fp8ToFloat(0x01, kE4), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8ToFloat(0x38, kE4), 1.0f);
  EXPECT_EQ(Fp8ToFloat(0x7B, kE5), 57344.0f);
  EXPECT_EQ(Fp8ToFloat(0x01, kE5), std::ldexp(1.0f, -16));
  EXPECT_EQ(Fp8Max(kE4), 448.0f);
  EXPECT_EQ(Fp8Max(kE5), 57344.0f);
}

TEST(Fp8Test, EveryFiniteCodeRoundTrips) {
  for (Fp8Format f : {kE4, kE5}) {
    int finite = 0;
    for (int code = 0; code < 256; ++code) {
      const float v = Fp8ToFloat(static_cast<uint8_t>(code), f);
      if (!std::isfinite(v)) continue;
      ++finite;
      EXPECT_EQ(Bits(v, f), code) << Fp8FormatName(f) << " code " << code << " value " << v;
      EXPECT_LE(std::fabs(v), Fp8Max(f));
    }
    EXPECT_EQ(finite, f == kE4 ? 254 : 248) << Fp8FormatName(f);
  }
}

// The nearest finite FP8 value by brute force over all codes; ties to the even code.
uint8_t NearestBySearch(float x, Fp8Format f) {
  int best = -1;
  double best_d = INFINITY;
  for (int code = 0; code < 256; ++code) {
    const float v = Fp8ToFloat(static_cast<uint8_t>(code), f);
    if (!std::isfinite(v) || std::signbit(v) != std::signbit(x)) continue;
    const double d = std::fabs(double(v) - double(x));
    if (d < best_d || (d == best_d && (code & 1) == 0)) best = code, best_d = d;
  }
  return static_cast<uint8_t>(best);
}

TEST(Fp8Test, RandomFloatsRoundToNearestEven) {
  std::mt19937_64 rng(4);
  for (Fp8Format f : {kE4, kE5}) {
    const float max = Fp8Max(f);
    // Log-uniform magnitudes from far below the smallest subnormal to the max.
    std::uniform_real_distribution<float> log2mag(-20.0f, std::log2(max));
    for (int i = 0; i < 20000; ++i) {
      float x = std::exp2(log2mag(rng));
      if (i % 2) x = -x;
      ASSERT_EQ(Bits(x, f), NearestBySearch(x, f)) << Fp8FormatName(f) << " x=" << x;
    }
  }
}

TEST(Fp8CastTest, ScalesSaturatesTransposesAndReportsAmax) {
  const int64_t rows = 3, cols = 2;
  const std::vector<float> x = {1.0f, -2.0f, 300.0f, 0.5f, -0.25f, 0.0f};
  std::vector<uint8_t> out(6), out_t(6);
  const float amax = CastToFp8(x.data(), rows, cols, 2.0f, kE4, out.data(), out_t.data());
  EXPECT_EQ(amax, 300.0f);  // before scaling
  // 2, -4, 600 -> 448 (saturated), 1, -0.5, 0
  const std::vector<uint8_t> want = {0x40, 0xC8, 0x7E, 0x38, 0xB0, 0x00};
  EXPECT_EQ(out, want);
  const std::vector<uint8_t> want_t = {0x40, 0x7E, 0xB0, 0xC8, 0x38, 0x00};
  EXPECT_EQ(out_t, want_t);
  // Either output may be left out.
  std::vector<uint8_t> only_t(6);
  CastToFp8(x.data(), rows, cols, 2.0f, kE4, nullptr, only_t.data());
  EXPECT_EQ(only_t, want_t);
}

TEST(Fp8CastTest, AmaxPropagatesInfAndNaN) {
  std::vector<float> x = {1.0f, -3.0f, 2.0f};
  EXPECT_EQ(AbsMax(x.data(), 3), 3.0f);
  EXPECT_EQ(AbsMax(x.data(), 0), 0.0f);
  x[0] = -INFINITY;
  EXPECT_EQ(AbsMax(x.data(), 3), INFINITY);
  x[2] = -std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(AbsMax(x.data(), 3)));
  EXPECT_EQ(AbsMaxBits(x.data(), 3) >> 31, 0u);  // sign cleared
}

}  // namespace
}  // namespace forge::cpu
