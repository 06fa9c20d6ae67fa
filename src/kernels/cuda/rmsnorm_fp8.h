// RMSNorm forward writing its output in FP8 (FP8 training, worker/model/fp8_linears.h), in one
// pass over x (rmsnorm_fp8.cu: a band of rows staged in shared memory): rstd exactly as
// RmsNormForward computes it, then out = x * rstd * w rounded to bf16 exactly as RmsNormForward
// rounds it and quantised like CastTransposeToFp8 (row-major and transposed FP8, amax
// max-accumulated, scale_inv written). Bit for bit RmsNormForward followed by the cast; the
// bf16 output is never stored.
//
// Needs N and d multiples of 64, d <= 2048 (RmsNormForward's limit), 16-byte aligned x and w,
// 8-byte aligned outputs (RmsNormFp8Supported). Test: tests/gpu/rmsnorm_fp8_test.cc, against the two kernels it fuses.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/gemm.h"  // DType
#include "kernels/cuda/rmsnorm.h"  // RmsNormDwReduce

namespace forge::cuda {

bool RmsNormFp8Supported(int64_t N, int d, const void* x, const void* w, const void* out,
                         const void* out_t);

Status RmsNormForwardFp8(void* out, void* out_t, float* rstd, const bf16* x, const bf16* w,
                         int64_t N, int d, float eps, DType format, const float* scale,
                         float* amax, float* scale_inv, cudaStream_t stream);

// RMSNorm backward (RmsNormBackward's contract: dx (+)= the gradient, dw (+)= its weight
// gradient, same workspace) that also writes the new dx in FP8: q [N, d] and q_t [d, N],
// quantised with *scale, amax max-accumulated, scale_inv written, bit for bit what
// CastTransposeToFp8 makes of the bf16 dx (rmsnorm_backward.cuh). For FP8 training, where dx
// is the output gradient of the next linear layer (the residual stream's gradient).
// Supported: N and d multiples of 64 (whole 8-row groups per block) with the block's FP8 band
// in shared memory (d <= 2048 covers every N the data takes), 8-byte aligned outputs.
bool RmsNormBackwardFp8Supported(int64_t N, int d, const void* q, const void* q_t);
Status RmsNormBackwardFp8(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w,
                          const float* rstd, int64_t N, int d, void* workspace,
                          size_t workspace_bytes, bool accumulate_dx, bool accumulate_dw, void* q,
                          void* q_t, DType format, const float* scale, float* amax,
                          float* scale_inv, cudaStream_t stream,
                          const RmsNormDwReduce& dw_reduce = {});

}  // namespace forge::cuda
