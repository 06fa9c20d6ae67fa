#include "kernels/cpu/attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/parallel_for.h"

namespace forge::cpu {
namespace {

float Dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Axpy(float* y, float a, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

float SoftmaxNumerators(float* p, int n, float mx) {
  double sum = 0.0;
  for (int s = 0; s < n; ++s) {
    p[s] = std::exp(p[s] - mx);
    sum += p[s];
  }
  return static_cast<float>(1.0 / sum);
}

void AttentionForward(float* out, float* probs, const float* qkv, int B, int T, int n_head,
                      int n_kv_head, int hd) {
  const int64_t row = int64_t{n_head + 2 * n_kv_head} * hd;
  const int group = n_head / n_kv_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // One item per (batch, query head): each writes only its own out columns and probs block.
  ParallelFor(int64_t{B} * n_head, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / n_head;
      const int h = static_cast<int>(item % n_head);
      const int kvh = h / group;
      const float* base = qkv + b * T * row;
      const int64_t q_off = int64_t{h} * hd;
      const int64_t k_off = int64_t{n_head + kvh} * hd;
      const int64_t v_off = int64_t{n_head + n_kv_head + kvh} * hd;
      float* P = probs + item * T * T;
      for (int t = 0; t < T; ++t) {
        const float* q = base + t * row + q_off;
        float* p = P + int64_t{t} * T;
        float mx = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          p[s] = Dot(q, base + s * row + k_off, hd) * scale;
          mx = std::max(mx, p[s]);
        }
        const float inv = SoftmaxNumerators(p, t + 1, mx);
        for (int s = 0; s <= t; ++s) p[s] *= inv;
        for (int s = t + 1; s < T; ++s) p[s] = 0.0f;
        float* o = out + (b * T + t) * int64_t{n_head} * hd + q_off;
        std::memset(o, 0, sizeof(float) * hd);
        for (int s = 0; s <= t; ++s) Axpy(o, p[s], base + s * row + v_off, hd);
      }
    }
  });
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                       int B, int T, int n_head, int n_kv_head, int hd) {
  const int64_t row = int64_t{n_head + 2 * n_kv_head} * hd;
  const int group = n_head / n_kv_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // One item per (batch, kv head): the query heads sharing a kv head all add into its dk/dv,
  // so they are handled by the same item in head order (deterministic, no races).
  ParallelFor(int64_t{B} * n_kv_head, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> dp(T);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / n_kv_head;
      const int kvh = static_cast<int>(item % n_kv_head);
      const float* base = qkv + b * T * row;
      float* dbase = dqkv + b * T * row;
      const int64_t k_off = int64_t{n_head + kvh} * hd;
      const int64_t v_off = int64_t{n_head + n_kv_head + kvh} * hd;
      for (int t = 0; t < T; ++t) {
        std::memset(dbase + t * row + k_off, 0, sizeof(float) * hd);
        std::memset(dbase + t * row + v_off, 0, sizeof(float) * hd);
      }
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const int64_t q_off = int64_t{h} * hd;
        const float* P = probs + (b * n_head + h) * int64_t{T} * T;
        for (int t = 0; t < T; ++t) {
          const float* p = P + int64_t{t} * T;
          const float* q = base + t * row + q_off;
          const float* g = dout + (b * T + t) * int64_t{n_head} * hd + q_off;
          float* dq = dbase + t * row + q_off;
          // dS = P * (dP - sum(P dP)), dP[s] = g . v_s
          double pdp = 0.0;
          for (int s = 0; s <= t; ++s) {
            dp[s] = Dot(g, base + s * row + v_off, hd);
            pdp += double(p[s]) * dp[s];
          }
          const float row_dot = static_cast<float>(pdp);
          std::memset(dq, 0, sizeof(float) * hd);
          for (int s = 0; s <= t; ++s) {
            const float ds = p[s] * (dp[s] - row_dot) * scale;
            Axpy(dq, ds, base + s * row + k_off, hd);
            Axpy(dbase + s * row + k_off, ds, q, hd);
            Axpy(dbase + s * row + v_off, p[s], g, hd);
          }
        }
      }
    }
  });
}

}  // namespace forge::cpu
