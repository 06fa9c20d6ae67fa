// SwiGLU's per-element math, shared by the BF16 kernels (swiglu.cu) and the ones that write
// FP8 directly (swiglu_fp8.cu), so both round the same fp32 expressions to the same bf16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace forge::cuda {

// The hardware's approximate exp2 and reciprocal (2 MUFU ops; relative error ~1e-7, far under
// bf16's 4e-3): the GEMM with SwiGLU in its epilogue computes this between its MMA issues, where
// expf + an IEEE reciprocal (~40 instructions, latency-bound in two warps a scheduler) held the
// tensor cores back (docs/benchmarks.md, session 14). 1 + exp(-g) above 2^126 gives 0, as it
// should.
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
// kernels that quantise it to FP8 start from): dgate in f[0], dup in f[1].
__device__ __forceinline__ void SwiGluGradsRounded8(const float (&g)[8], const float (&u)[8],
                                                    const float (&dy)[8], float (&f)[2][8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float dg, du;
    SwiGluGrads(g[e], u[e], dy[e], &dg, &du);
    f[0][e] = __bfloat162float(__float2bfloat16_rn(dg));
    f[1][e] = __bfloat162float(__float2bfloat16_rn(du));
  }
}

}  // namespace forge::cuda
