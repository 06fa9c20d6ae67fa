// RMSNorm (CPU float32 reference): y = x / sqrt(mean(x^2) + eps) * w.
#pragma once
#include <cstdint>

namespace forge::cpu {

// out, x: [N, d]; w: [d]; rstd: [N] saved for backward (may be null).
void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t N, int d,
                    float eps);
// dx += d(loss)/dx  (accumulates: the residual stream's gradient flows through it)
// dw += d(loss)/dw
void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                     const float* rstd, int64_t N, int d);

}  // namespace forge::cpu
