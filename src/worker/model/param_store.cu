// The parameter-shaped device buffers: fp32 master weights, the bf16 compute copy, fp32
// gradients, AdamW moments and their sharded slots, allocated in padded units
// (CudaParamBuffers), and the host <-> device copies of them.
#include "worker/model/cuda_model.h"

#include <string>

#include "kernels/cuda/bf16.cuh"
#include "kernels/cuda/cuda_check.h"
#include "worker/model/cuda_model_state.h"
#include "worker/parallel/shard_layout.h"

namespace forge {

using cuda::bf16;

namespace {

// Units start on 128-element boundaries: 256 bytes for bf16, 512 for fp32, so one offset table
// serves every parameter-shaped buffer and each unit (a DDP bucket / ZeRO shard) is aligned.
constexpr int64_t kUnitAlign = 128;

Status CheckUnitSizes(const ParamLayout& layout, const UnitBuffers& host) {
  if (host.size() != layout.units.size()) {
    return Status::Invalid("expected " + std::to_string(layout.units.size()) +
                           " unit buffers, got " + std::to_string(host.size()));
  }
  for (size_t u = 0; u < host.size(); ++u) {
    if (static_cast<int64_t>(host[u].size()) != layout.units[u].numel) {
      return Status::Invalid("unit " + layout.units[u].name + ": expected " +
                             std::to_string(layout.units[u].numel) + " floats, got " +
                             std::to_string(host[u].size()));
    }
  }
  return Status::Ok();
}

}  // namespace

Status CudaModel::AllocateParams() {
  const CudaModelOptions& o = o_;
  Buffers& b = *buf_;
  // Parameters, gradients, moments. Units padded for the data-parallel world (zero padding),
  // so collectives work in place on a unit.
  const int W = o.shard_world;
  if (W < 1 || o.shard_rank < 0 || o.shard_rank >= W) {
    return Status::Invalid("cuda model: shard rank " + std::to_string(o.shard_rank) + " of " +
                           std::to_string(W));
  }
  const size_t U = layout_.units.size();
  pb_.unit_offset.clear();
  pb_.shard_offset.clear();
  pb_.slot.clear();
  int64_t flat = 0, flat_shard = 0;
  for (const UnitLayout& u : layout_.units) {
    pb_.unit_offset.push_back(flat);
    flat = AlignUp(flat + PaddedSize(u.numel, W), kUnitAlign);
    pb_.slot.push_back(ShardSize(u.numel, W));
    pb_.shard_offset.push_back(flat_shard);
    flat_shard = AlignUp(flat_shard + pb_.slot.back(), kUnitAlign);
  }
  b.flat = flat;
  const int64_t state = o.shard_optimizer ? flat_shard : flat;  // master, m, v
  if (o.shard_params && !o.shard_optimizer) {
    return Status::Invalid("cuda model: shard_params needs shard_optimizer");
  }
  FORGE_RETURN_IF_ERROR(Alloc(&b.master, state));
  if (o.shard_params) {
    FORGE_RETURN_IF_ERROR(Alloc(&b.params_shard, flat_shard));
  } else {
    FORGE_RETURN_IF_ERROR(Alloc(&b.params, flat));
    FORGE_RETURN_IF_ERROR(Alloc(&b.grads, flat));
  }
  if (o.grads16) {
    if (o.shard_optimizer || W < 2) {
      return Status::Invalid("cuda model: grads16 is for ddp (shard_world > 1, whole units)");
    }
    FORGE_RETURN_IF_ERROR(Alloc(&b.grads16, flat));
    // Padding stays zero: collectives and norms read whole units only, but keep it defined.
    FORGE_CUDA_CHECK(cudaMemset(b.grads16, 0, size_t(flat) * sizeof(bf16)));
  }
  FORGE_RETURN_IF_ERROR(Alloc(&b.m, state));
  FORGE_RETURN_IF_ERROR(Alloc(&b.v, state));
  if (o.shard_optimizer) FORGE_RETURN_IF_ERROR(Alloc(&b.grad_shard, flat_shard));
  b.state_flat = state;
  b.flat_shard = flat_shard;
  pb_.master = b.master;
  pb_.params = b.params;
  pb_.grads = b.grads;
  pb_.grads16 = b.grads16;
  pb_.params_shard = b.params_shard;
  unit_params_.assign(U, nullptr);
  unit_grads_.assign(U, nullptr);
  if (!o.shard_params) {
    for (size_t u = 0; u < U; ++u) {
      BindUnit(int(u), b.params + pb_.unit_offset[u], b.grads + pb_.unit_offset[u]);
    }
  }
  pb_.m = b.m;
  pb_.v = b.v;
  pb_.grad_shard = b.grad_shard;
  return Status::Ok();
}

Status CudaModel::CopyUnits(const UnitBuffers& host, float* device, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, host));
  for (size_t u = 0; u < host.size(); ++u) {
    FORGE_CUDA_CHECK(cudaMemcpyAsync(device + pb_.unit_offset[u], host[u].data(),
                                     host[u].size() * sizeof(float), cudaMemcpyHostToDevice,
                                     stream));
  }
  return Status::Ok();
}

Status CudaModel::ReadUnits(const float* device, UnitBuffers* host, cudaStream_t stream) {
  host->resize(layout_.units.size());
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    (*host)[u].resize(layout_.units[u].numel);
    FORGE_CUDA_CHECK(cudaMemcpyAsync((*host)[u].data(), device + pb_.unit_offset[u],
                                     (*host)[u].size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream));
  }
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status CudaModel::CopySlots(const UnitBuffers& host, float* device, cudaStream_t stream) {
  for (size_t u = 0; u < host.size(); ++u) {
    const ShardRange own = ShardOf(layout_.units[u].numel, o_.shard_rank, o_.shard_world);
    if (own.size() == 0) continue;
    FORGE_CUDA_CHECK(cudaMemcpyAsync(device + pb_.shard_offset[u], host[u].data() + own.begin,
                                     own.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  }
  return Status::Ok();
}

// Sharded: the full fp32 units go through the gradient buffer (scratch between steps; its
// padding is never written, so it stays zero) to make the full bf16 copy.
Status CudaModel::UploadParams(const UnitBuffers& master, cudaStream_t stream) {
  Buffers& b = *buf_;
  FORGE_RETURN_IF_ERROR(FlushUpdate(stream));
  if (o_.shard_params) {  // slots only: fp32 master, and its bf16 values (padding stays 0)
    FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, master).Annotate("SetParams"));
    FORGE_RETURN_IF_ERROR(CopySlots(master, b.master, stream));
    FORGE_RETURN_IF_ERROR(cuda::CastFloatToBf16(b.params_shard, b.master, b.flat_shard, stream));
    FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return Status::Ok();
  }
  float* full = o_.shard_optimizer ? b.grads : b.master;
  FORGE_RETURN_IF_ERROR(CopyUnits(master, full, stream).Annotate("SetParams"));
  FORGE_RETURN_IF_ERROR(cuda::CastFloatToBf16(b.params, full, b.flat, stream));
  if (o_.shard_optimizer) FORGE_RETURN_IF_ERROR(CopySlots(master, b.master, stream));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status CudaModel::DownloadParams(UnitBuffers* master, cudaStream_t stream) {
  if (o_.shard_optimizer) {
    return Status::Precondition("cuda model: sharded master weights are gathered by the "
                                "data-parallel layer");
  }
  return ReadUnits(buf_->master, master, stream);
}

Status CudaModel::DownloadGrads(UnitBuffers* grads, cudaStream_t stream) {
  if (o_.shard_params) {
    return Status::Precondition("cuda model: fsdp gradients are gathered by the data-parallel "
                                "layer");
  }
  if (buf_->grads16) {  // the summed gradient lives in bf16 (grads16); widening is exact
    FORGE_RETURN_IF_ERROR(cuda::CastBf16ToFloat(buf_->grads, buf_->grads16, buf_->flat, stream));
  }
  return ReadUnits(buf_->grads, grads, stream);
}

Status CudaModel::UploadMoments(const UnitBuffers& m, const UnitBuffers& v,
                                cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(FlushUpdate(stream));
  if (o_.shard_optimizer) {
    FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, m).Annotate("SetMoments (m)"));
    FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, v).Annotate("SetMoments (v)"));
    FORGE_RETURN_IF_ERROR(CopySlots(m, buf_->m, stream));
    FORGE_RETURN_IF_ERROR(CopySlots(v, buf_->v, stream));
  } else {
    FORGE_RETURN_IF_ERROR(CopyUnits(m, buf_->m, stream).Annotate("SetMoments (m)"));
    FORGE_RETURN_IF_ERROR(CopyUnits(v, buf_->v, stream).Annotate("SetMoments (v)"));
  }
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status CudaModel::DownloadMoments(UnitBuffers* m, UnitBuffers* v, cudaStream_t stream) {
  if (o_.shard_optimizer) {
    return Status::Precondition("cuda model: sharded moments are gathered by the data-parallel "
                                "layer");
  }
  FORGE_RETURN_IF_ERROR(ReadUnits(buf_->m, m, stream));
  return ReadUnits(buf_->v, v, stream);
}

Status CudaModel::ZeroMoments(cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(FlushUpdate(stream));
  FORGE_CUDA_CHECK(cudaMemsetAsync(buf_->m, 0, buf_->state_flat * sizeof(float), stream));
  FORGE_CUDA_CHECK(cudaMemsetAsync(buf_->v, 0, buf_->state_flat * sizeof(float), stream));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status CudaModel::ZeroGrads(cudaStream_t stream) {
  if (o_.shard_params) return Status::Precondition("cuda model: ZeroGrads with fsdp");
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kCopy, stream));
  FORGE_CUDA_CHECK(cudaMemsetAsync(buf_->grads, 0, buf_->flat * sizeof(float), stream));
  return Status::Ok();
}

bf16* CudaModel::UnitGrads16(int unit) const {
  return buf_->grads16 ? buf_->grads16 + pb_.unit_offset[size_t(unit)] : nullptr;
}

}  // namespace forge
