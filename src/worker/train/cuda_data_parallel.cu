#include "worker/train/cuda_data_parallel.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "worker/parallel/shard_layout.h"

namespace forge {

CudaDataParallel::CudaDataParallel(NcclComm* comm, ParallelMode mode, CudaModel* model)
    : comm_(comm), mode_(mode), model_(model) {}

CudaDataParallel::~CudaDataParallel() {
  for (cudaEvent_t e : params_gathered_) cudaEventDestroy(e);
  if (compute_point_) cudaEventDestroy(compute_point_);
}

StatusOr<std::unique_ptr<CudaDataParallel>> CudaDataParallel::Create(NcclComm* comm,
                                                                     ParallelMode mode,
                                                                     CudaModel* model) {
  if (comm == nullptr || model == nullptr) return Status::Invalid("CudaDataParallel: null comm/model");
  if (mode == ParallelMode::kFsdp) {
    return Status::Invalid(
        "parallel.mode fsdp is not implemented on the cuda backend yet (ddp, zero1, zero2 are)");
  }
  std::unique_ptr<CudaDataParallel> dp(new CudaDataParallel(comm, mode, model));
  FORGE_RETURN_IF_ERROR(dp->Init());
  return StatusOr<std::unique_ptr<CudaDataParallel>>(std::move(dp));
}

Status CudaDataParallel::Init() {
  rank_ = comm_->rank();
  world_ = comm_->world();
  nccl_stream_ = static_cast<cudaStream_t>(comm_->stream());
  comm_->SetProducerStream(nullptr);  // ordering is explicit, through the events below
  const size_t U = model_->layout().units.size();
  const CudaParamBuffers& pb = model_->param_buffers();
  if (pb.slot.size() != U || (sharded() && pb.grad_shard == nullptr)) {
    return Status::Precondition("CudaDataParallel: the model was not created for " +
                                std::string(ParallelModeName(mode_)) + " over " +
                                std::to_string(world_) + " ranks");
  }
  FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&compute_point_, cudaEventDisableTiming));
  params_gathered_.resize(U);
  for (cudaEvent_t& e : params_gathered_) {
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  gather_pending_.assign(U, false);

  auto before = [this](int u, cudaStream_t s) { return OnBeforeForward(u, s); };
  read_hooks_.before_forward = before;
  grad_hooks_.before_forward = before;
  allreduce_hooks_.before_forward = before;
  grad_hooks_.grad_ready = [this](int u, cudaEvent_t c, cudaEvent_t w) {
    return OnGradReady(u, c, w, /*all_reduce=*/false);
  };
  allreduce_hooks_.grad_ready = [this](int u, cudaEvent_t c, cudaEvent_t w) {
    return OnGradReady(u, c, w, /*all_reduce=*/true);
  };
  return Status::Ok();
}

Status CudaDataParallel::CommWaits(cudaEvent_t e) {
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(nccl_stream_, e, 0));
  return Status::Ok();
}

Status CudaDataParallel::CommWaitsStream(cudaStream_t s) {
  FORGE_CUDA_CHECK(cudaEventRecord(compute_point_, s));
  return CommWaits(compute_point_);
}

Status CudaDataParallel::Track(StatusOr<CommWorkPtr> w) {
  if (!w.ok()) return w.status();
  in_flight_.push_back(std::move(w).value());
  return Status::Ok();
}

// Gradient buckets are whole units: the NCCL stream waits for the unit's last writes on both
// streams, then sums it. Later units' backward keeps running on the compute streams.
Status CudaDataParallel::OnGradReady(int u, cudaEvent_t compute_done, cudaEvent_t wgrad_done,
                                     bool all_reduce) {
  FORGE_RETURN_IF_ERROR(CommWaits(compute_done));
  if (wgrad_done != nullptr) FORGE_RETURN_IF_ERROR(CommWaits(wgrad_done));
  const CudaParamBuffers& pb = model_->param_buffers();
  const UnitLayout& unit = model_->layout().units[u];
  float* g = pb.grads + pb.unit_offset[u];
  const std::string what = "grad " + unit.name;
  if (all_reduce || !sharded()) {
    return Track(comm_->AllReduceSum(g, unit.numel, DType::kF32, what));
  }
  // Padded unit: world * slot elements, zero beyond numel.
  return Track(comm_->ReduceScatterSum(g, pb.grad_shard + pb.shard_offset[u], pb.slot[u],
                                       DType::kF32, what));
}

Status CudaDataParallel::OnBeforeForward(int u, cudaStream_t compute) {
  if (!gather_pending_[u]) return Status::Ok();
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(compute, params_gathered_[u], 0));
  return Status::Ok();
}

Status CudaDataParallel::JoinGrads(cudaStream_t compute) {
  Status first;
  for (CommWorkPtr& w : in_flight_) {
    const Status s = w->WaitOnStream(compute);
    if (first.ok() && !s.ok()) first = s;
  }
  in_flight_.clear();
  return first;
}

Status CudaDataParallel::SumLoss(float* stats, cudaStream_t compute) {
  FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
  FORGE_ASSIGN_OR_RETURN(CommWorkPtr w, comm_->AllReduceSum(stats, 1, DType::kF32, "loss"));
  return w->WaitOnStream(compute);
}

Status CudaDataParallel::Optimize(const cuda::AdamWHyper* hyper, float* stats,
                                  cudaStream_t compute) {
  FORGE_RETURN_IF_ERROR(model_->GradSumSquares(stats + 1, compute));
  if (!sharded()) {
    // Identical gradients everywhere: the local norm is the global one.
    FORGE_RETURN_IF_ERROR(model_->ClipAndUpdate(hyper, stats + 1, compute));
    return SumLoss(stats, compute);
  }
  // [loss, sum of squares of this rank's slots] summed over ranks in one collective.
  FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
  FORGE_ASSIGN_OR_RETURN(CommWorkPtr w,
                         comm_->AllReduceSum(stats, 2, DType::kF32, "loss and grad norm"));
  FORGE_RETURN_IF_ERROR(w->WaitOnStream(compute));
  FORGE_RETURN_IF_ERROR(model_->ClipAndUpdate(hyper, stats + 1, compute));
  return GatherParams(compute);
}

// In place: this rank's slot of the bf16 copy (just written by AdamW) is at slot `rank` of
// the padded unit, which is where NCCL's in-place all-gather reads it.
Status CudaDataParallel::GatherParams(cudaStream_t compute) {
  FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
  const CudaParamBuffers& pb = model_->param_buffers();
  const auto& units = model_->layout().units;
  for (size_t u = 0; u < units.size(); ++u) {
    cuda::bf16* p = pb.params + pb.unit_offset[u];
    FORGE_ASSIGN_OR_RETURN(CommWorkPtr w,
                           comm_->AllGather(p + rank_ * pb.slot[u], p, pb.slot[u], DType::kBF16,
                                            "params " + units[u].name));
    (void)w;  // completion is tracked by the event below (and the comm's watchdog)
    FORGE_CUDA_CHECK(cudaEventRecord(params_gathered_[u], nccl_stream_));
    gather_pending_[u] = true;
  }
  return Status::Ok();
}

Status CudaDataParallel::GatherSlots(State which, UnitBuffers* out, cudaStream_t compute) {
  if (!sharded()) return Status::Precondition("GatherSlots: not sharded");
  const CudaParamBuffers& pb = model_->param_buffers();
  const float* src = which == State::kMaster ? pb.master : which == State::kM ? pb.m : pb.v;
  const auto& units = model_->layout().units;
  out->resize(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    float* scratch = pb.grads + pb.unit_offset[u];
    FORGE_CUDA_CHECK(cudaMemcpyAsync(scratch + rank_ * pb.slot[u], src + pb.shard_offset[u],
                                     pb.slot[u] * sizeof(float), cudaMemcpyDeviceToDevice,
                                     compute));
    FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
    FORGE_ASSIGN_OR_RETURN(CommWorkPtr w,
                           comm_->AllGather(scratch + rank_ * pb.slot[u], scratch, pb.slot[u],
                                            DType::kF32, "gather " + units[u].name));
    FORGE_RETURN_IF_ERROR(w->WaitOnStream(compute));
    (*out)[u].resize(units[u].numel);
    FORGE_CUDA_CHECK(cudaMemcpyAsync((*out)[u].data(), scratch, units[u].numel * sizeof(float),
                                     cudaMemcpyDeviceToHost, compute));
  }
  FORGE_CUDA_CHECK(cudaStreamSynchronize(compute));
  return Status::Ok();
}

}  // namespace forge
