#include "kernels/cpu/rmsnorm.h"

#include <cmath>

namespace forge::cpu {

void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t N, int d,
                    float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * d;
    float* yr = out + n * d;
    double ss = 0.0;
    for (int j = 0; j < d; ++j) ss += double(xr[j]) * double(xr[j]);
    const float r = static_cast<float>(1.0 / std::sqrt(ss / d + double(eps)));
    for (int j = 0; j < d; ++j) yr[j] = xr[j] * r * w[j];
    if (rstd) rstd[n] = r;
  }
}

void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                     const float* rstd, int64_t N, int d) {
  // y = x r w with r = (mean(x^2) + eps)^-1/2:
  //   dx = r (w dy) - x r^3 / d * sum_j(w dy x)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * d;
    const float* gr = dout + n * d;
    float* dxr = dx + n * d;
    const float r = rstd[n];
    double dot = 0.0;
    for (int j = 0; j < d; ++j) dot += double(w[j]) * double(gr[j]) * double(xr[j]);
    const float c = static_cast<float>(dot * double(r) * double(r) * double(r) / d);
    for (int j = 0; j < d; ++j) {
      dxr[j] += r * w[j] * gr[j] - c * xr[j];
      dw[j] += gr[j] * xr[j] * r;
    }
  }
}

}  // namespace forge::cpu
