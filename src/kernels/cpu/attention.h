// Causal multi-head attention with GQA (CPU float32 reference; the oracle for cuDNN's SDPA).
// qkv: [B, T, (H + 2*KV) * hd] with rope already applied; query head h uses kv head
// h / (H / KV). Scale 1/sqrt(hd).
#pragma once
#include <cstdint>

namespace forge::cpu {

// out: [B, T, H*hd]; probs: [B, H, T, T] softmax probabilities saved for backward (the upper
// triangle is written as 0).
void AttentionForward(float* out, float* probs, const float* qkv, int B, int T, int n_head,
                      int n_kv_head, int hd);
// dqkv (overwritten): [B, T, (H + 2*KV) * hd]; dout: [B, T, H*hd].
void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                       int B, int T, int n_head, int n_kv_head, int hd);

// Turns the scores p[0, n), whose largest is mx, into exp(p - mx) and returns the reciprocal of
// their sum (p[s] times it is the softmax): the arithmetic every CPU attention shares (float
// exp, double sum, float reciprocal), which keeps the decode path bit-identical to the forward.
float SoftmaxNumerators(float* p, int n, float mx);

}  // namespace forge::cpu
