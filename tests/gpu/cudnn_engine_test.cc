// CudnnEngineChoice's text form (what the plan cache stores): round trips, canonical knob
// order, and strict rejection of anything else. No GPU needed.
#include "kernels/cuda/cudnn_engine.h"

#include <gtest/gtest.h>

#include <string>

namespace forge::cuda {
namespace {

TEST(CudnnEngineChoiceTest, RoundTrips) {
  CudnnEngineChoice c;
  c.engine = 8;
  c.knobs = {{2, 3}, {14, -1}};
  EXPECT_EQ(c.ToString(), "engine=8 knobs=2:3,14:-1");
  auto back = ParseCudnnEngineChoice(c.ToString());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, c);

  CudnnEngineChoice none;
  none.engine = 0;
  EXPECT_EQ(none.ToString(), "engine=0 knobs=");
  auto back_none = ParseCudnnEngineChoice("engine=0 knobs=");
  ASSERT_TRUE(back_none.ok());
  EXPECT_EQ(*back_none, none);
}

TEST(CudnnEngineChoiceTest, SortsKnobsByType) {
  auto c = ParseCudnnEngineChoice("engine=1 knobs=14:1,2:5");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ToString(), "engine=1 knobs=2:5,14:1");
}

TEST(CudnnEngineChoiceTest, RejectsMalformedText) {
  for (const char* bad :
       {"", "engine=", "engine=3", "engine=x knobs=", "engine=-1 knobs=", "engine=3 knobs=2",
        "engine=3 knobs=2:", "engine=3 knobs=:2", "engine=3 knobs=2:1,", "engine=3 knobs=2:1,,3:1",
        "engine=3 knobs=2:1,2:4", "engine=3 knobs=999:1", "engine=3 knobs=2:1 ", " engine=3 knobs=",
        "engine=3  knobs=", "engine=3 knobs=2:1x"}) {
    auto c = ParseCudnnEngineChoice(bad);
    EXPECT_FALSE(c.ok()) << "accepted \"" << bad << "\"";
    if (!c.ok()) EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  }
}

}  // namespace
}  // namespace forge::cuda
