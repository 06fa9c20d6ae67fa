// RMSNorm's output element, shared by the BF16 kernel (rmsnorm.cu) and the one that writes FP8
// (rmsnorm_fp8.cu), so both round the same fp32 value to bf16.
#pragma once

#include <cuda_runtime.h>

namespace forge::cuda {

// x * rstd * w, in this order.
__device__ __forceinline__ float RmsNormScale(float x, float rstd, float w) { return x * rstd * w; }

}  // namespace forge::cuda
