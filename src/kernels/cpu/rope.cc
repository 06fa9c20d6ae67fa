#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace forge::cpu {

void RopeApply(float* qkv, int B, int T, int n_head, int n_kv_head, int hd, float theta,
               bool inverse) {
  const int half = hd / 2;
  // Angles in double: the reference should carry no error of its own at long positions.
  std::vector<float> cos_t(size_t(T) * half), sin_t(size_t(T) * half);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      const double inv_freq = std::pow(double(theta), -2.0 * i / hd);
      const double a = double(t) * inv_freq;
      cos_t[size_t(t) * half + i] = static_cast<float>(std::cos(a));
      sin_t[size_t(t) * half + i] = static_cast<float>(inverse ? -std::sin(a) : std::sin(a));
    }
  }
  const int64_t row = int64_t{n_head + 2 * n_kv_head} * hd;
  const int rotated_heads = n_head + n_kv_head;  // Q heads then K heads; V is left alone
  for (int64_t b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* r = qkv + (b * T + t) * row;
      const float* c = cos_t.data() + size_t(t) * half;
      const float* s = sin_t.data() + size_t(t) * half;
      for (int h = 0; h < rotated_heads; ++h) {
        float* x = r + int64_t{h} * hd;
        for (int i = 0; i < half; ++i) {
          const float x0 = x[2 * i], x1 = x[2 * i + 1];
          x[2 * i] = x0 * c[i] - x1 * s[i];
          x[2 * i + 1] = x0 * s[i] + x1 * c[i];
        }
      }
    }
  }
}

}  // namespace forge::cpu
