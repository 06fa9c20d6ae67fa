#include "kernels/cuda/rmsnorm_fp8.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/rmsnorm_backward.cuh"
#include "kernels/cuda/rmsnorm_math.cuh"

namespace forge::cuda {
namespace {

// One pass over x, the band in registers: a block of 8 warps takes a band of 32 rows, each
// warp 4 whole rows loaded at once (V 16-byte vectors a lane a row, all in flight together),
// takes each row's statistics with a warp sum, and writes the row's FP8 bytes row-major
// straight from registers and into a [32, d] byte tile in shared memory; after one barrier,
// each thread transposes 8 x 8 byte blocks of the tile in registers (PRMTs) for 8-byte stores
// of the transposed output (a warp: 8 columns x 32 contiguous bytes, whole sectors).
// Staging the bf16 band (64 KiB) in shared memory instead, with 32 x 64 tiles and two barriers
// each, takes 41.8 us a call at gpt350m B 16 on an H100 (1.5 TB/s, against the BF16
// RmsNormForward's 2.8); this form 29.6 us.
//
// Bit for bit the two kernels it fuses (RmsNormForward, then the tile cast): the sum of squares
// runs in RmsNormForwardKernel's order (lane `lane` owns columns (k * 32 + lane) * 8 .. +8,
// ss += f * f for k = 0, 1, ..., zeros past d adding nothing, then WarpSum), and each output
// value is RoundBf16(RmsNormScale(x, rstd, w)) quantised by the tile kernel's conversions.
constexpr int kBandRows = 32;
constexpr int kBandThreads = 256;
constexpr int kWarpRows = kBandRows / (kBandThreads / 32);  // 4
// Blocks loop over bands beyond this (gpt350m B 48: 1536 bands).
constexpr int64_t kMaxBandBlocks = 2048;
// Whole warps of whole rows; the transposed phase's threads take one of 4 row groups of 8.
static_assert(kWarpRows * (kBandThreads / 32) == kBandRows && kBandRows == 4 * 8);

// Bytes between the tile's rows: d + 8 puts rows 8 apart 16 banks apart, so a warp's 8-byte
// reads of 4 row groups take the minimum two wavefronts.
__host__ __device__ constexpr int TileStride(int d) { return d + 8; }
// The tile, then w (read from shared memory: registers go to the rows in flight).
size_t BandSmemBytes(int d) { return size_t(kBandRows) * TileStride(d) + size_t(d) * sizeof(bf16); }

// Two blocks an SM up to d 1024 (at most 128 registers a thread), so one block's loads overlap
// the other's stores.
template <__nv_fp8_interpretation_t F, int V>
__global__ void __launch_bounds__(kBandThreads, V <= 4 ? 2 : 1)
    RmsNormFp8BandKernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                         float* __restrict__ rstd, const bf16* __restrict__ x,
                         const bf16* __restrict__ w, int64_t N, int d, float eps,
                         const float* __restrict__ scale, float* __restrict__ amax,
                         float* __restrict__ scale_inv) {
  extern __shared__ __align__(16) uint8_t tile[];  // [kBandRows][TileStride(d)], then w
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int stride = TileStride(d);
  bf16* w_s = reinterpret_cast<bf16*>(tile + kBandRows * stride);  // 16-byte aligned: d % 64 == 0
  for (int c = tid * 8; c < d; c += kBandThreads * 8) Store16(w_s + c, Load16(w + c));
  const float s = *scale;
  if (scale_inv && blockIdx.x == 0 && tid == 0) *scale_inv = 1.0f / s;
  const float inv_d = 1.0f / static_cast<float>(d);
  uint32_t m = 0;
  __syncthreads();  // w_s

  for (int64_t r0 = int64_t{blockIdx.x} * kBandRows; r0 < N; r0 += int64_t{gridDim.x} * kBandRows) {
    // 1. This warp's rows, every load issued before the first is used.
    uint4 xv[kWarpRows][V];
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i) {
      const bf16* row = x + (r0 + warp * kWarpRows + i) * d;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int c = (k * 32 + lane) * 8;
        xv[i][k] = c < d ? Load16(row + c) : make_uint4(0, 0, 0, 0);
      }
    }
    // 2. Each row's rstd, then its FP8 bytes to global memory and the tile.
#pragma unroll
    for (int i = 0; i < kWarpRows; ++i) {
      const int rr = warp * kWarpRows + i;
      float ss = 0.0f;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        float f[8];
        UnpackBf16x8(xv[i][k], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
      }
      ss = WarpSum(ss);
      const float r = RmsNormRstd(ss, inv_d, eps);
      if (lane == 0) rstd[r0 + rr] = r;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int c = (k * 32 + lane) * 8;
        if (c >= d) continue;
        float xf[8], wf[8], v[8];
        UnpackBf16x8(xv[i][k], xf);
        UnpackBf16x8(*reinterpret_cast<const uint4*>(w_s + c), wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          v[e] = fp8tile::RoundBf16(RmsNormScale(xf[e], r, wf[e]));
          m = max(m, fp8tile::AbsBits(v[e]));
        }
        const uint2 q = fp8tile::QuantizeFp8x8<F>(v, s);
        *reinterpret_cast<uint2*>(out + (r0 + rr) * d + c) = q;
        *reinterpret_cast<uint2*>(tile + rr * stride + c) = q;
      }
    }
    __syncthreads();

    // 3. The transposed output: thread (column group cg, row group g) turns rows 8 g .. 8 g + 7
    // of columns 8 cg .. 8 cg + 7 into 8 bytes of each of those 8 columns.
    const int g = tid % 4;
    for (int cg = tid / 4; cg < d / 8; cg += kBandThreads / 4) {
      uint2 rows[8], cols[8];
#pragma unroll
      for (int e = 0; e < 8; ++e)
        rows[e] = *reinterpret_cast<const uint2*>(tile + (8 * g + e) * stride + 8 * cg);
      Transpose8x8Bytes(rows, cols);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        *reinterpret_cast<uint2*>(out_t + (8 * cg + e) * N + r0 + 8 * g) = cols[e];
    }
    __syncthreads();  // the next band rewrites the tile
  }
  if (amax) fp8tile::BlockAmaxToGlobal(m, amax);
}

template <__nv_fp8_interpretation_t F, int V>
Status LaunchBand(uint8_t* out, uint8_t* out_t, float* rstd, const bf16* x, const bf16* w,
                  int64_t N, int d, float eps, const float* scale, float* amax, float* scale_inv,
                  cudaStream_t stream) {
  const size_t smem = BandSmemBytes(d);
  FORGE_RETURN_IF_ERROR(AllowDynamicSmem(RmsNormFp8BandKernel<F, V>, smem));
  const int64_t bands = N / kBandRows;  // N is a multiple of 64
  const int blocks = static_cast<int>(bands < kMaxBandBlocks ? bands : kMaxBandBlocks);
  RmsNormFp8BandKernel<F, V><<<blocks, kBandThreads, smem, stream>>>(out, out_t, rstd, x, w, N, d,
                                                                     eps, scale, amax, scale_inv);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

// V (vectors a lane a row) rounded up to 1, 2, 4 or 8: lanes past d load and write nothing.
template <__nv_fp8_interpretation_t F>
Status LaunchBandFor(int d, uint8_t* out, uint8_t* out_t, float* rstd, const bf16* x, const bf16* w,
                     int64_t N, float eps, const float* scale, float* amax, float* scale_inv,
                     cudaStream_t stream) {
  if (d <= 256)
    return LaunchBand<F, 1>(out, out_t, rstd, x, w, N, d, eps, scale, amax, scale_inv, stream);
  if (d <= 512)
    return LaunchBand<F, 2>(out, out_t, rstd, x, w, N, d, eps, scale, amax, scale_inv, stream);
  if (d <= 1024)
    return LaunchBand<F, 4>(out, out_t, rstd, x, w, N, d, eps, scale, amax, scale_inv, stream);
  return LaunchBand<F, 8>(out, out_t, rstd, x, w, N, d, eps, scale, amax, scale_inv, stream);
}

}  // namespace

bool RmsNormFp8Supported(int64_t N, int d, const void* x, const void* w, const void* out,
                         const void* out_t) {
  return fp8tile::TileShapeOk(N, d, out, out_t) && d <= kMaxD && IsAligned(x, 16) &&
         IsAligned(w, 16);
}

Status RmsNormForwardFp8(void* out, void* out_t, float* rstd, const bf16* x, const bf16* w,
                         int64_t N, int d, float eps, DType format, const float* scale, float* amax,
                         float* scale_inv, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckFp8CastArgs("RmsNormForwardFp8", format, scale, amax, scale_inv));
  if (rstd == nullptr || !RmsNormFp8Supported(N, d, x, w, out, out_t)) {
    return Status::Invalid("RmsNormForwardFp8: unsupported arguments (N " + std::to_string(N) +
                           ", d " + std::to_string(d) +
                           "; needs multiples of 64, d <= 2048, rstd and aligned buffers)");
  }
  if (N == 0) return Status::Ok();
  auto* o = static_cast<uint8_t*>(out);
  auto* ot = static_cast<uint8_t*>(out_t);
  if (format == DType::kE4M3) {
    return LaunchBandFor<__NV_E4M3>(d, o, ot, rstd, x, w, N, eps, scale, amax, scale_inv, stream);
  }
  return LaunchBandFor<__NV_E5M2>(d, o, ot, rstd, x, w, N, eps, scale, amax, scale_inv, stream);
}

bool RmsNormBackwardFp8Supported(int64_t N, int d, const void* q, const void* q_t) {
  if (N <= 0 || N % 64 != 0 || d <= 0 || d % 64 != 0 || d > kMaxD) return false;
  if (!IsAligned(q, 8) || !IsAligned(q_t, 8)) return false;
  const int64_t rows_per_block = CeilDiv(N, BackwardBlocks(N));
  return rows_per_block % 8 == 0 && RmsNormBackwardSmem(N, d, /*fp8=*/true) <= kMaxBwdSmem;
}

Status RmsNormBackwardFp8(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w,
                          const float* rstd, int64_t N, int d, void* workspace,
                          size_t workspace_bytes, bool accumulate_dx, bool accumulate_dw, void* q,
                          void* q_t, DType format, const float* scale, float* amax,
                          float* scale_inv, cudaStream_t stream, const RmsNormDwReduce& dw_reduce) {
  FORGE_RETURN_IF_ERROR(CheckFp8CastArgs("RmsNormBackwardFp8", format, scale, amax, scale_inv));
  FORGE_RETURN_IF_ERROR(CheckRmsNormBackwardArgs("RmsNormBackwardFp8", dx, dout, x, w, N, d,
                                                 workspace, workspace_bytes));
  if (!RmsNormBackwardFp8Supported(N, d, q, q_t)) {
    return Status::Invalid("RmsNormBackwardFp8: unsupported shape or outputs (N " +
                           std::to_string(N) + ", d " + std::to_string(d) +
                           "; needs multiples of 64 and 8-byte aligned FP8 outputs)");
  }
  RmsNormBwdFp8Out out;
  out.out = static_cast<uint8_t*>(q);
  out.out_t = static_cast<uint8_t*>(q_t);
  out.scale = scale;
  out.amax = amax;
  out.scale_inv = scale_inv;
  auto* partial = static_cast<float*>(workspace);
  if (format == DType::kE4M3) {
    return LaunchRmsNormBackward<true, __NV_E4M3>(dx, dw, dout, x, w, rstd, N, d, partial, stream,
                                                  accumulate_dx, accumulate_dw, out, dw_reduce);
  }
  return LaunchRmsNormBackward<true, __NV_E5M2>(dx, dw, dout, x, w, rstd, N, d, partial, stream,
                                                accumulate_dx, accumulate_dw, out, dw_reduce);
}

}  // namespace forge::cuda
