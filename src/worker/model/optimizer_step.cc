// The optimizer side of CudaModel: AdamW's per-tensor descriptors, each unit's completion
// (GradReady) and its share of the gradient norm, clipping, and AdamW now or deferred to the
// next forward (deferred_update.h), then the FP8 scale update.
#include "worker/model/cuda_model.h"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/spike_gate.h"
#include "worker/model/cuda_model_state.h"
#include "worker/model/deferred_update.h"

namespace forge {

using cuda::bf16;

Status CudaModel::SetUpOptimizer() {
  const CudaModelOptions& o = o_;
  const OptimizerConfig& opt = opt_;
  Buffers& b = *buf_;
  const size_t U = layout_.units.size();
  std::vector<int> first_tensor;  // unit u's descriptors start here
  const std::vector<cuda::AdamWTensor> tensors =
      store_.AdamWTensors(opt.weight_decay, &first_tensor);
  for (size_t u = 0; u < U; ++u) {
    cudaEvent_t e[2];
    for (cudaEvent_t& x : e) FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&x, cudaEventDisableTiming));
    b.grad_ready_compute.push_back(e[0]);
    b.grad_ready_wgrad.push_back(e[1]);
  }
  b.num_tensors = static_cast<int>(tensors.size());
  FORGE_RETURN_IF_ERROR(Alloc(&b.adam_tensors, tensors.size()));
  FORGE_CUDA_CHECK(cudaMemcpy(b.adam_tensors, tensors.data(),
                              tensors.size() * sizeof(cuda::AdamWTensor), cudaMemcpyHostToDevice));
  FORGE_RETURN_IF_ERROR(Alloc(&b.clip_scale, 1));
  FORGE_RETURN_IF_ERROR(Alloc(&b.skipped_steps, 1));
  // Deferred in every mode (deferred_update.h says who starts it and who waits): whole units
  // on one GPU and under ddp, this rank's slots under zero and fsdp, whose next gathers wait
  // for each unit's update. fsdp gathers both root units first, so they are updated first.
  if (o.defer_update) {
    first_tensor.push_back(static_cast<int>(tensors.size()));
    std::vector<int64_t> unit_elements;
    for (size_t u = 0; u < U; ++u) {
      unit_elements.push_back(o.shard_optimizer ? store_.buffers().slot[u]
                                                : layout_.units[u].numel);
    }
    std::vector<int> order;
    if (o.shard_params) {
      order = {layout_.embedding_unit(), layout_.final_norm_unit()};
      for (int l = 0; l < m_.n_layer; ++l) order.push_back(layout_.block_unit(l));
    }
    int least = 0, greatest = 0;  // the update yields to everything else
    FORGE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    b.update = std::make_unique<DeferredUpdate>();
    FORGE_RETURN_IF_ERROR(b.update->Init(b.adam_tensors, std::move(first_tensor),
                                         std::move(unit_elements), b.clip_scale,
                                         b.skipped_steps, least, std::move(order)));
  }
  return Status::Ok();
}

// The events are per unit, and a unit completes once per pass, so a hook may wait on them
// any time before the next pass's GradReady of the same unit.
Status CudaModel::GradReady(int unit, cudaStream_t s) {
  if (hooks_ == nullptr) return UnitSumSquares(unit, s);
  if (!hooks_->grad_ready) return Status::Ok();
  Buffers& b = *buf_;
  FORGE_CUDA_CHECK(cudaEventRecord(b.grad_ready_compute[unit], s));
  cudaEvent_t wgrad_done = nullptr;
  if (dual_ && wgrad_pending_) {
    wgrad_done = b.grad_ready_wgrad[unit];
    FORGE_CUDA_CHECK(cudaEventRecord(wgrad_done, b.wgrad));
  }
  return hooks_->grad_ready(unit, b.grad_ready_compute[unit], wgrad_done);
}

// World 1: the unit's share of the gradient norm as soon as its gradient is final, so the
// 1.4 GB read (gpt350m) overlaps the rest of the backward instead of opening the optimizer.
// On the wgrad stream when it is in use: queued after every dW GEMM forked so far (this
// unit's included) and, through the event, after the chain's writes to the unit; Forward's
// join orders it before the optimizer. Each micro-step recomputes it; the last one counts.
Status CudaModel::UnitSumSquares(int unit, cudaStream_t s) {
  Buffers& b = *buf_;
  cudaStream_t run = s;
  if (dual_) {
    FORGE_CUDA_CHECK(cudaEventRecord(b.grad_ready_compute[unit], s));
    FORGE_CUDA_CHECK(cudaStreamWaitEvent(b.wgrad, b.grad_ready_compute[unit], 0));
    wgrad_pending_ = true;
    run = b.wgrad;
  }
  return SumUnitSquares(unit, run);
}

Status CudaModel::SumUnitSquares(int unit, cudaStream_t s) {
  if (unit < 0 || unit >= static_cast<int>(layout_.units.size()) || UnitGrads(unit) == nullptr) {
    return Status::Invalid("cuda model: no full gradient for unit " + std::to_string(unit));
  }
  float* partial = buf_->unit_sumsq + int64_t{unit} * cuda::SumSquaresPartials();
  const int64_t n = layout_.units[size_t(unit)].numel;
  if (store_.buffers().grads16) return cuda::SumSquaresPartialBf16(UnitGrads16(unit), n, partial, s);
  return cuda::SumSquaresPartial(UnitGrads(unit), n, partial, s);
}

// The weight GEMMs wrote a block's four matrices (its matmul tensors) in bf16 when
// grads16_direct_; the rest of a block (its norm weights), and every other unit whole, are
// cast from the fp32 gradient.
Status CudaModel::CastUnitGradsToBf16(int unit, cudaStream_t s) {
  if (store_.buffers().grads16 == nullptr) return Status::Precondition("cuda model: no grads16");
  const UnitLayout& u = layout_.units[size_t(unit)];
  if (!(grads16_direct_ && layout_.is_block_unit(unit))) {
    return cuda::CastFloatToBf16(UnitGrads16(unit), UnitGrads(unit), u.numel, s);
  }
  for (const TensorSlot& t : u.tensors) {
    if (t.is_matmul) continue;
    FORGE_RETURN_IF_ERROR(cuda::CastFloatToBf16(UnitGrads16(unit) + t.offset,
                                                UnitGrads(unit) + t.offset, t.numel, s));
  }
  return Status::Ok();
}

Status CudaModel::GradSumSquaresFromUnits(float* sumsq_out, cudaStream_t s) {
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kOptimizer, s));
  const int64_t count = int64_t(layout_.units.size()) * cuda::SumSquaresPartials();
  // The clip scale written here is provisional; ClipAndUpdate replaces it.
  return cuda::GradNormFromPartials(buf_->unit_sumsq, count, opt_.grad_clip, sumsq_out,
                                    buf_->clip_scale, s);
}

Status CudaModel::OptimizerStep(const cuda::AdamWHyper* hyper, float* sumsq_out,
                                cudaStream_t s) {
  Buffers& b = *buf_;
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kOptimizer, s));
  if (unit_sumsq_ready_) {
    FORGE_RETURN_IF_ERROR(GradSumSquaresFromUnits(sumsq_out, s));
  } else {
    FORGE_RETURN_IF_ERROR(cuda::GlobalGradNorm(b.adam_tensors, b.num_tensors, opt_.grad_clip,
                                               sumsq_out, b.clip_scale, b.gradnorm_ws,
                                               b.gradnorm_ws_bytes, s));
  }
  return UpdateOrDefer(hyper, s);
}

// AdamW by the clip scale just written, now or (defer_update) during the next forward; then
// the FP8 scale update, at the step's end either way.
Status CudaModel::UpdateOrDefer(const cuda::AdamWHyper* hyper, cudaStream_t s) {
  Buffers& b = *buf_;
  if (spike_limits_ != nullptr) {
    FORGE_RETURN_IF_ERROR(
        cuda::GateSpike(spike_stats_, spike_divisor_, spike_limits_, b.clip_scale, s));
  }
  if (b.update) {
    FORGE_RETURN_IF_ERROR(b.update->Defer(hyper, s));
  } else {
    FORGE_RETURN_IF_ERROR(cuda::AdamWMultiTensor(b.adam_tensors, b.num_tensors, hyper,
                                                 b.clip_scale, s, b.skipped_steps));
  }
  return EndStep(s);
}

Status CudaModel::FlushUpdate(cudaStream_t s) {
  return buf_->update ? buf_->update->Flush(s) : Status::Ok();
}

Status CudaModel::BeginUpdate(cudaStream_t s) {
  return buf_->update ? buf_->update->Begin(s, /*overlap=*/observer_ == nullptr) : Status::Ok();
}

Status CudaModel::WaitUpdated(int unit, cudaStream_t s) {
  return buf_->update ? buf_->update->WaitUnit(unit, s) : Status::Ok();
}

Status CudaModel::GradSumSquares(float* sumsq_out, cudaStream_t s) {
  Buffers& b = *buf_;
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kOptimizer, s));
  // The clip scale written here is this rank's; ClipAndUpdate replaces it.
  return cuda::GlobalGradNorm(b.adam_tensors, b.num_tensors, opt_.grad_clip, sumsq_out,
                              b.clip_scale, b.gradnorm_ws, b.gradnorm_ws_bytes, s);
}

Status CudaModel::ClipAndUpdate(const cuda::AdamWHyper* hyper, const float* sumsq,
                                cudaStream_t s) {
  Buffers& b = *buf_;
  FORGE_RETURN_IF_ERROR(cuda::ClipScaleFromSumSquares(sumsq, opt_.grad_clip, b.clip_scale, s));
  return UpdateOrDefer(hyper, s);
}

Status CudaModel::EndStep(cudaStream_t s) {
  return buf_->fp8 ? buf_->fp8->EndStep(s) : Status::Ok();
}

const int64_t* CudaModel::skipped_steps() const { return buf_->skipped_steps; }

}  // namespace forge
