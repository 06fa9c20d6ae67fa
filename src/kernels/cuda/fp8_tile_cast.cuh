// The FP8 cast(+transpose) tile kernel, shared by the plain cast (fp8_cast.cu) and the casts
// fused into their producers (swiglu_fp8.cu): a Producer computes 8 consecutive values of a
// logical [rows, tile_cols] tensor (a bf16 load, or SwiGLU of gate/up), the kernel quantises
// them with *scale, writes the row-major FP8 output and, through a shared-memory tile, the
// transposed one, and max-accumulates the amax of |value| (see fp8_cast.h for the scale,
// amax and scale_inv contract). A producer may yield kOut values per position: output o goes
// to column c + o * second_col of an [rows, out_cols] tensor (SwiGLU backward writes the gate
// and up halves of dgate_up from one read of its inputs).
//
// Layout per 64x64 tile (rows and tile_cols multiples of 64, 16-byte aligned inputs, 8-byte
// aligned outputs; the launchers check): 256 threads, each loads 8 values twice (a warp covers
// 4 rows x 128 B of a bf16 input), stores 8 FP8 bytes row-major, and after the barrier gathers
// 8 bytes down a tile column for one 8-byte transposed store (4 x 64 B per warp). Tile rows
// are 68 bytes apart in shared memory, so a warp's column gathers (8 row groups, 4 columns)
// meet at most 2 words per bank.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.h"

namespace forge::cuda::fp8tile {

inline constexpr int kTile = 64;
inline constexpr int kThreads = 256;
inline constexpr int kStride = kTile + 4;  // bytes between tile rows in shared memory
inline constexpr int kMaxBlocks = 4096;

template <__nv_fp8_interpretation_t F>
__device__ __forceinline__ uint8_t ToFp8(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, F));
}
// Two values in one cvt; `lo` lands in the low byte (the lower address).
template <__nv_fp8_interpretation_t F>
__device__ __forceinline__ uint32_t ToFp8x2(float lo, float hi) {
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, F));
}

// 8 values times s as 8 FP8 bytes in order (v[0] in the lowest byte): one 8-byte store.
template <__nv_fp8_interpretation_t F>
__device__ __forceinline__ uint2 QuantizeFp8x8(const float* v, float s) {
  return make_uint2(ToFp8x2<F>(v[0] * s, v[1] * s) | (ToFp8x2<F>(v[2] * s, v[3] * s) << 16),
                    ToFp8x2<F>(v[4] * s, v[5] * s) | (ToFp8x2<F>(v[6] * s, v[7] * s) << 16));
}

// The bytes p[0], p[stride], ..., p[7 * stride] (8 rows of a shared-memory tile column) as one
// 8-byte word, p[0] lowest: a transposed store's 8 consecutive bytes.
__device__ __forceinline__ uint2 GatherColumn8(const uint8_t* p, int stride) {
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    lo |= uint32_t{p[e * stride]} << (8 * e);
    hi |= uint32_t{p[(4 + e) * stride]} << (8 * e);
  }
  return make_uint2(lo, hi);
}

__device__ __forceinline__ uint32_t AbsBits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

// The amax of bf16-rounded values taken on their packed pairs (PackBf16x2): one max.u16x2 a
// pair into acc (two magnitudes' bits), and at the end the larger as a float's |x| bits, the
// same bits AbsBits gives on the rounded floats.
__device__ __forceinline__ uint32_t AbsMaxBf16x2(uint32_t acc, uint32_t packed) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(acc), "r"(packed & 0x7FFF7FFFu));
  return d;
}
__device__ __forceinline__ uint32_t Bf16x2AbsBits(uint32_t acc) {
  return max(acc & 0xFFFFu, acc >> 16) << 16;
}

// Rounds like a BF16 kernel's store, back to float for the quantiser (device_util.cuh): what a
// producer fused with the cast must do to match the BF16 kernel followed by the cast bit for bit.
using ::forge::cuda::RoundBf16;

__device__ __forceinline__ uint32_t WarpMaxU32(uint32_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Folds the warp's `m` (|x| bits) into *amax (non-null): warp max, one atomicMax on the
// float's bits by lane 0 (non-negative floats order like their bits, NaN patterns above Inf's:
// deterministic, and an overflowed tensor cannot hide). Every lane of the warp must call it.
__device__ __forceinline__ void WarpAmaxToGlobal(uint32_t m, float* amax, int lane) {
  m = WarpMaxU32(m);
  // 0 cannot raise a zeroed amax: skip the atomic.
  if (lane == 0 && m != 0u) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
}

// The same over a block: warp max, block max over the warps, one atomicMax per block. Every
// thread of the block must call it; the block has a multiple of 32 threads.
__device__ __forceinline__ void BlockAmaxToGlobal(uint32_t m, float* amax) {
  __shared__ uint32_t warp_max[32];
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  const int lane = tid % 32, warp = tid / 32;
  const int n_warps = blockDim.x * blockDim.y / 32;
  m = WarpMaxU32(m);
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) WarpAmaxToGlobal(lane < n_warps ? warp_max[lane] : 0u, amax, lane);
}

// The transposed stores of a 64 x 64 byte tile (rows kStride apart) by kN threads, t this
// one: column c of the tile to out_t + c t_stride, 8 bytes (8 rows) a thread at a time.
template <int kN>
__device__ __forceinline__ void StoreTileTransposed(const uint8_t* tile, uint8_t* out_t,
                                                    int64_t t_stride, int t) {
#pragma unroll
  for (int k = 0; k < kTile * kTile / 8 / kN; ++k) {
    const int w = t + kN * k, c = w / 8, r8 = w % 8 * 8;
    *reinterpret_cast<uint2*>(out_t + c * t_stride + r8) =
        GatherColumn8(tile + r8 * kStride + c, kStride);
  }
}

// A bf16 tensor [rows, cols] as it is.
struct Bf16Source {
  static constexpr int kOut = 1;
  const bf16* x;
  int64_t cols;
  __device__ __forceinline__ void Load(int64_t r, int64_t c, float (&f)[kOut][8]) const {
    LoadVec<8>(x + r * cols + c, f[0]);
  }
};

// One 64x64 tile at (r0, c0) of the block's work: quantise the producer's values with s, store
// them row-major (when out) and, through the shared-memory tile, transposed (when out_t, which
// must be uniform over the block: it holds the barriers), and max-accumulate |value| bits in m.
// Both kernels below run exactly this per element.
template <__nv_fp8_interpretation_t F, class P>
__device__ __forceinline__ void CastTile(const P& p, uint8_t (&tile)[P::kOut][kTile * kStride],
                                         uint8_t* out, uint8_t* out_t, int64_t r0, int64_t c0,
                                         int64_t rows, int64_t out_cols, int64_t second_col,
                                         float s, uint32_t& m) {
  const int tid = threadIdx.x;
  constexpr int kChunks = kTile * kTile / 8;  // 8-element pieces per tile
#pragma unroll
  for (int k = 0; k < kChunks / kThreads; ++k) {
    const int chunk = tid + kThreads * k;
    const int r = chunk / 8, c8 = chunk % 8 * 8;
    float f[P::kOut][8];
    p.Load(r0 + r, c0 + c8, f);
#pragma unroll
    for (int o = 0; o < P::kOut; ++o) {
#pragma unroll
      for (int e = 0; e < 8; ++e) m = max(m, AbsBits(f[o][e]));
      const uint2 q = QuantizeFp8x8<F>(f[o], s);
      if (out) *reinterpret_cast<uint2*>(out + (r0 + r) * out_cols + c0 + c8 + o * second_col) = q;
      uint32_t* row = reinterpret_cast<uint32_t*>(tile[o] + r * kStride + c8);
      row[0] = q.x;
      row[1] = q.y;
    }
  }
  if (out_t) {
    __syncthreads();
#pragma unroll
    for (int o = 0; o < P::kOut; ++o) {
      StoreTileTransposed<kThreads>(tile[o], out_t + (c0 + o * second_col) * rows + r0, rows, tid);
    }
    __syncthreads();  // the tile may be rewritten next
  }
}

template <__nv_fp8_interpretation_t F, class P>
__global__ void __launch_bounds__(kThreads)
    TileCastKernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, P p, int64_t rows,
                   int64_t tile_cols, int64_t out_cols, int64_t second_col,
                   const float* __restrict__ scale, float* __restrict__ amax,
                   float* __restrict__ scale_inv) {
  __shared__ __align__(16) uint8_t tile[P::kOut][kTile * kStride];
  const float s = *scale;
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
  const int64_t tiles_c = tile_cols / kTile;
  const int64_t tiles = rows / kTile * tiles_c;
  uint32_t m = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    CastTile<F>(p, tile, out, out_t, t / tiles_c * kTile, t % tiles_c * kTile, rows, out_cols,
                second_col, s, m);
  }
  if (amax) BlockAmaxToGlobal(m, amax);
}

// Several bf16 tensors cast in one launch (a layer's four weights, once a step): block b takes
// tile b of the concatenated tile lists (one tile a block, so each block's amax goes to its own
// tensor's slot), with CastTile, so each tensor's outputs, amax and scale_inv are bit for bit
// what a TileCastKernel launch of its own writes. One launch of ~3k tiles fills the GPU where
// four launches of 256-1408 tiles each do not (those ran at 0.8-2.1 TB/s under ncu).
inline constexpr int kMaxGroupJobs = 4;
struct GroupJob {
  Fp8CastJob job;          // fp8_cast.h's description of one tensor
  int64_t first_tile = 0;  // of the concatenation
};
struct GroupJobs {
  GroupJob job[kMaxGroupJobs];
  int n = 0;
};

template <__nv_fp8_interpretation_t F>
__global__ void __launch_bounds__(kThreads) TileCastGroupKernel(GroupJobs jobs) {
  __shared__ __align__(16) uint8_t tile[1][kTile * kStride];
  const int64_t t = blockIdx.x;
  int j = 0;
  while (j + 1 < jobs.n && jobs.job[j + 1].first_tile <= t) ++j;
  const Fp8CastJob& g = jobs.job[j].job;
  const float s = *g.scale;
  const int64_t u = t - jobs.job[j].first_tile, tiles_c = g.cols / kTile;
  if (g.scale_inv && u == 0 && threadIdx.x == 0) *g.scale_inv = 1.0f / s;
  uint32_t m = 0;
  CastTile<F>(Bf16Source{g.x, g.cols}, tile, static_cast<uint8_t*>(g.out),
              static_cast<uint8_t*>(g.out_t), u / tiles_c * kTile, u % tiles_c * kTile, g.rows,
              g.cols, /*second_col=*/0, s, m);
  if (g.amax) BlockAmaxToGlobal(m, g.amax);
}

// Whether the tile kernel takes a [rows, tile_cols] problem with these buffers.
inline bool TileShapeOk(int64_t rows, int64_t tile_cols, const void* out, const void* out_t) {
  return rows % kTile == 0 && tile_cols % kTile == 0 && IsAligned(out, 8) && IsAligned(out_t, 8);
}

// Launches the tile kernel for `format` (true) or returns false for a format it does not know.
template <class P>
bool LaunchTileCast(bool e4m3, void* out, void* out_t, const P& p, int64_t rows,
                    int64_t tile_cols, int64_t out_cols, int64_t second_col, const float* scale,
                    float* amax, float* scale_inv, cudaStream_t stream) {
  const int64_t tiles = rows / kTile * (tile_cols / kTile);
  const int blocks = static_cast<int>(tiles < 1 ? 1 : tiles > kMaxBlocks ? kMaxBlocks : tiles);
  auto* o = static_cast<uint8_t*>(out);
  auto* ot = static_cast<uint8_t*>(out_t);
  if (e4m3) {
    TileCastKernel<__NV_E4M3, P><<<blocks, kThreads, 0, stream>>>(
        o, ot, p, rows, tile_cols, out_cols, second_col, scale, amax, scale_inv);
  } else {
    TileCastKernel<__NV_E5M2, P><<<blocks, kThreads, 0, stream>>>(
        o, ot, p, rows, tile_cols, out_cols, second_col, scale, amax, scale_inv);
  }
  return true;
}

}  // namespace forge::cuda::fp8tile
