// SwiGLU forward and backward writing FP8 directly (FP8 training, worker/model/fp8_linears.h):
// the bf16 result the BF16 kernel would write is never stored; each value is rounded to bf16
// exactly as SwiGluForward/SwiGluBackward round it, then quantised like CastTransposeToFp8
// (row-major and transposed FP8, amax max-accumulated, scale_inv written). So the outputs are
// bit for bit those of the BF16 kernel followed by the cast, without the bf16 round trip
// through memory (SwiGLU backward: 8 of its 14 bytes per gate/up element).
//
// Both need N and ffn multiples of 64 and 16-byte aligned inputs, 8-byte aligned outputs
// (SwiGluFp8Supported); scale/amax/scale_inv follow fp8_cast.h. Tests: against the BF16
// kernels + the cast (tests/gpu/swiglu_fp8_test.cc), which are tested against the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/gemm.h"  // DType

namespace forge::cuda {

bool SwiGluFp8Supported(int64_t N, int ffn, const void* in0, const void* in1, const void* out,
                        const void* out_t);

// out [N, ffn] = fp8(silu(gate) * up) and out_t [ffn, N]; `format` E4M3 or E5M2.
Status SwiGluForwardFp8(void* out, void* out_t, const bf16* gate_up, int64_t N, int ffn,
                        DType format, const float* scale, float* amax, float* scale_inv,
                        cudaStream_t stream);

// dgate_up [N, 2*ffn] = fp8(SwiGLU backward of dout) and its transpose [2*ffn, N].
Status SwiGluBackwardFp8(void* dgate_up, void* dgate_up_t, const bf16* dout,
                         const bf16* gate_up, int64_t N, int ffn, DType format,
                         const float* scale, float* amax, float* scale_inv, cudaStream_t stream);

}  // namespace forge::cuda
