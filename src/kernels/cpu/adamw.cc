#include "kernels/cpu/adamw.h"

#include <cmath>

namespace forge::cpu {

void AdamWUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a) {
  // Bias corrections in double: at step 1 with beta2 = 0.999 the float version loses digits.
  const float bc1 = static_cast<float>(1.0 - std::pow(double(a.beta1), double(a.step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(double(a.beta2), double(a.step)));
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * a.grad_scale;
    m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    const float mhat = m[i] / bc1;
    const float vhat = v[i] / bc2;
    p[i] -= a.lr * (mhat / (std::sqrt(vhat) + a.eps) + a.weight_decay * p[i]);
  }
}

double SumSquares(const float* g, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
  return s;
}

}  // namespace forge::cpu
