// Rotary embedding applied in place to the Q and K heads of a fused bf16 qkv buffer
// [B, T, (H + 2*KV) * hd]; same convention as kernels/cpu/rope.h (interleaved pairs).
// inverse=true is the backward pass. inv_freq: the hd/2 per-pair inverse frequencies in device
// memory (the model's rope_theta and rope_scaling, worker/model/rope_frequencies.h, as fp32).
// Requires hd even and hd <= 512 (Status::Invalid otherwise).
#pragma once

#include <cuda_runtime.h>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

Status RopeApply(bf16* qkv, int B, int T, int n_head, int n_kv_head, int hd,
                 const float* inv_freq, bool inverse, cudaStream_t stream);

// RoPE's (sin, cos) for positions [0, T) and pairs [0, hd/2), [T, hd/2], bitwise as RopeApply
// computes them: for epilogues that rotate from a table (gemm_wgmma.h's kRope).
Status RopeSinCosTable(float2* out, int T, int hd, const float* inv_freq, cudaStream_t stream);

// Plain RoPE's inverse frequencies theta^(-2i/hd), i in [0, hd/2), into out (device, hd/2
// floats): computed in double as the CPU reference does, then fp32. For kernels' tests and
// benchmarks; a model's table comes from its config (worker/model/rope_frequencies.h).
Status RopePlainInverseFrequencies(float* out, int hd, float theta, cudaStream_t stream);

}  // namespace forge::cuda
