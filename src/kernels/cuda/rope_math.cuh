// RoPE's per-pair math, shared by the in-place kernel (rope.cu) and the backward that writes
// FP8 directly (rope_fp8.cu), so both compute the same fp32 values before rounding to bf16.
#pragma once

#include <cuda_runtime.h>

namespace forge::cuda {

// theta^(-2i/hd) in double, as the CPU reference computes it, then fp32.
__device__ __forceinline__ float RopeFreq(int i, int hd, float theta) {
  return static_cast<float>(pow(static_cast<double>(theta), -2.0 * i / hd));
}

// sin/cos of the angle t * freq (full-precision sincosf: angles reach T radians); the sine
// takes the direction's sign (-1: the inverse rotation of the backward pass).
__device__ __forceinline__ void RopeSinCos(float t, float freq, float sign, float* sn, float* cs) {
  sincosf(t * freq, sn, cs);
  *sn *= sign;
}

// The pair (x, y) rotated by the angle whose sin/cos are given.
__device__ __forceinline__ float2 RopeRotate(float2 p, float sn, float cs) {
  return make_float2(p.x * cs - p.y * sn, p.x * sn + p.y * cs);
}

}  // namespace forge::cuda
