// RoPE's backward writing FP8 directly (FP8 training, worker/model/fp8_linears.h): the gradient
// of the fused qkv buffer [B*T, (H + 2*KV) * hd] as the attention backward leaves it (Q and K
// parts still rotated) gets the inverse rotation, is rounded to bf16 exactly as RopeApply
// (inverse) rounds it in place, and is quantised like CastTransposeToFp8 (row-major and
// transposed FP8, amax max-accumulated, scale_inv written); V passes through. Bit for bit
// RopeApply(inverse) followed by the cast, without writing and re-reading the bf16 gradient.
//
// `sin_cos` is RopeSinCosTable's [T, hd / 2] table for (T, hd, theta) (rope.h). Needs B*T
// and (H + 2*KV) * hd multiples of 64, hd a multiple of 8 and <= 512, a 16-byte aligned input
// and 8-byte aligned outputs (RopeFp8Supported). Test: tests/gpu/rope_fp8_test.cc, against
// the two kernels it fuses.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/gemm.h"  // DType

namespace forge::cuda {

bool RopeFp8Supported(int64_t rows, int n_head, int n_kv_head, int hd, const void* in,
                      const void* out, const void* out_t);

// first_heads > 0: only the first first_heads heads' columns (the Q heads, when the attention
// backward has written K's and V's casts itself: flash_backward.h), a multiple of 64 columns.
Status RopeBackwardFp8(void* out, void* out_t, const bf16* dqkv, int B, int T, int n_head,
                       int n_kv_head, int hd, const float2* sin_cos, DType format,
                       const float* scale, float* amax, float* scale_inv, cudaStream_t stream,
                       int first_heads = 0);

}  // namespace forge::cuda
