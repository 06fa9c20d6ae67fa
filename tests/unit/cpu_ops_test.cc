// The CPU reference ops: forwards against naive double loops, backwards against central finite
// differences of a random projection of the output (loss = sum(out * R), so dout = R).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <random>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

namespace forge::cpu {
namespace {

using Vec = std::vector<float>;

Vec Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

double Project(const Vec& out, const Vec& r) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += double(out[i]) * double(r[i]);
  return s;
}

// Checks grad[i] == d loss / d x[i] by central differences for every element of x (the shapes
// here are small). loss() must read x.
void ExpectGradMatchesFiniteDiff(Vec* x, const Vec& grad, const std::function<double()>& loss,
                                 const char* what, float eps = 1e-2f, double rtol = 1e-2,
                                 double atol = 1e-3) {
  ASSERT_EQ(x->size(), grad.size());
  int bad = 0;
  for (size_t i = 0; i < x->size(); ++i) {
    const float saved = (*x)[i];
    (*x)[i] = saved + eps;
    const double lp = loss();
    (*x)[i] = saved - eps;
    const double lm = loss();
    (*x)[i] = saved;
    const double fd = (lp - lm) / (2.0 * double(eps));
    if (std::abs(fd - grad[i]) > atol + rtol * std::abs(fd)) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: analytic " << grad[i] << " vs finite diff " << fd;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << x->size() << " elements off";
}

TEST(CpuOpsMatmul, ForwardMatchesNaiveLoop) {
  const int N = 7, I = 13, O = 5;
  Vec x = Random(N * I, 1), w = Random(O * I, 2), out(N * O, 0.0f);
  MatmulForward(out.data(), x.data(), w.data(), N, I, O);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < O; ++o) {
      double s = 0.0;
      for (int i = 0; i < I; ++i) s += double(x[n * I + i]) * w[o * I + i];
      EXPECT_NEAR(out[n * O + o], s, 1e-5) << n << "," << o;
    }
  }
  // accumulate=true adds onto what is there.
  Vec acc(N * O, 1.5f);
  MatmulForward(acc.data(), x.data(), w.data(), N, I, O, /*accumulate=*/true);
  for (int i = 0; i < N * O; ++i) EXPECT_NEAR(acc[i], out[i] + 1.5f, 1e-5);
}

TEST(CpuOpsMatmul, BackwardMatchesFiniteDifferences) {
  const int N = 6, I = 9, O = 4;
  Vec x = Random(N * I, 3), w = Random(O * I, 4), r = Random(N * O, 5), out(N * O);
  auto loss = [&] {
    MatmulForward(out.data(), x.data(), w.data(), N, I, O);
    return Project(out, r);
  };
  Vec dx(N * I, 123.0f), dw(O * I, 0.0f);  // dx is overwritten, dw accumulated
  MatmulBackward(dx.data(), dw.data(), r.data(), x.data(), w.data(), N, I, O);
  ExpectGradMatchesFiniteDiff(&x, dx, loss, "dx");
  ExpectGradMatchesFiniteDiff(&w, dw, loss, "dw");

  // dw accumulates; accumulate_dx adds; null outputs are skipped.
  Vec dw2 = dw, dx2 = dx;
  MatmulBackward(dx2.data(), dw2.data(), r.data(), x.data(), w.data(), N, I, O,
                 /*accumulate_dx=*/true);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw2[i], 2 * dw[i], 1e-5);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx2[i], 2 * dx[i], 1e-5);
  Vec dw3 = dw;
  MatmulBackward(nullptr, dw3.data(), r.data(), x.data(), w.data(), N, I, O);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw3[i], 2 * dw[i], 1e-5);
}

TEST(CpuOpsEmbedding, LookupAndAccumulatingBackward) {
  const int V = 5, d = 3, N = 4;
  Vec wte = Random(V * d, 6);
  const int32_t tokens[N] = {2, 0, 2, 4};
  Vec out(N * d);
  EmbeddingForward(out.data(), tokens, wte.data(), N, d);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < d; ++j) EXPECT_EQ(out[n * d + j], wte[tokens[n] * d + j]);

  Vec dout = Random(N * d, 7), dwte(V * d, 1.0f);
  EmbeddingBackward(dwte.data(), dout.data(), tokens, N, d);
  for (int j = 0; j < d; ++j) {
    EXPECT_FLOAT_EQ(dwte[2 * d + j], 1.0f + dout[0 * d + j] + dout[2 * d + j]);  // repeated token
    EXPECT_FLOAT_EQ(dwte[0 * d + j], 1.0f + dout[1 * d + j]);
    EXPECT_FLOAT_EQ(dwte[4 * d + j], 1.0f + dout[3 * d + j]);
    EXPECT_EQ(dwte[1 * d + j], 1.0f);  // untouched rows keep their value
    EXPECT_EQ(dwte[3 * d + j], 1.0f);
  }
}

TEST(CpuOpsRmsNorm, ForwardMatchesDefinition) {
  const int N = 3, d = 8;
  const float eps = 1e-5f;
  Vec x = Random(N * d, 8), w = Random(d, 9), out(N * d), rstd(N);
  RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, d, eps);
  for (int n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int j = 0; j < d; ++j) ss += double(x[n * d + j]) * x[n * d + j];
    const double r = 1.0 / std::sqrt(ss / d + eps);
    EXPECT_NEAR(rstd[n], r, 1e-5 * r);
    for (int j = 0; j < d; ++j) EXPECT_NEAR(out[n * d + j], x[n * d + j] * r * w[j], 1e-5);
  }
}

TEST(CpuOpsRmsNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int N = 4, d = 16;
  const float eps = 1e-5f;
  Vec x = Random(N * d, 10), w = Random(d, 11, 0.5f), r = Random(N * d, 12), out(N * d), rstd(N);
  auto loss = [&] {
    RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, d, eps);
    return Project(out, r);
  };
  loss();
  Vec dx(N * d, 0.0f), dw(d, 0.0f);
  RmsNormBackward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, d);
  ExpectGradMatchesFiniteDiff(&x, dx, loss, "dx", 1e-3f);
  ExpectGradMatchesFiniteDiff(&w, dw, loss, "dw", 1e-3f);

  Vec dx2(N * d, 0.25f), dw2(d, -1.0f);
  RmsNormBackward(dx2.data(), dw2.data(), r.data(), x.data(), w.data(), rstd.data(), N, d);
  for (int i = 0; i < N * d; ++i) EXPECT_NEAR(dx2[i], dx[i] + 0.25f, 1e-5);
  for (int j = 0; j < d; ++j) EXPECT_NEAR(dw2[j], dw[j] - 1.0f, 1e-5);
}

TEST(CpuOpsRope, InverseUndoesApplyAndVIsUntouched) {
  const int B = 2, T = 9, H = 4, KV = 2, hd = 8;
  const int row = (H + 2 * KV) * hd;
  Vec x = Random(B * T * row, 13), y = x;
  RopeApply(y.data(), B, T, H, KV, hd, 10000.0f, false);
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < row; ++j) {
      const int i = b * T * row + j;  // position 0: the identity rotation
      EXPECT_EQ(y[i], x[i]);
    }
    for (int t = 0; t < T; ++t)
      for (int j = (H + KV) * hd; j < row; ++j) {
        const int i = (b * T + t) * row + j;
        EXPECT_EQ(y[i], x[i]) << "V must not rotate";
      }
  }
  double changed = 0.0;
  for (size_t i = 0; i < x.size(); ++i) changed += std::abs(y[i] - x[i]);
  EXPECT_GT(changed, 1.0);
  RopeApply(y.data(), B, T, H, KV, hd, 10000.0f, true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5) << i;
}

TEST(CpuOpsRope, MatchesInterleavedPairFormula) {
  const int B = 1, T = 5, H = 2, KV = 1, hd = 4;
  const int row = (H + 2 * KV) * hd;
  const float theta = 500.0f;
  Vec x = Random(B * T * row, 14), y = x;
  RopeApply(y.data(), B, T, H, KV, hd, theta, false);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H + KV; ++h) {
      for (int i = 0; i < hd / 2; ++i) {
        const double a = t * std::pow(double(theta), -2.0 * i / hd);
        const int k = t * row + h * hd + 2 * i;
        EXPECT_NEAR(y[k], x[k] * std::cos(a) - x[k + 1] * std::sin(a), 1e-5);
        EXPECT_NEAR(y[k + 1], x[k] * std::sin(a) + x[k + 1] * std::cos(a), 1e-5);
      }
    }
  }
}

// Llama 3.1 scaling: pairs of long wavelength slowed by the factor, short ones kept, the band
// between blended; numbers worked by hand for theta 100, hd 8 (frequencies 1, 100^-1/4,
// 100^-1/2, 100^-3/4) over 16 original positions, factor 4, low 1, high 4.
TEST(CpuOpsRope, Llama3ScalingBands) {
  RopeScalingConfig s;
  s.type = RopeScalingType::kLlama3;
  s.factor = 4.0f;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position_embeddings = 16;
  const std::vector<double> plain = RopeInverseFrequencies(8, 100.0);
  const std::vector<double> scaled = RopeInverseFrequencies(8, 100.0, s);
  ASSERT_EQ(scaled.size(), 4u);
  // Pair 0: wavelength 2 pi in [4, 16]: blended with s = (16 / 2 pi - 1) / 3.
  const double smooth = (16.0 / (2.0 * std::numbers::pi) - 1.0) / 3.0;
  EXPECT_NEAR(scaled[0], (1 - smooth) * 1.0 / 4.0 + smooth * 1.0, 1e-15);
  // Pairs 1-3: wavelengths 19.9, 62.8, 199 > 16: divided by the factor.
  for (int i = 1; i < 4; ++i) EXPECT_NEAR(scaled[i], plain[i] / 4.0, 1e-15) << i;
  // A high-frequency pair (wavelength < 16 / 4) keeps its frequency.
  s.original_max_position_embeddings = 2;  // thresholds 2, 0.5: pair 0 (6.28) is low-frequency
  EXPECT_NEAR(RopeInverseFrequencies(8, 100.0, s)[0], 0.25, 1e-15);
  s.original_max_position_embeddings = 64;  // thresholds 64 and 16: pair 0 is high-frequency
  EXPECT_EQ(RopeInverseFrequencies(8, 100.0, s)[0], 1.0);
  // The theta overload is the frequency overload with plain frequencies, bit for bit.
  const int B = 1, T = 7, H = 2, KV = 1, hd = 8, row = (H + 2 * KV) * hd;
  Vec x = Random(B * T * row, 19), a = x, b = x;
  RopeApply(a.data(), B, T, H, KV, hd, 100.0f, false);
  RopeApply(b.data(), B, T, H, KV, hd, plain.data(), false);
  EXPECT_EQ(a, b);
}

TEST(CpuOpsRope, InverseIsTheBackward) {
  const int B = 1, T = 6, H = 2, KV = 1, hd = 4;
  const int row = (H + 2 * KV) * hd;
  Vec x = Random(B * T * row, 15), r = Random(B * T * row, 16), y(x.size());
  auto loss = [&] {
    y = x;
    RopeApply(y.data(), B, T, H, KV, hd, 10000.0f, false);
    return Project(y, r);
  };
  Vec dx = r;
  RopeApply(dx.data(), B, T, H, KV, hd, 10000.0f, true);
  ExpectGradMatchesFiniteDiff(&x, dx, loss, "dx");
}

TEST(CpuOpsSwiGlu, ForwardAndBackward) {
  const int N = 5, ffn = 7;
  Vec gu = Random(N * 2 * ffn, 17, 2.0f), r = Random(N * ffn, 18), out(N * ffn);
  SwiGluForward(out.data(), gu.data(), N, ffn);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < ffn; ++j) {
      const double g = gu[n * 2 * ffn + j], u = gu[n * 2 * ffn + ffn + j];
      EXPECT_NEAR(out[n * ffn + j], g / (1.0 + std::exp(-g)) * u, 1e-5);
    }
  auto loss = [&] {
    SwiGluForward(out.data(), gu.data(), N, ffn);
    return Project(out, r);
  };
  Vec dgu(gu.size(), 99.0f);  // overwritten
  SwiGluBackward(dgu.data(), r.data(), gu.data(), N, ffn);
  ExpectGradMatchesFiniteDiff(&gu, dgu, loss, "dgate_up", 1e-3f);
}

// Naive causal GQA attention in double.
void NaiveAttention(std::vector<double>* out, const Vec& qkv, int B, int T, int H, int KV, int hd) {
  const int row = (H + 2 * KV) * hd;
  out->assign(size_t(B) * T * H * hd, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int kvh = h / (H / KV);
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300, sum = 0.0;
        for (int u = 0; u <= t; ++u) {
          double dot = 0.0;
          for (int j = 0; j < hd; ++j)
            dot += double(qkv[(b * T + t) * row + h * hd + j]) *
                   qkv[(b * T + u) * row + (H + kvh) * hd + j];
          s[u] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[u]);
        }
        for (double& v : s) sum += (v = std::exp(v - mx));
        for (int u = 0; u <= t; ++u)
          for (int j = 0; j < hd; ++j)
            (*out)[((b * T + t) * H + h) * hd + j] +=
                s[u] / sum * qkv[(b * T + u) * row + (H + KV + kvh) * hd + j];
      }
    }
}

void CheckAttention(int B, int T, int H, int KV, int hd, uint32_t seed) {
  const int row = (H + 2 * KV) * hd;
  Vec qkv = Random(size_t(B) * T * row, seed), out(size_t(B) * T * H * hd),
      probs(size_t(B) * H * T * T, -7.0f);
  AttentionForward(out.data(), probs.data(), qkv.data(), B, T, H, KV, hd);
  std::vector<double> ref;
  NaiveAttention(&ref, qkv, B, T, H, KV, hd);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-5) << i;
  for (int bh = 0; bh < B * H; ++bh)
    for (int t = 0; t < T; ++t) {
      double sum = 0.0;
      for (int u = 0; u < T; ++u) {
        const float p = probs[(size_t(bh) * T + t) * T + u];
        if (u > t) {
          EXPECT_EQ(p, 0.0f) << "upper triangle";
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }

  Vec r = Random(out.size(), seed + 1);
  auto loss = [&] {
    AttentionForward(out.data(), probs.data(), qkv.data(), B, T, H, KV, hd);
    return Project(out, r);
  };
  loss();
  Vec dqkv(qkv.size(), 42.0f);  // overwritten
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), probs.data(), B, T, H, KV, hd);
  ExpectGradMatchesFiniteDiff(&qkv, dqkv, loss, "dqkv", 1e-2f, 2e-2, 2e-3);
}

TEST(CpuOpsAttention, GqaForwardAndBackward) { CheckAttention(2, 5, 4, 2, 4, 19); }
TEST(CpuOpsAttention, MhaForwardAndBackward) { CheckAttention(1, 6, 2, 2, 8, 21); }
TEST(CpuOpsAttention, MqaForwardAndBackward) { CheckAttention(2, 4, 3, 1, 4, 23); }

TEST(CpuOpsAttention, DeterministicAcrossRuns) {
  const int B = 3, T = 16, H = 4, KV = 2, hd = 8;
  Vec qkv = Random(size_t(B) * T * (H + 2 * KV) * hd, 25), dout = Random(size_t(B) * T * H * hd, 26);
  Vec out1(dout.size()), out2(dout.size()), p1(size_t(B) * H * T * T), p2(p1.size());
  Vec d1(qkv.size()), d2(qkv.size());
  AttentionForward(out1.data(), p1.data(), qkv.data(), B, T, H, KV, hd);
  AttentionBackward(d1.data(), dout.data(), qkv.data(), p1.data(), B, T, H, KV, hd);
  AttentionForward(out2.data(), p2.data(), qkv.data(), B, T, H, KV, hd);
  AttentionBackward(d2.data(), dout.data(), qkv.data(), p2.data(), B, T, H, KV, hd);
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(d1, d2);
}

TEST(CpuOpsCrossEntropy, MatchesNaiveLogSoftmaxAndGradient) {
  const int N = 40, V = 33;  // enough rows to spread over threads
  Vec logits = Random(N * V, 27, 3.0f);
  std::vector<int32_t> tgt(N);
  for (int n = 0; n < N; ++n) tgt[n] = (n * 7) % V;
  Vec losses(N), dl(N * V);
  const float dloss = 0.25f;
  CrossEntropyForwardBackward(losses.data(), dl.data(), logits.data(), tgt.data(), N, V, dloss);
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, sum = 0.0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, double(logits[n * V + j]));
    for (int j = 0; j < V; ++j) sum += std::exp(logits[n * V + j] - mx);
    const double lse = mx + std::log(sum);
    EXPECT_NEAR(losses[n], lse - logits[n * V + tgt[n]], 1e-5);
    for (int j = 0; j < V; ++j) {
      const double p = std::exp(logits[n * V + j] - lse);
      EXPECT_NEAR(dl[n * V + j], (p - (j == tgt[n] ? 1.0 : 0.0)) * dloss, 1e-6);
    }
  }
  // dlogits may alias logits.
  Vec inplace = logits, losses2(N);
  CrossEntropyForwardBackward(losses2.data(), inplace.data(), inplace.data(), tgt.data(), N, V,
                              dloss);
  EXPECT_EQ(losses2, losses);
  EXPECT_EQ(inplace, dl);
  // Forward only.
  Vec losses3(N);
  CrossEntropyForwardBackward(losses3.data(), nullptr, logits.data(), tgt.data(), N, V, dloss);
  EXPECT_EQ(losses3, losses);
}

TEST(CpuOpsCrossEntropy, GradientMatchesFiniteDifferences) {
  const int N = 3, V = 11;
  Vec logits = Random(N * V, 29, 2.0f), losses(N), dl(N * V);
  const int32_t tgt[N] = {0, 10, 4};
  const float dloss = 1.0f / N;
  auto loss = [&] {
    CrossEntropyForwardBackward(losses.data(), nullptr, logits.data(), tgt, N, V, dloss);
    double s = 0.0;
    for (float l : losses) s += l;
    return s * dloss;
  };
  CrossEntropyForwardBackward(losses.data(), dl.data(), logits.data(), tgt, N, V, dloss);
  ExpectGradMatchesFiniteDiff(&logits, dl, loss, "dlogits", 1e-2f, 1e-2, 1e-4);
}

TEST(CpuOpsAdamW, OneStepMatchesHandComputation) {
  const AdamWParams a{/*lr=*/0.1f, /*beta1=*/0.9f, /*beta2=*/0.99f, /*eps=*/1e-8f,
                      /*weight_decay=*/0.5f, /*step=*/1, /*grad_scale=*/0.5f};
  Vec p = {1.0f, -2.0f, 0.5f}, g = {0.4f, -1.0f, 0.0f}, m(3, 0.0f), v(3, 0.0f);
  const Vec p0 = p;
  AdamWUpdate(p.data(), g.data(), m.data(), v.data(), 3, a);
  for (int i = 0; i < 3; ++i) {
    const double gi = g[i] * 0.5;
    const double mi = 0.1 * gi, vi = 0.01 * gi * gi;
    EXPECT_NEAR(m[i], mi, 1e-7);
    EXPECT_NEAR(v[i], vi, 1e-8);
    // Step 1: mhat = g, vhat = g^2, so the Adam part is sign(g) (0 where g = 0).
    const double mhat = mi / 0.1, vhat = vi / 0.01;
    const double expect = p0[i] - 0.1 * (mhat / (std::sqrt(vhat) + 1e-8) + 0.5 * p0[i]);
    EXPECT_NEAR(p[i], expect, 1e-6) << i;
  }
  EXPECT_NEAR(p[0], 1.0 - 0.1 * (1.0 + 0.5), 1e-6);
  EXPECT_NEAR(p[2], 0.5 - 0.1 * 0.25, 1e-6);
  EXPECT_NEAR(SumSquares(g.data(), 3), 0.16 + 1.0, 1e-7);
}

}  // namespace
}  // namespace forge::cpu
