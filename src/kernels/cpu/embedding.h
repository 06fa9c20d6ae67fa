// Token embedding lookup (CPU float32 reference). Row-major [N, d]; N = B*T tokens.
#pragma once
#include <cstdint>

namespace forge::cpu {

// out[n, :] = wte[tokens[n], :]
void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, int64_t N, int d);
// dwte[tokens[n], :] += dout[n, :]   (accumulates, in token order: deterministic)
void EmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int64_t N, int d);

}  // namespace forge::cpu
