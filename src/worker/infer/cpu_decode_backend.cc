// The CPU DecodeBackend: CpuModel's forward, row by row of the appended tokens, with each
// layer's keys and values kept per sequence. Every op is the training reference's own kernel
// (kernels/cpu) or, for attention over the cache, the same arithmetic in the same order as
// cpu::AttentionForward, so a sequence decoded token by token gets the logits the full forward
// computes up to the GEMMs' float reassociation (tests/unit/generate_test.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel_for.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "worker/infer/decode_backend.h"
#include "worker/model/param_layout.h"
#include "worker/model/rope_frequencies.h"

namespace forge {
namespace {

using Vec = std::vector<float>;

class CpuDecodeBackend final : public DecodeBackend {
 public:
  CpuDecodeBackend(const ModelConfig& m, UnitBuffers params)
      : m_(m), layout_(MakeParamLayout(m)), params_(std::move(params)) {
    d_ = m.d_model;
    H_ = m.n_head;
    KV_ = m.n_kv_head;
    hd_ = m.head_dim();
    V_ = m.padded_vocab();
    qkv_dim_ = (H_ + 2 * KV_) * hd_;
    rope_freq_ = RopeFrequencies(m);
  }

  const ModelConfig& model() const override { return m_; }
  const char* name() const override { return "cpu"; }

  Status Reset(int batch, int max_len) override {
    FORGE_RETURN_IF_ERROR(CheckReset(batch, max_len));
    if (params_.size() != layout_.units.size())
      return Status::Invalid("decode: parameters have the wrong number of units");
    for (size_t u = 0; u < params_.size(); ++u)
      if (int64_t(params_[u].size()) != layout_.units[u].numel)
        return Status::Invalid("decode: unit " + layout_.units[u].name + " has the wrong size");
    max_len_ = max_len;
    lengths_.assign(batch, 0);
    const size_t per_layer = size_t(batch) * max_len * KV_ * hd_;
    k_cache_.assign(m_.n_layer, Vec(per_layer));
    v_cache_.assign(m_.n_layer, Vec(per_layer));
    return Status::Ok();
  }

  int length(int seq) const override { return lengths_.at(seq); }

  Status Append(std::span<const int> seqs, std::span<const std::vector<int32_t>> tokens,
                bool all_positions, std::vector<float>* logits) override;

 private:
  float* KRow(int layer, int seq, int pos) {
    return k_cache_[layer].data() + (size_t(seq) * max_len_ + pos) * KV_ * hd_;
  }
  float* VRow(int layer, int seq, int pos) {
    return v_cache_[layer].data() + (size_t(seq) * max_len_ + pos) * KV_ * hd_;
  }
  const float* Tensor(int unit, int64_t off) const { return params_[unit].data() + off; }

  ModelConfig m_;
  ParamLayout layout_;
  UnitBuffers params_;
  int d_ = 0, H_ = 0, KV_ = 0, hd_ = 0, V_ = 0, qkv_dim_ = 0;
  std::vector<double> rope_freq_;  // hd/2 RoPE inverse frequencies
  int max_len_ = 0;
  std::vector<int> lengths_;
  std::vector<Vec> k_cache_, v_cache_;  // per layer: [batch, max_len, KV * hd]
  // Scratch, sized per call.
  Vec x_, h_, qkv_, att_, gu_, sw_, hf_, rstd_;
};

Status CpuDecodeBackend::Append(std::span<const int> seqs,
                                std::span<const std::vector<int32_t>> tokens,
                                bool all_positions, std::vector<float>* logits) {
  FORGE_ASSIGN_OR_RETURN(AppendRows plan,
                         PlanAppend(seqs, tokens, lengths_, max_len_, V_, m_.vocab));
  const std::vector<int32_t>& ids = plan.ids;
  const std::vector<int32_t>& pos = plan.pos;
  const std::vector<int32_t>& row_seq = plan.row_seq;
  const int64_t N = int64_t(ids.size());
  const int d = d_, hd = hd_, H = H_, KV = KV_;
  x_.resize(size_t(N) * d);
  h_.resize(size_t(N) * d);
  qkv_.resize(size_t(N) * qkv_dim_);
  att_.resize(size_t(N) * H * hd);
  gu_.resize(size_t(N) * 2 * m_.ffn);
  sw_.resize(size_t(N) * m_.ffn);
  rstd_.resize(size_t(N) * std::max(H, 1));

  const BlockOffsets& o = layout_.block;
  const float* wte = Tensor(layout_.embedding_unit(), 0);
  cpu::EmbeddingForward(x_.data(), ids.data(), wte, N, d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int group = H / KV;

  for (int l = 0; l < m_.n_layer; ++l) {
    const int u = layout_.block_unit(l);
    cpu::RmsNormForward(h_.data(), nullptr, x_.data(), Tensor(u, o.attn_norm), N, d, m_.norm_eps);
    cpu::MatmulForward(qkv_.data(), h_.data(), Tensor(u, o.wqkv), N, d, qkv_dim_);
    if (m_.qk_norm) {
      // RMSNorm over each head vector of the Q heads, then of the K heads (in place: each
      // vector is read whole before it is written).
      for (int64_t n = 0; n < N; ++n) {
        float* r = qkv_.data() + n * qkv_dim_;
        cpu::RmsNormForward(r, nullptr, r, Tensor(u, o.q_norm), H, hd, m_.norm_eps);
        cpu::RmsNormForward(r + int64_t{H} * hd, nullptr, r + int64_t{H} * hd,
                            Tensor(u, o.k_norm), KV, hd, m_.norm_eps);
      }
    }
    cpu::RopeApplyAtPositions(qkv_.data(), pos.data(), N, H, KV, hd, rope_freq_.data());
    for (int64_t n = 0; n < N; ++n) {
      const float* r = qkv_.data() + n * qkv_dim_;
      std::memcpy(KRow(l, row_seq[n], pos[n]), r + int64_t{H} * hd, sizeof(float) * KV * hd);
      std::memcpy(VRow(l, row_seq[n], pos[n]), r + int64_t{H + KV} * hd, sizeof(float) * KV * hd);
    }
    // Attention of each (row, query head) over its sequence's cache up to its own position:
    // cpu::AttentionForward's arithmetic (float dot, scale, max, exp, double sum, float
    // reciprocal, axpy in position order).
    cpu::ParallelFor(N * H, 1, [&](int64_t begin, int64_t end) {
      Vec p;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t n = item / H;
        const int h = int(item % H), kvh = h / group, s = row_seq[n], t = pos[n];
        const float* q = qkv_.data() + n * qkv_dim_ + int64_t{h} * hd;
        p.resize(size_t(t) + 1);
        float mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const float* k = KRow(l, s, j) + int64_t{kvh} * hd;
          float dot = 0.0f;
          for (int i = 0; i < hd; ++i) dot += q[i] * k[i];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        const float inv = cpu::SoftmaxNumerators(p.data(), t + 1, mx);
        float* out = att_.data() + (n * H + h) * hd;
        std::memset(out, 0, sizeof(float) * hd);
        for (int j = 0; j <= t; ++j) {
          const float w = p[j] * inv;
          const float* v = VRow(l, s, j) + int64_t{kvh} * hd;
          for (int i = 0; i < hd; ++i) out[i] += w * v[i];
        }
      }
    });
    cpu::MatmulForward(x_.data(), att_.data(), Tensor(u, o.wo), N, H * hd, d, /*accumulate=*/true);
    cpu::RmsNormForward(h_.data(), nullptr, x_.data(), Tensor(u, o.mlp_norm), N, d, m_.norm_eps);
    cpu::MatmulForward(gu_.data(), h_.data(), Tensor(u, o.w_gate_up), N, d, 2 * m_.ffn);
    cpu::SwiGluForward(sw_.data(), gu_.data(), N, m_.ffn);
    cpu::MatmulForward(x_.data(), sw_.data(), Tensor(u, o.w_down), N, m_.ffn, d, /*accumulate=*/true);
  }

  // The rows whose logits are wanted: every row, or each sequence's last.
  std::vector<int64_t> rows;
  if (all_positions) {
    for (int64_t n = 0; n < N; ++n) rows.push_back(n);
  } else {
    rows.assign(plan.last.begin(), plan.last.end());
  }
  const int64_t R = int64_t(rows.size());
  hf_.resize(size_t(R) * d);
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(hf_.data() + r * d, x_.data() + rows[r] * d, sizeof(float) * d);
  cpu::RmsNormForward(hf_.data(), nullptr, hf_.data(), Tensor(layout_.final_norm_unit(), 0), R, d,
                      m_.norm_eps);
  logits->resize(size_t(R) * V_);
  cpu::MatmulForward(logits->data(), hf_.data(), Tensor(layout_.head_unit, layout_.lm_head), R, d,
                     V_);

  for (size_t k = 0; k < seqs.size(); ++k) lengths_[seqs[k]] += int(tokens[k].size());
  return Status::Ok();
}

}  // namespace

std::unique_ptr<DecodeBackend> MakeCpuDecodeBackend(const ModelConfig& m, UnitBuffers params) {
  return std::make_unique<CpuDecodeBackend>(m, std::move(params));
}

}  // namespace forge
