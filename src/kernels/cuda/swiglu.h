// SwiGLU on the GPU: out = silu(gate) * up over a fused [N, 2*ffn] gate_up buffer (bf16).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

Status SwiGluForward(bf16* out, const bf16* gate_up, int64_t N, int ffn, cudaStream_t stream);
// dgate_up (overwritten) [N, 2*ffn]
Status SwiGluBackward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int64_t N, int ffn,
                      cudaStream_t stream);

}  // namespace forge::cuda
