// The shard layout shared by ZeRO/FSDP and checkpoints: slices tile the unit in rank order,
// slots are aligned and equal, and small units leave trailing ranks empty.
#include <gtest/gtest.h>

#include "worker/model/shard_layout.h"

namespace forge {
namespace {

TEST(ShardLayout, SlicesTileTheUnitInRankOrder) {
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{1000}, int64_t{4097},
                    int64_t{50304} * 128}) {
    for (int w : {1, 2, 3, 4, 7, 8}) {
      const int64_t s = ShardSize(n, w);
      EXPECT_EQ(s % kShardAlign, 0);
      EXPECT_GE(s * w, n) << n << " / " << w;
      EXPECT_LT(s * w - n, int64_t{w} * kShardAlign) << "padding is bounded";
      EXPECT_EQ(PaddedSize(n, w), s * w);
      int64_t next = 0;
      for (int r = 0; r < w; ++r) {
        const ShardRange x = ShardOf(n, r, w);
        EXPECT_EQ(x.begin, next) << "n=" << n << " w=" << w << " r=" << r;
        EXPECT_GE(x.size(), 0);
        EXPECT_LE(x.size(), s);
        // A non-empty slice starts at its slot (collectives address slot r*S).
        if (x.size() > 0) EXPECT_EQ(x.begin, r * s);
        next = x.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(ShardLayout, NearlyEqualSlicesForLargeUnits) {
  const int64_t n = 128 * 384 * 3 + 5;
  const int w = 4;
  for (int r = 0; r + 1 < w; ++r) EXPECT_EQ(ShardOf(n, r, w).size(), ShardSize(n, w));
  EXPECT_GT(ShardOf(n, w - 1, w).size(), ShardSize(n, w) - w * kShardAlign);
}

TEST(ShardLayout, SmallUnitLivesOnTheFirstRanks) {
  // 40 elements over 4 ranks: slots of 32 (aligned), so ranks 0 and 1 hold it all.
  EXPECT_EQ(ShardSize(40, 4), 32);
  EXPECT_EQ(ShardOf(40, 0, 4).size(), 32);
  EXPECT_EQ(ShardOf(40, 1, 4).size(), 8);
  EXPECT_EQ(ShardOf(40, 2, 4).size(), 0);
  EXPECT_EQ(ShardOf(40, 3, 4).size(), 0);
  EXPECT_EQ(ShardOf(40, 3, 4).begin, 40);
  EXPECT_EQ(ShardSize(0, 4), 0);
}

}  // namespace
}  // namespace forge
