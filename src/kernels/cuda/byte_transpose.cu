#include "kernels/cuda/byte_transpose.cuh"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace forge::cuda {
namespace {

// 64 x 64 byte tiles: each of 256 threads loads 16 bytes of a tile row (4 threads a 64-byte
// row), the tile goes through shared memory, and each thread stores 16 bytes of a transposed
// row. Tile rows are 68 bytes apart, so a warp's column reads (4 groups of 16 rows) meet at
// most 2 words per bank. Two tiles a thread in flight before the barrier keep enough loads
// outstanding for a bandwidth-bound pass.
constexpr int kTile = 64;
constexpr int kThreads = 256;
constexpr int kStride = kTile + 4;
constexpr int kTilesPerIter = 2;

__global__ void __launch_bounds__(kThreads)
    TransposeBytesKernel(uint8_t* __restrict__ out, const uint8_t* __restrict__ in, int64_t rows,
                         int64_t cols) {
  __shared__ __align__(16) uint32_t tile_words[kTilesPerIter][kTile * kStride / 4];
  const auto* tile = reinterpret_cast<const uint8_t(*)[kTile * kStride]>(tile_words);
  const int tid = threadIdx.x, r = tid / 4, c16 = tid % 4 * 16;
  const int64_t tiles_c = cols / kTile, tiles = rows / kTile * tiles_c;
  for (int64_t t0 = int64_t{blockIdx.x} * kTilesPerIter; t0 < tiles;
       t0 += int64_t{gridDim.x} * kTilesPerIter) {
    uint4 v[kTilesPerIter];
#pragma unroll
    for (int k = 0; k < kTilesPerIter; ++k) {
      const int64_t t = t0 + k;
      if (t < tiles) {
        const int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
        v[k] = *reinterpret_cast<const uint4*>(in + (r0 + r) * cols + c0 + c16);
      }
    }
#pragma unroll
    for (int k = 0; k < kTilesPerIter; ++k) {
      uint32_t* row = tile_words[k] + (r * kStride + c16) / 4;
      row[0] = v[k].x, row[1] = v[k].y, row[2] = v[k].z, row[3] = v[k].w;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTilesPerIter; ++k) {
      const int64_t t = t0 + k;
      if (t < tiles) {
        const int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
        // Output row c0 + r (input column), bytes of input rows r0 + c16 .. + 16.
        uint32_t w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t x = 0;
#pragma unroll
          for (int e = 0; e < 4; ++e)
            x |= uint32_t{tile[k][(c16 + 4 * q + e) * kStride + r]} << (8 * e);
          w[q] = x;
        }
        *reinterpret_cast<uint4*>(out + (c0 + r) * rows + r0 + c16) =
            make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    __syncthreads();  // the tiles are rewritten next
  }
}

}  // namespace

bool TransposeBytesSupported(int64_t rows, int64_t cols, const void* out, const void* in) {
  return rows >= 0 && cols >= 0 && rows % kTile == 0 && cols % kTile == 0 && IsAligned(out, 16) &&
         IsAligned(in, 16);
}

Status TransposeBytes(void* out, const void* in, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (!TransposeBytesSupported(rows, cols, out, in) || (rows * cols > 0 && (!out || !in))) {
    return Status::Invalid(
        "TransposeBytes: needs rows and cols multiples of 64 and 16-byte "
        "aligned buffers (rows " +
        std::to_string(rows) + ", cols " + std::to_string(cols) + ")");
  }
  const int64_t tiles = rows / kTile * (cols / kTile);
  if (tiles == 0) return Status::Ok();
  const int64_t iters = (tiles + kTilesPerIter - 1) / kTilesPerIter;
  const int blocks = static_cast<int>(iters < 8192 ? iters : 8192);
  TransposeBytesKernel<<<blocks, kThreads, 0, stream>>>(
      static_cast<uint8_t*>(out), static_cast<const uint8_t*>(in), rows, cols);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
