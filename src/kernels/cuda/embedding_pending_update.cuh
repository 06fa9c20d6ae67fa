// The embedding forward of a step whose AdamW update of the table is still pending (the
// deferred update, worker/model/deferred_update.h), so the forward need not wait for it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/bf16.cuh"

namespace forge::cuda {

// out[n, :] = bf16 of row tokens[n] of the table as the pending update will leave it: the
// update's own arithmetic (adamw_math.cuh) on the fp32 master, gradient and moments, which
// are only read, so bitwise the bf16 copy that AdamWMultiTensor writes later. Without a
// pending update (*gate == 0) or on a skipped step (non-finite *grad_scale) it is
// EmbeddingForward of the bf16 copy. table: the table's optimizer descriptor (param,
// param_bf16, grad, m, v of [vocab, d], weight_decay; n = vocab * d); hyper, grad_scale and
// gate: device pointers, the deferred update's.
Status EmbeddingForwardPendingUpdate(bf16* out, const int32_t* tokens, const AdamWTensor& table,
                                     int64_t N, int d, const AdamWHyper* hyper,
                                     const float* grad_scale, const int* gate,
                                     cudaStream_t stream);

}  // namespace forge::cuda
