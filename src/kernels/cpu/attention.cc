#include "kernels/cpu/attention.h"

#include <algorithm>
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

// Rows of 32 queries (or keys) a work item: enough items to keep every thread busy at one
// sequence of a few heads, few enough that the hand-out costs nothing.
constexpr int64_t kRowsPerItem = 32;

// Work item `item` over (batch, head) pairs of `blocks` row blocks each: its pair's index and
// its rows [begin, end) of the sequence's T.
struct RowBlock {
  int64_t pair;
  int begin, end;
};
RowBlock RowBlockOf(int64_t item, int64_t blocks, int T) {
  const int begin = static_cast<int>((item % blocks) * kRowsPerItem);
  return {item / blocks, begin, static_cast<int>(std::min<int64_t>(T, begin + kRowsPerItem))};
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
  // One item per (batch, query head, block of query rows): each writes only its rows' out
  // columns and probs rows.
  const int64_t blocks = (T + kRowsPerItem - 1) / kRowsPerItem;
  ParallelFor(int64_t{B} * n_head * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const RowBlock rb = RowBlockOf(item, blocks, T);
      const int64_t bh = rb.pair;
      const int64_t b = bh / n_head;
      const int h = static_cast<int>(bh % n_head);
      const int kvh = h / group;
      const float* base = qkv + b * T * row;
      const int64_t q_off = int64_t{h} * hd;
      const int64_t k_off = int64_t{n_head + kvh} * hd;
      const int64_t v_off = int64_t{n_head + n_kv_head + kvh} * hd;
      float* P = probs + bh * T * T;
      for (int t = rb.begin; t < rb.end; ++t) {
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
  const int64_t blocks = (T + kRowsPerItem - 1) / kRowsPerItem;
  // dS[t][s] = P[t][s] (dP[t][s] - row_dot[t]) scale, dP[t][s] = g_t . v_s, row_dot[t] = sum over
  // s of P dP (in double). Two passes of independent items, each element summed in one fixed
  // order whatever the thread count:
  //   1. per (batch, query head, block of query rows): row_dot and dq_t = sum over s <= t
  //      (ascending) of dS[t][s] k_s;
  //   2. per (batch, kv head, block of key rows): dk_s and dv_s, summed over the group's query
  //      heads in order and, within a head, over t >= s ascending (dP recomputed).
  std::vector<float> row_dot(size_t(B) * n_head * T);
  ParallelFor(int64_t{B} * n_head * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> dp(T);
    for (int64_t item = begin; item < end; ++item) {
      const RowBlock rb = RowBlockOf(item, blocks, T);
      const int64_t bh = rb.pair;
      const int64_t b = bh / n_head;
      const int h = static_cast<int>(bh % n_head);
      const int kvh = h / group;
      const float* base = qkv + b * T * row;
      float* dbase = dqkv + b * T * row;
      const int64_t q_off = int64_t{h} * hd;
      const int64_t k_off = int64_t{n_head + kvh} * hd;
      const int64_t v_off = int64_t{n_head + n_kv_head + kvh} * hd;
      const float* P = probs + bh * int64_t{T} * T;
      for (int t = rb.begin; t < rb.end; ++t) {
        const float* p = P + int64_t{t} * T;
        const float* g = dout + (b * T + t) * int64_t{n_head} * hd + q_off;
        float* dq = dbase + t * row + q_off;
        double pdp = 0.0;
        for (int s = 0; s <= t; ++s) {
          dp[s] = Dot(g, base + s * row + v_off, hd);
          pdp += double(p[s]) * dp[s];
        }
        const float rd = static_cast<float>(pdp);
        row_dot[size_t(bh) * T + t] = rd;
        std::memset(dq, 0, sizeof(float) * hd);
        for (int s = 0; s <= t; ++s) {
          Axpy(dq, p[s] * (dp[s] - rd) * scale, base + s * row + k_off, hd);
        }
      }
    }
  });
  ParallelFor(int64_t{B} * n_kv_head * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const RowBlock rb = RowBlockOf(item, blocks, T);
      const int64_t b = rb.pair / n_kv_head;
      const int kvh = static_cast<int>(rb.pair % n_kv_head);
      const float* base = qkv + b * T * row;
      float* dbase = dqkv + b * T * row;
      const int64_t k_off = int64_t{n_head + kvh} * hd;
      const int64_t v_off = int64_t{n_head + n_kv_head + kvh} * hd;
      for (int s = rb.begin; s < rb.end; ++s) {
        float* dk = dbase + s * row + k_off;
        float* dv = dbase + s * row + v_off;
        std::memset(dk, 0, sizeof(float) * hd);
        std::memset(dv, 0, sizeof(float) * hd);
        const float* v = base + s * row + v_off;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          const int64_t q_off = int64_t{h} * hd;
          const int64_t bh = b * n_head + h;
          const float* P = probs + bh * int64_t{T} * T;
          for (int t = s; t < T; ++t) {
            const float p = P[int64_t{t} * T + s];
            const float* g = dout + (b * T + t) * int64_t{n_head} * hd + q_off;
            const float ds = p * (Dot(g, v, hd) - row_dot[size_t(bh) * T + t]) * scale;
            Axpy(dk, ds, base + t * row + q_off, hd);
            Axpy(dv, p, g, hd);
          }
        }
      }
    }
  });
}

}  // namespace forge::cpu
