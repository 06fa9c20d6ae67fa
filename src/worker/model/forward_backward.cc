// One micro-batch's pass: the deferred update's start, embedding, the blocks, the final norm
// and LM head, then (with backward) the blocks in reverse and the embedding backward, with the
// per-unit hooks around each unit.
#include "worker/model/cuda_model.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rmsnorm.h"
#include "worker/model/cuda_model_state.h"
#include "worker/model/deferred_update.h"
#include "worker/model/fp8_linears.h"

namespace forge {

using cuda::bf16;

Status CudaModel::ForwardBackward(const int32_t* inputs, const int32_t* targets, float dloss,
                                  bool accumulate_grads, float* losses, cudaStream_t stream) {
  return Forward(inputs, targets, dloss, /*backward=*/true, accumulate_grads, losses, stream);
}

Status CudaModel::ForwardLoss(const int32_t* inputs, const int32_t* targets, float* losses,
                              cudaStream_t stream) {
  return Forward(inputs, targets, 0.0f, /*backward=*/false, /*accumulate_grads=*/true, losses,
                 stream);
}

Status CudaModel::Forward(const int32_t* inputs, const int32_t* targets, float dloss,
                          bool backward, bool accumulate_grads, float* losses, cudaStream_t s) {
  dual_ = backward && buf_->wgrad != nullptr && observer_ == nullptr;
  // FP8 casts that measure first (current scaling, the first step) cannot be fused.
  plan_ = &linears_.For(buf_->fp8 != nullptr && !buf_->fp8->measuring());
  wgrad_pending_ = false;
  // ddp, bf16 collectives, a step of one micro-step, BF16 GEMMs: see CastUnitGradsToBf16.
  grads16_direct_ = backward && !accumulate_grads && store_.buffers().grads16 != nullptr &&
                    buf_->fp8 == nullptr && hooks_ != nullptr && hooks_->grads_to_bf16;
  hazard_recorded_.fill(false);
  if (backward) unit_sumsq_ready_ = false;
  // The last step's deferred AdamW, before the weights are first read in this step (its first
  // micro-batch) or in an evaluation pass.
  const Status st = [&]() -> Status {
    if (buf_->update && (!backward || !accumulate_grads)) {
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kOptimizer, s));
      FORGE_RETURN_IF_ERROR(buf_->update->Begin(s, /*overlap=*/observer_ == nullptr));
    }
    return ForwardImpl(inputs, targets, dloss, backward, accumulate_grads, losses, s);
  }();
  // Join even after an error, so no wgrad or update work is left unordered (or unjoined in
  // a capture).
  const Status update_joined = buf_->update ? buf_->update->End(s) : Status::Ok();
  Status joined = JoinWgrad(s);
  if (joined.ok()) joined = update_joined;
  dual_ = false;
  // Without hooks every unit's GradReady summed its gradient's squares (UnitSumSquares).
  if (backward && st.ok() && joined.ok()) unit_sumsq_ready_ = hooks_ == nullptr;
  return st.ok() ? joined : st;
}

Status CudaModel::ForwardImpl(const int32_t* inputs, const int32_t* targets, float dloss,
                              bool backward, bool accumulate_grads, float* losses,
                              cudaStream_t s) {
  Buffers& b = *buf_;
  const int L = m_.n_layer;
  const int fin = layout_.final_norm_unit();
  const bool recompute = o_.recompute == Recompute::kFull;
  // Selective: the two sets of h1/h2/sw still hold blocks L-1 and L-2 from the forward.
  const bool selective = o_.recompute == Recompute::kSelective && b.fp8 == nullptr;
  auto set = [&](int l) { return recompute ? 0 : l; };
  auto acts = [&](int l) -> const BlockActs& { return b.acts[set(l)]; };
  // FP8 weights are cast once per step (its first micro-batch) and for every evaluation pass
  // (the optimizer changed the weights since). fsdp: the layers share one set of FP8 weights
  // (Fp8Linears one_weight_set), cast before each block's forward and backward.
  const bool recast = b.fp8 != nullptr && o_.shard_params;
  const bool cast_weights = b.fp8 != nullptr && (!backward || !accumulate_grads || recast);

  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
  FORGE_RETURN_IF_ERROR(BeforeForward(layout_.embedding_unit(), s));
  if (hooks_ != nullptr && hooks_->lookup_rows && layout_.head_unit != layout_.embedding_unit()) {
    FORGE_RETURN_IF_ERROR(hooks_->lookup_rows(inputs, N_, b.xs[0], s));
  } else {
    FORGE_RETURN_IF_ERROR(cuda::EmbeddingForward(b.xs[0], inputs,
                                                 UnitParams(layout_.embedding_unit()), N_, d_, s));
  }
  for (int l = 0; l < L; ++l) {
    FORGE_RETURN_IF_ERROR(BeforeForward(layout_.block_unit(l), s));
    if (cast_weights) FORGE_RETURN_IF_ERROR(CastLayerWeights(l, /*backward=*/false, s));
    FORGE_RETURN_IF_ERROR(BlockForward(l, set(l), acts(l), b.xs[l], b.xs[l + 1], s));
  }
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
  FORGE_RETURN_IF_ERROR(BeforeForward(layout_.final_norm_unit(), s));
  FORGE_RETURN_IF_ERROR(cuda::RmsNormForward(b.hf, b.rstd_f, b.xs[L], UnitParams(fin), N_, d_,
                                             m_.norm_eps, s));
  FORGE_RETURN_IF_ERROR(LmHead(targets, dloss, backward, accumulate_grads, losses, s));
  // An evaluation pass must not shape the next step's FP8 scales.
  if (!backward) return b.fp8 ? b.fp8->ResetAmax(s) : Status::Ok();

  // dL/dhf is in dh. The final norm's backward starts the residual gradient (overwrites dres,
  // so it needs no zeroing); every later RmsNormBackward adds to it. No dW GEMM reads dh or
  // dres yet (dWte reads the logits buffers and hf).
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdElementwise, s));
  // FP8: dres is the last block's Down output gradient (NormBackward writes its casts).
  FORGE_RETURN_IF_ERROR(NormBackward(L - 1, LinearKind::kDown, b.dres, UnitGrads(fin), b.dh,
                                     b.xs[L], UnitParams(fin), b.rstd_f,
                                     /*accumulate_dx=*/false, accumulate_grads, s));
  FORGE_RETURN_IF_ERROR(GradReady(layout_.final_norm_unit(), s));
  // The tied embedding's LM-head part is complete once the head's last dWte chunk lands (the
  // wgrad event GradReady records covers it): announced now when the lookup part goes apart.
  const int emb = layout_.embedding_unit();
  const bool tied = layout_.head_unit == emb;
  const bool lookup_apart = hooks_ != nullptr && hooks_->lookup_grad;
  if (lookup_apart && tied) FORGE_RETURN_IF_ERROR(GradReady(emb, s));
  // The blocks' backward overlaps the gradient collectives (data parallelism).
  b.gemm.set_default_sm_count(bwd_sm_count_);
  b.gemm_w.set_default_sm_count(wgrad_sm_count_);
  for (int l = L - 1; l >= 0; --l) {
    FORGE_RETURN_IF_ERROR(BeforeBackward(layout_.block_unit(l), s));
    if (recast) FORGE_RETURN_IF_ERROR(CastLayerWeights(l, /*backward=*/true, s));
    // The shared set still holds the last layer from the forward pass. Recomputing layer l
    // rewrites it while block l+1's dW GEMMs may still read it: wait for the last of them.
    if (recompute && l != L - 1) {
      FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDqkv, s));
      FORGE_RETURN_IF_ERROR(BlockForward(l, set(l), acts(l), b.xs[l], nullptr, s));
    }
    if (selective && l < L - 2) {
      FORGE_RETURN_IF_ERROR(RecomputeNormAndSwiGlu(l, acts(l), b.xs[l], s));
    }
    FORGE_RETURN_IF_ERROR(
        BlockBackward(l, set(l), acts(l), b.xs[l], b.dres, accumulate_grads, s));
    FORGE_RETURN_IF_ERROR(GradReady(layout_.block_unit(l), s));
  }
  b.gemm.set_default_sm_count(0);
  b.gemm_w.set_default_sm_count(0);
  // Always adds: the LM head above already wrote this step's part of the tied gradient, and
  // its last dWte chunk (wgrad stream) must have landed first. Untied, the head's gradient is
  // the final unit's and wte's starts from zero on a pass that overwrites the gradients.
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdElementwise, s));
  FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDwte, s));
  FORGE_RETURN_IF_ERROR(BeforeBackward(emb, s));
  if (lookup_apart) return hooks_->lookup_grad(b.dres, inputs, N_, s);
  if (!tied && !accumulate_grads) {
    FORGE_CUDA_CHECK(cudaMemsetAsync(UnitGrads(emb), 0,
                                     size_t(layout_.units[size_t(emb)].numel) * sizeof(float), s));
  }
  FORGE_RETURN_IF_ERROR(cuda::EmbeddingBackward(UnitGrads(emb), b.dres, inputs, N_, d_, V_,
                                                b.emb_ws, b.emb_ws_bytes, s));
  return GradReady(emb, s);
}

Status CudaModel::BeforeForward(int unit, cudaStream_t s) {
  if (buf_->update) FORGE_RETURN_IF_ERROR(buf_->update->WaitUnit(unit, s));
  return hooks_ && hooks_->before_forward ? hooks_->before_forward(unit, s) : Status::Ok();
}

}  // namespace forge
