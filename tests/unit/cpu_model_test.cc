// The whole CPU reference model: forward against an independent double-precision loop version
// of the anchor's architecture, backward against finite differences (for each architecture
// knob: QK-norm, head_dim apart from d_model / n_head, GQA 4:1, an untied LM head, Llama 3.1
// RoPE scaling, and all of them at once), plus init, gradient accumulation, determinism and a
// can-it-learn check.
#include "worker/model/cpu_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "../common/tiny_fixtures.h"
#include "kernels/cpu/adamw.h"
#include "worker/model/init.h"

namespace forge {
namespace {

// The CPU trainer tests' tiny model at T 16, with a vocabulary of 256.
ModelConfig TinyConfig(bool qk_norm) {
  ModelConfig m = test::TinyCpuModel(/*seq_len=*/16);
  m.vocab = 256;
  m.qk_norm = qk_norm;
  return m;
}

// One architecture the model tests run: TinyConfig with some knobs changed.
struct Arch {
  const char* name;
  bool qk_norm = false;
  int head_dim = 0;  // 0: d_model / n_head (8)
  int n_head = 4, n_kv_head = 2;
  bool tied = true;
  bool rope_scaling = false;
};

const Arch kArchs[] = {
    {"Plain"},
    {"QkNorm", true},
    {"HeadDim", false, 16},                        // attention width 64 over d_model 32
    {"Gqa4to1", false, 0, 8, 2},                   // head_dim 4 = 32 / 8
    {"Untied", false, 0, 4, 2, false},
    {"RopeScaling", false, 0, 4, 2, true, true},
    {"All", true, 12, 8, 2, false, true},          // attention width 96
};

ModelConfig ArchConfig(const Arch& a) {
  ModelConfig m = TinyConfig(a.qk_norm);
  m.explicit_head_dim = a.head_dim;
  m.n_head = a.n_head;
  m.n_kv_head = a.n_kv_head;
  m.tie_embeddings = a.tied;
  if (a.rope_scaling) {
    // Thresholds at wavelengths 16 / 1 and 16 / 4 over seq_len 16, theta 100: pair 0 (wavelength
    // 2 pi) is blended, the others are divided by the factor.
    m.rope_theta = 100.0f;
    m.rope_scaling.type = RopeScalingType::kLlama3;
    m.rope_scaling.factor = 4.0f;
    m.rope_scaling.low_freq_factor = 1.0f;
    m.rope_scaling.high_freq_factor = 4.0f;
    m.rope_scaling.original_max_position_embeddings = 16;
  }
  return m;
}

std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = dist(rng);
  return t;
}

// Weights far from init (matrices N(0, std), norm weights 1 + N(0, std)) so that every
// parameter visibly changes the loss.
UnitBuffers RandomParams(const ParamLayout& layout, float std, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, std);
  UnitBuffers p(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    p[u].resize(layout.units[u].numel);
    for (const auto& t : layout.units[u].tensors)
      for (int64_t i = 0; i < t.numel; ++i)
        p[u][t.offset + i] = (t.is_matmul ? 0.0f : 1.0f) + dist(rng);
  }
  return p;
}

UnitBuffers ZerosLike(const UnitBuffers& p) {
  UnitBuffers g(p.size());
  for (size_t u = 0; u < p.size(); ++u) g[u].assign(p[u].size(), 0.0f);
  return g;
}

// ---- independent reference: the anchor's forward written as plain double loops -----------

using Mat = std::vector<double>;  // row-major

Mat RmsNorm(const Mat& x, int rows, int d, const float* w, double eps) {
  Mat y(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int j = 0; j < d; ++j) ss += x[r * d + j] * x[r * d + j];
    const double s = 1.0 / std::sqrt(ss / d + eps);
    for (int j = 0; j < d; ++j) y[r * d + j] = x[r * d + j] * s * w[j];
  }
  return y;
}

Mat Linear(const Mat& x, int rows, int in, const float* w, int out) {  // x W^T
  Mat y(size_t(rows) * out, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o)
      for (int i = 0; i < in; ++i) y[r * out + o] += x[r * in + i] * w[o * in + i];
  return y;
}

// RoPE's frequency of pair i, with Llama 3.1's scaling written as transformers writes it
// (wavelength thresholds, then the blend of the middle band).
double RopeFrequency(const ModelConfig& m, int i) {
  const int hd = m.head_dim();
  const double f = std::pow(double(m.rope_theta), -2.0 * i / hd);
  if (m.rope_scaling.type == RopeScalingType::kNone) return f;
  const RopeScalingConfig& r = m.rope_scaling;
  const double old_len = r.original_max_position_embeddings;
  const double wavelen = 2.0 * std::numbers::pi / f;
  const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
  const double scaled = wavelen > low_wavelen ? f / r.factor : f;
  const double smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const double smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
  return medium ? smoothed : scaled;
}

double ReferenceLoss(const ModelConfig& m, const ParamLayout& layout, const UnitBuffers& p,
                     const std::vector<int32_t>& in, const std::vector<int32_t>& tgt, int B) {
  const int T = m.seq_len, d = m.d_model, H = m.n_head, KV = m.n_kv_head, hd = m.head_dim();
  const int V = m.padded_vocab(), N = B * T, qkv_dim = (H + 2 * KV) * hd;
  const BlockOffsets& o = layout.block;
  const float* wte = p[0].data();
  Mat x(size_t(N) * d);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < d; ++j) x[n * d + j] = wte[in[n] * d + j];
  for (int l = 0; l < m.n_layer; ++l) {
    const float* w = p[layout.block_unit(l)].data();
    Mat qkv = Linear(RmsNorm(x, N, d, w + o.attn_norm, m.norm_eps), N, d, w + o.wqkv, qkv_dim);
    auto head = [&](int n, int h) { return &qkv[size_t(n) * qkv_dim + size_t(h) * hd]; };
    for (int n = 0; n < N; ++n) {
      const int t = n % T;
      for (int h = 0; h < H + KV; ++h) {
        double* v = head(n, h);
        if (m.qk_norm) {
          const float* g = w + (h < H ? o.q_norm : o.k_norm);
          Mat one(v, v + hd);
          one = RmsNorm(one, 1, hd, g, m.norm_eps);
          std::copy(one.begin(), one.end(), v);
        }
        for (int i = 0; i < hd / 2; ++i) {
          const double a = t * RopeFrequency(m, i);
          const double x0 = v[2 * i], x1 = v[2 * i + 1];
          v[2 * i] = x0 * std::cos(a) - x1 * std::sin(a);
          v[2 * i + 1] = x0 * std::sin(a) + x1 * std::cos(a);
        }
      }
    }
    Mat att(size_t(N) * H * hd, 0.0);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t <= T - 1; ++t) {
          const int kvh = h / (H / KV);
          std::vector<double> s(t + 1);
          double mx = -1e300, sum = 0.0;
          for (int u = 0; u <= t; ++u) {
            double dot = 0.0;
            for (int j = 0; j < hd; ++j) dot += head(b * T + t, h)[j] * head(b * T + u, H + kvh)[j];
            s[u] = dot / std::sqrt(double(hd));
            mx = std::max(mx, s[u]);
          }
          for (double& e : s) sum += (e = std::exp(e - mx));
          for (int u = 0; u <= t; ++u)
            for (int j = 0; j < hd; ++j)
              att[(size_t(b * T + t) * H + h) * hd + j] += s[u] / sum * head(b * T + u, H + KV + kvh)[j];
        }
    Mat proj = Linear(att, N, H * hd, w + o.wo, d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
    Mat gu = Linear(RmsNorm(x, N, d, w + o.mlp_norm, m.norm_eps), N, d, w + o.w_gate_up, 2 * m.ffn);
    Mat sw(size_t(N) * m.ffn);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < m.ffn; ++j) {
        const double g = gu[size_t(n) * 2 * m.ffn + j], u = gu[size_t(n) * 2 * m.ffn + m.ffn + j];
        sw[size_t(n) * m.ffn + j] = g / (1.0 + std::exp(-g)) * u;
      }
    Mat down = Linear(sw, N, m.ffn, w + o.w_down, d);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  // The LM head: the embedding when tied, else the lm_head tensor (found by name).
  const float* head = wte;
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (const TensorSlot& t : layout.units[u].tensors)
      if (t.name == "lm_head") head = p[u].data() + t.offset;
  EXPECT_EQ(head == wte, m.tie_embeddings);
  Mat logits = Linear(RmsNorm(x, N, d, p[layout.final_norm_unit()].data(), m.norm_eps), N, d, head, V);
  double loss = 0.0;
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, sum = 0.0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[size_t(n) * V + v]);
    for (int v = 0; v < V; ++v) sum += std::exp(logits[size_t(n) * V + v] - mx);
    loss += mx + std::log(sum) - logits[size_t(n) * V + tgt[n]];
  }
  return loss / N;
}

class CpuModelArch : public ::testing::TestWithParam<Arch> {};

TEST_P(CpuModelArch, ForwardMatchesDoubleReference) {
  const ModelConfig m = ArchConfig(GetParam());
  const int B = 2, N = B * m.seq_len;
  CpuModel model(m, B);
  const UnitBuffers p = RandomParams(model.layout(), 0.3f, 1);
  const auto in = RandomTokens(N, m.vocab, 2), tgt = RandomTokens(N, m.vocab, 3);
  const float loss = model.Forward(p, in.data(), tgt.data(), B);
  const double ref = ReferenceLoss(m, model.layout(), p, in, tgt, B);
  EXPECT_GT(std::abs(ref - std::log(256.0)), 0.5) << "weights too close to uniform output";
  EXPECT_NEAR(loss, ref, 1e-4 * ref);
}

// Central finite differences of Forward's loss for a few elements of every tensor of every
// unit. The loss is a float (ulp ~5e-7 near ln 256), so eps is large and the tolerance has an
// absolute floor of a few loss-ulps / (2 eps).
TEST_P(CpuModelArch, GradientsMatchFiniteDifferences) {
  const ModelConfig m = ArchConfig(GetParam());
  const int B = 2, N = B * m.seq_len;
  CpuModel model(m, B);
  const ParamLayout& layout = model.layout();
  UnitBuffers p = RandomParams(layout, 0.2f, 4);
  const auto in = RandomTokens(N, m.vocab, 5), tgt = RandomTokens(N, m.vocab, 6);
  UnitBuffers g = ZerosLike(p);
  model.Forward(p, in.data(), tgt.data(), B);
  const float dloss = 0.7f;  // the gradient must scale with dloss
  model.Backward(p, dloss, &g);

  std::mt19937 rng(7);
  const float eps = 1e-2f;
  int checked = 0;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    for (const TensorSlot& t : layout.units[u].tensors) {
      double gmax = 0.0;
      for (int64_t i = 0; i < t.numel; ++i) gmax = std::max(gmax, std::abs(double(g[u][t.offset + i])));
      ASSERT_GT(gmax, 1e-5) << t.name << ": no gradient at all";
      std::vector<int64_t> picks;
      std::uniform_int_distribution<int64_t> pick(0, t.numel - 1);
      for (int k = 0; k < 5; ++k) picks.push_back(t.offset + pick(rng));
      if (t.name == "wte") picks.push_back(int64_t{in[0]} * m.d_model + 3);  // a used row
      for (int64_t i : picks) {
        const float saved = p[u][i];
        p[u][i] = saved + eps;
        const double lp = model.Forward(p, in.data(), tgt.data(), B);
        p[u][i] = saved - eps;
        const double lm = model.Forward(p, in.data(), tgt.data(), B);
        p[u][i] = saved;
        const double fd = dloss * (lp - lm) / (2.0 * eps);
        EXPECT_NEAR(g[u][i], fd, 0.02 * std::abs(fd) + 5e-5)
            << t.name << " element " << i - t.offset << " (max |grad| " << gmax << ")";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 40);
}

TEST_P(CpuModelArch, GradientAccumulationSumsMicroSteps) {
  const ModelConfig m = ArchConfig(GetParam());
  const int B = 2, N = B * m.seq_len;
  CpuModel model(m, B);
  UnitBuffers p = RandomParams(model.layout(), 0.2f, 8);
  const auto in = RandomTokens(N, m.vocab, 9), tgt = RandomTokens(N, m.vocab, 10);
  UnitBuffers half = ZerosLike(p), full = ZerosLike(p), replay = ZerosLike(p);
  model.Forward(p, in.data(), tgt.data(), B);
  model.Backward(p, 0.5f, &half);
  model.Backward(p, 0.5f, &half);  // Backward can run twice on one Forward
  model.Forward(p, in.data(), tgt.data(), B);
  model.Backward(p, 1.0f, &full);
  for (int k = 0; k < 2; ++k) {  // the gradient-accumulation loop shape
    model.Forward(p, in.data(), tgt.data(), B);
    model.Backward(p, 0.5f, &replay);
  }
  for (size_t u = 0; u < p.size(); ++u) {
    double gmax = 0.0;
    for (float x : full[u]) gmax = std::max(gmax, double(std::abs(x)));
    ASSERT_GT(gmax, 0.0);
    for (size_t i = 0; i < p[u].size(); ++i) {
      ASSERT_NEAR(half[u][i], full[u][i], 1e-5 * gmax) << "unit " << u << " element " << i;
      ASSERT_EQ(half[u][i], replay[u][i]) << "unit " << u << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpuModel, CpuModelArch, ::testing::ValuesIn(kArchs),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CpuModelInit, LossAtInitIsLogPaddedVocab) {
  for (int vocab : {256, 200}) {  // 200 pads to 256: the padded rows share the softmax
    ModelConfig m = TinyConfig(false);
    m.vocab = vocab;
    const int B = 2, N = B * m.seq_len;
    CpuModel model(m, B);
    UnitBuffers p;
    InitParams(m, model.layout(), 42, &p);
    const auto in = RandomTokens(N, vocab, 11), tgt = RandomTokens(N, vocab, 12);
    const float loss = model.Forward(p, in.data(), tgt.data(), B);
    EXPECT_NEAR(loss, std::log(double(m.padded_vocab())), 0.05) << "vocab " << vocab;
  }
}

// model.init torch: PyTorch's module defaults, as the anchor builds its model.
TEST(CpuModelInit, TorchSchemeIsPyTorchsModuleDefaults) {
  ModelConfig m = TinyConfig(true);
  m.n_layer = 2;
  m.d_model = 64;
  m.ffn = 192;
  m.init = InitScheme::kTorch;
  const ParamLayout layout = MakeParamLayout(m);
  UnitBuffers p;
  InitParams(m, layout, 3, &p);
  UnitBuffers again;
  InitParams(m, layout, 3, &again);
  EXPECT_EQ(p, again);  // counter-based: the same seed, the same weights
  for (size_t u = 0; u < layout.units.size(); ++u) {
    for (const TensorSlot& t : layout.units[u].tensors) {
      const float* x = p[u].data() + t.offset;
      if (!t.is_matmul) {
        for (int64_t i = 0; i < t.numel; ++i) ASSERT_EQ(x[i], 1.0f) << t.name;
        continue;
      }
      double s = 0.0, ss = 0.0, big = 0.0;
      for (int64_t i = 0; i < t.numel; ++i) {
        s += x[i], ss += double(x[i]) * x[i], big = std::max(big, double(std::fabs(x[i])));
      }
      const double mean = s / t.numel, sd = std::sqrt(ss / t.numel - mean * mean);
      if (t.name == "wte") {  // nn.Embedding: N(0, 1)
        EXPECT_NEAR(sd, 1.0, 0.03) << t.name;
        EXPECT_GT(big, 3.0) << t.name;  // a normal's tail, not a bounded uniform
        continue;
      }
      // nn.Linear: U(-b, b), b = 1/sqrt(fan_in), fan_in the inner dimension (d or ffn).
      const double b = 1.0 / std::sqrt(double(t.shape.back()));
      EXPECT_LE(big, b) << t.name;
      EXPECT_GT(big, 0.99 * b) << t.name;
      EXPECT_NEAR(sd, b / std::sqrt(3.0), 0.03 * b) << t.name;
      EXPECT_NEAR(mean, 0.0, 5.0 * b / std::sqrt(3.0 * t.numel)) << t.name;
    }
  }
}

TEST(CpuModelInit, DistributionPerTensorKind) {
  ModelConfig m = TinyConfig(true);
  m.n_layer = 4;
  m.d_model = 64;
  const ParamLayout layout = MakeParamLayout(m);
  UnitBuffers p;
  InitParams(m, layout, 3, &p);
  ASSERT_EQ(p.size(), layout.units.size());
  const double resid = m.init_std / std::sqrt(2.0 * m.n_layer);
  for (size_t u = 0; u < layout.units.size(); ++u) {
    ASSERT_EQ(int64_t(p[u].size()), layout.units[u].numel);
    for (const TensorSlot& t : layout.units[u].tensors) {
      const float* x = p[u].data() + t.offset;
      if (!t.is_matmul) {
        for (int64_t i = 0; i < t.numel; ++i) ASSERT_EQ(x[i], 1.0f) << t.name;
        continue;
      }
      double s = 0.0, ss = 0.0;
      for (int64_t i = 0; i < t.numel; ++i) s += x[i], ss += double(x[i]) * x[i];
      const double mean = s / t.numel, sd = std::sqrt(ss / t.numel - mean * mean);
      const bool is_resid = t.name.ends_with("attn.wo") || t.name.ends_with("mlp.w_down");
      const double want = is_resid ? resid : m.init_std;
      EXPECT_NEAR(sd, want, 0.06 * want) << t.name;
      EXPECT_NEAR(mean, 0.0, 5.0 * want / std::sqrt(double(t.numel))) << t.name;
    }
  }
}

TEST(CpuModelInit, SameSeedSameWeightsAndLoss) {
  const ModelConfig m = TinyConfig(true);
  const int B = 2, N = B * m.seq_len;
  const ParamLayout layout = MakeParamLayout(m);
  UnitBuffers a, b, c;
  InitParams(m, layout, 1234, &a);
  InitParams(m, layout, 1234, &b);
  InitParams(m, layout, 1235, &c);
  EXPECT_EQ(a, b);
  EXPECT_NE(a[1], c[1]);
  EXPECT_NE(a[0], c[0]);
  EXPECT_NE(a[1], a[2]) << "blocks must get different weights";

  const auto in = RandomTokens(N, m.vocab, 13), tgt = RandomTokens(N, m.vocab, 14);
  CpuModel m1(m, B), m2(m, B);
  const float l1 = m1.Forward(a, in.data(), tgt.data(), B);
  const float l2 = m2.Forward(b, in.data(), tgt.data(), B);
  EXPECT_EQ(l1, l2);
  UnitBuffers g1 = ZerosLike(a), g2 = ZerosLike(a);
  m1.Backward(a, 1.0f, &g1);
  m2.Backward(b, 1.0f, &g2);
  EXPECT_EQ(g1, g2);
}

TEST(CpuModelTrain, OverfitsOneBatch) {
  const ModelConfig m = TinyConfig(true);
  const int B = 2, N = B * m.seq_len;
  CpuModel model(m, B);
  const ParamLayout& layout = model.layout();
  UnitBuffers p;
  InitParams(m, layout, 99, &p);
  UnitBuffers mom = ZerosLike(p), var = ZerosLike(p);
  const auto in = RandomTokens(N, m.vocab, 15), tgt = RandomTokens(N, m.vocab, 16);
  float first = 0.0f, last = 0.0f;
  for (int step = 1; step <= 100; ++step) {
    UnitBuffers g = ZerosLike(p);
    last = model.Forward(p, in.data(), tgt.data(), B);
    if (step == 1) first = last;
    model.Backward(p, 1.0f, &g);
    const cpu::AdamWParams a{/*lr=*/1e-2f, 0.9f, 0.95f, 1e-8f, /*weight_decay=*/0.0f, step, 1.0f};
    for (size_t u = 0; u < p.size(); ++u)
      cpu::AdamWUpdate(p[u].data(), g[u].data(), mom[u].data(), var[u].data(),
                       int64_t(p[u].size()), a);
  }
  EXPECT_NEAR(first, std::log(256.0), 0.05);
  EXPECT_LT(last, 0.1f * first) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace forge
