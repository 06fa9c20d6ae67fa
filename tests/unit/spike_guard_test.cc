// The loss-spike statistics (worker/train/spike_guard.h) against a direct computation in long
// double, their exact round trip through the checkpoint text, and the data windows a rollback
// leaves out.
#include "worker/train/spike_guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace forge {
namespace {

// mean + sigma * max(population stddev, 1% of |mean|), computed independently.
float Expected(const std::vector<float>& v, double sigma) {
  long double sum = 0;
  for (float x : v) sum += x;
  const long double mean = sum / v.size();
  long double sq = 0;
  for (float x : v) sq += (x - mean) * (x - mean);
  const long double sd = std::sqrt(sq / v.size());
  return static_cast<float>(mean + sigma * std::max(sd, 0.01L * std::fabs(mean)));
}

TEST(SpikeGuard, NoLimitsUntilTheWindowIsFull) {
  SpikeGuard g(6.0, 4, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(g.Limits().any()) << i;
    EXPECT_EQ(g.Observe(100.0f + i, 1.0f, g.Limits(), i + 1, i * 8), StepVerdict::kAccepted);
  }
  EXPECT_FALSE(g.Limits().any());
  g.Observe(3.0f, 1.0f, g.Limits(), 4, 24);
  EXPECT_TRUE(g.Limits().any());
}

TEST(SpikeGuard, LimitsAreMeanPlusSigmaStddevOfTheLastWindow) {
  SpikeGuard g(4.0, 5, 3);
  const std::vector<float> loss = {3.1f, 2.9f, 3.0f, 2.7f, 2.8f, 2.6f, 2.75f};
  const std::vector<float> norm = {0.5f, 0.9f, 0.7f, 0.65f, 1.1f, 0.8f, 0.6f};
  for (size_t i = 0; i < loss.size(); ++i) g.Observe(loss[i], norm[i], g.Limits(), i + 1, 0);
  const SpikeLimits l = g.Limits();
  EXPECT_FLOAT_EQ(l.loss, Expected({3.0f, 2.7f, 2.8f, 2.6f, 2.75f}, 4.0));
  EXPECT_FLOAT_EQ(l.grad_norm, Expected({0.7f, 0.65f, 1.1f, 0.8f, 0.6f}, 4.0));
  // A constant window: the 1% floor, not a zero-width band.
  SpikeGuard flat(6.0, 3, 3);
  for (int i = 0; i < 3; ++i) flat.Observe(2.0f, 1.0f, flat.Limits(), i + 1, 0);
  EXPECT_FLOAT_EQ(flat.Limits().loss, 2.0f + 6.0f * 0.02f);
  EXPECT_FLOAT_EQ(flat.Limits().grad_norm, 1.0f + 6.0f * 0.01f);
}

TEST(SpikeGuard, SpikesCountInARowAndStayOutOfTheWindow) {
  SpikeGuard g(3.0, 4, 2);
  for (int i = 0; i < 4; ++i) g.Observe(2.0f + 0.01f * i, 1.0f, g.Limits(), i + 1, i * 8);
  const SpikeLimits before = g.Limits();
  EXPECT_EQ(g.Observe(9.0f, 1.0f, before, 5, 32), StepVerdict::kSpike);  // the loss
  EXPECT_EQ(g.in_row(), 1);
  EXPECT_EQ(g.row_first_step(), 5);
  EXPECT_EQ(g.row_from_cursor(), 32);
  EXPECT_FALSE(g.RollbackDue());
  EXPECT_EQ(g.Limits().loss, before.loss);  // the spike did not enter the window
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(g.Observe(nan, nan, before, 6, 40), StepVerdict::kNonFinite);
  EXPECT_EQ(g.in_row(), 1);  // non-finite steps neither add to nor end the row
  EXPECT_EQ(g.Observe(2.0f, 50.0f, before, 7, 48), StepVerdict::kSpike);  // the norm
  EXPECT_EQ(g.in_row(), 2);
  EXPECT_EQ(g.row_first_step(), 5);
  EXPECT_TRUE(g.RollbackDue());
  g.ClearRow();
  EXPECT_FALSE(g.RollbackDue());
  EXPECT_EQ(g.Observe(2.01f, 1.0f, before, 8, 56), StepVerdict::kAccepted);
  EXPECT_EQ(g.in_row(), 0);
  // Off: never a spike, never a limit.
  SpikeGuard off(0.0, 4, 2);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(off.Observe(i == 7 ? 1e6f : 1.0f, 1.0f, off.Limits(), i + 1, 0),
              StepVerdict::kAccepted);
  EXPECT_FALSE(off.Limits().any());
}

TEST(SpikeGuard, EncodedStateDecidesAsTheOriginal) {
  SpikeGuard a(5.0, 6, 3);
  uint32_t x = 7;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return float(x >> 8) / float(1 << 24);
  };
  for (int i = 0; i < 9; ++i) a.Observe(3.0f + next(), 1.0f + next(), a.Limits(), i + 1, 8 * i);
  a.Observe(1e3f, 1.0f, a.Limits(), 10, 72);  // one spike: in_row 1 travels too
  SpikeGuard b(5.0, 6, 3);
  ASSERT_TRUE(b.Decode(a.Encode()).ok());
  EXPECT_EQ(b.Encode(), a.Encode());
  EXPECT_EQ(b.in_row(), 1);
  EXPECT_EQ(b.row_from_cursor(), 72);
  for (int i = 0; i < 20; ++i) {
    const float l = 3.0f + next(), n = (i == 5 ? 40.0f : 1.0f + next());
    const SpikeLimits la = a.Limits(), lb = b.Limits();
    EXPECT_EQ(std::memcmp(&la, &lb, sizeof la), 0) << i;
    EXPECT_EQ(a.Observe(l, n, la, 11 + i, 0), b.Observe(l, n, lb, 11 + i, 0)) << i;
  }
  // A smaller window keeps the newest entries.
  SpikeGuard c(5.0, 3, 3);
  ASSERT_TRUE(c.Decode(a.Encode()).ok());
  EXPECT_EQ(c.size(), 3u);
  // Damage is an error and changes nothing.
  const std::string kept = c.Encode();
  std::string bad = a.Encode();
  bad.resize(bad.size() / 2);
  EXPECT_FALSE(c.Decode(bad).ok());
  EXPECT_FALSE(c.Decode("spike_guard v2 in_row 0 0 0 count 0\n").ok());
  EXPECT_FALSE(c.Decode("").ok());
  EXPECT_EQ(c.Encode(), kept);
}

TEST(DataSkips, RangesMergeAndCursorsJumpToTheirEnd) {
  DataSkips d;
  d.Add(80, 92);
  d.Add(200, 210);
  d.Add(92, 100);  // touches the first: merged
  d.Add(5, 5);     // empty: ignored
  ASSERT_EQ(d.ranges().size(), 2u);
  EXPECT_EQ(d.ranges()[0].from, 80);
  EXPECT_EQ(d.ranges()[0].to, 100);
  EXPECT_EQ(d.Apply(79), 79);
  EXPECT_EQ(d.Apply(80), 100);
  EXPECT_EQ(d.Apply(99), 100);
  EXPECT_EQ(d.Apply(100), 100);
  EXPECT_EQ(d.Apply(205), 210);
  DataSkips e;
  ASSERT_TRUE(e.Decode(d.Encode()).ok());
  EXPECT_EQ(e.Encode(), d.Encode());
  EXPECT_FALSE(e.Decode("data_skips v1 count 2\n1 2\n").ok());
  EXPECT_FALSE(e.Decode("data_skips v1 count 1\n9 3\n").ok());
  EXPECT_EQ(e.Encode(), d.Encode());

  SpikeGuard g(6.0, 4, 3), h(6.0, 4, 3);
  g.Observe(1.0f, 1.0f, g.Limits(), 1, 0);
  DataSkips f;
  ASSERT_TRUE(DecodeSpikeState(EncodeSpikeState(g, d), &h, &f).ok());
  EXPECT_EQ(h.Encode(), g.Encode());
  EXPECT_EQ(f.Encode(), d.Encode());
  EXPECT_FALSE(DecodeSpikeState(g.Encode(), &h, &f).ok());
}

}  // namespace
}  // namespace forge
