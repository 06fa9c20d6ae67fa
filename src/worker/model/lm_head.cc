// The LM head and the loss: logits, cross-entropy, dhf and dWte over chunks of token rows.
#include "worker/model/cuda_model.h"

#include <algorithm>

#include "kernels/cuda/cross_entropy.h"
#include "worker/model/cuda_model_state.h"
#include "worker/model/fp8_linears.h"
#include "worker/model/linear_gemm_args.h"

namespace forge {

using cuda::bf16;

// Tied LM head + loss over token chunks, so only [chunk, V] bf16 logits buffers exist:
// logits = hf Wte^T; cross-entropy turns them into dlogits in place; dhf = dlogits Wte;
// dWte (+)= dlogits^T hf (fp32, into the same gradient the embedding backward adds to later).
// Without accumulate_grads the first chunk overwrites dWte (every element: [V, d]) and the
// later chunks add to it.
//
// With the wgrad stream, dWte of chunk c runs there next to chunk c's dhf GEMM and chunk
// c+1's logits GEMM and cross-entropy. Chunk c's dlogits buffer is rewritten by the logits
// GEMM of chunk c + num_logits, which waits for that buffer's last dWte (kLogits0/1); with two
// buffers that is two chunks of chain work later. hf is only read here (rewritten by the next
// forward, after the join). dh rows are written by the chain only. The FP8 LM head's dWte
// (Fp8Linears::lm_head_wgrad) reads the same buffer (holding dlogits8's transposed copy then)
// and hf8t of the same slot, whose cast comes after that wait too.
Status CudaModel::LmHead(const int32_t* targets, float dloss, bool backward,
                         bool accumulate_grads, float* losses, cudaStream_t s) {
  Buffers& b = *buf_;
  // The head's weight: wte itself when tied, else the final unit's lm_head tensor.
  const bf16* wte = UnitParams(layout_.head_unit) + layout_.lm_head;
  float* dwte = UnitGrads(layout_.head_unit) + layout_.lm_head;
  const int64_t chunk = std::min<int64_t>(N_, o_.lm_head_chunk_rows);
  const LinearStrategy& lm = plan_->lm_head;
  // FP8 logits and dhf GEMMs (precision.fp8.lm_head): Wte cast as the blocks' weights are,
  // once per step (its first micro-batch) and for every evaluation pass.
  Fp8Linears* f8 = b.fp8.get();
  if (lm.input == CastBy::kCastPass && (!backward || !accumulate_grads)) {
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
    FORGE_RETURN_IF_ERROR(f8->CastLmHeadWeight(wte, s));
  }
  int c = 0;
  for (int64_t r0 = 0; r0 < N_; r0 += chunk, ++c) {
    const int64_t rows = std::min(chunk, N_ - r0);
    const bf16* hf = b.hf + r0 * d_;
    const int slot = c % b.num_logits;
    bf16* logits = b.logits[slot];
    const WgradHazard logits_read = slot == 0 ? WgradHazard::kLogits0 : WgradHazard::kLogits1;
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kLmHeadGemm, s));
    FORGE_RETURN_IF_ERROR(WaitWgrad(logits_read, s));  // dWte of chunk c - num_logits
    if (lm.forward == GemmPath::kFp8CublasLt) {
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
      FORGE_RETURN_IF_ERROR(f8->CastLmHeadInput(hf, rows, backward ? slot : -1, s));
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kLmHeadGemm, s));
      FORGE_RETURN_IF_ERROR(b.gemm.Run(f8->LmHeadForward(logits, rows), s));
    } else {
      FORGE_RETURN_IF_ERROR(b.gemm.Run(Linear(logits, hf, wte, rows, V_, d_), s));
    }
    FORGE_RETURN_IF_ERROR(Phase(StepPhase::kCrossEntropy, s));
    // FP8: the dgrad's E5M2 dlogits come out of the cross-entropy kernel itself on a delayed
    // step, from a cast of its bf16 output otherwise.
    if (backward && lm.grad == CastBy::kCrossEntropy) {
      FORGE_RETURN_IF_ERROR(
          f8->CrossEntropyToGrad(logits, losses + r0, targets + r0, rows, dloss, s));
    } else {
      FORGE_RETURN_IF_ERROR(cuda::CrossEntropyForwardBackward(logits, losses + r0, targets + r0,
                                                              rows, V_, dloss, backward, s));
      if (backward && lm.grad == CastBy::kCastPass) {
        FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdElementwise, s));
        FORGE_RETURN_IF_ERROR(f8->CastLmHeadGrad(logits, rows, s));
      }
    }
    if (!backward) continue;
    const bool acc = accumulate_grads || r0 > 0;
    const GemmPath wgrad = rows == chunk ? lm.wgrad : plan_->lm_head_tail_wgrad;
    if (wgrad == GemmPath::kFp8CublasLt) {
      // FP8 dWte: dlogits8's transposed copy goes into this chunk's logits buffer (no bf16
      // dlogits were written, or the cast above has read them), guarded like the logits.
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kBwdElementwise, s));
      FORGE_RETURN_IF_ERROR(f8->TransposeLmHeadGrad(logits, rows, s));
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kLmHeadGemm, s));
      FORGE_RETURN_IF_ERROR(
          WgradGemm(f8->LmHeadBackwardWeight(dwte, logits, slot, rows, acc), logits_read, s));
    } else {
      FORGE_RETURN_IF_ERROR(Phase(StepPhase::kLmHeadGemm, s));
      FORGE_RETURN_IF_ERROR(
          WgradGemm(LinearBackwardWeight(dwte, logits, hf, rows, V_, d_, acc), logits_read, s));
    }
    FORGE_RETURN_IF_ERROR(b.gemm.Run(
        lm.dgrad == GemmPath::kFp8CublasLt
            ? f8->LmHeadBackwardData(b.dh + r0 * d_, rows)
            : LinearBackwardData(b.dh + r0 * d_, logits, wte, rows, V_, d_),
        s));
  }
  // The embedding backward adds into dWte on the chain after the last dWte chunk.
  if (backward) FORGE_RETURN_IF_ERROR(RecordWgrad(WgradHazard::kDwte));
  return Status::Ok();
}

}  // namespace forge
