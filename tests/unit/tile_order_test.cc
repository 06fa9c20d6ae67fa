// The persistent GEMMs' tile order (kernels/cuda/tile_order.h): every tile once, bands of the
// asked rows with their rows fastest, the last band holding what is left.
#include "kernels/cuda/tile_order.h"

#include <gtest/gtest.h>

#include <vector>

namespace forge {
namespace {

using cuda::TileAt;
using cuda::TileCoord;

TEST(TileOrder, VisitsEveryTileOnce) {
  for (int tiles_m : {1, 3, 8, 13, 128}) {
    for (int tiles_n : {1, 2, 5, 64}) {
      for (int group : {1, 2, 3, 8, 200}) {
        SCOPED_TRACE(testing::Message() << tiles_m << " x " << tiles_n << " in bands of " << group);
        std::vector<int> seen(size_t(tiles_m * tiles_n), 0);
        for (int t = 0; t < tiles_m * tiles_n; ++t) {
          const TileCoord c = TileAt(t, tiles_m, tiles_n, group);
          ASSERT_GE(c.row, 0);
          ASSERT_LT(c.row, tiles_m);
          ASSERT_GE(c.col, 0);
          ASSERT_LT(c.col, tiles_n);
          ++seen[size_t(c.row * tiles_n + c.col)];
        }
        for (int v : seen) ASSERT_EQ(v, 1);
      }
    }
  }
}

TEST(TileOrder, OneRowBandIsRowMajor) {
  for (int t = 0; t < 6 * 7; ++t) {
    const TileCoord c = TileAt(t, 6, 7, 1);
    EXPECT_EQ(c.row, t / 7);
    EXPECT_EQ(c.col, t % 7);
  }
}

TEST(TileOrder, BandRowsRunFastestAndTheLastBandIsShort) {
  // 5 tile rows in bands of 2: rows {0, 1}, {2, 3}, {4}; 3 columns.
  const std::vector<TileCoord> want = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2},
                                       {1, 2}, {2, 0}, {3, 0}, {2, 1}, {3, 1},
                                       {2, 2}, {3, 2}, {4, 0}, {4, 1}, {4, 2}};
  for (int t = 0; t < 15; ++t) {
    const TileCoord c = TileAt(t, 5, 3, 2);
    EXPECT_EQ(c.row, want[size_t(t)].row) << "tile " << t;
    EXPECT_EQ(c.col, want[size_t(t)].col) << "tile " << t;
  }
}

// Row-major while B fits in half the L2, bands of 8 beyond: on a 50 MB L2, gpt350m's largest B
// (gate/up, 11.5 MB) and llama3-1b's QKV weight (12.6 MB) stay row-major, llama3-1b's gate/up
// (64 MB) and down projection (32 MB) take bands.
TEST(TileOrder, BandsOnlyWhereBOutgrowsHalfTheL2) {
  const int64_t l2 = 50 * 1024 * 1024;
  EXPECT_EQ(cuda::TileGroupRows(5632 * 1024 * 2, l2), 1);
  EXPECT_EQ(cuda::TileGroupRows(3072 * 2048 * 2, l2), 1);
  EXPECT_EQ(cuda::TileGroupRows(l2 / 2, l2), 1);
  EXPECT_EQ(cuda::TileGroupRows(l2 / 2 + 1, l2), 8);
  EXPECT_EQ(cuda::TileGroupRows(2048 * 8192 * 2, l2), 8);
  EXPECT_EQ(cuda::TileGroupRows(int64_t(16384) * 2048 * 2, l2), 8);
}

}  // namespace
}  // namespace forge
