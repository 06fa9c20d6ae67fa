// QK-norm on the GPU: RMSNorm of every query and key head (width hd) inside the fused bf16 qkv
// buffer [N, (H + 2 KV) hd] (Q heads, then K heads, then V heads a row), the Q heads scaled by
// wq [hd] and the K heads by wk [hd]; V is not touched. Per head row: rstd = 1 / sqrt(mean(x^2)
// + eps), y = x rstd w (rmsnorm_math.cuh), fp32 statistics, bf16 values; same convention as the
// CPU reference's QK-norm (worker/model/cpu_model.cc). Requires hd 32, 64, 128 or 256
// (Status::Invalid otherwise).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

struct HeadNormShape {
  int64_t N = 0;  // tokens (rows of qkv)
  int H = 0, KV = 0, hd = 0;
  float eps = 1e-5f;
};

// Whether the kernels take this shape (the reason if not).
Status HeadRmsNormSupports(const HeadNormShape& s);

// Normalises the Q and K heads of qkv in place; raw receives their values from before,
// [N, (H + KV) hd], and rstd the rows' statistics, [N, H + KV] (both for the backward).
Status HeadRmsNormForward(bf16* qkv, bf16* raw, float* rstd, const bf16* wq, const bf16* wk,
                          const HeadNormShape& s, cudaStream_t stream);

// Scratch for the deterministic weight-gradient reduction (bytes).
size_t HeadRmsNormBackwardWorkspace(const HeadNormShape& s);

// dqkv's Q and K columns hold dL/d(normalised head) on entry and dL/d(raw head) on return (V's
// columns are not touched); dwq and dwk (fp32 [hd]) receive the weights' gradients, added to
// with accumulate_dw, else overwritten. Fixed-order two-pass reduction: bitwise reproducible.
Status HeadRmsNormBackward(bf16* dqkv, float* dwq, float* dwk, const bf16* raw, const bf16* wq,
                           const bf16* wk, const float* rstd, const HeadNormShape& s,
                           bool accumulate_dw, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream);

}  // namespace forge::cuda
