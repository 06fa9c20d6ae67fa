// Optimizer kernels: global grad-norm (deterministic) and multi-tensor AdamW on fp32 master
// weights that also writes the bf16 compute copy. The clip factor, learning rate and step
// live in device memory, and the tensor lists are device arrays uploaded once: the whole
// optimizer can be captured in a CUDA graph and replayed with no host synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

// One contiguous tensor (or flat unit) the optimizer updates.
struct AdamWTensor {
  float* param;        // fp32 master
  bf16* param_bf16;    // compute copy, written after the update (may be null)
  const float* grad;   // fp32
  float* m;
  float* v;
  int64_t n;
  float weight_decay;  // 0 for norms
  // When set, the gradient is read from here (bf16) instead of `grad`: ddp with bf16 gradient
  // collectives keeps the summed gradient in bf16 (worker/train/cuda_data_parallel.h), and
  // widening it to fp32 first would only add a pass (the values are the same).
  const bf16* grad16 = nullptr;
};

// Scratch for the grad-norm reduction (bytes).
size_t GradNormWorkspace();
// tensors: DEVICE array of num_tensors descriptors (only grad and n are read).
// sumsq_out[0] = sum over all tensors of grad^2 (fp32 partials in a fixed order, so the result
// is bitwise reproducible); clip_scale_out[0] = min(1, max_norm / (sqrt(sumsq) + 1e-6))
// (1 if max_norm <= 0); NaN when sumsq is not finite (AdamW then skips the step).
Status GlobalGradNorm(const AdamWTensor* tensors, int num_tensors, float max_norm,
                      float* sumsq_out, float* clip_scale_out, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream);

// The same norm in pieces, for a model that sums each unit's gradient as soon as it is final
// (on a side stream, overlapping the rest of the backward): SumSquaresPartial writes
// SumSquaresPartials() fp32 partial sums of g[0, n)^2 (fixed grid and order) to partial;
// GradNormFromPartials sums `count` such values in a fixed order into sumsq_out[0] and derives
// clip_scale_out[0] as GlobalGradNorm does. Bitwise reproducible; not bitwise GlobalGradNorm
// (another summation order).
int64_t SumSquaresPartials();
Status SumSquaresPartial(const float* g, int64_t n, float* partial, cudaStream_t stream);
// The same over bf16 values: bitwise SumSquaresPartial of the widened values (same grid, same
// element order per thread) when both buffers are 16-byte aligned.
Status SumSquaresPartialBf16(const bf16* g, int64_t n, float* partial, cudaStream_t stream);
Status GradNormFromPartials(const float* partial, int64_t count, float max_norm,
                            float* sumsq_out, float* clip_scale_out, cudaStream_t stream);

// clip_scale_out[0] from an existing sum of squares (e.g. summed over data-parallel ranks),
// by the same rule as GlobalGradNorm.
Status ClipScaleFromSumSquares(const float* sumsq, float max_norm, float* clip_scale_out,
                               cudaStream_t stream);

struct AdamWHyper {
  float lr, beta1, beta2, eps;
  int64_t step;  // 1-based
};

// tensors: DEVICE array; hyper: DEVICE pointer (the host writes lr/step there before each
// step with cudaMemcpyAsync, so a captured graph sees the new values). Grads are multiplied by
// *grad_scale (device pointer, e.g. the clip factor). Matches cpu::AdamWUpdate up to fp32
// rounding. A non-finite *grad_scale (the clip factor of non-finite gradients) skips the whole
// update and adds 1 to *skipped_steps (device counter; may be null).
// gate (device flag, may be null): the launch does nothing unless *gate != 0, so a captured
// graph can hold an update that runs only when one is pending (see MarkUpdatePending).
// elements: the tensors' total size, to size the grid for small lists (<= 0: the full grid).
Status AdamWMultiTensor(const AdamWTensor* tensors, int num_tensors, const AdamWHyper* hyper,
                        const float* grad_scale, cudaStream_t stream,
                        int64_t* skipped_steps = nullptr, const int* gate = nullptr,
                        int64_t elements = 0);

// For an update applied later (gated AdamWMultiTensor launches): *gate = 1 when *grad_scale
// is finite, else 0 and *skipped_steps += 1 (the step is counted as skipped now, when its
// gradients are known, not when the update would have run).
Status MarkUpdatePending(const float* grad_scale, int* gate, int64_t* skipped_steps,
                         cudaStream_t stream);

// bf16 copy of an fp32 buffer (initial upload of weights).
Status CastFloatToBf16(bf16* out, const float* in, int64_t n, cudaStream_t stream);
Status CastBf16ToFloat(float* out, const bf16* in, int64_t n, cudaStream_t stream);

}  // namespace forge::cuda
