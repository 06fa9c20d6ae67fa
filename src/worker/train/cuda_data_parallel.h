// Data parallelism for the CUDA backend over NCCL, kept apart from the model: it plugs into
// CudaModel's per-unit hooks (cuda_model.h) and owns every collective of a step.
//
//   ddp    each unit's gradient is all-reduced on the NCCL stream as soon as the unit's
//          backward finished (on the step's last micro-step only), overlapped with the
//          backward of the units before it; the compute stream waits for all of them just
//          before the optimizer. Gradients are then identical everywhere, so the grad norm
//          needs no collective; AdamW runs on the full model on every rank.
//   zero1  each unit's gradient is reduce-scattered the same way into this rank's fp32 slot;
//   zero2  the grad norm's sum of squares is all-reduced (one float); AdamW updates this
//          rank's slots of the master weights and moments and writes their bf16 values into
//          the full compute copy, which is then all-gathered in place unit by unit; the next
//          forward waits for each unit's gather just before it reads the unit, so the gathers
//          overlap the forward of the units before. On the GPU zero2 is zero1: the flat
//          gradient buffer is the backward's working memory either way (freeing non-local
//          gradients needs per-unit gradient buffers, which fsdp would bring).
//
// The loss of a step is the mean over ranks of each rank's mean (equal token counts), summed
// by one all-reduce of a float; callers divide by the world size. Gradients use
// dloss = 1 / (tokens * world), so the summed gradient is the global mean's.
//
// Every call only enqueues work (the gathers of GatherSlots end in a host sync).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "kernels/cuda/adamw.cuh"
#include "worker/model/cuda_model.h"
#include "worker/model/unit_buffers.h"
#include "worker/parallel/nccl_comm.h"

namespace forge {

class CudaDataParallel {
 public:
  // `comm` and `model` must outlive this. The model must have been created with
  // shard_world = comm->world(), shard_rank = comm->rank() and shard_optimizer for zero1/2.
  static StatusOr<std::unique_ptr<CudaDataParallel>> Create(NcclComm* comm, ParallelMode mode,
                                                            CudaModel* model);
  ~CudaDataParallel();

  int world() const { return world_; }
  bool sharded() const { return mode_ != ParallelMode::kDdp; }

  // Hooks for a pass that only reads parameters (forward-only passes, micro-steps before the
  // last) and for the pass that completes a step's gradient: all_reduce forces all-reduce in
  // every mode (ComputeGradients, where every rank wants the full gradient).
  const CudaModelHooks* read_hooks() const { return &read_hooks_; }
  const CudaModelHooks* grad_hooks(bool all_reduce) const {
    return all_reduce ? &allreduce_hooks_ : &grad_hooks_;
  }

  // The compute stream waits for the gradient collectives started by grad hooks.
  Status JoinGrads(cudaStream_t compute);
  // stats[0] = this rank's mean loss -> summed over ranks (divide by world()).
  Status SumLoss(float* stats, cudaStream_t compute);
  // After JoinGrads: grad norm (stats[1] = global sum of squares), clipping, AdamW, and for
  // zero the parameter all-gathers. stats[0] is summed over ranks as by SumLoss.
  Status Optimize(const cuda::AdamWHyper* hyper, float* stats, cudaStream_t compute);
  // zero: the full fp32 units of a sharded buffer (master, m or v: pick with `which`),
  // gathered through the gradient buffer (scratch between steps). Collective; synchronises.
  enum class State { kMaster, kM, kV };
  Status GatherSlots(State which, UnitBuffers* out, cudaStream_t compute);

 private:
  CudaDataParallel(NcclComm* comm, ParallelMode mode, CudaModel* model);
  Status Init();
  // The NCCL stream waits for `e` (recorded on a stream the collective depends on).
  Status CommWaits(cudaEvent_t e);
  Status CommWaitsStream(cudaStream_t s);
  Status Track(StatusOr<CommWorkPtr> w);
  Status OnGradReady(int unit, cudaEvent_t compute_done, cudaEvent_t wgrad_done,
                     bool all_reduce);
  Status OnBeforeForward(int unit, cudaStream_t compute);
  Status GatherParams(cudaStream_t compute);

  NcclComm* comm_;
  ParallelMode mode_;
  CudaModel* model_;
  int rank_ = 0, world_ = 1;
  cudaStream_t nccl_stream_ = nullptr;
  cudaEvent_t compute_point_ = nullptr;        // compute-stream point the NCCL stream waits for
  std::vector<cudaEvent_t> params_gathered_;  // per unit, on the NCCL stream (zero)
  std::vector<bool> gather_pending_;
  std::vector<CommWorkPtr> in_flight_;        // gradient collectives of the current pass
  CudaModelHooks read_hooks_, grad_hooks_, allreduce_hooks_;
};

}  // namespace forge
