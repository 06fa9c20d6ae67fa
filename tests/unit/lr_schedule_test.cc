#include "worker/optim/lr_schedule.h"

#include <gtest/gtest.h>

namespace forge {
namespace {

TEST(LrSchedule, WarmupThenCosineToMin) {
  OptimizerConfig o;
  o.lr = 1.0f;
  ScheduleConfig s;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.min_lr_ratio = 0.1f;
  s.decay = DecayKind::kCosine;
  EXPECT_FLOAT_EQ(LearningRate(o, s, 1), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(o, s, 5), 0.5f);
  EXPECT_FLOAT_EQ(LearningRate(o, s, 10), 1.0f);
  EXPECT_NEAR(LearningRate(o, s, 60), 0.55f, 1e-6);  // half way: (1 + 0.1) / 2
  EXPECT_NEAR(LearningRate(o, s, 110), 0.1f, 1e-6);
  EXPECT_NEAR(LearningRate(o, s, 500), 0.1f, 1e-6);  // clamps past the end
  for (int64_t t = 11; t < 110; ++t) EXPECT_LE(LearningRate(o, s, t + 1), LearningRate(o, s, t));
}

TEST(LrSchedule, LinearAndConstant) {
  OptimizerConfig o;
  o.lr = 2.0f;
  ScheduleConfig s;
  s.warmup_steps = 0;
  s.total_steps = 100;
  s.min_lr_ratio = 0.0f;
  s.decay = DecayKind::kLinear;
  EXPECT_NEAR(LearningRate(o, s, 50), 1.0f, 1e-6);
  EXPECT_NEAR(LearningRate(o, s, 100), 0.0f, 1e-6);
  s.decay = DecayKind::kConstant;
  EXPECT_FLOAT_EQ(LearningRate(o, s, 73), 2.0f);
}

}  // namespace
}  // namespace forge
