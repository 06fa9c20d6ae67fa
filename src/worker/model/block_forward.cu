// One transformer block's forward: RMSNorm, QKV projection (+ QK-norm, RoPE), attention, output
// projection with the residual add, RMSNorm, gate/up projection, SwiGLU, down projection with
// the residual add; in BF16 (cuBLASLt or our epilogue GEMMs) or FP8 (Fp8Linears).
#include "worker/model/cuda_model.h"

#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/head_rmsnorm.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "worker/model/cuda_model_state.h"
#include "worker/model/fp8_linears.h"
#include "worker/model/linear_gemm_args.h"

namespace forge {

using cuda::bf16;

Status CudaModel::BlockForward(int layer, int set, const BlockActs& a, const bf16* x_in,
                               bf16* x_out, cudaStream_t s) {
  Buffers& b = *buf_;
  const BlockOffsets& o = layout_.block;
  const bf16* w = UnitParams(layout_.block_unit(layer));
  const int Bm = o_.micro_batch;
  Fp8Linears* f8 = b.fp8.get();
  // One linear layer: y = x W^T (+ residual), in FP8 after casting x (which also saves its
  // transposed copy for the weight gradient), else BF16.
  auto linear = [&](LinearKind k, bf16* y, const bf16* x, int64_t weight_offset, int64_t out,
                    int64_t in, const bf16* residual) -> Status {
    if (f8 == nullptr) return b.gemm.Run(Linear(y, x, w + weight_offset, N_, out, in, residual), s);
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
    FORGE_RETURN_IF_ERROR(f8->CastInput(layer, k, set, x, s));
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
    return b.gemm.Run(f8->Forward(layer, k, y, residual), s);
  };

  // FP8: RMSNorm of x into linear layer k's FP8 input; on a delayed step the norm writes it
  // itself (no bf16 h), else through h and the cast.
  auto norm_to_input = [&](LinearKind k, const bf16* x, int64_t norm_offset, bf16* h,
                           float* rstd) -> Status {
    if (f8->fuse_norm())
      return f8->RmsNormToInput(layer, k, set, rstd, x, w + norm_offset, m_.norm_eps, s);
    FORGE_RETURN_IF_ERROR(
        cuda::RmsNormForward(h, rstd, x, w + norm_offset, N_, d_, m_.norm_eps, s));
    return f8->CastInput(layer, k, set, h, s);
  };

  // RMSNorm of x into h (FP8: into the layer's input casts), then h's linear layer.
  auto norm_linear = [&](LinearKind k, const bf16* x, int64_t norm_offset, bf16* h, float* rstd,
                         bf16* y, int64_t weight_offset, int64_t out) -> Status {
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
    if (f8 != nullptr) {
      FORGE_RETURN_IF_ERROR(norm_to_input(k, x, norm_offset, h, rstd));
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
      return b.gemm.Run(f8->Forward(layer, k, y), s);
    }
    FORGE_RETURN_IF_ERROR(
        cuda::RmsNormForward(h, rstd, x, w + norm_offset, N_, d_, m_.norm_eps, s));
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
    return linear(k, y, h, weight_offset, out, d_, nullptr);
  };

  // RMSNorm of x, then our own GEMM with its epilogue (see rope_gemm): BF16 on h (A), FP8 on
  // linear layer k's input cast (which g, from Fp8Linears, already reads).
  auto norm_epilogue_gemm = [&](LinearKind k, cuda::WgmmaGemmArgs g, const bf16* x,
                                int64_t norm_offset, bf16* h, float* rstd) -> Status {
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
    if (f8 != nullptr) {
      FORGE_RETURN_IF_ERROR(norm_to_input(k, x, norm_offset, h, rstd));
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
      return cuda::WgmmaGemmFp8(g, s);
    }
    FORGE_RETURN_IF_ERROR(
        cuda::RmsNormForward(h, rstd, x, w + norm_offset, N_, d_, m_.norm_eps, s));
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
    g.A = h;
    return cuda::WgmmaGemmBf16(g, s);
  };

  if (b.rope_gemm) {
    cuda::WgmmaGemmArgs g = QkvRopeGemm();
    g.B = w + o.wqkv, g.D = a.qkv;
    FORGE_RETURN_IF_ERROR(
        norm_epilogue_gemm(LinearKind::kQkv, g, x_in, o.attn_norm, a.h1, a.rstd1));
  } else if (f8 != nullptr && f8->has_rope_gemm()) {  // FP8: RoPE in our GEMM
    FORGE_RETURN_IF_ERROR(norm_epilogue_gemm(LinearKind::kQkv, f8->QkvRopeGemm(layer, a.qkv), x_in,
                                             o.attn_norm, a.h1, a.rstd1));
  } else {
    FORGE_RETURN_IF_ERROR(norm_linear(LinearKind::kQkv, x_in, o.attn_norm, a.h1, a.rstd1, a.qkv,
                                      o.wqkv, qkv_dim_));
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
    if (m_.qk_norm) {
      FORGE_RETURN_IF_ERROR(cuda::HeadRmsNormForward(a.qkv, a.qk_raw, a.rstd_qk, w + o.q_norm,
                                                     w + o.k_norm, b.qk_norm, s));
    }
    FORGE_RETURN_IF_ERROR(
        cuda::RopeApply(a.qkv, Bm, T_, H_, KV_, hd_, b.rope_freq, /*inverse=*/false, s));
  }
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdAttention, s));
  FORGE_RETURN_IF_ERROR(b.sdpa.Forward(b.sdpa_shape, a.qkv, a.att, a.stats, s));
  // x_mid = x_in + att Wo^T: the residual add rides on the GEMM (C = x_in, beta = 1); x_in
  // stays intact because backward needs it for the attn_norm gradient.
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
  FORGE_RETURN_IF_ERROR(
      linear(LinearKind::kOut, a.x_mid, a.att, o.wo, d_, H_ * hd_, /*residual=*/x_in));
  // FP8 on a delayed step: SwiGLU writes the down projection's FP8 input itself (no bf16 sw).
  const bool fused = f8 != nullptr && f8->fuse_swiglu();
  if (b.swiglu_gemm) {
    cuda::WgmmaGemmArgs g = GateUpSwiGluGemm();
    g.B = w + o.w_gate_up, g.D = a.sw, g.epi.gu = a.gu;
    FORGE_RETURN_IF_ERROR(
        norm_epilogue_gemm(LinearKind::kGateUp, g, a.x_mid, o.mlp_norm, a.h2, a.rstd2));
  } else if (fused && f8->fuse_swiglu_gemm()) {  // FP8: SwiGLU and its casts in our GEMM
    FORGE_RETURN_IF_ERROR(norm_epilogue_gemm(LinearKind::kGateUp,
                                             f8->GateUpSwiGluGemm(layer, set, a.gu), a.x_mid,
                                             o.mlp_norm, a.h2, a.rstd2));
  } else {
    FORGE_RETURN_IF_ERROR(norm_linear(LinearKind::kGateUp, a.x_mid, o.mlp_norm, a.h2, a.rstd2,
                                      a.gu, o.w_gate_up, 2 * ffn_));
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
    if (fused) {
      FORGE_RETURN_IF_ERROR(f8->SwiGluForwardToInput(layer, set, a.gu, s));
    } else {
      FORGE_RETURN_IF_ERROR(cuda::SwiGluForward(a.sw, a.gu, N_, ffn_, s));
    }
  }
  if (x_out == nullptr) {
    // Recompute in backward: the output is not needed, but FP8's dWdown reads sw's cast.
    return f8 == nullptr || fused ? Status::Ok()
                                  : f8->CastInput(layer, LinearKind::kDown, set, a.sw, s);
  }
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
  if (fused) return b.gemm.Run(f8->Forward(layer, LinearKind::kDown, x_out, a.x_mid), s);
  return linear(LinearKind::kDown, x_out, a.sw, o.w_down, d_, ffn_, /*residual=*/a.x_mid);
}

}  // namespace forge
