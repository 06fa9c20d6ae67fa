// common/splitmix64.h against SplitMix64's published outputs (Vigna's splitmix64.c from state
// 0: 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f).
#include "common/splitmix64.h"

#include <gtest/gtest.h>

namespace forge {
namespace {

TEST(SplitMix64Test, GeneratorFromZero) {
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64Next(&state), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64Next(&state), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(SplitMix64Next(&state), 0x06c45d188009454full);
  EXPECT_EQ(state, 3 * kSplitMix64Gamma);
}

TEST(SplitMix64Test, HashIsTheGeneratorsOutputFromThatState) {
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64(kSplitMix64Gamma), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(SplitMix64Finish(kSplitMix64Gamma), 0xe220a8397b1dcdafull);
}

}  // namespace
}  // namespace forge
