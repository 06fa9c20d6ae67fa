// FP8 scaling recipes (worker/model/fp8_scaling): the scale formula with margin and clamps,
// the delayed recipe's rolling amax window against an independent max-of-last-N, zero and
// non-finite amaxes keeping the previous scale, and the current recipe.
#include "worker/model/fp8_scaling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <random>

namespace forge {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Fp8ScalingParams Delayed(int window, int margin, float fp8_max = cpu::kE4M3Max) {
  Fp8ScalingParams p;
  p.recipe = Fp8Recipe::kDelayed;
  p.amax_history = window;
  p.margin = margin;
  p.fp8_max = fp8_max;
  return p;
}

TEST(Fp8ScalingTest, ScaleFormulaWithMarginAndClamps) {
  EXPECT_EQ(Fp8ScaleFromAmax(448.0f, 448.0f, 0, 7.0f), 1.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(1.0f, 448.0f, 0, 7.0f), 448.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(1.0f, 448.0f, 1, 7.0f), 224.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(2.0f, 57344.0f, 3, 7.0f), 3584.0f);
  // No usable amax: the previous scale.
  EXPECT_EQ(Fp8ScaleFromAmax(0.0f, 448.0f, 0, 7.0f), 7.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(-0.0f, 448.0f, 0, 7.0f), 7.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(-1.0f, 448.0f, 0, 7.0f), 7.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(kNaN, 448.0f, 0, 7.0f), 7.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(INFINITY, 448.0f, 0, 7.0f), 7.0f);
  // Tiny and huge amaxes clamp instead of giving Inf or 0.
  EXPECT_EQ(Fp8ScaleFromAmax(1e-38f, 448.0f, 0, 7.0f), kMaxFp8Scale);
  EXPECT_EQ(Fp8ScaleFromAmax(std::numeric_limits<float>::denorm_min(), 448.0f, 0, 7.0f),
            kMaxFp8Scale);
  EXPECT_EQ(Fp8ScaleFromAmax(1e30f, 448.0f, 0, 7.0f), kMinFp8Scale);
  EXPECT_EQ(Fp8ScaleFromAmax(std::numeric_limits<float>::max(), 448.0f, 32, 7.0f),
            kMinFp8Scale);
}

TEST(Fp8ScalingTest, DelayedStartsAtOneAndFollowsTheWindow) {
  const Fp8ScalingParams p = Delayed(3, 0);
  Fp8ScaleState s = MakeFp8ScaleState(p);
  EXPECT_EQ(s.scale, 1.0f);
  EXPECT_EQ(s.scale_inv, 1.0f);
  EXPECT_EQ(s.history.size(), 3u);
  // amax sequence -> window max -> scale = 448 / max
  const float amax[] = {1.0f, 4.0f, 2.0f, 1.0f, 0.5f, 0.25f, 8.0f};
  const float want[] = {448.0f, 112.0f, 112.0f, 112.0f, 224.0f, 448.0f, 56.0f};
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(RecordAmax(p, amax[i], &s));
    EXPECT_EQ(s.scale, want[i]) << "after step " << i;
    EXPECT_EQ(s.scale_inv, 1.0f / want[i]) << "after step " << i;
  }
  EXPECT_EQ(s.recorded, 7);
  EXPECT_EQ(HistoryAmax(s), 8.0f);
}

TEST(Fp8ScalingTest, DelayedMatchesMaxOfLastNWithMargin) {
  std::mt19937_64 rng(11);
  std::lognormal_distribution<float> amax_dist(0.0f, 3.0f);
  for (int window : {1, 2, 16, 37}) {
    for (int margin : {0, 2}) {
      const Fp8ScalingParams p = Delayed(window, margin, cpu::kE5M2Max);
      Fp8ScaleState s = MakeFp8ScaleState(p);
      std::deque<float> last;
      for (int step = 0; step < 200; ++step) {
        const float a = amax_dist(rng);
        ASSERT_TRUE(RecordAmax(p, a, &s));
        last.push_back(a);
        if (static_cast<int>(last.size()) > window) last.pop_front();
        const float m = *std::max_element(last.begin(), last.end());
        const float want =
            std::clamp(std::ldexp(cpu::kE5M2Max / m, -margin), kMinFp8Scale, kMaxFp8Scale);
        ASSERT_EQ(s.scale, want) << "window " << window << " margin " << margin << " step "
                                 << step;
      }
    }
  }
}

TEST(Fp8ScalingTest, ZeroAmaxKeepsThePreviousScale) {
  const Fp8ScalingParams p = Delayed(2, 0);
  Fp8ScaleState s = MakeFp8ScaleState(p);
  ASSERT_TRUE(RecordAmax(p, 0.0f, &s));  // nothing seen yet: stays 1
  EXPECT_EQ(s.scale, 1.0f);
  ASSERT_TRUE(RecordAmax(p, 2.0f, &s));
  EXPECT_EQ(s.scale, 224.0f);
  ASSERT_TRUE(RecordAmax(p, 0.0f, &s));  // 2 is still in the window
  EXPECT_EQ(s.scale, 224.0f);
  ASSERT_TRUE(RecordAmax(p, 0.0f, &s));  // window all zero: previous scale, never Inf
  EXPECT_EQ(s.scale, 224.0f);
  EXPECT_EQ(s.scale_inv, 1.0f / 224.0f);
  EXPECT_EQ(HistoryAmax(s), 0.0f);
  ASSERT_TRUE(RecordAmax(p, 7.0f, &s));
  EXPECT_EQ(s.scale, 64.0f);
}

TEST(Fp8ScalingTest, NonFiniteAmaxIsRefusedAndCounted) {
  const Fp8ScalingParams p = Delayed(2, 0);
  Fp8ScaleState s = MakeFp8ScaleState(p);
  ASSERT_TRUE(RecordAmax(p, 4.0f, &s));
  ASSERT_EQ(s.scale, 112.0f);
  EXPECT_FALSE(RecordAmax(p, kNaN, &s));
  EXPECT_FALSE(RecordAmax(p, INFINITY, &s));
  EXPECT_FALSE(RecordAmax(p, -INFINITY, &s));
  EXPECT_EQ(s.nonfinite_amax, 3);
  EXPECT_EQ(s.recorded, 1);  // not in the history
  EXPECT_EQ(s.scale, 112.0f);
  // The window still holds only 4: one more step with 1 keeps 4 as the max, the next drops it.
  ASSERT_TRUE(RecordAmax(p, 1.0f, &s));
  EXPECT_EQ(s.scale, 112.0f);
  ASSERT_TRUE(RecordAmax(p, 1.0f, &s));
  EXPECT_EQ(s.scale, 448.0f);
}

TEST(Fp8ScalingTest, CurrentUsesTheTensorsOwnAmax) {
  Fp8ScalingParams p;
  p.recipe = Fp8Recipe::kCurrent;
  p.margin = 2;
  Fp8ScaleState s = MakeFp8ScaleState(p);
  ASSERT_TRUE(UpdateCurrentScale(p, 8.0f, &s));
  EXPECT_EQ(s.scale, 14.0f);  // 448 / 8 / 4
  ASSERT_TRUE(UpdateCurrentScale(p, 0.5f, &s));
  EXPECT_EQ(s.scale, 224.0f);  // no memory of the 8
  ASSERT_TRUE(UpdateCurrentScale(p, 0.0f, &s));
  EXPECT_EQ(s.scale, 224.0f);
  EXPECT_FALSE(UpdateCurrentScale(p, kNaN, &s));
  EXPECT_EQ(s.scale, 224.0f);
  EXPECT_EQ(s.scale_inv, 1.0f / 224.0f);
  EXPECT_EQ(s.nonfinite_amax, 1);
  EXPECT_EQ(s.recorded, 0);
}

TEST(Fp8ScalingTest, ScalesStayFiniteAndNonZero) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  const Fp8ScalingParams p = Delayed(4, 32);
  Fp8ScaleState s = MakeFp8ScaleState(p);
  for (int i = 0; i < 10000; ++i) {
    const uint32_t u = bits(rng);  // any float: NaNs, Infs, subnormals, negatives
    float a;
    std::memcpy(&a, &u, 4);
    RecordAmax(p, a, &s);
    ASSERT_TRUE(std::isnormal(s.scale)) << s.scale;
    ASSERT_TRUE(std::isnormal(s.scale_inv)) << s.scale_inv;
    ASSERT_GE(s.scale, kMinFp8Scale);
    ASSERT_LE(s.scale, kMaxFp8Scale);
  }
}

TEST(Fp8ScalingTest, ParamsFromConfigAndValidation) {
  Fp8Config cfg;
  cfg.recipe = Fp8Recipe::kCurrent;
  cfg.amax_history = 5;
  cfg.margin = 1;
  const Fp8ScalingParams e5 = Fp8ParamsFromConfig(cfg, cpu::Fp8Format::kE5M2);
  EXPECT_EQ(e5.recipe, Fp8Recipe::kCurrent);
  EXPECT_EQ(e5.amax_history, 5);
  EXPECT_EQ(e5.margin, 1);
  EXPECT_EQ(e5.fp8_max, 57344.0f);
  EXPECT_EQ(Fp8ParamsFromConfig(cfg, cpu::Fp8Format::kE4M3).fp8_max, 448.0f);
  EXPECT_TRUE(ValidateFp8ScalingParams(e5).ok());
  Fp8ScalingParams bad = e5;
  bad.amax_history = 0;
  EXPECT_EQ(ValidateFp8ScalingParams(bad).code(), Code::kInvalidArgument);
  bad = e5;
  bad.margin = -1;
  EXPECT_NE(ValidateFp8ScalingParams(bad).message().find("margin"), std::string::npos);
  bad = e5;
  bad.fp8_max = kNaN;
  EXPECT_FALSE(ValidateFp8ScalingParams(bad).ok());
}

}  // namespace
}  // namespace forge
