#include "kernels/cuda/rope_fp8.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/rope_math.cuh"  // RopeRotateBackBf16

namespace forge::cuda {
namespace {

constexpr int kMaxHd = 512;  // as RopeApply

// Row r is position r % T; columns below rot_cols are the Q and K heads (pairs rotated back),
// the V columns pass through. A chunk of 8 never straddles a head (hd % 8 == 0). The angles'
// (sin, cos) come from RopeSinCosTable's [T, hd / 2] table (bitwise RopeApply's sincosf, the
// sine negated for the inverse rotation, exactly as RopeSinCos's sign does): computing them
// here (four full-precision sincosf per 8 values) made this pass slower than its traffic
// (74.5 us at gpt350m B 16 on an H200).
struct RopeBackwardSource {
  static constexpr int kOut = 1;
  const bf16* dqkv;
  const float2* sin_cos;
  int64_t cols, rot_cols;
  int T, hd;
  __device__ __forceinline__ void Load(int64_t r, int64_t c, float (&f)[1][8]) const {
    const uint4 u = Load16(dqkv + r * cols + c);
    const uint32_t raw[4] = {u.x, u.y, u.z, u.w};
    const bool rotate = c < rot_cols;
    float4 sc[2];
    if (rotate) {  // pairs pair0 .. pair0 + 3 of position r % T: 32 bytes
      const float4* t =
          reinterpret_cast<const float4*>(sin_cos + (r % T) * (hd / 2) + (c % hd) / 2);
      sc[0] = __ldg(t);
      sc[1] = __ldg(t + 1);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float2 p = UnpackBf16x2(raw[q]);
      if (rotate) {
        p = RopeRotateBackBf16(p, q % 2 == 0 ? make_float2(sc[q / 2].x, sc[q / 2].y)
                                             : make_float2(sc[q / 2].z, sc[q / 2].w));
      }
      f[0][2 * q] = p.x;
      f[0][2 * q + 1] = p.y;
    }
  }
};

}  // namespace

bool RopeFp8Supported(int64_t rows, int n_head, int n_kv_head, int hd, const void* in,
                      const void* out, const void* out_t) {
  const int64_t cols = int64_t{n_head + 2 * n_kv_head} * hd;
  return hd % 8 == 0 && hd <= kMaxHd && fp8tile::TileShapeOk(rows, cols, out, out_t) &&
         IsAligned(in, 16);
}

Status RopeBackwardFp8(void* out, void* out_t, const bf16* dqkv, int B, int T, int n_head,
                       int n_kv_head, int hd, const float2* sin_cos, DType format,
                       const float* scale, float* amax, float* scale_inv, cudaStream_t stream,
                       int first_heads) {
  const int64_t rows = int64_t{B} * T;
  FORGE_RETURN_IF_ERROR(CheckFp8CastArgs("RopeBackwardFp8", format, scale, amax, scale_inv));
  const int heads = first_heads > 0 ? first_heads : n_head + 2 * n_kv_head;
  if (B < 0 || T <= 0 || n_head <= 0 || n_kv_head <= 0 || sin_cos == nullptr ||
      !RopeFp8Supported(rows, n_head, n_kv_head, hd, dqkv, out, out_t) ||
      heads > n_head + 2 * n_kv_head || int64_t{heads} * hd % 64 != 0) {
    return Status::Invalid("RopeBackwardFp8: unsupported arguments (B*T " + std::to_string(rows) +
                           ", H " + std::to_string(n_head) + ", KV " + std::to_string(n_kv_head) +
                           ", hd " + std::to_string(hd) + ", first_heads " +
                           std::to_string(first_heads) +
                           "; needs multiples of 64, hd % 8 == 0, aligned buffers)");
  }
  if (rows == 0) return Status::Ok();
  const int64_t cols = int64_t{n_head + 2 * n_kv_head} * hd;
  const RopeBackwardSource src{dqkv, sin_cos, cols, int64_t{n_head + n_kv_head} * hd, T, hd};
  fp8tile::LaunchTileCast(format == DType::kE4M3, out, out_t, src, rows, int64_t{heads} * hd, cols,
                          0, scale, amax, scale_inv, stream);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
