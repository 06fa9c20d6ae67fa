// The QKV projection's output of newly appended rows made ready for attention over a KV cache
// (incremental decoding, worker/infer/cuda_decode_backend.cc): per row n (sequence seq[n],
// position pos[n]) of an fp32 qkv buffer [N, (H + 2*KV) * hd],
//   - with q_norm/k_norm: RMSNorm of each Q head and each K head vector (model.qk_norm);
//   - RoPE of the Q and K heads at the row's position, interleaved pairs, angle
//     pos * inv_freq[i] in double with cos/sin rounded to float, as kernels/cpu/rope.h does
//     (inv_freq from RopeFrequencies: plain or Llama 3 scaled);
//   - Q written back in place (fp32), K and V stored as bf16 into the caches at [seq, pos].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

struct DecodeQkvArgs {
  float* qkv = nullptr;             // [N, (H + 2*KV) * hd]
  const int32_t* seq = nullptr;     // [N] device
  const int32_t* pos = nullptr;     // [N] device
  const double* inv_freq = nullptr;  // [hd / 2] device
  const bf16* q_norm = nullptr;     // [hd] or null (no QK-norm)
  const bf16* k_norm = nullptr;     // [hd] or null
  float norm_eps = 1e-5f;
  bf16* k_cache = nullptr;          // [batch, max_len, KV, hd]
  bf16* v_cache = nullptr;
  int64_t N = 0;
  int n_head = 0, n_kv_head = 0, hd = 0, max_len = 0;
};

// Requires hd even and <= 512.
Status DecodeQkvToCache(const DecodeQkvArgs& a, cudaStream_t stream);

}  // namespace forge::cuda
