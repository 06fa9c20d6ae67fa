#include "kernels/cpu/embedding.h"

#include <cstring>

namespace forge::cpu {

void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, int64_t N, int d) {
  for (int64_t n = 0; n < N; ++n) {
    std::memcpy(out + n * d, wte + int64_t{tokens[n]} * d, sizeof(float) * d);
  }
}

void EmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int64_t N, int d) {
  // Single-threaded on purpose: repeated tokens must be summed in token order.
  for (int64_t n = 0; n < N; ++n) {
    float* row = dwte + int64_t{tokens[n]} * d;
    const float* g = dout + n * d;
    for (int j = 0; j < d; ++j) row[j] += g[j];
  }
}

}  // namespace forge::cpu
