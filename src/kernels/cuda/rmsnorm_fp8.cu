#include "kernels/cuda/rmsnorm_fp8.cuh"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/rmsnorm_backward.cuh"
#include "kernels/cuda/rmsnorm_math.cuh"

namespace forge::cuda {
namespace {

// One pass over x: a block stages a band of kBandRows whole rows in shared memory (16-byte
// loads, all of them in flight at once), takes each row's statistics from there, then writes
// the band's FP8 output in 32 x 64 tiles, row-major and (through a small tile) transposed.
// The two-kernel form it replaces read x twice: a statistics pass (RmsNormForward without an
// output, 16 us at gpt350m B 16) and the tile cast (26 us), 42 us a call, 48 calls a step. An
// earlier one-kernel try that read the band's rows for the statistics one dependent row at a
// time from L2 ran 48 us: here the loads do not wait on each other.
//
// Bit for bit the two kernels: the sum of squares runs in RmsNormForwardKernel's order (lane
// `lane` owns columns (k * 32 + lane) * 8 .. +8 for k < V, ss += f * f in that order, then
// WarpSum), and each output value is RoundBf16(RmsNormScale(x, rstd, w)) quantised by the
// tile kernel's conversions.
constexpr int kBandRows = 32;
constexpr int kBandThreads = 256;  // 8 warps: 4 rows each for the statistics
constexpr int kTileCols = 64;
constexpr int kTileStride = kTileCols + 4;  // bytes between tile rows (bank spread)
// The tile phase maps 256 threads onto 32 rows x 8 chunks, and back onto 64 columns x 4.
static_assert(kBandRows * 8 == kBandThreads && kTileCols * 4 == kBandThreads);

size_t BandSmemBytes(int d) {
  return size_t(kBandRows) * d * sizeof(bf16) + kBandRows * sizeof(float) +
         size_t(kBandRows) * kTileStride;
}

template <__nv_fp8_interpretation_t F>
__global__ void __launch_bounds__(kBandThreads)
    RmsNormFp8BandKernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                         float* __restrict__ rstd, const bf16* __restrict__ x,
                         const bf16* __restrict__ w, int64_t N, int d, float eps,
                         const float* __restrict__ scale, float* __restrict__ amax,
                         float* __restrict__ scale_inv) {
  extern __shared__ __align__(16) uint8_t smem[];
  bf16* band = reinterpret_cast<bf16*>(smem);  // [kBandRows][d]
  float* s_rstd = reinterpret_cast<float*>(smem + size_t(kBandRows) * d * sizeof(bf16));
  uint8_t* tile = reinterpret_cast<uint8_t*>(s_rstd + kBandRows);  // [kBandRows][kTileStride]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const float s = *scale;
  if (scale_inv && blockIdx.x == 0 && tid == 0) *scale_inv = 1.0f / s;
  const int per_thread = kBandRows * (d / 8) / kBandThreads;  // d / 64
  const int V = (d + 255) / 256;
  const float inv_d = 1.0f / static_cast<float>(d);
  uint32_t m = 0;

  for (int64_t r0 = int64_t{blockIdx.x} * kBandRows; r0 < N;
       r0 += int64_t{gridDim.x} * kBandRows) {
    // 1. The band into shared memory.
    // kBandRows * d / 8 vectors, d / 64 per thread; 8 loads in flight before their stores.
    const uint4* src = reinterpret_cast<const uint4*>(x + r0 * d);
    uint4* dst = reinterpret_cast<uint4*>(band);
    for (int base = 0; base < per_thread; base += 8) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (base + u < per_thread) v[u] = src[tid + (base + u) * kBandThreads];
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (base + u < per_thread) dst[tid + (base + u) * kBandThreads] = v[u];
      }
    }
    __syncthreads();

    // 2. Each row's rstd, in RmsNormForwardKernel's order.
    for (int rr = warp; rr < kBandRows; rr += kBandThreads / 32) {
      const bf16* row = band + size_t(rr) * d;
      float ss = 0.0f;
      for (int k = 0; k < V; ++k) {
        const int c = (k * 32 + lane) * 8;
        float f[8];
        UnpackBf16x8(c < d ? *reinterpret_cast<const uint4*>(row + c) : make_uint4(0, 0, 0, 0),
                     f);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
      }
      ss = WarpSum(ss);
      const float r = RmsNormRstd(ss, inv_d, eps);
      if (lane == 0) {
        s_rstd[rr] = r;
        rstd[r0 + rr] = r;
      }
    }
    __syncthreads();

    // 3. 32 x 64 tiles: thread (row tid / 8, 8 columns at tid % 8 * 8) quantises and stores
    // row-major; after the barrier thread (column tid / 4, 8 rows at tid % 4 * 8) stores 8
    // bytes of the transposed output.
    const int r = tid / 8, c8 = tid % 8 * 8;
    const int tc = tid / 4, tr8 = tid % 4 * 8;
    for (int c0 = 0; c0 < d; c0 += kTileCols) {
      float xf[8], wf[8], v[8];
      UnpackBf16x8(*reinterpret_cast<const uint4*>(band + size_t(r) * d + c0 + c8), xf);
      UnpackBf16x8(Load16(w + c0 + c8), wf);
      const float rr = s_rstd[r];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        v[e] = fp8tile::RoundBf16(RmsNormScale(xf[e], rr, wf[e]));
        m = max(m, fp8tile::AbsBits(v[e]));
      }
      const uint2 q = fp8tile::QuantizeFp8x8<F>(v, s);
      *reinterpret_cast<uint2*>(out + (r0 + r) * d + c0 + c8) = q;
      uint32_t* trow = reinterpret_cast<uint32_t*>(tile + r * kTileStride + c8);
      trow[0] = q.x;
      trow[1] = q.y;
      __syncthreads();
      *reinterpret_cast<uint2*>(out_t + (c0 + tc) * N + r0 + tr8) =
          fp8tile::GatherColumn8(tile + tr8 * kTileStride + tc, kTileStride);
      __syncthreads();  // the tile (and, after the last, the band) is rewritten next
    }
  }
  if (amax) fp8tile::BlockAmaxToGlobal(m, amax);
}

}  // namespace

bool RmsNormFp8Supported(int64_t N, int d, const void* x, const void* w, const void* out,
                         const void* out_t) {
  return fp8tile::TileShapeOk(N, d, out, out_t) && d <= kMaxD && IsAligned(x, 16) &&
         IsAligned(w, 16);
}

Status RmsNormForwardFp8(void* out, void* out_t, float* rstd, const bf16* x, const bf16* w,
                         int64_t N, int d, float eps, DType format, const float* scale,
                         float* amax, float* scale_inv, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckFp8CastArgs("RmsNormForwardFp8", format, scale, amax, scale_inv));
  if (rstd == nullptr || !RmsNormFp8Supported(N, d, x, w, out, out_t)) {
    return Status::Invalid("RmsNormForwardFp8: unsupported arguments (N " + std::to_string(N) +
                           ", d " + std::to_string(d) +
                           "; needs multiples of 64, d <= 2048, rstd and aligned buffers)");
  }
  if (N == 0) return Status::Ok();
  const size_t smem = BandSmemBytes(d);
  const int64_t bands = N / kBandRows;  // N is a multiple of 64
  const int blocks = static_cast<int>(bands < 65535 ? bands : 65535);
  auto* o = static_cast<uint8_t*>(out);
  auto* ot = static_cast<uint8_t*>(out_t);
  if (format == DType::kE4M3) {
    FORGE_RETURN_IF_ERROR(AllowDynamicSmem(RmsNormFp8BandKernel<__NV_E4M3>, smem));
    RmsNormFp8BandKernel<__NV_E4M3><<<blocks, kBandThreads, smem, stream>>>(
        o, ot, rstd, x, w, N, d, eps, scale, amax, scale_inv);
  } else {
    FORGE_RETURN_IF_ERROR(AllowDynamicSmem(RmsNormFp8BandKernel<__NV_E5M2>, smem));
    RmsNormFp8BandKernel<__NV_E5M2><<<blocks, kBandThreads, smem, stream>>>(
        o, ot, rstd, x, w, N, d, eps, scale, amax, scale_inv);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
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
