// Every parameter-shaped device buffer of a CudaModel, in one place: fp32 master weights, the
// bf16 compute copy, fp32 gradients, AdamW moments and, with data parallelism, their sharded
// slots. Each is one flat allocation of units padded to PaddedSize(numel, shard_world)
// (shard_layout.h) at 128-element boundaries, zero in the padding, so NCCL reduce-scatter /
// all-gather run in place on a unit. The store also holds the per-unit views the model's passes
// read and write (BindUnit), AdamW's per-tensor descriptors over its buffers, and the host <->
// device copies of them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/bf16.h"
#include "worker/model/param_layout.h"
#include "worker/model/unit_buffers.h"

namespace forge {

// How the buffers are laid out over the data-parallel ranks (CudaModelOptions has the why of
// each).
struct ParamStoreOptions {
  int shard_world = 1;
  int shard_rank = 0;
  bool shard_optimizer = false;  // master, m, v and grad_shard hold this rank's slots only
  bool shard_params = false;     // no bf16 copy or full gradient: the gathers cast the slots
  bool grads16 = false;          // a bf16 copy of the gradient buffer (ddp only)
  // Where the buffers collectives run on (params, grads, grads16) come from, when set (a
  // zeroed buffer of that many bytes, owned by whoever gives it); cudaMalloc else.
  std::function<StatusOr<void*>(size_t)> collective_alloc;
};

// Where the parameter-shaped device buffers are, for the data-parallel layer.
struct CudaParamBuffers {
  float* master = nullptr;      // full, or this rank's slots (shard_optimizer)
  cuda::bf16* params = nullptr; // full, padded units (null with shard_params)
  float* grads = nullptr;       // full, padded units (null with shard_params)
  float* m = nullptr;           // like master
  float* v = nullptr;
  float* grad_shard = nullptr;  // this rank's summed gradient slots (shard_optimizer only)
  cuda::bf16* grads16 = nullptr;      // like grads, bf16 (CudaModelOptions::grads16 only)
  std::vector<int64_t> unit_offset;   // of unit u in params / grads (and master, m, v unsharded)
  std::vector<int64_t> shard_offset;  // of unit u's slot in master, m, v, grad_shard (sharded)
  std::vector<int64_t> slot;          // ShardSize(numel_u, shard_world)
};

class ParamStore {
 public:
  ParamStore() = default;
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Allocates every buffer (zero-filled) for `layout`; binds each unit to the full buffers
  // (none with shard_params).
  Status Init(const ParamLayout& layout, const ParamStoreOptions& o);

  const CudaParamBuffers& buffers() const { return pb_; }
  size_t allocated_bytes() const { return allocated_bytes_; }
  int64_t flat() const { return flat_; }              // elements of params, grads, grads16
  int64_t state_flat() const { return state_flat_; }  // of master, m, v
  int64_t flat_shard() const { return flat_shard_; }  // of the slot buffers

  // Unit u's bf16 parameters and fp32 gradient for the passes that follow (BindUnit), and its
  // bf16 gradient (null without grads16).
  cuda::bf16* unit_params(int unit) const { return unit_params_[size_t(unit)]; }
  float* unit_grads(int unit) const { return unit_grads_[size_t(unit)]; }
  cuda::bf16* unit_grads16(int unit) const {
    return pb_.grads16 ? pb_.grads16 + pb_.unit_offset[size_t(unit)] : nullptr;
  }
  void BindUnit(int unit, cuda::bf16* params, float* grads) {
    unit_params_[size_t(unit)] = params;
    unit_grads_[size_t(unit)] = grads;
  }

  // AdamW's descriptors over these buffers: one per tensor (not per unit) so weight decay
  // follows the tensor; sharded, one per piece of a tensor inside this rank's slot (bf16
  // output at its place in the full compute copy, where the all-gather sends it from). Unit
  // u's descriptors start at (*first_tensor)[u]. Never empty: a rank whose slots are all empty
  // (tiny models on many ranks) gets one of 0 elements, so it still runs the kernels.
  std::vector<cuda::AdamWTensor> AdamWTensors(float weight_decay,
                                              std::vector<int>* first_tensor) const;

  // Host <-> device, ordered on `stream` and synchronised before returning. Host buffers must
  // have the layout's unit sizes (Invalid otherwise). UploadParams also refreshes the bf16 copy.
  // With shard_optimizer the uploads keep this rank's slots of the full host units (the bf16
  // copy is still filled in full), and DownloadParams / DownloadMoments are Precondition
  // errors: gathering the slots is a collective, the data-parallel layer's job. A CudaModel's
  // uploads and ZeroMoments go through CudaModel (a deferred update is applied first).
  Status UploadParams(const UnitBuffers& master, cudaStream_t stream);
  Status DownloadParams(UnitBuffers* master, cudaStream_t stream);
  Status DownloadGrads(UnitBuffers* grads, cudaStream_t stream);
  Status UploadMoments(const UnitBuffers& m, const UnitBuffers& v, cudaStream_t stream);
  Status DownloadMoments(UnitBuffers* m, UnitBuffers* v, cudaStream_t stream);
  Status ZeroMoments(cudaStream_t stream);
  // Stream-ordered, not synchronised (a step piece).
  Status ZeroGrads(cudaStream_t stream);

 private:
  Status CopyUnits(const UnitBuffers& host, float* device, cudaStream_t stream);
  Status ReadUnits(const float* device, UnitBuffers* host, cudaStream_t stream);
  // This rank's slot of every host unit into a sharded buffer (shard_optimizer).
  Status CopySlots(const UnitBuffers& host, float* device, cudaStream_t stream);

  ParamLayout layout_;
  ParamStoreOptions o_;
  CudaParamBuffers pb_;
  int64_t flat_ = 0, state_flat_ = 0, flat_shard_ = 0;
  std::vector<cuda::bf16*> unit_params_;
  std::vector<float*> unit_grads_;
  std::vector<void*> allocations_;  // freed in the destructor
  size_t allocated_bytes_ = 0;
};

}  // namespace forge
