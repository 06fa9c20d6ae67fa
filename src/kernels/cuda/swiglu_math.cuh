// SwiGLU's per-element math, shared by the BF16 kernels (swiglu.cu) and the ones that write
// FP8 directly (swiglu_fp8.cu), so both round the same fp32 expressions to the same bf16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_util.cuh"  // PackBf16x2

namespace forge::cuda {

// The hardware's approximate exp2 and reciprocal (2 MUFU ops; relative error ~1e-7, far under
// bf16's 4e-3): the GEMM with SwiGLU in its epilogue computes this between its MMA issues, where
// expf + an IEEE reciprocal (~40 instructions, latency-bound in two warps a scheduler) held the
// tensor cores back (~63 us of a 370 us gate/up GEMM on an H100). 1 + exp(-g) above 2^126
// gives 0, as it should.
__device__ __forceinline__ float SwiGluSigmoid(float g) {
  return __fdividef(1.0f, 1.0f + __expf(-g));
}

// out = silu(g) * u
__device__ __forceinline__ float SwiGluOut(float g, float u) { return g * SwiGluSigmoid(g) * u; }

// d/dg and d/du of silu(g) * u for an incoming gradient dy; silu'(g) = sig (1 + g (1 - sig)).
__device__ __forceinline__ void SwiGluGrads(float g, float u, float dy, float* dg, float* du) {
  const float sig = SwiGluSigmoid(g);
  *dg = dy * u * sig * (1.0f + g * (1.0f - sig));
  *du = dy * (g * sig);
}

// SwiGLU's backward of 8 positions, each rounded to bf16 as SwiGluBackward stores it (what the
// kernels that quantise it to FP8 start from): dgate in f[0], dup in f[1]; the same values as
// bf16 pairs in packed[0] / packed[1] (pair q: positions 2q, 2q + 1), which callers that take
// an amax over them may use (a float's |x| bits are its bf16's, shifted up 16).
__device__ __forceinline__ void SwiGluGradsRounded8(const float (&g)[8], const float (&u)[8],
                                                    const float (&dy)[8], float (&f)[2][8],
                                                    uint32_t (&packed)[2][4]) {
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    float dg0, du0, dg1, du1;
    SwiGluGrads(g[e], u[e], dy[e], &dg0, &du0);
    SwiGluGrads(g[e + 1], u[e + 1], dy[e + 1], &dg1, &du1);
    packed[0][e / 2] = PackBf16x2(dg0, dg1), packed[1][e / 2] = PackBf16x2(du0, du1);
#pragma unroll
    for (int o = 0; o < 2; ++o) {
      f[o][e] = __uint_as_float(packed[o][e / 2] << 16);
      f[o][e + 1] = __uint_as_float(packed[o][e / 2] & 0xFFFF0000u);
    }
  }
}

}  // namespace forge::cuda
