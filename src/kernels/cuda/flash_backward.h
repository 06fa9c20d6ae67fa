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
// Shapes: head width 64, T a multiple of 128, H a multiple of KV (GQA: a tile per query head,
// whose dK and dV the group's last tile of that kv block sums in query-head order). Layouts are SdpaRunner's: Q, K, V
// read in place from the fused qkv buffer [B, T, H + 2 KV, 64], O and dO [B, T, H, 64], Stats
// fp32 [B, H, T] (rowmax + natural log of the row sum, scores scaled by 1/8), dQKV written into
// a [B, T, H + 2 KV, 64] buffer.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

struct FlashBackwardShape {
  int B = 0, T = 0, H = 0, KV = 0, hd = 0;
};

// Whether FlashBackward takes this shape on this device (an sm_90 GPU); the reason if not.
Status FlashBackwardSupports(const FlashBackwardShape& s);

// Scratch of one call (no initial contents needed): per-row (Stats log2 e, rowsum(dO O)), the
// fp32 dQ partial sums, the query blocks' semaphores, a tile counter and, under GQA, every query
// head's fp32 dK and dV (512 bytes a head and token) with a finished-tile count a kv block.
size_t FlashBackwardScratchBytes(const FlashBackwardShape& s);

// FP8 outputs for an FP8 QKV projection's backward: RoPE's inverse rotation applied to the Q
// and K columns (V's pass through), each value quantised to E5M2 with *scale, row-major
// [B T, H + 2 KV, 64] into `out` and transposed [(H + 2 KV) 64, B T] into `out_t`, |value|
// max-accumulated into *amax and 1 / *scale written to *scale_inv (the contract of
// fp8_cast.h). Bit for bit what the bf16 backward followed by RopeBackwardFp8 writes (the
// same bf16 roundings before and after the rotation).
//
// Where: dK and dV are in registers at the end of a tile, so the compute warpgroups rotate,
// cast and store them through two shared-memory byte tiles (their bf16 never reaches memory);
// the amax is kept per thread over the persistent CTA's tiles and folded into *amax once a warp.
// dQ still goes out in bf16 (into dqkv's Q columns, which must be given) and RopeBackwardFp8
// casts those columns after the kernel: done by the dQ writer warp instead (kv block 0's final
// addition), the rotation and casts made that one warp the kernel's bottleneck (0.58 ms
// against 0.37 at gpt350m's shape on an H200); done by kv block 0's compute warpgroups after
// their tile (reading dQ back), 0.467 ms against this form's 0.403-0.415 on an H100
// (docs/performance.md).
struct FlashBackwardFp8Out {
  void* out = nullptr;                   // E5M2, 16-byte aligned
  void* out_t = nullptr;                 // E5M2, 16-byte aligned
  const float2* rope_sin_cos = nullptr;  // RopeSinCosTable's [T, 32] (sin, cos) pairs
  const float* scale = nullptr;
  float* amax = nullptr;       // may be null
  float* scale_inv = nullptr;  // may be null
};

// With fp8, dqkv's K and V columns are not written (its Q columns are).
Status FlashBackward(const FlashBackwardShape& s, const bf16* qkv, const bf16* out,
                     const bf16* dout, const float* stats, bf16* dqkv, void* scratch,
                     cudaStream_t stream, const FlashBackwardFp8Out* fp8 = nullptr);

}  // namespace forge::cuda
