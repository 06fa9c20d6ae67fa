// Rotary position embedding (CPU float32 reference), interleaved pairs as in the PyTorch
// anchor: for head dim index pair (2i, 2i+1) at position t, angle = t * theta^(-2i/hd):
//   y[2i]   = x[2i] cos - x[2i+1] sin
//   y[2i+1] = x[2i] sin + x[2i+1] cos
#pragma once

#include <cstdint>
#include <cstdint>

namespace forge::cpu {

// In place on the Q and K heads of a fused qkv buffer [B, T, (H + 2*KV) * hd]
// (Q heads first, then K heads; V untouched). inverse=true rotates by -angle, which is the
// backward pass (the rotation is orthogonal).
void RopeApply(float* qkv, int B, int T, int n_head, int n_kv_head, int hd, float theta,
               bool inverse);

// The forward rotation of N rows of a fused qkv buffer [N, (H + 2*KV) * hd], row n at position
// positions[n] (incremental decoding: each row continues its own sequence). The same angles, in
// the same arithmetic, as RopeApply at those positions.
void RopeApplyAtPositions(float* qkv, const int32_t* positions, int64_t N, int n_head,
                          int n_kv_head, int hd, float theta);

}  // namespace forge::cpu
