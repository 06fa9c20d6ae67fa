// One transformer block's forward: RMSNorm, QKV projection (+ QK-norm, RoPE), attention, output
// projection with the residual add, RMSNorm, gate/up projection, SwiGLU, down projection with
// the residual add; in BF16 (cuBLASLt or our epilogue GEMMs) or FP8 (Fp8Linears).
#include "worker/model/cuda_model.h"

#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/head_rmsnorm.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#include "worker/model/cuda_model_state.h"
#include "worker/model/fp8_linears.h"
#include "worker/model/linear_gemm_args.h"

namespace forge {

using cuda::bf16;

Status CudaModel::BlockForward(int layer, int set, const BlockActs& a, const bf16* x_in,
                               bf16* x_out, cudaStream_t s) {
  Buffers& b = *buf_;
  const BlockOffsets& o = layout_.block;
  const LinearPlan& p = *plan_;
  const bf16* w = UnitParams(layout_.block_unit(layer));
  const int Bm = o_.micro_batch;
  Fp8Linears* f8 = b.fp8.get();
  // Linear k's GEMM on its input (x in BF16; in FP8 its cast, which is written by then):
  // y = x W^T (+ residual). The epilogue GEMMs are issued by their linear below.
  auto gemm = [&](LinearKind k, bf16* y, const bf16* x, int64_t weight_offset, int64_t out,
                  int64_t in, const bf16* residual) -> Status {
    switch (p[k].forward) {
      case GemmPath::kCublasLt:
        return b.gemm.Run(Linear(y, x, w + weight_offset, N_, out, in, residual), s);
      case GemmPath::kFp8CublasLt:
        return b.gemm.Run(f8->Forward(layer, k, y, residual), s);
      case GemmPath::kEpilogue:
      case GemmPath::kFp8Epilogue:
        break;
    }
    return Status::Internal("cuda model: no plain GEMM for this linear's forward");
  };
  // One linear layer on x: y = x W^T (+ residual), after x's FP8 cast where a pass writes it
  // (which also saves its transposed copy for the weight gradient).
  auto linear = [&](LinearKind k, bf16* y, const bf16* x, int64_t weight_offset, int64_t out,
                    int64_t in, const bf16* residual) -> Status {
    if (p[k].input == CastBy::kCastPass) {
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
      FORGE_RETURN_IF_ERROR(f8->CastInput(layer, k, set, x, s));
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
    }
    return gemm(k, y, x, weight_offset, out, in, residual);
  };
  // RMSNorm of x into linear k's input: h (BF16), h and its FP8 cast, or (CastBy::kNorm) the
  // FP8 cast alone (no bf16 h).
  auto norm = [&](LinearKind k, const bf16* x, int64_t norm_offset, bf16* h,
                  float* rstd) -> Status {
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
    if (p[k].input == CastBy::kNorm)
      return f8->RmsNormToInput(layer, k, set, rstd, x, w + norm_offset, m_.norm_eps, s);
    FORGE_RETURN_IF_ERROR(
        cuda::RmsNormForward(h, rstd, x, w + norm_offset, N_, d_, m_.norm_eps, s));
    return p[k].input == CastBy::kCastPass ? f8->CastInput(layer, k, set, h, s) : Status::Ok();
  };

  // Attention: qkv = RoPE(QK-norm(RMSNorm(x_in) Wqkv^T)), RoPE in our GEMM's epilogue where it
  // runs (then without QK-norm, which sits between them).
  FORGE_RETURN_IF_ERROR(norm(LinearKind::kQkv, x_in, o.attn_norm, a.h1, a.rstd1));
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
  switch (p[LinearKind::kQkv].forward) {
    case GemmPath::kEpilogue: {
      cuda::WgmmaGemmArgs g = QkvRopeGemm();
      g.A = a.h1, g.B = w + o.wqkv, g.D = a.qkv;
      FORGE_RETURN_IF_ERROR(cuda::WgmmaGemmBf16(g, s));
      break;
    }
    case GemmPath::kFp8Epilogue:
      FORGE_RETURN_IF_ERROR(cuda::WgmmaGemmFp8(f8->QkvRopeGemm(layer, a.qkv), s));
      break;
    case GemmPath::kCublasLt:
    case GemmPath::kFp8CublasLt:
      FORGE_RETURN_IF_ERROR(gemm(LinearKind::kQkv, a.qkv, a.h1, o.wqkv, qkv_dim_, d_, nullptr));
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
      if (m_.qk_norm) {
        FORGE_RETURN_IF_ERROR(cuda::HeadRmsNormForward(a.qkv, a.qk_raw, a.rstd_qk, w + o.q_norm,
                                                       w + o.k_norm, b.qk_norm, s));
      }
      FORGE_RETURN_IF_ERROR(
          cuda::RopeApply(a.qkv, Bm, T_, H_, KV_, hd_, b.rope_freq, /*inverse=*/false, s));
      break;
  }
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdAttention, s));
  if (x_out != nullptr && hooks_ && hooks_->forward_window) {
    FORGE_RETURN_IF_ERROR(hooks_->forward_window(layout_.block_unit(layer), s));
  }
  FORGE_RETURN_IF_ERROR(b.sdpa.Forward(b.sdpa_shape, a.qkv, a.att, a.stats, s));
  // x_mid = x_in + att Wo^T: the residual add rides on the GEMM (C = x_in, beta = 1); x_in
  // stays intact because backward needs it for the attn_norm gradient.
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
  FORGE_RETURN_IF_ERROR(
      linear(LinearKind::kOut, a.x_mid, a.att, o.wo, d_, H_ * hd_, /*residual=*/x_in));

  // MLP: sw = SwiGLU(RMSNorm(x_mid) Wgu^T), SwiGLU in our GEMM's epilogue where it runs; in
  // FP8 SwiGLU or that GEMM may write the down projection's input cast itself (no bf16 sw).
  FORGE_RETURN_IF_ERROR(norm(LinearKind::kGateUp, a.x_mid, o.mlp_norm, a.h2, a.rstd2));
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
  switch (p[LinearKind::kGateUp].forward) {
    case GemmPath::kEpilogue: {
      cuda::WgmmaGemmArgs g = GateUpSwiGluGemm();
      g.A = a.h2, g.B = w + o.w_gate_up, g.D = a.sw, g.epi.gu = a.gu;
      FORGE_RETURN_IF_ERROR(cuda::WgmmaGemmBf16(g, s));
      break;
    }
    case GemmPath::kFp8Epilogue:
      FORGE_RETURN_IF_ERROR(cuda::WgmmaGemmFp8(f8->GateUpSwiGluGemm(layer, set, a.gu), s));
      break;
    case GemmPath::kCublasLt:
    case GemmPath::kFp8CublasLt:
      FORGE_RETURN_IF_ERROR(
          gemm(LinearKind::kGateUp, a.gu, a.h2, o.w_gate_up, 2 * ffn_, d_, nullptr));
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
      if (p[LinearKind::kDown].input == CastBy::kSwiGlu) {
        FORGE_RETURN_IF_ERROR(f8->SwiGluForwardToInput(layer, set, a.gu, s));
      } else {
        FORGE_RETURN_IF_ERROR(cuda::SwiGluForward(a.sw, a.gu, N_, ffn_, s));
      }
      break;
  }
  if (x_out == nullptr) {
    // Recompute in backward: the output is not needed, but FP8's dWdown reads sw's cast.
    return p[LinearKind::kDown].input == CastBy::kCastPass
               ? f8->CastInput(layer, LinearKind::kDown, set, a.sw, s)
               : Status::Ok();
  }
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdGemm, s));
  return linear(LinearKind::kDown, x_out, a.sw, o.w_down, d_, ffn_, /*residual=*/a.x_mid);
}

}  // namespace forge
