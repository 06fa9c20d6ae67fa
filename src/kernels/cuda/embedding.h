// Token embedding forward/backward on the GPU. Backward is deterministic: no float atomics;
// every vocabulary row's gradient is summed over its positions in token order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

// out[n, :] = wte[tokens[n], :]   (out, wte bf16; N tokens, d columns)
Status EmbeddingForward(bf16* out, const int32_t* tokens, const bf16* wte, int64_t N, int d,
                        cudaStream_t stream);

// Scratch the backward needs for N tokens (bytes); allocate once per shape.
size_t EmbeddingBackwardWorkspace(int64_t N, int vocab);
// dwte[tokens[n], :] += dout[n, :]   (dwte fp32 [V, d]; accumulates, deterministic)
Status EmbeddingBackward(float* dwte, const bf16* dout, const int32_t* tokens, int64_t N, int d,
                         int vocab, void* workspace, size_t workspace_bytes, cudaStream_t stream);
// The same into a bf16 gradient: each touched row read, its tokens' rows added in fp32 in the
// same order, rounded once.
Status EmbeddingBackward(bf16* dwte, const bf16* dout, const int32_t* tokens, int64_t N, int d,
                         int vocab, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// One rank's part of a lookup in a table sharded over ranks (fsdp): the rank holds elements
// [lo, hi) of the flat [vocab, d] table in fp32 at slot[e - lo]. out[n, :] = wte[tokens[n], :]
// rounded to bf16 where the slot holds the element, -0 elsewhere: the ranks' outputs, summed,
// are the lookup in the whole bf16 table, bit for bit.
Status EmbeddingRowsFromSlot(bf16* out, const int32_t* tokens, int64_t N, int d,
                             const float* slot, int64_t lo, int64_t hi, cudaStream_t stream);
// The embedding's gradient for N = ranks x rows_per_rank tokens (every rank's rows, rank-major),
// into one rank's slot of it (elements [lo, hi) at slot[e - lo]; accumulates): for each token,
// each rank's rows summed in position order, those sums added in rank order, and the total
// added to the slot. Deterministic; the workspace is EmbeddingBackwardWorkspace(N, vocab).
Status EmbeddingBackwardToSlot(float* slot, int64_t lo, int64_t hi, const bf16* dout,
                               const int32_t* tokens, int64_t N, int64_t rows_per_rank, int d,
                               int vocab, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

}  // namespace forge::cuda
