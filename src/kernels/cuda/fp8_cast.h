// FP8 casts on the GPU for FP8 GEMMs (E4M3 activations/weights, E5M2 gradients):
//   out[i] = sat(x[i] * *scale)   (round to nearest even, saturating to +-max: the GPU's
//                                  cvt.rn.satfinite; NaN stays NaN)
// with the tensor's amax written in the same pass, and optionally a transposed FP8 copy, which
// Hopper's FP8 GEMMs need for the backward (cuBLASLt takes FP8 operands only in the TN layout,
// K contiguous in both: dgrad dx = dy W reads W^T [in, out], wgrad dW = dy^T x reads dy^T and
// x^T [*, tokens]).
//
// CPU reference: kernels/cpu/fp8_cast.h (bit for bit, amax included).
//
// Pointers: `scale` (required), `amax` and `scale_inv` (optional, nullptr) are device floats
// and must be 16-byte aligned, the alignment cuBLASLt requires of its scale/amax pointers, so
// the same slots feed the GEMM (docs/ARCHITECTURE.md "Tuned choices").
//   - `scale`: the quantisation scale (fp8_max / amax ...; worker/model/fp8_scaling.h).
//   - `scale_inv`: written as 1.0f / *scale (IEEE division) by one thread, for the GEMM's
//     a_scale/b_scale (which dequantise).
//   - `amax`: max-accumulated, *amax = max(*amax, max |x|) with |x| before scaling, so several
//     casts (micro-batches, a tensor in pieces) fold into one amax. The caller zeroes it
//     (cudaMemsetAsync to 0) where a new amax begins. Computed on the float's bit pattern:
//     non-negative floats order like their bits as unsigned ints, so each thread keeps the max
//     of (bits & 0x7FFFFFFF), a warp/block reduction combines them and one atomicMax per block
//     on the float's bits folds it into *amax. Integer max is exact and order-free, so the
//     result is deterministic; an Inf in x gives Inf and a NaN gives a NaN (NaN patterns sort
//     above Inf's), so an overflowed tensor cannot hide behind a finite amax.
// Input and output buffers may have any alignment; CastToFp8 takes a vectorised path (8
// elements a thread) when rows * cols % 8 == 0, x is 16-byte and out 8-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/status.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/gemm.h"  // DType

namespace forge::cuda {

// (a) bf16 x [rows, cols] -> fp8 out [rows, cols]; `format` is DType::kE4M3 or kE5M2.
// out = nullptr measures the amax only (the current recipe's pass before the cast).
Status CastToFp8(void* out, const bf16* x, int64_t rows, int64_t cols, DType format,
                 const float* scale, float* amax, float* scale_inv, cudaStream_t stream);

// (b) bf16 x [rows, cols] -> out [rows, cols] and out_t [cols, rows] in one pass (64x64 tiles
// through shared memory). Either output may be null, not both (unless the tensor is empty).
Status CastTransposeToFp8(void* out, void* out_t, const bf16* x, int64_t rows, int64_t cols,
                          DType format, const float* scale, float* amax, float* scale_inv,
                          cudaStream_t stream);

// (c) fp32 master weights [rows, cols] -> fp8 out [rows, cols] and out_t [cols, rows], the
// once-per-step weight cast after the optimizer update. Same contract as (b).
Status CastTransposeToFp8(void* out, void* out_t, const float* x, int64_t rows, int64_t cols,
                          DType format, const float* scale, float* amax, float* scale_inv,
                          cudaStream_t stream);

// (d) Up to four bf16 tensors cast as (b) in one launch (a layer's weights), each with its own
// scale / amax / scale_inv: bit for bit (b) called on each. Every tensor must take the 64x64
// tile path (rows and cols multiples of 64, x 16-byte and outputs 8-byte aligned, both outputs
// given): CastTransposeGroupSupported; otherwise call (b) per tensor.
struct Fp8CastJob {
  const bf16* x = nullptr;
  void* out = nullptr;
  void* out_t = nullptr;
  int64_t rows = 0, cols = 0;
  const float* scale = nullptr;
  float* amax = nullptr;
  float* scale_inv = nullptr;
};
bool CastTransposeGroupSupported(const Fp8CastJob* jobs, int n);
Status CastTransposeGroupToFp8(const Fp8CastJob* jobs, int n, DType format, cudaStream_t stream);

// The arguments every FP8 cast takes, checked once for the casts here and the kernels that
// write their output in FP8 themselves (rmsnorm_fp8, swiglu_fp8, rope_fp8): `format` E4M3 or
// E5M2, a scale pointer, and scale/amax/scale_inv 16-byte aligned where given. Errors start
// with `what`.
Status CheckFp8CastArgs(const std::string& what, DType format, const float* scale,
                        const float* amax, const float* scale_inv);

}  // namespace forge::cuda
