#include "worker/model/cpu_model.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "worker/model/rope_frequencies.h"

namespace forge {
namespace {

// Misuse of the model (wrong buffer sizes, batch too large) is a programming error.
void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "CpuModel: %s\n", what);
    std::abort();
  }
}

using Vec = std::vector<float>;

// What one block keeps from Forward for Backward.
struct BlockActs {
  Vec x_in;      // [N, d] residual stream entering the block
  Vec rstd1;     // [N]
  Vec h1;        // [N, d] attn_norm output
  Vec qkv_raw;   // [N, qkv] projection before QK-norm (only with qk_norm)
  Vec rstd_q;    // [N * H]  (only with qk_norm)
  Vec rstd_k;    // [N * KV] (only with qk_norm)
  Vec qkv;       // [N, qkv] after QK-norm and RoPE: the attention input
  Vec att;       // [N, H*hd] attention output
  Vec x_mid;     // [N, d] residual after attention
  Vec rstd2;     // [N]
  Vec h2;        // [N, d] mlp_norm output
  Vec gu;        // [N, 2*ffn]
  Vec sw;        // [N, ffn] SwiGLU output
};

}  // namespace

struct CpuModel::Impl {
  ModelConfig m;
  ParamLayout layout;
  int max_batch = 0;
  int d = 0, H = 0, KV = 0, hd = 0, ffn = 0, V = 0, T = 0, qkv_dim = 0;
  std::vector<double> rope_freq;  // hd/2 inverse frequencies (rope_theta, rope_scaling)

  // Forward state.
  int B = 0;
  std::vector<int32_t> inputs;
  std::vector<BlockActs> blocks;
  Vec x_final;      // [N, d] residual entering the final norm
  Vec rstd_f;       // [N]
  Vec h_f;          // [N, d]
  Vec dlogits;      // [N, V] softmax - onehot (unscaled), written by Forward
  Vec losses;       // [N]
  // Attention probabilities for one layer only; the others are recomputed in Backward, which
  // keeps memory at one [B, H, T, T] buffer instead of one per layer.
  Vec probs;
  int probs_layer = -1;

  // Backward scratch.
  Vec dx, dh, datt, dqkv, dqkv_raw, dgu, dsw, att_scratch, h_scaled;

  int64_t N() const { return int64_t{B} * T; }

  const float* Tensor(const UnitBuffers& p, int unit, int64_t off) const {
    return p[unit].data() + off;
  }
  float* Tensor(UnitBuffers* p, int unit, int64_t off) const { return (*p)[unit].data() + off; }

  // RMSNorm over each head_dim vector of the Q (first H) or K (next KV) heads of every token.
  void QkNormForward(float* out, float* rstd, const float* in, const float* w, int first_head,
                     int n_heads) const {
    for (int64_t n = 0; n < N(); ++n) {
      const int64_t off = n * qkv_dim + int64_t{first_head} * hd;
      cpu::RmsNormForward(out + off, rstd + n * n_heads, in + off, w, n_heads, hd, m.norm_eps);
    }
  }
  void QkNormBackward(float* dx_raw, float* dw, const float* dy, const float* raw,
                      const float* w, const float* rstd, int first_head, int n_heads) const {
    for (int64_t n = 0; n < N(); ++n) {
      const int64_t off = n * qkv_dim + int64_t{first_head} * hd;
      cpu::RmsNormBackward(dx_raw + off, dw, dy + off, raw + off, w, rstd + n * n_heads, n_heads,
                           hd);
    }
  }

  // Embedding through the final norm (h_f) over inputs [B, T], keeping the activations.
  void ForwardHidden(const UnitBuffers& params, const int32_t* inputs, int B);

  void EnsureProbs(int layer) {
    if (probs_layer == layer) return;
    cpu::AttentionForward(att_scratch.data(), probs.data(), blocks[layer].qkv.data(), B, T, H, KV,
                          hd);
    probs_layer = layer;
  }
};

CpuModel::CpuModel(const ModelConfig& m, int max_batch) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.m = m;
  s.layout = MakeParamLayout(m);
  s.max_batch = max_batch;
  s.d = m.d_model;
  s.H = m.n_head;
  s.KV = m.n_kv_head;
  s.hd = m.head_dim();
  s.ffn = m.ffn;
  s.V = m.padded_vocab();
  s.T = m.seq_len;
  s.qkv_dim = (s.H + 2 * s.KV) * s.hd;
  s.rope_freq = RopeFrequencies(m);
  Check(s.H % s.KV == 0 && s.hd % 2 == 0, "n_head must be a multiple of n_kv_head, head_dim even");

  const size_t N = size_t(max_batch) * s.T, d = s.d;
  s.inputs.resize(N);
  s.blocks.resize(m.n_layer);
  for (BlockActs& a : s.blocks) {
    a.x_in.resize(N * d);
    a.rstd1.resize(N);
    a.h1.resize(N * d);
    if (m.qk_norm) {
      a.qkv_raw.resize(N * s.qkv_dim);
      a.rstd_q.resize(N * s.H);
      a.rstd_k.resize(N * s.KV);
    }
    a.qkv.resize(N * s.qkv_dim);
    a.att.resize(N * s.H * s.hd);
    a.x_mid.resize(N * d);
    a.rstd2.resize(N);
    a.h2.resize(N * d);
    a.gu.resize(N * 2 * s.ffn);
    a.sw.resize(N * s.ffn);
  }
  s.x_final.resize(N * d);
  s.rstd_f.resize(N);
  s.h_f.resize(N * d);
  s.dlogits.resize(N * s.V);
  s.losses.resize(N);
  s.probs.resize(size_t(max_batch) * s.H * s.T * s.T);
  s.dx.resize(N * d);
  s.dh.resize(N * d);
  s.datt.resize(N * s.H * s.hd);
  s.dqkv.resize(N * s.qkv_dim);
  if (m.qk_norm) s.dqkv_raw.resize(N * s.qkv_dim);
  s.dgu.resize(N * 2 * s.ffn);
  s.dsw.resize(N * s.ffn);
  s.att_scratch.resize(N * s.H * s.hd);
  s.h_scaled.resize(N * d);
}

CpuModel::~CpuModel() = default;

const ParamLayout& CpuModel::layout() const { return impl_->layout; }

float CpuModel::Forward(const UnitBuffers& params, const int32_t* inputs, const int32_t* targets,
                        int B) {
  Impl& s = *impl_;
  for (int64_t n = 0; n < int64_t{B} * s.T; ++n)
    Check(targets[n] >= 0 && targets[n] < s.V, "token id outside the padded vocabulary");
  s.ForwardHidden(params, inputs, B);
  const int64_t N = s.N();
  const float* head = s.Tensor(params, s.layout.head_unit, s.layout.lm_head);
  // LM head (wte when tied) over the padded vocabulary; the padded rows take part in the
  // softmax.
  cpu::MatmulForward(s.dlogits.data(), s.h_f.data(), head, N, s.d, s.V);
  // Softmax - onehot in place (dloss = 1): Backward scales it, so it can run more than once.
  cpu::CrossEntropyForwardBackward(s.losses.data(), s.dlogits.data(), s.dlogits.data(), targets, N,
                                   s.V, 1.0f);
  double sum = 0.0;
  for (int64_t n = 0; n < N; ++n) sum += s.losses[n];
  return static_cast<float>(sum / N);
}

void CpuModel::ForwardLogits(const UnitBuffers& params, const int32_t* inputs, int B,
                             float* logits) {
  Impl& s = *impl_;
  s.ForwardHidden(params, inputs, B);
  cpu::MatmulForward(logits, s.h_f.data(), s.Tensor(params, s.layout.head_unit, s.layout.lm_head),
                     s.N(), s.d, s.V);
  s.B = 0;  // the activations are kept, but dlogits is not this forward's: no Backward
}

void CpuModel::Impl::ForwardHidden(const UnitBuffers& params, const int32_t* inputs, int B) {
  Impl& s = *this;
  Check(B >= 1 && B <= s.max_batch, "batch size out of range");
  Check(params.size() == s.layout.units.size(), "params: wrong number of units");
  for (size_t u = 0; u < params.size(); ++u) {
    Check(int64_t(params[u].size()) == s.layout.units[u].numel, "params: wrong unit size");
  }
  s.B = B;
  const int64_t N = s.N();
  const int d = s.d, HD = s.H * s.hd;
  const BlockOffsets& o = s.layout.block;
  for (int64_t n = 0; n < N; ++n)
    Check(inputs[n] >= 0 && inputs[n] < s.V, "token id outside the padded vocabulary");
  std::copy(inputs, inputs + N, s.inputs.begin());

  const float* wte = s.Tensor(params, s.layout.embedding_unit(), 0);
  float* x = s.m.n_layer > 0 ? s.blocks[0].x_in.data() : s.x_final.data();
  cpu::EmbeddingForward(x, inputs, wte, N, d);

  for (int l = 0; l < s.m.n_layer; ++l) {
    BlockActs& a = s.blocks[l];
    const int u = s.layout.block_unit(l);
    cpu::RmsNormForward(a.h1.data(), a.rstd1.data(), a.x_in.data(), s.Tensor(params, u, o.attn_norm),
                        N, d, s.m.norm_eps);
    float* proj = s.m.qk_norm ? a.qkv_raw.data() : a.qkv.data();
    cpu::MatmulForward(proj, a.h1.data(), s.Tensor(params, u, o.wqkv), N, d, s.qkv_dim);
    if (s.m.qk_norm) {
      std::copy(a.qkv_raw.begin(), a.qkv_raw.begin() + N * s.qkv_dim, a.qkv.begin());  // V heads
      s.QkNormForward(a.qkv.data(), a.rstd_q.data(), a.qkv_raw.data(),
                      s.Tensor(params, u, o.q_norm), 0, s.H);
      s.QkNormForward(a.qkv.data(), a.rstd_k.data(), a.qkv_raw.data(),
                      s.Tensor(params, u, o.k_norm), s.H, s.KV);
    }
    cpu::RopeApply(a.qkv.data(), B, s.T, s.H, s.KV, s.hd, s.rope_freq.data(), /*inverse=*/false);
    cpu::AttentionForward(a.att.data(), s.probs.data(), a.qkv.data(), B, s.T, s.H, s.KV, s.hd);
    s.probs_layer = l;

    std::copy(a.x_in.begin(), a.x_in.begin() + N * d, a.x_mid.begin());
    cpu::MatmulForward(a.x_mid.data(), a.att.data(), s.Tensor(params, u, o.wo), N, HD, d,
                       /*accumulate=*/true);
    cpu::RmsNormForward(a.h2.data(), a.rstd2.data(), a.x_mid.data(), s.Tensor(params, u, o.mlp_norm),
                        N, d, s.m.norm_eps);
    cpu::MatmulForward(a.gu.data(), a.h2.data(), s.Tensor(params, u, o.w_gate_up), N, d,
                       2 * s.ffn);
    cpu::SwiGluForward(a.sw.data(), a.gu.data(), N, s.ffn);
    float* x_next = l + 1 < s.m.n_layer ? s.blocks[l + 1].x_in.data() : s.x_final.data();
    std::copy(a.x_mid.begin(), a.x_mid.begin() + N * d, x_next);
    cpu::MatmulForward(x_next, a.sw.data(), s.Tensor(params, u, o.w_down), N, s.ffn, d,
                       /*accumulate=*/true);
  }

  cpu::RmsNormForward(s.h_f.data(), s.rstd_f.data(), s.x_final.data(),
                      s.Tensor(params, s.layout.final_norm_unit(), 0), N, d, s.m.norm_eps);
}

void CpuModel::Backward(const UnitBuffers& params, float dloss, UnitBuffers* grads) {
  Impl& s = *impl_;
  Check(s.B > 0, "Backward without Forward");
  Check(grads->size() == s.layout.units.size(), "grads: wrong number of units");
  for (size_t u = 0; u < grads->size(); ++u) {
    Check(int64_t((*grads)[u].size()) == s.layout.units[u].numel, "grads: wrong unit size");
  }
  const int64_t N = s.N();
  const int d = s.d, HD = s.H * s.hd;
  const BlockOffsets& o = s.layout.block;
  const float scale = dloss / static_cast<float>(N);  // d(mean loss)/d(token loss)
  const int emb = s.layout.embedding_unit(), fin = s.layout.final_norm_unit();
  const int head_unit = s.layout.head_unit;
  const int64_t head = s.layout.lm_head;

  // LM head: dlogits holds the unscaled (softmax - onehot), so `scale` is applied to the
  // small [N, d] operands instead: dW += dlogits^T (scale h_f), dh = scale (dlogits W), W the
  // head (wte when tied).
  for (int64_t i = 0; i < N * d; ++i) s.h_scaled[i] = s.h_f[i] * scale;
  cpu::MatmulBackward(s.dh.data(), s.Tensor(grads, head_unit, head), s.dlogits.data(),
                      s.h_scaled.data(), s.Tensor(params, head_unit, head), N, d, s.V);
  for (int64_t i = 0; i < N * d; ++i) s.dh[i] *= scale;
  std::fill(s.dx.begin(), s.dx.begin() + N * d, 0.0f);
  cpu::RmsNormBackward(s.dx.data(), s.Tensor(grads, fin, 0), s.dh.data(), s.x_final.data(),
                       s.Tensor(params, fin, 0), s.rstd_f.data(), N, d);

  for (int l = s.m.n_layer - 1; l >= 0; --l) {
    BlockActs& a = s.blocks[l];
    const int u = s.layout.block_unit(l);
    // MLP: x_out = x_mid + SwiGLU(h2 Wgu^T) Wdown^T
    cpu::MatmulBackward(s.dsw.data(), s.Tensor(grads, u, o.w_down), s.dx.data(), a.sw.data(),
                        s.Tensor(params, u, o.w_down), N, s.ffn, d);
    cpu::SwiGluBackward(s.dgu.data(), s.dsw.data(), a.gu.data(), N, s.ffn);
    cpu::MatmulBackward(s.dh.data(), s.Tensor(grads, u, o.w_gate_up), s.dgu.data(), a.h2.data(),
                        s.Tensor(params, u, o.w_gate_up), N, d, 2 * s.ffn);
    cpu::RmsNormBackward(s.dx.data(), s.Tensor(grads, u, o.mlp_norm), s.dh.data(), a.x_mid.data(),
                         s.Tensor(params, u, o.mlp_norm), a.rstd2.data(), N, d);
    // Attention: x_mid = x_in + Attn(rope(qknorm(h1 Wqkv^T))) Wo^T
    cpu::MatmulBackward(s.datt.data(), s.Tensor(grads, u, o.wo), s.dx.data(), a.att.data(),
                        s.Tensor(params, u, o.wo), N, HD, d);
    s.EnsureProbs(l);
    cpu::AttentionBackward(s.dqkv.data(), s.datt.data(), a.qkv.data(), s.probs.data(), s.B, s.T,
                           s.H, s.KV, s.hd);
    cpu::RopeApply(s.dqkv.data(), s.B, s.T, s.H, s.KV, s.hd, s.rope_freq.data(), /*inverse=*/true);
    const float* dproj = s.dqkv.data();
    if (s.m.qk_norm) {
      // V heads pass straight through; Q/K heads go back through their RMSNorm (dx += ...).
      const int64_t qk_cols = int64_t{s.H + s.KV} * s.hd;
      for (int64_t n = 0; n < N; ++n) {
        float* r = s.dqkv_raw.data() + n * s.qkv_dim;
        std::fill(r, r + qk_cols, 0.0f);
        std::copy(s.dqkv.data() + n * s.qkv_dim + qk_cols, s.dqkv.data() + (n + 1) * s.qkv_dim,
                  r + qk_cols);
      }
      s.QkNormBackward(s.dqkv_raw.data(), s.Tensor(grads, u, o.q_norm), s.dqkv.data(),
                       a.qkv_raw.data(), s.Tensor(params, u, o.q_norm), a.rstd_q.data(), 0, s.H);
      s.QkNormBackward(s.dqkv_raw.data(), s.Tensor(grads, u, o.k_norm), s.dqkv.data(),
                       a.qkv_raw.data(), s.Tensor(params, u, o.k_norm), a.rstd_k.data(), s.H,
                       s.KV);
      dproj = s.dqkv_raw.data();
    }
    cpu::MatmulBackward(s.dh.data(), s.Tensor(grads, u, o.wqkv), dproj, a.h1.data(),
                        s.Tensor(params, u, o.wqkv), N, d, s.qkv_dim);
    cpu::RmsNormBackward(s.dx.data(), s.Tensor(grads, u, o.attn_norm), s.dh.data(), a.x_in.data(),
                         s.Tensor(params, u, o.attn_norm), a.rstd1.data(), N, d);
  }

  // The residual stream's gradient lands in the looked-up rows (on top of the LM head's when
  // tied).
  cpu::EmbeddingBackward(s.Tensor(grads, emb, 0), s.dx.data(), s.inputs.data(), N, d);
}

}  // namespace forge
