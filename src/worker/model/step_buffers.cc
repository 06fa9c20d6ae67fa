// The buffers a step works in: RoPE's frequencies, the residual stream and what each block
// keeps for backward (per activation_recompute), the backward's gradient scratch, the region
// the LM head's logits chunks share with attention's backward scratch and workspace, and the
// other kernels' workspaces.
#include "worker/model/cuda_model.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/head_rmsnorm.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/sdpa.h"
#include "worker/model/cuda_model_state.h"
#include "worker/model/rope_frequencies.h"

namespace forge {

using cuda::bf16;

Status CudaModel::AllocateStepBuffers() {
  const CudaModelOptions& o = o_;
  Buffers& b = *buf_;
  {  // RoPE's inverse frequencies (model.rope_theta, model.rope_scaling), as the kernels read them
    const std::vector<double> f = RopeFrequencies(m_);
    const std::vector<float> f32(f.begin(), f.end());
    FORGE_RETURN_IF_ERROR(Alloc(&b.rope_freq, f32.size()));
    FORGE_CUDA_CHECK(cudaMemcpy(b.rope_freq, f32.data(), f32.size() * sizeof(float),
                                cudaMemcpyHostToDevice));
  }

  // Activations.
  const size_t N = N_, d = d_;
  const size_t stats_n = size_t(o.micro_batch) * H_ * T_;
  b.xs.assign(m_.n_layer + 1, nullptr);
  for (bf16*& x : b.xs) FORGE_RETURN_IF_ERROR(Alloc(&x, N * d));
  b.acts.assign(o.recompute == Recompute::kFull ? std::min(m_.n_layer, 1) : m_.n_layer,
                BlockActs{});
  // Sets of h1, h2 and sw: FP8's backward reads their FP8 transposed copies, so the BF16 ones
  // are forward scratch, one set shared by every layer; selective recompute alternates two.
  const size_t own_h = o.fp8                                 ? 1
                       : o.recompute == Recompute::kSelective ? 2
                                                              : b.acts.size();
  for (size_t i = 0; i < b.acts.size(); ++i) {
    BlockActs& a = b.acts[i];
    if (i >= own_h) {
      const BlockActs& shared = b.acts[i % own_h];
      a.h1 = shared.h1, a.h2 = shared.h2, a.sw = shared.sw;
    } else {
      FORGE_RETURN_IF_ERROR(Alloc(&a.h1, N * d));
      FORGE_RETURN_IF_ERROR(Alloc(&a.h2, N * d));
      FORGE_RETURN_IF_ERROR(Alloc(&a.sw, N * ffn_));
    }
    FORGE_RETURN_IF_ERROR(Alloc(&a.rstd1, N));
    FORGE_RETURN_IF_ERROR(Alloc(&a.qkv, N * qkv_dim_));
    if (m_.qk_norm) {
      FORGE_RETURN_IF_ERROR(Alloc(&a.qk_raw, N * size_t(H_ + KV_) * hd_));
      FORGE_RETURN_IF_ERROR(Alloc(&a.rstd_qk, N * size_t(H_ + KV_)));
    }
    FORGE_RETURN_IF_ERROR(Alloc(&a.att, N * H_ * hd_));
    FORGE_RETURN_IF_ERROR(Alloc(&a.stats, stats_n));
    FORGE_RETURN_IF_ERROR(Alloc(&a.x_mid, N * d));
    FORGE_RETURN_IF_ERROR(Alloc(&a.rstd2, N));
    FORGE_RETURN_IF_ERROR(Alloc(&a.gu, N * 2 * ffn_));
  }
  FORGE_RETURN_IF_ERROR(SetUpFp8());
  FORGE_RETURN_IF_ERROR(Alloc(&b.hf, N * d));
  FORGE_RETURN_IF_ERROR(Alloc(&b.rstd_f, N));
  FORGE_RETURN_IF_ERROR(SetUpEpilogueGemms());

  FORGE_RETURN_IF_ERROR(Alloc(&b.dres, N * d));
  FORGE_RETURN_IF_ERROR(Alloc(&b.dh, N * d));
  // dh of the MLP: never stored where SwiGLU's backward rides on its BF16 GEMM (FP8's runs
  // only on delayed steps: the first step stores it).
  if (linears_.measuring[LinearKind::kDown].dgrad != GemmPath::kEpilogue) {
    FORGE_RETURN_IF_ERROR(Alloc(&b.dsw, N * ffn_));
  }
  FORGE_RETURN_IF_ERROR(Alloc(&b.dgu, N * 2 * ffn_));
  FORGE_RETURN_IF_ERROR(Alloc(&b.datt, N * H_ * hd_));
  FORGE_RETURN_IF_ERROR(Alloc(&b.dqkv, N * qkv_dim_));

  // One region holds the LM head's logits chunks and, at other times, attention's backward
  // scratch (softmax_sum [B,H,T], then dq_accum [B,H,T,hd] where not deterministic) followed
  // by the SDPA runner's workspace (cuDNN's plans', or our backward's scratch). The head is
  // done with its chunks before a pass's first attention backward writes the region (the
  // chain in stream order; BlockBackward waits for the head's last dWte on the wgrad stream),
  // and the next pass's logits come after this pass's backward (every pass joins the wgrad
  // stream). At llama3-8b the logits (2 GiB) fit inside cuDNN's deterministic backward's dS.
  b.sdpa_shape = cuda::SdpaShape{o.micro_batch, T_, H_, KV_, hd_};
  // The runner's layout of that scratch: softmax_sum at 0, dq_accum at the next 256 bytes.
  const size_t sum_bytes = AlignUp(int64_t(stats_n * sizeof(float)), 256);
  const size_t scratch_bytes =
      cuda::SdpaRunner::BackwardScratchBytes(b.sdpa_shape, o.deterministic_attention);
  FORGE_ASSIGN_OR_RETURN(const size_t runner_bytes, b.sdpa.WorkspaceBytes(b.sdpa_shape));
  const int64_t chunk = std::min<int64_t>(N_, o.lm_head_chunk_rows);
  const size_t logits_bytes = AlignUp(chunk * V_ * int64_t(sizeof(bf16)), 256);
  b.num_logits = NumLogitsBuffers(o);
  const size_t region_bytes =
      std::max(b.num_logits * logits_bytes, scratch_bytes + AlignUp(int64_t(runner_bytes), 256));
  char* region = nullptr;
  FORGE_RETURN_IF_ERROR(Alloc(&region, region_bytes));
  for (int i = 0; i < b.num_logits; ++i) {
    b.logits[i] = reinterpret_cast<bf16*>(region + i * logits_bytes);
  }
  b.softmax_sum = reinterpret_cast<float*>(region);
  b.dq_accum = o.deterministic_attention ? nullptr : reinterpret_cast<float*>(region + sum_bytes);
  if (region_bytes > scratch_bytes) {
    FORGE_RETURN_IF_ERROR(
        b.sdpa.ShareWorkspace(region + scratch_bytes, region_bytes - scratch_bytes));
  }

  if (m_.qk_norm) {
    b.qk_norm = cuda::HeadNormShape{N_, H_, KV_, hd_, m_.norm_eps};
    b.qk_norm_ws_bytes = cuda::HeadRmsNormBackwardWorkspace(b.qk_norm);
    FORGE_RETURN_IF_ERROR(Alloc(&b.qk_norm_ws, b.qk_norm_ws_bytes));
  }
  b.norm_ws_bytes = cuda::RmsNormBackwardWorkspace(N_, d_);
  for (char*& ws : b.norm_ws) FORGE_RETURN_IF_ERROR(Alloc(&ws, b.norm_ws_bytes));
  b.emb_ws_bytes = cuda::EmbeddingBackwardWorkspace(N_, V_);
  FORGE_RETURN_IF_ERROR(Alloc(&b.emb_ws, b.emb_ws_bytes));
  b.gradnorm_ws_bytes = cuda::GradNormWorkspace();
  FORGE_RETURN_IF_ERROR(Alloc(&b.gradnorm_ws, b.gradnorm_ws_bytes));
  FORGE_RETURN_IF_ERROR(
      Alloc(&b.unit_sumsq, layout_.units.size() * size_t(cuda::SumSquaresPartials())));
  return Status::Ok();
}

}  // namespace forge
