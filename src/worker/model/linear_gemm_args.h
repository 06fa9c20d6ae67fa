// The cuBLASLt GEMM arguments of a linear layer y = x W^T (W stored [out, in], as
// nn.Linear), its input gradient and its weight gradient, in row-major bf16 with fp32
// weight gradients. The model's forward, backward and LM head build their GEMMs from these.
#pragma once

#include <cstdint>

#include "kernels/cuda/bf16.h"
#include "kernels/cuda/gemm.h"

namespace forge {

// y[M, out] = x[M, in] W[out, in]^T (+ residual[M, out] when given; residual is only read)
inline cuda::GemmArgs Linear(cuda::bf16* y, const cuda::bf16* x, const cuda::bf16* w, int64_t M,
                             int64_t out, int64_t in, const cuda::bf16* residual = nullptr) {
  cuda::GemmArgs g;
  g.M = M, g.N = out, g.K = in;
  g.A = x, g.B = w, g.D = y;
  g.trans_a = false, g.trans_b = true;
  g.accumulate = residual != nullptr;
  g.C = residual;
  return g;
}

// dx[M, in] = dy[M, out] W[out, in]   (bf16 out, overwrites)
inline cuda::GemmArgs LinearBackwardData(cuda::bf16* dx, const cuda::bf16* dy,
                                         const cuda::bf16* w, int64_t M, int64_t out, int64_t in) {
  cuda::GemmArgs g;
  g.M = M, g.N = in, g.K = out;
  g.A = dy, g.B = w, g.D = dx;
  g.trans_a = false, g.trans_b = false;  // W stored [K=out, N=in]
  return g;
}

// dW[out, in] (+)= dy[M, out]^T x[M, in]   (fp32; accumulate across micro-steps and for the
// tied wte sum; the first write of a step overwrites, so gradients need no zeroing pass)
inline cuda::GemmArgs LinearBackwardWeight(float* dw, const cuda::bf16* dy, const cuda::bf16* x,
                                           int64_t M, int64_t out, int64_t in, bool accumulate) {
  cuda::GemmArgs g;
  g.M = out, g.N = in, g.K = M;
  g.A = dy, g.B = x, g.D = dw;
  g.trans_a = true;   // dy stored [K=M, out]
  g.trans_b = false;  // x stored [K=M, N=in]
  g.d_type = cuda::DType::kFp32;
  g.accumulate = accumulate;
  return g;
}

}  // namespace forge
