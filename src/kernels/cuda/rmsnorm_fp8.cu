#include "kernels/cuda/rmsnorm_fp8.cuh"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rmsnorm_math.cuh"

namespace forge::cuda {
namespace {

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
  FORGE_RETURN_IF_ERROR(RmsNormForward(nullptr, rstd, x, w, N, d, eps, stream));
  if (N == 0) return Status::Ok();
  fp8tile::LaunchTileCast(format == DType::kE4M3, out, out_t, RmsNormSource{x, w, rstd, d}, N, d,
                          d, 0, scale, amax, scale_inv, stream);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
