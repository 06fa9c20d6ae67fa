// One transformer block's backward (its weight gradients on the wgrad stream, the activation
// gradients on the caller's), the selective recompute of its norm and SwiGLU outputs, and the
// RMSNorm backward the blocks and the final norm share.
#include "worker/model/cuda_model.h"

#include "kernels/cuda/flash_backward.h"
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
using cuda::DType;
using cuda::GemmArgs;

// dres holds dL/d(block output) on entry and dL/d(block input) on return: the residual path
// passes it through and each RmsNormBackward adds its branch's contribution. The block's
// weight gradients are added to (accumulate_grads) or overwritten, every element either way.
//
// Each dW GEMM is issued before the dx GEMM that shares its input, so the fork does not make
// it wait for that dx GEMM. Write-after-read hazards of the dW GEMMs (they read dres, dgu,
// dqkv and this block's activations, all rewritten later on the compute stream):
// - dres: dWdown and dWo read it; each RmsNormBackward rewrites it in place (accumulate_dx),
//   two chain kernels after dWdown and three after dWo. No double buffer: the kernel has no
//   out-of-place form; the chain waits (kDres) before each norm backward. dWdown's window is
//   SwiGLU backward + the dh GEMM (≈ 2× dWdown's time), dWo's is the attention backward.
// - dgu: dWgu of block l reads it; SwiGluBackward of block l-1 rewrites it a whole block of
//   chain work later (kDgu). Single buffer: the wait is all but free (185 MB saved).
// - dqkv: dWqkv of block l reads it; the attention backward of block l-1 rewrites it (kDqkv),
//   likewise a block later.
// - activations (h1, att, h2, sw): per-layer sets are never rewritten in backward; the shared
//   recompute set is, by block l-1's recompute: Forward waits for kDqkv there (dWqkv is the
//   block's last dW GEMM, and the wgrad stream runs in order). Selective recompute's two sets
//   of h1/h2/sw: block l's refill follows block l+1's kDqkv wait, which covers block l+2's
//   dW GEMMs, the last readers of that set.
// The norm weight gradients are written by the chain (RmsNormBackward), disjoint from the dW
// tensors.
//
// FP8: each linear's output gradient is cast (E5M2, plus its transposed copy) right before its
// two GEMMs, which then read the casts; the weight gradient reads the input's transposed cast
// saved by the forward. The casts' buffers (one per linear kind) are read on the wgrad stream
// by block l's dW GEMMs and rewritten by block l-1's casts, each issued after a wait that
// already covers that dW GEMM: kDres (after dWo of block l, so also dWdown and dWgu before
// it) precedes block l-1's first cast, kDgu its gate/up cast, kDqkv its qkv cast. The saved
// input casts follow the activation sets' rules above.
Status CudaModel::BlockBackward(int layer, int set, const BlockActs& a, const bf16* x_in,
                                bf16* dres, bool accumulate_grads, cudaStream_t s) {
  Buffers& b = *buf_;
  const BlockOffsets& o = layout_.block;
  const LinearPlan& p = *plan_;
  const bf16* w = UnitParams(layout_.block_unit(layer));
  float* g = UnitGrads(layout_.block_unit(layer));
  const int Bm = o_.micro_batch;
  const bool acc = accumulate_grads;
  Fp8Linears* f8 = b.fp8.get();
  // dW (+)= dy^T x on the wgrad stream; in FP8 dy's casts first where a pass writes them (else
  // dy's producer wrote them), then dW (+)= dy8t x8t^T.
  auto weight_grad = [&](LinearKind k, const bf16* dy, const bf16* x, int64_t weight_offset,
                         int64_t out, int64_t in, WgradHazard reads) -> Status {
    if (p[k].grad == CastBy::kCastPass) {
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdElementwise, s));
      FORGE_RETURN_IF_ERROR(f8->CastGrad(layer, k, dy, s));
    }
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdGemm, s));
    switch (p[k].wgrad) {
      case GemmPath::kCublasLt: {
        GemmArgs wg = LinearBackwardWeight(g + weight_offset, dy, x, N_, out, in, acc);
        if (grads16_direct_) {  // ddp's bf16 collectives read it straight from here
          wg.D = UnitGrads16(layout_.block_unit(layer)) + weight_offset;
          wg.d_type = DType::kBf16;
        }
        return WgradGemm(wg, reads, s);
      }
      case GemmPath::kFp8CublasLt:
        return WgradGemm(f8->BackwardWeight(layer, k, set, g + weight_offset, acc), reads, s);
      case GemmPath::kEpilogue:
      case GemmPath::kFp8Epilogue:
        break;
    }
    return Status::Internal("cuda model: no weight-gradient GEMM with an epilogue");
  };
  // dx = dy W on this stream (the epilogue GEMMs are issued by their linear below).
  auto input_grad = [&](LinearKind k, bf16* dx, const bf16* dy, int64_t weight_offset,
                        int64_t out, int64_t in) -> Status {
    switch (p[k].dgrad) {
      case GemmPath::kCublasLt:
        return b.gemm.Run(LinearBackwardData(dx, dy, w + weight_offset, N_, out, in), s);
      case GemmPath::kFp8CublasLt:
        return b.gemm.Run(f8->BackwardData(layer, k, dx), s);
      case GemmPath::kEpilogue:
      case GemmPath::kFp8Epilogue:
        break;
    }
    return Status::Internal("cuda model: no plain GEMM for this linear's input gradient");
  };
  // dW (+)= dy^T x on the wgrad stream, then dx = dy W on this one.
  auto linear_backward = [&](LinearKind k, bf16* dx, const bf16* dy, const bf16* x,
                             int64_t weight_offset, int64_t out, int64_t in,
                             WgradHazard reads) -> Status {
    FORGE_RETURN_IF_ERROR(weight_grad(k, dy, x, weight_offset, out, in, reads));
    return input_grad(k, dx, dy, weight_offset, out, in);
  };

  // MLP: x_out = x_mid + SwiGLU(h2 Wgu^T) Wdown^T. In FP8 on a delayed step the norm backward
  // that wrote dres (the final norm's, or block l+1's attention norm's) may have written its
  // casts for this block's Down projection (CastBy::kNorm); this block's MLP norm backward
  // writes them for its Out projection (NormBackward).
  FORGE_RETURN_IF_ERROR(
      weight_grad(LinearKind::kDown, dres, a.sw, o.w_down, d_, ffn_, WgradHazard::kDres));
  switch (p[LinearKind::kDown].dgrad) {
    case GemmPath::kEpilogue: {
      // dh = dres W_down with SwiGLU's backward in the GEMM: dgu comes out, dh is never stored.
      FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDgu, s));  // block l+1's dWgu reads dgu
      cuda::WgmmaGemmArgs gb = DownSwiGluBackwardGemm();
      gb.A = dres, gb.B = w + o.w_down, gb.D = b.dgu, gb.epi.gu = a.gu;
      FORGE_RETURN_IF_ERROR(cuda::WgmmaGemmBf16(gb, s));
      break;
    }
    case GemmPath::kFp8Epilogue:
      // dh = dres8 W_down8 with SwiGLU's backward in one kernel straight into dgu's casts.
      FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDgu, s));  // block l+1's dWgu reads dgu
      FORGE_RETURN_IF_ERROR(f8->SwiGluBackwardGemm(layer, a.gu, s));
      break;
    case GemmPath::kCublasLt:
    case GemmPath::kFp8CublasLt:
      FORGE_RETURN_IF_ERROR(input_grad(LinearKind::kDown, b.dsw, dres, o.w_down, d_, ffn_));
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdElementwise, s));
      FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDgu, s));  // block l+1's dWgu reads dgu
      if (p[LinearKind::kGateUp].grad == CastBy::kSwiGlu) {  // writes dgu's FP8 casts
        FORGE_RETURN_IF_ERROR(f8->SwiGluBackwardToGrad(layer, b.dsw, a.gu, s));
      } else {
        FORGE_RETURN_IF_ERROR(cuda::SwiGluBackward(b.dgu, b.dsw, a.gu, N_, ffn_, s));
      }
      break;
  }
  FORGE_RETURN_IF_ERROR(linear_backward(LinearKind::kGateUp, b.dh, b.dgu, a.h2, o.w_gate_up,
                                        2 * ffn_, d_, WgradHazard::kDgu));
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdElementwise, s));
  FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDres, s));  // dWdown reads dres
  FORGE_RETURN_IF_ERROR(NormBackward(layer, LinearKind::kOut, dres, g + o.mlp_norm, b.dh,
                                     a.x_mid, w + o.mlp_norm, a.rstd2, /*accumulate_dx=*/true,
                                     acc, s));

  // Attention: x_mid = x_in + SDPA(rope(h1 Wqkv^T)) Wo^T
  FORGE_RETURN_IF_ERROR(linear_backward(LinearKind::kOut, b.datt, dres, a.att, o.wo, d_,
                                        H_ * hd_, WgradHazard::kDres));
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdAttention, s));
  FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDqkv, s));  // block l+1's dWqkv reads dqkv
  // Attention's backward works in the region of the LM head's logits chunks (step_buffers.cc):
  // the first one of a pass waits for the head's last dWte to have read them.
  if (layer == m_.n_layer - 1) FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDwte, s));
  if (hooks_ && hooks_->comm_window) {
    FORGE_RETURN_IF_ERROR(hooks_->comm_window(layout_.block_unit(layer), s));
  }
  // FP8 on a delayed step: the inverse RoPE writes the QKV gradient's FP8 casts itself, in
  // our attention backward's epilogue where it runs (CastBy::kAttention), else after it.
  const CastBy qkv_grad = p[LinearKind::kQkv].grad;
  const cuda::FlashBackwardFp8Out qkv8 = qkv_grad == CastBy::kAttention
                                             ? f8->QkvGradFromAttention(layer)
                                             : cuda::FlashBackwardFp8Out{};
  FORGE_RETURN_IF_ERROR(b.sdpa.Backward(b.sdpa_shape, a.qkv, a.att, b.datt, a.stats, b.dqkv,
                                        b.softmax_sum, b.dq_accum, s,
                                        qkv_grad == CastBy::kAttention ? &qkv8 : nullptr));
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdElementwise, s));
  if (qkv_grad == CastBy::kRope) {
    FORGE_RETURN_IF_ERROR(f8->RopeBackwardToGrad(layer, b.dqkv, s));
  } else if (qkv_grad != CastBy::kAttention) {
    FORGE_RETURN_IF_ERROR(
        cuda::RopeApply(b.dqkv, Bm, T_, H_, KV_, hd_, b.rope_freq, /*inverse=*/true, s));
    if (m_.qk_norm) {  // RoPE's FP8 fusions are off with it (ChooseLinearStrategies)
      FORGE_RETURN_IF_ERROR(cuda::HeadRmsNormBackward(
          b.dqkv, g + o.q_norm, g + o.k_norm, a.qk_raw, w + o.q_norm, w + o.k_norm, a.rstd_qk,
          b.qk_norm, acc, b.qk_norm_ws, b.qk_norm_ws_bytes, s));
    }
  }
  FORGE_RETURN_IF_ERROR(linear_backward(LinearKind::kQkv, b.dh, b.dqkv, a.h1, o.wqkv, qkv_dim_,
                                        d_, WgradHazard::kDqkv));
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdElementwise, s));
  FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDres, s));  // dWo reads dres
  // dres is now block l-1's output gradient: the casts for its Down projection.
  return NormBackward(layer - 1, LinearKind::kDown, dres, g + o.attn_norm, b.dh, x_in,
                      w + o.attn_norm, a.rstd1, /*accumulate_dx=*/true, acc, s);
}

// Selective recompute: block `layer`'s h1, h2 and sw again, with the forward's kernels on the
// kept x_in, x_mid and gu (the epilogue GEMMs round before their math, so these are their
// bits too; the rstd rewritten are the same values). Their set (layer % 2) was last read by
// block layer+2's dW GEMMs, which the chain waited for (kDqkv) in block layer+1's backward.
Status CudaModel::RecomputeNormAndSwiGlu(int layer, const BlockActs& a, const bf16* x_in,
                                         cudaStream_t s) {
  const BlockOffsets& o = layout_.block;
  const bf16* w = UnitParams(layout_.block_unit(layer));
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdElementwise, s));
  FORGE_RETURN_IF_ERROR(
      cuda::RmsNormForward(a.h1, a.rstd1, x_in, w + o.attn_norm, N_, d_, m_.norm_eps, s));
  FORGE_RETURN_IF_ERROR(
      cuda::RmsNormForward(a.h2, a.rstd2, a.x_mid, w + o.mlp_norm, N_, d_, m_.norm_eps, s));
  return cuda::SwiGluForward(a.sw, a.gu, N_, ffn_, s);
}

// RMSNorm backward into the residual stream's gradient dres, which is the output gradient of
// linear `k` of block `cast_layer` (none below block 0): on a delayed FP8 step the same
// kernel writes that projection's E5M2 casts, and the projection's backward skips its cast.
// The casts' buffers are free here: the wait for kDres before each norm backward covers the
// dW GEMMs that read them last (see BlockBackward).
Status CudaModel::NormBackward(int cast_layer, LinearKind k, bf16* dres, float* dw,
                               const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                               bool accumulate_dx, bool accumulate_dw, cudaStream_t s) {
  Buffers& b = *buf_;
  const int ws = k == LinearKind::kOut ? 0 : 1;
  char* work = b.norm_ws[size_t(ws)];
  // With norm_dw_on_wgrad the dw reduction runs on the wgrad stream; the reduction that last
  // read this buffer there must be done with it first.
  const bool on_wgrad = dual_ && o_.norm_dw_on_wgrad;
  const WgradHazard h = ws == 0 ? WgradHazard::kNormWs0 : WgradHazard::kNormWs1;
  cuda::RmsNormDwReduce dw_reduce;
  if (on_wgrad) {
    FORGE_RETURN_IF_ERROR(WaitWgrad(h, s));
    dw_reduce = {b.wgrad, b.fork};
    wgrad_pending_ = true;
  }
  if (cast_layer >= 0 && (*plan_)[k].grad == CastBy::kNorm) {
    FORGE_RETURN_IF_ERROR(b.fp8->RmsNormBackwardToGrad(cast_layer, k, dres, dw, dout, x, w, rstd,
                                                       work, b.norm_ws_bytes, accumulate_dx,
                                                       accumulate_dw, s, dw_reduce));
  } else {
    FORGE_RETURN_IF_ERROR(cuda::RmsNormBackward(dres, dw, dout, x, w, rstd, N_, d_, work,
                                                b.norm_ws_bytes, s, accumulate_dx, accumulate_dw,
                                                dw_reduce));
  }
  return on_wgrad ? RecordWgrad(h) : Status::Ok();
}

}  // namespace forge
