// RMSNorm's row statistic and output element, shared by the BF16 kernel (rmsnorm.cu) and the one
// that writes FP8 (rmsnorm_fp8.cu), so both compute the same fp32 values.
#pragma once

#include <cuda_runtime.h>

namespace forge::cuda {

// 1 / sqrt(mean of squares + eps) from the row's sum of squares (summed in the BF16 kernel's
// order by both callers).
__device__ __forceinline__ float RmsNormRstd(float sum_sq, float inv_d, float eps) {
  return 1.0f / sqrtf(sum_sq * inv_d + eps);
}

// x * rstd * w, in this order.
__device__ __forceinline__ float RmsNormScale(float x, float rstd, float w) { return x * rstd * w; }

}  // namespace forge::cuda
