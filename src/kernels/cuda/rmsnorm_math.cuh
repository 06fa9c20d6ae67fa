// RMSNorm's row statistics and output element, shared by the BF16 kernel (rmsnorm.cu) and the
// one that writes FP8 (rmsnorm_fp8.cu), so both compute the same rstd and round the same fp32
// value to bf16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/device_util.cuh"

namespace forge::cuda {

// x * rstd * w, in this order.
__device__ __forceinline__ float RmsNormScale(float x, float rstd, float w) { return x * rstd * w; }

// 1 / sqrt(mean(x^2) + eps) of row xr (d columns, d % 8 == 0, d <= V * 256), computed by one
// warp: lane `lane` loads columns [(k * 32 + lane) * 8, +8) for k < V into xv (zeros past d)
// and the squares are summed over k, then the 8 values, then across the warp.
template <int V>
__device__ __forceinline__ float RmsNormRowRstd(const bf16* xr, int d, float eps, int lane,
                                                uint4 (&xv)[V]) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int c = (k * 32 + lane) * 8;
    xv[k] = make_uint4(0, 0, 0, 0);
    if (c < d) xv[k] = Load16(xr + c);
  }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    float f[8];
    UnpackBf16x8(xv[k], f);  // zeros past d contribute nothing
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
  }
  ss = WarpSum(ss);
  return 1.0f / sqrtf(ss * (1.0f / static_cast<float>(d)) + eps);
}

}  // namespace forge::cuda
