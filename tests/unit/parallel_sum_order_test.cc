// The canonical summation order: its definition, its memory bound, and the property the
// data-parallel trainer relies on (one process's sum over A micro-steps equals the sum over W
// ranks of each rank's sum, bitwise, for W a power of two or one micro-step per rank).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "worker/parallel/sum_order.h"

namespace forge {
namespace {

// The definition, written as plainly as possible: S(x) = S(even positions) + S(odd positions).
float Reference(const std::vector<float>& x) {
  if (x.size() == 1) return x[0];
  std::vector<float> even, odd;
  for (size_t i = 0; i < x.size(); ++i) (i % 2 ? odd : even).push_back(x[i]);
  return Reference(even) + Reference(odd);
}

// Values spread over many exponents so any reassociation shows up.
std::vector<float> Values(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-20, 0);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(u(rng), e(rng));
  return v;
}

// CanonicalReduce over scalar slots.
float Streamed(const std::vector<float>& x, int* max_slot, std::vector<int64_t>* order) {
  std::vector<float> slot(CanonicalSumSlots(int64_t(x.size())), NAN);
  *max_slot = -1;
  CanonicalReduce(
      int64_t(x.size()),
      [&](int64_t i, int s) {
        order->push_back(i);
        *max_slot = std::max(*max_slot, s);
        slot.at(s) = x[i];
      },
      [&](int d, int s) { slot.at(d) += slot.at(s); });
  return slot[0];
}

TEST(SumOrder, CanonicalReduceFollowsTheDefinitionWithLogSlots) {
  for (int n = 1; n <= 40; ++n) {
    const auto x = Values(n, 100 + n);
    int max_slot = 0;
    std::vector<int64_t> order;
    const float got = Streamed(x, &max_slot, &order);
    const float want = Reference(x);
    EXPECT_EQ(std::memcmp(&got, &want, 4), 0) << "n=" << n;
    EXPECT_LT(max_slot, CanonicalSumSlots(n));
    EXPECT_EQ(CanonicalSumSlots(n), n == 1 ? 1 : int(std::ceil(std::log2(n))) + 1) << n;
    EXPECT_EQ(int(order.size()), n) << "each leaf exactly once";
  }
}

TEST(SumOrder, OrderMattersSoTheTestCanFail) {
  // Plain left-to-right summation differs from the canonical order for some inputs.
  int differ = 0;
  for (int seed = 0; seed < 20; ++seed) {
    const auto x = Values(8, seed);
    float seq = 0;
    for (float v : x) seq += v;
    const float can = Reference(x);
    differ += std::memcmp(&seq, &can, 4) != 0;
  }
  EXPECT_GT(differ, 0);
}

// The data-parallel identity: rank r holds global micro-steps j = k*W + r.
float TwoLevel(const std::vector<float>& x, int world) {
  const int local = int(x.size()) / world;
  std::vector<float> per_rank(world);
  for (int r = 0; r < world; ++r) {
    std::vector<float> mine;
    for (int k = 0; k < local; ++k) mine.push_back(x[k * world + r]);
    per_rank[r] = Reference(mine);
  }
  // The collective: CanonicalSum over ranks.
  std::vector<float*> parts(world);
  for (int r = 0; r < world; ++r) parts[r] = &per_rank[r];
  float out = 0;
  CanonicalSum(&out, parts.data(), world, 1);
  return out;
}

TEST(SumOrder, RanksThenCollectiveEqualsOneProcessForPowerOfTwoWorlds) {
  for (int world : {1, 2, 4, 8}) {
    for (int local : {1, 2, 3, 4, 5, 8}) {
      for (int seed = 0; seed < 10; ++seed) {
        const auto x = Values(world * local, seed * 31 + world);
        const float one = Reference(x), dp = TwoLevel(x, world);
        EXPECT_EQ(std::memcmp(&one, &dp, 4), 0) << "W=" << world << " local=" << local;
      }
    }
  }
}

TEST(SumOrder, AnyWorldWithOneMicroStepPerRank) {
  for (int world : {3, 5, 6, 7}) {
    const auto x = Values(world, world);
    const float one = Reference(x), dp = TwoLevel(x, world);
    EXPECT_EQ(std::memcmp(&one, &dp, 4), 0) << world;
  }
}

TEST(SumOrder, NonPowerOfTwoWorldWithSeveralMicroStepsDiffers) {
  // The documented limit: W=3 with 2 micro-steps per rank is not the same tree.
  int differ = 0;
  for (int seed = 0; seed < 50; ++seed) {
    const auto x = Values(6, seed);
    const float one = Reference(x), dp = TwoLevel(x, 3);
    differ += std::memcmp(&one, &dp, 4) != 0;
  }
  EXPECT_GT(differ, 0);
}

TEST(SumOrder, CanonicalSumOfVectorsIsElementwise) {
  const int W = 5;
  const int64_t n = 37;
  std::vector<std::vector<double>> in(W);
  std::vector<double*> parts(W);
  for (int r = 0; r < W; ++r) {
    auto v = Values(int(n), 7 + r);
    in[r].assign(v.begin(), v.end());
    parts[r] = in[r].data();
  }
  std::vector<double> want(n);
  for (int64_t e = 0; e < n; ++e)  // (x0 + x4 + x2 ...) per the definition, in double
    want[e] = ((in[0][e] + in[4][e]) + in[2][e]) + (in[1][e] + in[3][e]);
  std::vector<double> out(n);
  CanonicalSum(out.data(), parts.data(), W, n);
  EXPECT_EQ(std::memcmp(out.data(), want.data(), n * sizeof(double)), 0);
}

}  // namespace
}  // namespace forge
