#include "kernels/cpu/rope.h"

#include <cmath>
#include <numbers>
#include <vector>

namespace forge::cpu {

namespace {

// cos and sin of position t's angles for pairs i < hd/2.
void Angles(int64_t t, int hd, const double* inv_freq, bool inverse, float* c, float* s) {
  for (int i = 0; i < hd / 2; ++i) {
    const double a = double(t) * inv_freq[i];
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

std::vector<double> RopeInverseFrequencies(int hd, double theta,
                                           const RopeScalingConfig& scaling) {
  std::vector<double> f(hd / 2);
  for (int i = 0; i < hd / 2; ++i) f[i] = std::pow(theta, -2.0 * i / hd);
  if (scaling.type == RopeScalingType::kNone) return f;
  const double factor = scaling.factor, low = scaling.low_freq_factor,
               high = scaling.high_freq_factor,
               original = scaling.original_max_position_embeddings;
  const double low_wavelen = original / low;
  const double high_wavelen = original / high;
  for (double& x : f) {
    const double wavelen = 2.0 * std::numbers::pi / x;
    if (wavelen > low_wavelen) {
      x /= factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (original / wavelen - low) / (high - low);
      x = (1.0 - smooth) * x / factor + smooth * x;
    }
  }
  return f;
}

void RopeApply(float* qkv, int B, int T, int n_head, int n_kv_head, int hd,
               const double* inv_freq, bool inverse) {
  const int half = hd / 2;
  std::vector<float> cos_t(size_t(T) * half), sin_t(size_t(T) * half);
  for (int t = 0; t < T; ++t)
    Angles(t, hd, inv_freq, inverse, cos_t.data() + size_t(t) * half,
           sin_t.data() + size_t(t) * half);
  const int64_t row = int64_t{n_head + 2 * n_kv_head} * hd;
  for (int64_t b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      RotateRow(qkv + (b * T + t) * row, n_head + n_kv_head, hd, cos_t.data() + size_t(t) * half,
                sin_t.data() + size_t(t) * half);
    }
  }
}

void RopeApply(float* qkv, int B, int T, int n_head, int n_kv_head, int hd, float theta,
               bool inverse) {
  const std::vector<double> f = RopeInverseFrequencies(hd, theta);
  RopeApply(qkv, B, T, n_head, n_kv_head, hd, f.data(), inverse);
}

void RopeApplyAtPositions(float* qkv, const int32_t* positions, int64_t N, int n_head,
                          int n_kv_head, int hd, const double* inv_freq) {
  std::vector<float> c(hd / 2), s(hd / 2);
  const int64_t row = int64_t{n_head + 2 * n_kv_head} * hd;
  for (int64_t n = 0; n < N; ++n) {
    Angles(positions[n], hd, inv_freq, /*inverse=*/false, c.data(), s.data());
    RotateRow(qkv + n * row, n_head + n_kv_head, hd, c.data(), s.data());
  }
}

void RopeApplyAtPositions(float* qkv, const int32_t* positions, int64_t N, int n_head,
                          int n_kv_head, int hd, float theta) {
  const std::vector<double> f = RopeInverseFrequencies(hd, theta);
  RopeApplyAtPositions(qkv, positions, N, n_head, n_kv_head, hd, f.data());
}

}  // namespace forge::cpu
