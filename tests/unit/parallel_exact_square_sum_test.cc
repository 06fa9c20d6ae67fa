// The exact sum of squares behind the global grad norm: independent of order and of how the
// values are split over partial sums (ranks), and accurate to double rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "worker/parallel/exact_square_sum.h"

namespace forge {
namespace {

std::vector<float> Gradients(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-30, 5);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(g(rng), e(rng));
  return v;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(ExactSquareSum, MatchesLongDoubleReference) {
  const auto v = Gradients(10000, 1);
  ExactSquareSum s;
  s.Add(v.data(), int64_t(v.size()));
  long double ref = 0;
  for (float x : v) ref += (long double)x * x;
  EXPECT_NEAR(s.Value() / double(ref), 1.0, 1e-15);
}

TEST(ExactSquareSum, SameBitsForAnyOrderAndSplit) {
  auto v = Gradients(5000, 2);
  ExactSquareSum whole;
  whole.Add(v.data(), int64_t(v.size()));
  const double want = whole.Value();
  // A plain double sum does depend on the order (so this test can tell the difference).
  double fwd = 0, bwd = 0;
  for (size_t i = 0; i < v.size(); ++i) fwd += double(v[i]) * v[i];
  for (size_t i = v.size(); i-- > 0;) bwd += double(v[i]) * v[i];
  EXPECT_FALSE(SameBits(fwd, bwd)) << "pick other data: plain sums agree by chance";

  std::mt19937 rng(3);
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(v.begin(), v.end(), rng);
    // Split at random points into "ranks", merge through the wire format.
    const int ranks = 1 + trial * 2;
    std::vector<size_t> cut = {0, v.size()};
    for (int r = 1; r < ranks; ++r) cut.push_back(rng() % v.size());
    std::sort(cut.begin(), cut.end());
    std::vector<double> wire(ExactSquareSum::kWireSize, 0.0);
    for (size_t r = 0; r + 1 < cut.size(); ++r) {
      ExactSquareSum part;
      part.Add(v.data() + cut[r], int64_t(cut[r + 1] - cut[r]));
      const auto w = part.ToDoubles();
      for (int k = 0; k < ExactSquareSum::kWireSize; ++k) wire[k] += w[k];  // an all-reduce
    }
    EXPECT_TRUE(SameBits(ExactSquareSum::FromDoubles(wire.data()).Value(), want)) << trial;
    ExactSquareSum a, b;
    a.Add(v.data(), 1234);
    b.Add(v.data() + 1234, int64_t(v.size()) - 1234);
    a.Merge(b);
    EXPECT_TRUE(SameBits(a.Value(), want)) << trial;
  }
}

TEST(ExactSquareSum, ExtremesZerosAndNonFinite) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  const float v[] = {0.0f, -0.0f, tiny, -tiny, 1.0f, big, -3.0f};
  ExactSquareSum s;
  s.Add(v, 7);
  const long double want = 2.0L * tiny * tiny + 1.0L + (long double)big * big + 9.0L;
  EXPECT_NEAR(s.Value() / double(want), 1.0, 1e-15);
  EXPECT_TRUE(std::isfinite(s.Value()));

  ExactSquareSum only_tiny;
  only_tiny.Add(&tiny, 1);
  EXPECT_EQ(only_tiny.Value(), std::ldexp(1.0, -298));  // exactly 2^-298

  ExactSquareSum zero;
  EXPECT_EQ(zero.Value(), 0.0);
  zero.Add(v, 2);
  EXPECT_EQ(zero.Value(), 0.0);

  const float bad[] = {1.0f, std::numeric_limits<float>::infinity()};
  ExactSquareSum s_inf;
  s_inf.Add(bad, 2);
  EXPECT_TRUE(std::isnan(s_inf.Value()));
  ExactSquareSum merged;
  merged.Add(v, 7);
  merged.Merge(s_inf);
  EXPECT_TRUE(std::isnan(merged.Value()));
}

}  // namespace
}  // namespace forge
