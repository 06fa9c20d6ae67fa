// Token embedding rows widened to fp32: out[n, :] = float(wte[tokens[n], :]) (exact), the
// start of an fp32 residual stream (incremental decoding, worker/infer/cuda_decode_backend.cc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

Status EmbeddingForwardF32(float* out, const int32_t* tokens, const bf16* wte, int64_t N, int d,
                           cudaStream_t stream);

}  // namespace forge::cuda
