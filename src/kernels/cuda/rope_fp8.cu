#include "kernels/cuda/rope_fp8.cuh"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/rope_math.cuh"

namespace forge::cuda {
namespace {

constexpr int kMaxHd = 512;  // as RopeApply

__global__ void RopeFreqKernel(float* freq, int hd, float theta) {
  for (int i = threadIdx.x; i < hd / 2; i += blockDim.x) freq[i] = RopeFreq(i, hd, theta);
}

// Row r is position r % T; columns below rot_cols are the Q and K heads (pairs rotated back),
// the V columns pass through. A chunk of 8 never straddles a head (hd % 8 == 0).
struct RopeBackwardSource {
  static constexpr int kOut = 1;
  const bf16* dqkv;
  const float* freq;
  int64_t cols, rot_cols;
  int T, hd;
  __device__ __forceinline__ void Load(int64_t r, int64_t c, float (&f)[1][8]) const {
    const uint4 u = Load16(dqkv + r * cols + c);
    const uint32_t raw[4] = {u.x, u.y, u.z, u.w};
    const float t = static_cast<float>(r % T);
    const int pair0 = static_cast<int>(c % hd) / 2;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float2 p = UnpackBf16x2(raw[q]);
      if (c < rot_cols) {
        float sn, cs;
        RopeSinCos(t, freq[pair0 + q], -1.0f, &sn, &cs);
        p = RopeRotate(p, sn, cs);
        // RopeApply stores the pair as bf16: the same rounding before quantising.
        p = make_float2(fp8tile::RoundBf16(p.x), fp8tile::RoundBf16(p.y));
      }
      f[0][2 * q] = p.x;
      f[0][2 * q + 1] = p.y;
    }
  }
};

}  // namespace

Status RopeFreqTable(float* freq, int hd, float theta, cudaStream_t stream) {
  if (freq == nullptr || hd <= 0 || hd % 2 != 0 || hd > kMaxHd || !(theta > 0.0f))
    return Status::Invalid("RopeFreqTable: bad arguments (hd " + std::to_string(hd) + ")");
  RopeFreqKernel<<<1, 256, 0, stream>>>(freq, hd, theta);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

bool RopeFp8Supported(int64_t rows, int n_head, int n_kv_head, int hd, const void* in,
                      const void* out, const void* out_t) {
  const int64_t cols = int64_t{n_head + 2 * n_kv_head} * hd;
  return hd % 8 == 0 && hd <= kMaxHd && fp8tile::TileShapeOk(rows, cols, out, out_t) &&
         IsAligned(in, 16);
}

Status RopeBackwardFp8(void* out, void* out_t, const bf16* dqkv, int B, int T, int n_head,
                       int n_kv_head, int hd, const float* freq, DType format,
                       const float* scale, float* amax, float* scale_inv, cudaStream_t stream) {
  const int64_t rows = int64_t{B} * T;
  FORGE_RETURN_IF_ERROR(CheckFp8CastArgs("RopeBackwardFp8", format, scale, amax, scale_inv));
  if (B < 0 || T <= 0 || n_head <= 0 || n_kv_head <= 0 || freq == nullptr ||
      !RopeFp8Supported(rows, n_head, n_kv_head, hd, dqkv, out, out_t)) {
    return Status::Invalid("RopeBackwardFp8: unsupported arguments (B*T " +
                           std::to_string(rows) + ", H " + std::to_string(n_head) + ", KV " +
                           std::to_string(n_kv_head) + ", hd " + std::to_string(hd) +
                           "; needs multiples of 64, hd % 8 == 0, aligned buffers)");
  }
  if (rows == 0) return Status::Ok();
  const int64_t cols = int64_t{n_head + 2 * n_kv_head} * hd;
  const RopeBackwardSource src{dqkv, freq, cols, int64_t{n_head + n_kv_head} * hd, T, hd};
  fp8tile::LaunchTileCast(format == DType::kE4M3, out, out_t, src, rows, cols, cols, 0, scale,
                          amax, scale_inv, stream);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
