// RMSNorm of rows of an fp32 residual stream into bf16 (the input of the next bf16 GEMM), for
// incremental decoding (worker/infer/cuda_decode_backend.cc):
//   out[r] = x[rows[r]] * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps)
// with the sum of squares in double and rstd rounded to float, as kernels/cpu/rmsnorm.h.
// rows null: row r is x's row r. w is bf16 [d].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

Status RmsNormF32Rows(bf16* out, const float* x, const int32_t* rows, const bf16* w, int64_t R,
                      int d, float eps, cudaStream_t stream);

}  // namespace forge::cuda
