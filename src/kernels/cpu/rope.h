// Rotary position embedding (CPU float32 reference), interleaved pairs as in the PyTorch
// anchor: for head dim index pair (2i, 2i+1) at position t, angle = t * inv_freq[i]:
//   y[2i]   = x[2i] cos - x[2i+1] sin
//   y[2i+1] = x[2i] sin + x[2i+1] cos
// with inv_freq[i] = theta^(-2i/hd), optionally rescaled by Llama 3.1's frequency scaling.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"

namespace forge::cpu {

// The hd/2 inverse frequencies, in double (the reference carries no error of its own at long
// positions): plain RoPE, or with Llama 3.1's frequency scaling (scaling.type kLlama3,
// transformers' rope_type "llama3"): a pair whose wavelength 2 pi / f is above
// original_max_position_embeddings / low_freq_factor takes f / factor, one below
// original_max_position_embeddings / high_freq_factor keeps f, and one between takes
// (1 - s) f / factor + s f with s = (original_max_position_embeddings / wavelength -
// low_freq_factor) / (high_freq_factor - low_freq_factor).
std::vector<double> RopeInverseFrequencies(int hd, double theta,
                                           const RopeScalingConfig& scaling = {});

// In place on the Q and K heads of a fused qkv buffer [B, T, (H + 2*KV) * hd]
// (Q heads first, then K heads; V untouched). inverse=true rotates by -angle, which is the
// backward pass (the rotation is orthogonal). inv_freq: hd/2 values (RopeInverseFrequencies).
void RopeApply(float* qkv, int B, int T, int n_head, int n_kv_head, int hd,
               const double* inv_freq, bool inverse);
// Plain RoPE of base theta.
void RopeApply(float* qkv, int B, int T, int n_head, int n_kv_head, int hd, float theta,
               bool inverse);

// The forward rotation of N rows of a fused qkv buffer [N, (H + 2*KV) * hd], row n at position
// positions[n] (incremental decoding: each row continues its own sequence). The same angles, in
// the same arithmetic, as RopeApply at those positions.
void RopeApplyAtPositions(float* qkv, const int32_t* positions, int64_t N, int n_head,
                          int n_kv_head, int hd, const double* inv_freq);
void RopeApplyAtPositions(float* qkv, const int32_t* positions, int64_t N, int n_head,
                          int n_kv_head, int hd, float theta);

}  // namespace forge::cpu
