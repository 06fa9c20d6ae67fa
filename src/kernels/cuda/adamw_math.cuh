// The AdamW arithmetic of one element, shared by the multi-tensor update (adamw.cu) and the
// embedding gather that applies a pending update on the fly (embedding.cu): one rounding per
// operation, in cpu::AdamWUpdate's order, with explicit round-to-nearest intrinsics so no
// kernel contracts it differently; both therefore produce bitwise the same weights.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/adamw.cuh"

namespace forge::cuda {

struct AdamWConsts {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, bc1, bc2, grad_scale;
};

__device__ __forceinline__ AdamWConsts MakeAdamWConsts(const AdamWHyper& h, float grad_scale) {
  AdamWConsts c;
  c.lr = h.lr;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.one_minus_beta1 = 1.0f - h.beta1;
  c.one_minus_beta2 = 1.0f - h.beta2;
  c.eps = h.eps;
  // Bias corrections in double, as the reference.
  c.bc1 = static_cast<float>(1.0 - pow(static_cast<double>(h.beta1), static_cast<double>(h.step)));
  c.bc2 = static_cast<float>(1.0 - pow(static_cast<double>(h.beta2), static_cast<double>(h.step)));
  c.grad_scale = grad_scale;
  return c;
}

__device__ __forceinline__ void AdamWElement(float& p, float g, float& m, float& v,
                                             const AdamWConsts& c, float wd) {
  const float gi = __fmul_rn(g, c.grad_scale);
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, gi));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
  const float mhat = __fdiv_rn(m, c.bc1);
  const float vhat = __fdiv_rn(v, c.bc2);
  const float step = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), c.eps)),
                               __fmul_rn(wd, p));
  p = __fsub_rn(p, __fmul_rn(c.lr, step));
}

}  // namespace forge::cuda
