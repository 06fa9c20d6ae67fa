// RoPE's per-pair math, shared by the in-place kernel (rope.cu) and the kernels that write the
// backward's FP8 casts directly (rope_fp8.cu, the attention backward's FP8 epilogue), so all
// compute the same fp32 values before rounding to bf16.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/device_util.cuh"  // RoundBf16

namespace forge::cuda {

// sin/cos of the angle t * freq (full-precision sincosf: angles reach T radians); the sine
// takes the direction's sign (-1: the inverse rotation of the backward pass).
__device__ __forceinline__ void RopeSinCos(float t, float freq, float sign, float* sn, float* cs) {
  sincosf(t * freq, sn, cs);
  *sn *= sign;
}

// The pair (x, y) rotated by the angle whose sin/cos are given. The roundings are spelled out
// (no contraction left to the compiler): every kernel that rotates (RopeApply, the QKV GEMM's
// epilogue, the FP8 backward casts, the attention backward's FP8 epilogue) must compute the same
// bits, and the compiler may fuse a * b - c * d into an FMA differently in each context.
__device__ __forceinline__ float2 RopeRotate(float2 p, float sn, float cs) {
  return make_float2(__fmaf_rn(p.x, cs, -__fmul_rn(p.y, sn)),
                     __fmaf_rn(p.x, sn, __fmul_rn(p.y, cs)));
}

// A bf16 pair of the backward's gradient rotated back by the angle whose (sin, cos) RoPE's
// table holds (RopeSinCosTable), rounded to bf16 as RopeApply(inverse) stores it: what the
// kernels that cast the result to FP8 must quantise to match RopeApply followed by the cast.
__device__ __forceinline__ float2 RopeRotateBackBf16(float2 p, float2 sin_cos) {
  p = RopeRotate(p, -sin_cos.x, sin_cos.y);
  return make_float2(RoundBf16(p.x), RoundBf16(p.y));
}

}  // namespace forge::cuda
