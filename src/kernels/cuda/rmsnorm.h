// RMSNorm forward/backward on the GPU (bf16 activations, fp32 statistics and weight grads).
// Requires d % 8 == 0, d <= 8192 and 16-byte aligned buffers (Status::Invalid otherwise).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

// out = x * rstd * w;  rstd[n] = 1/sqrt(mean(x[n]^2) + eps) saved for backward (fp32).
Status RmsNormForward(bf16* out, float* rstd, const bf16* x, const bf16* w, int64_t N, int d,
                      float eps, cudaStream_t stream);

// Scratch for the deterministic dw reduction (bytes).
size_t RmsNormBackwardWorkspace(int64_t N, int d);
// Where the backward's second kernel (the dw reduction of the per-block partials in the
// workspace) runs. Default (fork null): on the dx kernel's stream, right after it. Else on
// `stream`, ordered after the dx kernel through `fork` (recorded on the dx stream), so the dx
// chain's next kernel need not wait for it; dw and the workspace are then final / free only
// once `stream` has run it (the caller orders their next users after it).
struct RmsNormDwReduce {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr;
};
// dx += d(loss)/dx (bf16; accumulates into the residual-stream gradient; dx may not alias dout)
// dw += d(loss)/dw (fp32 [d]; deterministic two-pass reduction, no atomics)
// accumulate_dx / accumulate_dw = false overwrite instead (dx = ..., dw = ...): the old
// contents are never read, so they need no zeroing (first micro-step, first residual grad).
Status RmsNormBackward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w,
                       const float* rstd, int64_t N, int d, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream, bool accumulate_dx = true, bool accumulate_dw = true,
                       const RmsNormDwReduce& dw_reduce = {});

}  // namespace forge::cuda
