// Fused softmax + cross-entropy over the vocabulary on the GPU. Works on a chunk of rows of
// bf16 logits at a time (the caller runs the LM-head GEMM per token chunk), so no B*T*V fp32
// tensor ever exists: each row is read once for max/sum (online softmax) and once to write
// its gradient, in place, as bf16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

// logits [n, V] bf16, overwritten with dlogits = (softmax - onehot(target)) * dloss when
// write_grad; losses[n] (fp32) = -log softmax(logits)[target].
Status CrossEntropyForwardBackward(bf16* logits, float* losses, const int32_t* targets,
                                   int64_t n, int V, float dloss, bool write_grad,
                                   cudaStream_t stream);

// The same with write_grad, also writing dlogits as FP8 E5M2 into grad8 [n, V] (the FP8 LM
// head's GEMM operand): quantised with *scale from the bf16-rounded gradient, so bitwise
// CastToFp8(dlogits, kE5M2) of the bf16 result; amax of |dlogits| max-accumulated into *amax,
// *scale_inv = 1 / *scale (may be null). write_bf16 false leaves the logits as they were (no
// bf16 dlogits: for a caller whose every dlogits GEMM reads grad8). Needs
// CrossEntropyFp8GradSupported.
Status CrossEntropyForwardBackwardFp8Grad(bf16* logits, float* losses, const int32_t* targets,
                                          int64_t n, int V, float dloss, uint8_t* grad8,
                                          const float* scale, float* amax, float* scale_inv,
                                          bool write_bf16, cudaStream_t stream);
bool CrossEntropyFp8GradSupported(int V, const void* logits, const void* grad8);

// Deterministic mean of n fp32 values into *out (fixed-order reduction, one block).
Status MeanReduce(float* out, const float* values, int64_t n, cudaStream_t stream);

}  // namespace forge::cuda
