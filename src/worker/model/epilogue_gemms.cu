// Which of the BF16 linear layers run our own GEMM with an epilogue (RoPE, SwiGLU, SwiGLU's
// backward) instead of cuBLASLt and a separate pass, decided once at Init, the GEMM
// arguments they run with, and the fallbacks the backend reports.
#include "worker/model/cuda_model.h"

#include <string>

#include "kernels/cuda/flash_backward.cuh"
#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/rope.cuh"
#include "worker/model/cuda_model_state.h"

namespace forge {

bool CudaModel::rope_gemm_active() const { return buf_->rope_gemm; }
bool CudaModel::fp8_attention_rope_active() const { return buf_->fp8_attention_rope; }
bool CudaModel::swiglu_gemm_active() const { return buf_->swiglu_gemm; }
bool CudaModel::swiglu_bwd_gemm_active() const { return buf_->swiglu_bwd_gemm; }

// Our own GEMM (sm_90 only) takes the QKV and gate/up projections and the down projection's
// input gradient of BF16 steps where it accepts the shapes (cuda::WgmmaGemmCheck); otherwise
// (or when the options are off, or the model computes in FP8, whose linears are Fp8Linears':
// its gate/up GEMM with SwiGLU is Fp8Linears::fuse_swiglu_gemm) cuBLASLt and the separate
// RoPE/SwiGLU kernels run, with the same results.
Status CudaModel::SetUpEpilogueGemms(const CudaModelOptions& o) {
  Buffers& b = *buf_;
  const bool here =
      !o.fp8 && (o.rope_gemm || o.swiglu_gemm || o.swiglu_bwd_gemm) && cuda::WgmmaGemmRunsHere();
  // QK-norm sits between the QKV projection and RoPE.
  b.rope_gemm =
      o.rope_gemm && here && !m_.qk_norm && cuda::WgmmaGemmCheck(QkvRopeGemm()).ok();
  b.swiglu_gemm = o.swiglu_gemm && here && cuda::WgmmaGemmCheck(GateUpSwiGluGemm()).ok();
  b.swiglu_bwd_gemm =
      o.swiglu_bwd_gemm && here && cuda::WgmmaGemmCheck(DownSwiGluBackwardGemm()).ok();
  if (!b.rope_gemm) return Status::Ok();
  FORGE_RETURN_IF_ERROR(DeviceAlloc("cuda model", &b.allocations, &allocated_bytes_,
                                    &b.rope_sin_cos, size_t(T_) * (hd_ / 2)));
  // On the legacy stream, finished by Init's closing device synchronisation.
  return cuda::RopeSinCosTable(b.rope_sin_cos, T_, hd_, b.rope_freq, nullptr);
}

// h Wqkv^T with RoPE, [N, qkv]; BlockForward sets A, B and D per layer.
cuda::WgmmaGemmArgs CudaModel::QkvRopeGemm() const {
  cuda::WgmmaGemmArgs g;
  g.M = N_, g.N = qkv_dim_, g.K = d_;
  g.epilogue = cuda::WgmmaEpilogue::kRope;
  g.epi.rope_sin_cos = buf_->rope_sin_cos, g.epi.T = T_, g.epi.hd = hd_;
  g.epi.rot_cols = (H_ + KV_) * hd_;
  return g;
}

// dgu from dres W_down (N-major [d, ffn]) and gu, [N, 2 ffn]; the backward sets A, B, D and gu
// per layer. Leaves the SMs the other backward GEMMs leave (gemm_sm_margin).
cuda::WgmmaGemmArgs CudaModel::DownSwiGluBackwardGemm() const {
  cuda::WgmmaGemmArgs g;
  g.M = N_, g.N = ffn_, g.K = d_;
  g.b_n_major = true;
  g.epilogue = cuda::WgmmaEpilogue::kSwiGluBackward;
  g.epi.ffn = ffn_;
  g.ctas = bwd_sm_count_;
  return g;
}

// h Wgu^T into gu and SwiGLU(gu) into D, [N, ffn]; BlockForward sets A, B, D and gu per layer.
cuda::WgmmaGemmArgs CudaModel::GateUpSwiGluGemm() const {
  cuda::WgmmaGemmArgs g;
  g.M = N_, g.N = 2 * int64_t{ffn_}, g.K = d_;
  g.epilogue = cuda::WgmmaEpilogue::kSwiGlu;
  g.epi.ffn = ffn_;
  return g;
}

// The faster paths the options asked for that this model's shapes (or GPU) leave out, with the
// kernels' own reasons.
void CudaModel::NoteFallbacks(const CudaModelOptions& o) {
  const Buffers& b = *buf_;
  fallbacks_.clear();
  if (!o.cudnn_attention_backward && !b.sdpa.flash_backward(b.sdpa_shape)) {
    const Status why = cuda::FlashBackwardSupports(
        {b.sdpa_shape.B, b.sdpa_shape.T, b.sdpa_shape.H, b.sdpa_shape.KV, b.sdpa_shape.hd});
    fallbacks_.push_back("attention backward: cuDNN's instead of ours (" + why.message() + ")");
  }
  if (o.fp8 || !cuda::WgmmaGemmRunsHere()) return;
  if (o.rope_gemm && !b.rope_gemm) {
    fallbacks_.push_back("QKV projection: cuBLASLt, then RoPE apart (" +
                         (m_.qk_norm ? std::string("QK-norm runs between them")
                                     : cuda::WgmmaGemmCheck(QkvRopeGemm()).message()) +
                         ")");
  }
  if (o.swiglu_gemm && !b.swiglu_gemm) {
    fallbacks_.push_back("gate/up projection: cuBLASLt, then SwiGLU apart (" +
                         cuda::WgmmaGemmCheck(GateUpSwiGluGemm()).message() + ")");
  }
}

}  // namespace forge
