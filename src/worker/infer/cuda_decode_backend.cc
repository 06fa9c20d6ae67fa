// The CUDA DecodeBackend: the model's weights in BF16 on the GPU, a BF16 KV cache per layer
// ([batch, max_len, KV, hd]), and each Append run as one batch of rows (every appended token of
// every sequence), in chunks of at most kChunkRows rows so a long prefill's activations stay
// bounded (a chunk attends to what earlier chunks cached, so chunking changes nothing).
//
// Precision: the residual stream, the QKV projection's output, attention and logits are fp32;
// GEMM inputs (RMSNorm outputs, attention output, SwiGLU output) and the weights are bf16, the
// gate/up projection's output is bf16 (kernels/cuda/swiglu.h takes bf16). The residual adds
// are the GEMMs' own fp32 accumulation (beta = 1). Against the CPU reference given the same
// bf16-rounded weights, what differs is the rounding of those bf16 activations and of K and V
// in the cache, and summation orders (tests/gpu/cuda_decode_test.cc states the agreement rule).
//
// Per layer: RMSNorm (kernels/cuda/rmsnorm_f32_rows) -> QKV GEMM (cuBLASLt, fp32 out) ->
// QK-norm + RoPE + K/V into the cache (decode_qkv_to_cache) -> attention over the cache
// (decode_attention) -> output projection added into the residual -> RMSNorm -> gate/up GEMM
// -> SwiGLU (swiglu) -> down projection added into the residual. Then the final RMSNorm of the
// rows whose logits are wanted, the LM head GEMM, and the logits to the host, or only their
// argmax (AppendGreedy, argmax_rows) or their losses (AppendLosses, row_cross_entropy). Deterministic: no atomics, and one cuBLASLt plan
// per shape (the split-K rule off), so the same calls give the same bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/argmax_rows.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/decode_qkv_to_cache.h"
#include "kernels/cuda/embedding_f32.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rmsnorm_f32_rows.h"
#include "kernels/cuda/row_cross_entropy.h"
#include "kernels/cuda/swiglu.h"
#include "worker/checkpoint/safetensors.h"  // FloatToBf16
#include "worker/infer/decode_backend.h"
#include "worker/model/param_layout.h"
#include "worker/model/rope_frequencies.h"

namespace forge {
namespace {

using cuda::bf16;

constexpr int64_t kChunkRows = 8192;

// A device allocation freed with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Free(); }
  Status Resize(size_t bytes) {
    if (bytes <= bytes_) return Status::Ok();
    Free();
    const cudaError_t e = cudaMalloc(&p_, bytes);
    if (e != cudaSuccess) {
      p_ = nullptr;
      return Status::Unavailable("cuda decode: cudaMalloc of " + std::to_string(bytes) +
                                 " bytes failed (" + cudaGetErrorString(e) + ")");
    }
    bytes_ = bytes;
    return Status::Ok();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void Free() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

class CudaDecodeBackend final : public DecodeBackend {
 public:
  explicit CudaDecodeBackend(const ModelConfig& m) : m_(m), layout_(MakeParamLayout(m)) {
    d_ = m.d_model;
    H_ = m.n_head;
    KV_ = m.n_kv_head;
    hd_ = m.head_dim();
    V_ = m.padded_vocab();
    ffn_ = m.ffn;
    qkv_dim_ = (H_ + 2 * KV_) * hd_;
  }
  ~CudaDecodeBackend() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status Init(const UnitBuffers& params) {
    if (params.size() != layout_.units.size())
      return Status::Invalid("cuda decode: parameters have the wrong number of units");
    if (m_.n_head % m_.n_kv_head != 0)
      return Status::Invalid("cuda decode: model.n_head must be a multiple of model.n_kv_head");
    FORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FORGE_RETURN_IF_ERROR(gemm_.Init(32ull << 20));
    gemm_.set_splitk(false);
    units_.resize(params.size());
    std::vector<uint16_t> host;
    for (size_t u = 0; u < params.size(); ++u) {
      if (int64_t(params[u].size()) != layout_.units[u].numel)
        return Status::Invalid("cuda decode: unit " + layout_.units[u].name +
                               " has the wrong size");
      host.resize(params[u].size());
      for (size_t i = 0; i < host.size(); ++i) host[i] = FloatToBf16(params[u][i]);
      units_[u] = std::make_unique<DeviceBuffer>();
      FORGE_RETURN_IF_ERROR(units_[u]->Resize(host.size() * sizeof(uint16_t)));
      FORGE_CUDA_CHECK(cudaMemcpy(units_[u]->as<void>(), host.data(),
                                  host.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    }
    const std::vector<double> f = RopeFrequencies(m_);
    FORGE_RETURN_IF_ERROR(inv_freq_.Resize(f.size() * sizeof(double)));
    FORGE_CUDA_CHECK(cudaMemcpy(inv_freq_.as<void>(), f.data(), f.size() * sizeof(double),
                                cudaMemcpyHostToDevice));
    return Status::Ok();
  }

  const ModelConfig& model() const override { return m_; }
  const char* name() const override { return "cuda"; }

  Status Reset(int batch, int max_len) override {
    FORGE_RETURN_IF_ERROR(CheckReset(batch, max_len));
    batch_ = batch;
    max_len_ = max_len;
    lengths_.assign(batch, 0);
    const size_t per_layer = size_t(batch) * max_len * KV_ * hd_;
    // Caches are only read at positions written since this Reset, so they need no clearing.
    FORGE_RETURN_IF_ERROR(k_cache_.Resize(per_layer * m_.n_layer * sizeof(bf16)));
    FORGE_RETURN_IF_ERROR(v_cache_.Resize(per_layer * m_.n_layer * sizeof(bf16)));
    return Status::Ok();
  }

  int length(int seq) const override { return lengths_.at(seq); }

  Status Append(std::span<const int> seqs, std::span<const std::vector<int32_t>> tokens,
                bool all_positions, std::vector<float>* logits) override {
    return Run(seqs, tokens, all_positions, {}, logits, nullptr, nullptr);
  }

  Status AppendGreedy(std::span<const int> seqs, std::span<const std::vector<int32_t>> tokens,
                      std::vector<int32_t>* next) override {
    return Run(seqs, tokens, false, {}, nullptr, next, nullptr);
  }

  Status AppendLosses(std::span<const int> seqs, std::span<const std::vector<int32_t>> tokens,
                      std::span<const std::vector<int32_t>> targets,
                      std::vector<float>* losses) override {
    FORGE_RETURN_IF_ERROR(CheckTargets(tokens, targets, V_));
    return Run(seqs, tokens, true, targets, nullptr, nullptr, losses);
  }

 private:
  const bf16* Tensor(int unit, int64_t off) const { return units_[unit]->as<bf16>() + off; }
  bf16* KCache(int layer) const {
    return k_cache_.as<bf16>() + size_t(layer) * batch_ * max_len_ * KV_ * hd_;
  }
  bf16* VCache(int layer) const {
    return v_cache_.as<bf16>() + size_t(layer) * batch_ * max_len_ * KV_ * hd_;
  }

  // out[rows, n] = in[rows, k] W^T (bf16 weights [n, k]), fp32 or bf16 out, optionally += out.
  Status Gemm(void* out, cuda::DType out_type, const bf16* in, const bf16* w, int64_t rows,
              int64_t n, int64_t k, bool accumulate) {
    cuda::GemmArgs g;
    g.M = rows;
    g.N = n;
    g.K = k;
    g.A = in;
    g.B = w;
    g.D = out;
    g.trans_b = true;
    g.d_type = out_type;
    g.accumulate = accumulate;
    return gemm_.Run(g, stream_);
  }

  // Activations for chunks of `rows` rows with up to `out_rows` wanted logits rows.
  Status Reserve(int64_t rows, int64_t out_rows);
  // One chunk of rows [0, n) of the staged row arrays (offset r0): the layers, then the logits
  // of its wanted rows (want: indices within the chunk) into logits_ (fp32 [R, V]) and, for
  // greedy, their argmax into argmax_.
  Status Chunk(int64_t r0, int64_t n, const std::vector<int32_t>& want);
  // Append's work; the results asked for: logits, greedy ids (next), or with targets
  // (flattened per row, all_positions) each row's loss.
  Status Run(std::span<const int> seqs, std::span<const std::vector<int32_t>> tokens,
             bool all_positions, std::span<const std::vector<int32_t>> targets,
             std::vector<float>* logits, std::vector<int32_t>* next, std::vector<float>* losses);

  ModelConfig m_;
  ParamLayout layout_;
  int d_ = 0, H_ = 0, KV_ = 0, hd_ = 0, V_ = 0, ffn_ = 0, qkv_dim_ = 0;
  cudaStream_t stream_ = nullptr;
  cuda::GemmRunner gemm_;
  std::vector<std::unique_ptr<DeviceBuffer>> units_;  // bf16, the layout's offsets
  DeviceBuffer inv_freq_;                              // double [hd / 2]
  int batch_ = 0, max_len_ = 0;
  std::vector<int> lengths_;
  DeviceBuffer k_cache_, v_cache_;  // [layer][batch, max_len, KV, hd] bf16
  // Per call: row metadata (ids, positions, sequences, wanted rows) and activations.
  DeviceBuffer ids_, pos_, seq_, want_, x_, h_, qkv_, att_, gu_, sw_, hf_, logits_, argmax_, targets_,
      loss_;
  int64_t rows_cap_ = 0, out_cap_ = 0;
};

Status CudaDecodeBackend::Reserve(int64_t rows, int64_t out_rows) {
  if (rows > rows_cap_) {
    FORGE_RETURN_IF_ERROR(x_.Resize(rows * d_ * sizeof(float)));
    FORGE_RETURN_IF_ERROR(h_.Resize(rows * d_ * sizeof(bf16)));
    FORGE_RETURN_IF_ERROR(qkv_.Resize(rows * qkv_dim_ * sizeof(float)));
    FORGE_RETURN_IF_ERROR(att_.Resize(rows * H_ * hd_ * sizeof(bf16)));
    FORGE_RETURN_IF_ERROR(gu_.Resize(rows * 2 * ffn_ * sizeof(bf16)));
    FORGE_RETURN_IF_ERROR(sw_.Resize(rows * ffn_ * sizeof(bf16)));
    rows_cap_ = rows;
  }
  if (out_rows > out_cap_) {
    FORGE_RETURN_IF_ERROR(want_.Resize(out_rows * sizeof(int32_t)));
    FORGE_RETURN_IF_ERROR(hf_.Resize(out_rows * d_ * sizeof(bf16)));
    FORGE_RETURN_IF_ERROR(logits_.Resize(out_rows * V_ * sizeof(float)));
    FORGE_RETURN_IF_ERROR(argmax_.Resize(out_rows * sizeof(int32_t)));
    FORGE_RETURN_IF_ERROR(targets_.Resize(out_rows * sizeof(int32_t)));
    FORGE_RETURN_IF_ERROR(loss_.Resize(out_rows * sizeof(float)));
    out_cap_ = out_rows;
  }
  return Status::Ok();
}

Status CudaDecodeBackend::Chunk(int64_t r0, int64_t n, const std::vector<int32_t>& want) {
  const int32_t* ids = ids_.as<int32_t>() + r0;
  const int32_t* pos = pos_.as<int32_t>() + r0;
  const int32_t* seq = seq_.as<int32_t>() + r0;
  float* x = x_.as<float>();
  bf16* h = h_.as<bf16>();
  float* qkv = qkv_.as<float>();
  const BlockOffsets& o = layout_.block;
  const float eps = m_.norm_eps;
  // The rows and the cache's shape, which the QKV-to-cache and the attention kernels share.
  auto set_shape = [&](auto* args) {
    args->N = n;
    args->n_head = H_;
    args->n_kv_head = KV_;
    args->hd = hd_;
    args->max_len = max_len_;
  };
  FORGE_RETURN_IF_ERROR(
      cuda::EmbeddingForwardF32(x, ids, Tensor(layout_.embedding_unit(), 0), n, d_, stream_));
  for (int l = 0; l < m_.n_layer; ++l) {
    const int u = layout_.block_unit(l);
    FORGE_RETURN_IF_ERROR(
        cuda::RmsNormF32Rows(h, x, nullptr, Tensor(u, o.attn_norm), n, d_, eps, stream_));
    FORGE_RETURN_IF_ERROR(Gemm(qkv, cuda::DType::kFp32, h, Tensor(u, o.wqkv), n, qkv_dim_, d_,
                               false));
    cuda::DecodeQkvArgs q;
    q.qkv = qkv;
    q.seq = seq;
    q.pos = pos;
    q.inv_freq = inv_freq_.as<double>();
    if (m_.qk_norm) {
      q.q_norm = Tensor(u, o.q_norm);
      q.k_norm = Tensor(u, o.k_norm);
    }
    q.norm_eps = eps;
    q.k_cache = KCache(l);
    q.v_cache = VCache(l);
    set_shape(&q);
    FORGE_RETURN_IF_ERROR(cuda::DecodeQkvToCache(q, stream_));
    cuda::DecodeAttentionArgs a;
    a.q = qkv;
    a.q_stride = qkv_dim_;
    a.k_cache = KCache(l);
    a.v_cache = VCache(l);
    a.seq = seq;
    a.pos = pos;
    a.out = att_.as<bf16>();
    set_shape(&a);
    FORGE_RETURN_IF_ERROR(cuda::DecodeAttention(a, stream_));
    FORGE_RETURN_IF_ERROR(Gemm(x, cuda::DType::kFp32, att_.as<bf16>(), Tensor(u, o.wo), n, d_,
                               int64_t{H_} * hd_, true));
    FORGE_RETURN_IF_ERROR(
        cuda::RmsNormF32Rows(h, x, nullptr, Tensor(u, o.mlp_norm), n, d_, eps, stream_));
    FORGE_RETURN_IF_ERROR(Gemm(gu_.as<bf16>(), cuda::DType::kBf16, h, Tensor(u, o.w_gate_up), n,
                               2 * int64_t{ffn_}, d_, false));
    FORGE_RETURN_IF_ERROR(cuda::SwiGluForward(sw_.as<bf16>(), gu_.as<bf16>(), n, ffn_, stream_));
    FORGE_RETURN_IF_ERROR(Gemm(x, cuda::DType::kFp32, sw_.as<bf16>(), Tensor(u, o.w_down), n, d_,
                               ffn_, true));
  }
  const int64_t R = int64_t(want.size());
  if (R == 0) return Status::Ok();
  FORGE_CUDA_CHECK(cudaMemcpyAsync(want_.as<void>(), want.data(), R * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  FORGE_RETURN_IF_ERROR(cuda::RmsNormF32Rows(hf_.as<bf16>(), x, want_.as<int32_t>(),
                                             Tensor(layout_.final_norm_unit(), 0), R, d_, eps,
                                             stream_));
  return Gemm(logits_.as<float>(), cuda::DType::kFp32, hf_.as<bf16>(),
              Tensor(layout_.head_unit, layout_.lm_head), R, V_, d_, false);
}

Status CudaDecodeBackend::Run(std::span<const int> seqs,
                              std::span<const std::vector<int32_t>> tokens, bool all_positions,
                              std::span<const std::vector<int32_t>> targets,
                              std::vector<float>* logits, std::vector<int32_t>* next,
                              std::vector<float>* losses) {
  FORGE_ASSIGN_OR_RETURN(AppendRows plan,
                         PlanAppend(seqs, tokens, lengths_, max_len_, V_, m_.vocab));
  const std::vector<int32_t>& ids = plan.ids;
  const std::vector<int32_t>& pos = plan.pos;
  const std::vector<int32_t>& row_seq = plan.row_seq;
  const std::vector<int32_t>& last = plan.last;
  const int64_t N = int64_t(ids.size());
  const int64_t chunk = std::min(N, kChunkRows);
  const int64_t R = all_positions ? N : int64_t(last.size());
  // The row metadata is staged whole; the chunks index into it.
  FORGE_RETURN_IF_ERROR(ids_.Resize(N * sizeof(int32_t)));
  FORGE_RETURN_IF_ERROR(pos_.Resize(N * sizeof(int32_t)));
  FORGE_RETURN_IF_ERROR(seq_.Resize(N * sizeof(int32_t)));
  FORGE_RETURN_IF_ERROR(Reserve(chunk, std::min(R, chunk)));
  FORGE_CUDA_CHECK(cudaMemcpyAsync(ids_.as<void>(), ids.data(), N * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  FORGE_CUDA_CHECK(cudaMemcpyAsync(pos_.as<void>(), pos.data(), N * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  FORGE_CUDA_CHECK(cudaMemcpyAsync(seq_.as<void>(), row_seq.data(), N * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  std::vector<int32_t> flat_targets;
  for (const auto& t : targets) flat_targets.insert(flat_targets.end(), t.begin(), t.end());
  if (logits) logits->resize(size_t(R) * V_);
  if (next) next->resize(size_t(R));
  if (losses) losses->resize(size_t(R));
  int64_t out_row = 0;
  size_t li = 0;
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t n = std::min(chunk, N - r0);
    std::vector<int32_t> want;
    if (all_positions) {
      for (int64_t r = 0; r < n; ++r) want.push_back(int32_t(r));
    } else {
      for (; li < last.size() && last[li] < r0 + n; ++li) want.push_back(int32_t(last[li] - r0));
    }
    FORGE_RETURN_IF_ERROR(Chunk(r0, n, want));
    const int64_t w = int64_t(want.size());
    if (w > 0 && logits) {
      FORGE_CUDA_CHECK(cudaMemcpyAsync(logits->data() + out_row * V_, logits_.as<void>(),
                                       w * V_ * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    if (w > 0 && losses) {  // all_positions: the chunk's rows are its wanted rows
      FORGE_CUDA_CHECK(cudaMemcpyAsync(targets_.as<void>(), flat_targets.data() + r0,
                                       w * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
      FORGE_RETURN_IF_ERROR(cuda::RowCrossEntropy(loss_.as<float>(), logits_.as<float>(),
                                                  targets_.as<int32_t>(), w, V_, V_, stream_));
      FORGE_CUDA_CHECK(cudaMemcpyAsync(losses->data() + out_row, loss_.as<void>(),
                                       w * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    if (w > 0 && next) {
      FORGE_RETURN_IF_ERROR(cuda::ArgmaxRows(argmax_.as<int32_t>(), logits_.as<float>(), w,
                                             m_.vocab, V_, stream_));
      FORGE_CUDA_CHECK(cudaMemcpyAsync(next->data() + out_row, argmax_.as<void>(),
                                       w * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    }
    // The host vectors (want, and the copies' destinations) must outlive the chunk's work.
    FORGE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    out_row += w;
  }
  for (size_t k = 0; k < seqs.size(); ++k) lengths_[seqs[k]] += int(tokens[k].size());
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<DecodeBackend>> MakeCudaDecodeBackend(const ModelConfig& m,
                                                               const UnitBuffers& params) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    return Status::Unavailable("cuda decode: no CUDA device visible");
  auto b = std::make_unique<CudaDecodeBackend>(m);
  FORGE_RETURN_IF_ERROR(b->Init(params).Annotate("cuda decode"));
  return std::unique_ptr<DecodeBackend>(std::move(b));
}

}  // namespace forge
