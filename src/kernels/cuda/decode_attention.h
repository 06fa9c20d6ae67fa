// Attention of newly appended rows over a KV cache, for incremental decoding
// (worker/infer/cuda_decode_backend.cc). Row n belongs to sequence seq[n] at position pos[n];
// its query heads attend causally to that sequence's cached keys and values at positions
// [0, pos[n]] (the row's own K and V already written there). GQA: query head h reads KV head
// h / (n_head / n_kv_head).
//
// Arithmetic (fp32 throughout; K and V are bf16 in the cache): scores q.k / sqrt(hd), the
// row's maximum subtracted, exp, their sum in double, one float reciprocal, then the weighted
// sum of V: the CPU decoder's order of operations (cpu_decode_backend.cc), not its bits (the
// dot products are summed in another order). No atomics: the same launch gives the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

struct DecodeAttentionArgs {
  const float* q = nullptr;     // row n's query heads at q + n * q_stride, [H, hd] (RoPE'd)
  int64_t q_stride = 0;         // floats between rows
  const bf16* k_cache = nullptr;  // [batch, max_len, KV, hd]
  const bf16* v_cache = nullptr;  // [batch, max_len, KV, hd]
  const int32_t* seq = nullptr;   // [N] device
  const int32_t* pos = nullptr;   // [N] device
  bf16* out = nullptr;            // [N, H * hd]
  int64_t N = 0;
  int n_head = 0, n_kv_head = 0, hd = 0, max_len = 0;
};

// Requires hd <= 256 and max_len small enough for its scores to fit in shared memory
// (max_len <= 40000; Status::Invalid otherwise).
Status DecodeAttention(const DecodeAttentionArgs& a, cudaStream_t stream);

}  // namespace forge::cuda
