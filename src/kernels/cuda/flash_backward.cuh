// Causal attention backward of our own (FlashAttention-style, Hopper warpgroup MMAs):
// dQ, dK, dV from Q, K, V, O, dO and the forward's Stats, deterministic, without cuDNN's
// materialised dS.
//
// Why: cuDNN's deterministic backward writes dS (2 B H T^2 bytes, 512 MiB a gpt350m layer) and
// reads it back in a separate dQ = dS K matmul (~170 us a layer on an H100); its fast backward
// sums dQ with unordered fp32 atomics, so two runs differ in the last bits and a resumed run
// would not follow the uninterrupted one. Here dQ's partial sums are added in a fixed order
// (from the diagonal kv block of each query block down to kv block 0, ordered through a
// per-query-block semaphore), through shared memory and the bulk copy engine, so the result is
// bitwise reproducible at the cost of the fast path's traffic, not the deterministic path's.
//
// Shapes: head width 64, T a multiple of 128, H a multiple of KV (GQA: a kv head's CTA walks
// its group's query heads, summing dK and dV in registers). Layouts are SdpaRunner's: Q, K, V
// read in place from the fused qkv buffer [B, T, H + 2 KV, 64], O and dO [B, T, H, 64], Stats
// fp32 [B, H, T] (rowmax + natural log of the row sum, scores scaled by 1/8), dQKV written into
// a [B, T, H + 2 KV, 64] buffer.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/status.h"
#include "kernels/cuda/bf16.cuh"

namespace forge::cuda {

struct FlashBackwardShape {
  int B = 0, T = 0, H = 0, KV = 0, hd = 0;
};

// Whether FlashBackward takes this shape on this device (an sm_90 GPU); the reason if not.
Status FlashBackwardSupports(const FlashBackwardShape& s);

// Scratch of one call (no initial contents needed): per-row (Stats log2 e, rowsum(dO O)), the
// fp32 dQ partial sums, the query blocks' semaphores and a tile counter.
size_t FlashBackwardScratchBytes(const FlashBackwardShape& s);

Status FlashBackward(const FlashBackwardShape& s, const bf16* qkv, const bf16* out,
                     const bf16* dout, const float* stats, bf16* dqkv, void* scratch,
                     cudaStream_t stream);

}  // namespace forge::cuda
