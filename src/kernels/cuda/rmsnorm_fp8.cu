#include "kernels/cuda/rmsnorm_fp8.cuh"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/rmsnorm_math.cuh"

namespace forge::cuda {
namespace {

// Design: one block owns a band of 64 rows. Its 8 warps first compute the band's rstd (8 rows
// each, RmsNormRowRstd: the BF16 kernel's order, so rstd is bit for bit RmsNormForward's) into
// the rstd output, then the block casts the band's d / 64 tiles (fp8tile::CastTile) reading x
// again, now from L2 (a band is 2 * 64 * d bytes; ~2 bands per SM are live). One HBM read of x
// instead of two: a separate statistics pass (RmsNormForward with no output) cost 16 us of the
// 42 a gpt350m-sized call took.
constexpr int kBandRows = fp8tile::kTile;
constexpr int kWarps = fp8tile::kThreads / 32;
constexpr int kMaxBlocks = 1024;

struct RmsNormSource {
  static constexpr int kOut = 1;
  const bf16* x;
  const bf16* w;
  const float* rstd;
  int64_t d;
  __device__ __forceinline__ void Load(int64_t r, int64_t c, float (&f)[1][8]) const {
    float xf[8], wf[8];
    LoadVec<8>(x + r * d + c, xf);
    LoadVec<8>(w + c, wf);
    const float rr = rstd[r];
#pragma unroll
    for (int e = 0; e < 8; ++e) f[0][e] = fp8tile::RoundBf16(RmsNormScale(xf[e], rr, wf[e]));
  }
};

template <__nv_fp8_interpretation_t F, int V>
__global__ void __launch_bounds__(fp8tile::kThreads)
    RmsNormFp8Kernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, float* rstd,
                     const bf16* __restrict__ x, const bf16* __restrict__ w, int64_t N, int d,
                     float eps, const float* __restrict__ scale, float* __restrict__ amax,
                     float* __restrict__ scale_inv) {
  __shared__ __align__(16) uint8_t tile[1][fp8tile::kTile * fp8tile::kStride];
  const float s = *scale;
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const RmsNormSource src{x, w, rstd, d};
  uint32_t m = 0;
  for (int64_t band = blockIdx.x; band < N / kBandRows; band += gridDim.x) {
    const int64_t r0 = band * kBandRows;
    for (int i = 0; i < kBandRows / kWarps; ++i) {
      const int64_t row = r0 + warp * (kBandRows / kWarps) + i;
      uint4 xv[V];
      const float r = RmsNormRowRstd<V>(x + row * d, d, eps, lane, xv);
      if (lane == 0) rstd[row] = r;
    }
    __syncthreads();  // the band's rstd, written by every warp, is read by every thread
    for (int64_t c0 = 0; c0 < d; c0 += fp8tile::kTile) {
      fp8tile::CastTile<F, RmsNormSource>(tile, out, out_t, src, r0, c0, N, d, 0, s, m);
    }
    // No barrier here: the next band's rstd rows are other rows, and CastTile's last barrier
    // already orders the tile's reuse.
  }
  if (amax) fp8tile::BlockAmaxToGlobal(m, amax);
}

template <int V>
void Launch(bool e4m3, uint8_t* out, uint8_t* out_t, float* rstd, const bf16* x, const bf16* w,
            int64_t N, int d, float eps, const float* scale, float* amax, float* scale_inv,
            cudaStream_t stream) {
  const int64_t bands = N / kBandRows;
  const int blocks = static_cast<int>(bands < 1 ? 1 : bands > kMaxBlocks ? kMaxBlocks : bands);
  if (e4m3) {
    RmsNormFp8Kernel<__NV_E4M3, V><<<blocks, fp8tile::kThreads, 0, stream>>>(
        out, out_t, rstd, x, w, N, d, eps, scale, amax, scale_inv);
  } else {
    RmsNormFp8Kernel<__NV_E5M2, V><<<blocks, fp8tile::kThreads, 0, stream>>>(
        out, out_t, rstd, x, w, N, d, eps, scale, amax, scale_inv);
  }
}

}  // namespace

bool RmsNormFp8Supported(int64_t N, int d, const void* x, const void* w, const void* out,
                         const void* out_t) {
  return fp8tile::TileShapeOk(N, d, out, out_t) && d <= 2048 && IsAligned(x, 16) &&
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
  auto* o = static_cast<uint8_t*>(out);
  auto* ot = static_cast<uint8_t*>(out_t);
  const bool e4m3 = format == DType::kE4M3;
  switch ((d + 255) / 256) {
#define FORGE_RMS_FP8(V)                                                               \
  case V:                                                                              \
    Launch<V>(e4m3, o, ot, rstd, x, w, N, d, eps, scale, amax, scale_inv, stream); \
    break;
    FORGE_RMS_FP8(1)
    FORGE_RMS_FP8(2)
    FORGE_RMS_FP8(3)
    FORGE_RMS_FP8(4)
    FORGE_RMS_FP8(5)
    FORGE_RMS_FP8(6)
    FORGE_RMS_FP8(7)
    FORGE_RMS_FP8(8)
#undef FORGE_RMS_FP8
    default:
      return Status::Internal("RmsNormForwardFp8: no kernel for d=" + std::to_string(d));
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
