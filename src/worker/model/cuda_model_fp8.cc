// The model's FP8 side (precision.compute fp8): Fp8Linears made for the blocks' four linear
// layers (and the LM head) at this model's shapes, and a layer's weights cast into their FP8
// copies. The FP8 GEMMs themselves are called from the forward, backward and LM head.
#include "worker/model/cuda_model.h"

#include <algorithm>
#include <array>

#include "worker/model/cuda_model_state.h"
#include "worker/model/fp8_linears.h"

namespace forge {

using cuda::bf16;

// The layout's block linears are the linear layers, in LinearKind order.
static_assert(kBlockLinears == kLinearKinds);

Status CudaModel::SetUpFp8() {
  if (!o_.fp8) return Status::Ok();
  const CudaModelOptions& o = o_;
  Buffers& b = *buf_;
  std::array<Fp8LinearShape, kLinearKinds> shapes{};
  for (int k = 0; k < kLinearKinds; ++k) {
    const BlockLinear& w = layout_.linears[size_t(k)];
    shapes[size_t(k)] = {w.cols, w.rows};
  }
  const Fp8RopeShape rope{o.micro_batch, T_, H_, KV_, hd_, b.rope_freq};
  Fp8LmHeadShape lm_head;
  if (o.fp8_config.lm_head) {
    lm_head = {V_, d_, std::min<int64_t>(N_, o.lm_head_chunk_rows), NumLogitsBuffers(o),
               o.fp8_lm_head_wgrad};
  }
  FORGE_ASSIGN_OR_RETURN(
      b.fp8,
      Fp8Linears::Create(o.fp8_config, m_.n_layer, shapes, N_, int(b.acts.size()), rope, lm_head,
                         Fp8FusedBuffers{linears_.fp8_rope_table(), linears_.fp8_swiglu_gemm()},
                         /*one_weight_set=*/o.shard_params));
  allocated_bytes_ += b.fp8->allocated_bytes();
  return Status::Ok();
}

Status CudaModel::CastLayerWeights(int layer, bool backward, cudaStream_t s) {
  const int unit = layout_.block_unit(layer);
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kFwdElementwise, s));
  // Given cast already (CudaModelHooks::fp8_weights): the backward's GEMMs need their
  // transposes, the forward's none.
  if (const uint8_t* w8 = hooks_ && hooks_->fp8_weights ? hooks_->fp8_weights(unit) : nullptr) {
    std::array<const uint8_t*, kLinearKinds> at{};
    for (int k = 0; k < kLinearKinds; ++k) at[size_t(k)] = w8 + layout_.linears[size_t(k)].offset;
    return buf_->fp8->UseCastWeights(layer, at, backward, s);
  }
  const bf16* w = UnitParams(unit);
  std::array<const bf16*, kLinearKinds> at{};
  for (int k = 0; k < kLinearKinds; ++k) at[size_t(k)] = w + layout_.linears[size_t(k)].offset;
  return buf_->fp8->CastLayerWeights(layer, at, s);
}

}  // namespace forge
