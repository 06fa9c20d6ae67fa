// The order a persistent GEMM walks its output tiles in: bands of `group_rows` tile rows, the
// rows of a band fastest, then the band's next tile column. The CTAs in flight (one per SM)
// then share a few of A's row blocks and a few of B's column blocks, so each block is read from
// memory about once per band and re-read from L2 by the band's other rows. Row-major order
// (group_rows 1) keeps the CTAs in flight on one or two of A's row blocks and sweeps all of B,
// which reads B from memory once while B stays in L2 (gpt350m's gate/up weight, 11.5 MB) and
// once every two row blocks where it does not (llama3-1b's, 64 MB: 4 GB a GEMM). Host and
// device alike, so the order is tested without a GPU.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FORGE_TILE_ORDER_FN __host__ __device__ __forceinline__
#else
#define FORGE_TILE_ORDER_FN inline
#endif

namespace forge::cuda {

struct TileCoord {
  int row;  // tile row (M / the tile's rows)
  int col;  // tile column (N / the tile's columns)
};

// Tile `tile` of a tiles_m x tiles_n grid in bands of group_rows (>= 1) rows; the last band
// holds what is left. A bijection of [0, tiles_m * tiles_n) onto the grid.
FORGE_TILE_ORDER_FN TileCoord TileAt(int tile, int tiles_m, int tiles_n, int group_rows) {
  const int band = tile / (group_rows * tiles_n);
  const int first = band * group_rows;
  const int rows = tiles_m - first < group_rows ? tiles_m - first : group_rows;
  const int in_band = tile - first * tiles_n;
  return {first + in_band % rows, in_band / rows};
}

// The band our GEMMs take for a B operand of b_bytes on a GPU with l2_bytes of L2: row-major
// while B fits in half the L2 (it then stays there beside A's rows and the outputs), else bands
// of 8 rows (132 CTAs in flight cover 8 of A's row blocks, 4 MB at K = 2048, and ~17 of B's
// 256-row blocks). On H200s, llama3-1b's gate/up GEMM with SwiGLU took 1.47-1.63 ms in bands
// of 8 against 1.84-1.91 row-major; gpt350m's GEMMs, whose B fit, measured within 3% either
// way (forge-wgmma-bench --group-rows; docs/performance.md). Bands of 16 or 32 read about half
// as much from memory as 8 but leave the llama3-1b step where it is (within 0.3 ms).
inline int TileGroupRows(int64_t b_bytes, int64_t l2_bytes) {
  return 2 * b_bytes <= l2_bytes ? 1 : 8;
}

}  // namespace forge::cuda

#undef FORGE_TILE_ORDER_FN
