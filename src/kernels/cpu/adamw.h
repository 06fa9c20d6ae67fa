// AdamW with decoupled weight decay (CPU float32 reference), as torch.optim.AdamW:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + lr * wd * p
// g is the raw gradient times grad_scale (the clipping factor).
#pragma once
#include <cstdint>

namespace forge::cpu {

struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;        // 1-based, for bias correction
  float grad_scale;    // multiplies g (global-norm clipping)
};

void AdamWUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamWParams& a);

// Sum of squares of g (double accumulation, for the global grad norm).
double SumSquares(const float* g, int64_t n);

}  // namespace forge::cpu
