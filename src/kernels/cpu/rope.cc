#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace forge::cpu {

namespace {

// cos and sin of position t's angles for pairs i < hd/2. Angles in double: the reference should
// carry no error of its own at long positions.
void Angles(int64_t t, int hd, float theta, bool inverse, float* c, float* s) {
  for (int i = 0; i < hd / 2; ++i) {
    const double inv_freq = std::pow(double(theta), -2.0 * i / hd);
    const double a = double(t) * inv_freq;
    c[i] = static_cast<float>(std::cos(a));
    s[i] = static_cast<float>(inverse ? -std::sin(a) : std::sin(a));
  }
}

// Rotates the Q heads then the K heads of one qkv row (V is left alone).
void RotateRow(float* r, int rotated_heads, int hd, const float* c, const float* s) {
  for (int h = 0; h < rotated_heads; ++h) {
    float* x = r + int64_t{h} * hd;
    for (int i = 0; i < hd / 2; ++i) {
      const float x0 = x[2 * i], x1 = x[2 * i + 1];
      x[2 * i] = x0 * c[i] - x1 * s[i];
      x[2 * i + 1] = x0 * s[i] + x1 * c[i];
    }
  }
}

}  // namespace

void RopeApply(float* qkv, int B, int T, int n_head, int n_kv_head, int hd, float theta,
               bool inverse) {
  const int half = hd / 2;
  std::vector<float> cos_t(size_t(T) * half), sin_t(size_t(T) * half);
  for (int t = 0; t < T; ++t)
    Angles(t, hd, theta, inverse, cos_t.data() + size_t(t) * half, sin_t.data() + size_t(t) * half);
  const int64_t row = int64_t{n_head + 2 * n_kv_head} * hd;
  for (int64_t b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      RotateRow(qkv + (b * T + t) * row, n_head + n_kv_head, hd, cos_t.data() + size_t(t) * half,
                sin_t.data() + size_t(t) * half);
    }
  }
}

void RopeApplyAtPositions(float* qkv, const int32_t* positions, int64_t N, int n_head,
                          int n_kv_head, int hd, float theta) {
  std::vector<float> c(hd / 2), s(hd / 2);
  const int64_t row = int64_t{n_head + 2 * n_kv_head} * hd;
  for (int64_t n = 0; n < N; ++n) {
    Angles(positions[n], hd, theta, /*inverse=*/false, c.data(), s.data());
    RotateRow(qkv + n * row, n_head + n_kv_head, hd, c.data(), s.data());
  }
}

}  // namespace forge::cpu
