#include "kernels/cpu/swiglu.h"

#include <cmath>

namespace forge::cpu {

void SwiGluForward(float* out, const float* gate_up, int64_t N, int ffn) {
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gate_up + n * 2 * ffn;
    const float* u = g + ffn;
    float* o = out + n * ffn;
    for (int j = 0; j < ffn; ++j) {
      const float sig = 1.0f / (1.0f + std::exp(-g[j]));
      o[j] = g[j] * sig * u[j];
    }
  }
}

void SwiGluBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int ffn) {
  // silu'(g) = sig(g) (1 + g (1 - sig(g)))
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gate_up + n * 2 * ffn;
    const float* u = g + ffn;
    const float* dy = dout + n * ffn;
    float* dg = dgate_up + n * 2 * ffn;
    float* du = dg + ffn;
    for (int j = 0; j < ffn; ++j) {
      const float sig = 1.0f / (1.0f + std::exp(-g[j]));
      const float silu = g[j] * sig;
      dg[j] = dy[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
      du[j] = dy[j] * silu;
    }
  }
}

}  // namespace forge::cpu
