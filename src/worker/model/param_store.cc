#include "worker/model/param_store.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/bf16.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/model/device_alloc.h"
#include "worker/model/shard_layout.h"

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

ParamStore::~ParamStore() {
  for (void* p : allocations_) cudaFree(p);
}

Status ParamStore::Init(const ParamLayout& layout, const ParamStoreOptions& o) {
  layout_ = layout;
  o_ = o;
  auto alloc = [&](auto** p, size_t n) {
    return DeviceAlloc("cuda model", &allocations_, &allocated_bytes_, p, n);
  };
  // Units padded for the data-parallel world (zero padding), so collectives work in place on
  // a unit.
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
  flat_ = flat;
  const int64_t state = o.shard_optimizer ? flat_shard : flat;  // master, m, v
  if (o.shard_params && !o.shard_optimizer) {
    return Status::Invalid("cuda model: shard_params needs shard_optimizer");
  }
  FORGE_RETURN_IF_ERROR(alloc(&pb_.master, state));
  auto alloc_collective = [&](auto** p, size_t n) -> Status {
    if (!o.collective_alloc) return alloc(p, n);
    using T = std::remove_pointer_t<std::remove_pointer_t<decltype(p)>>;
    FORGE_ASSIGN_OR_RETURN(void* q, o.collective_alloc(n * sizeof(T)));
    *p = static_cast<T*>(q);
    allocated_bytes_ += n * sizeof(T);
    return Status::Ok();
  };
  if (!o.shard_params) {  // fsdp keeps no bf16 copy: its gathers cast the fp32 slots
    FORGE_RETURN_IF_ERROR(alloc_collective(&pb_.params, flat));
    FORGE_RETURN_IF_ERROR(alloc_collective(&pb_.grads, flat));
  }
  if (o.grads16) {
    if (o.shard_optimizer || W < 2) {
      return Status::Invalid("cuda model: grads16 is for ddp (shard_world > 1, whole units)");
    }
    FORGE_RETURN_IF_ERROR(alloc_collective(&pb_.grads16, flat));
    // Padding stays zero: collectives and norms read whole units only, but keep it defined.
    FORGE_CUDA_CHECK(cudaMemset(pb_.grads16, 0, size_t(flat) * sizeof(bf16)));
  }
  FORGE_RETURN_IF_ERROR(alloc(&pb_.m, state));
  FORGE_RETURN_IF_ERROR(alloc(&pb_.v, state));
  if (o.shard_optimizer) FORGE_RETURN_IF_ERROR(alloc(&pb_.grad_shard, flat_shard));
  state_flat_ = state;
  flat_shard_ = flat_shard;
  unit_params_.assign(U, nullptr);
  unit_grads_.assign(U, nullptr);
  if (!o.shard_params) {
    for (size_t u = 0; u < U; ++u) {
      BindUnit(int(u), pb_.params + pb_.unit_offset[u], pb_.grads + pb_.unit_offset[u]);
    }
  }
  return Status::Ok();
}

std::vector<cuda::AdamWTensor> ParamStore::AdamWTensors(float weight_decay,
                                                        std::vector<int>* first_tensor) const {
  const ParamStoreOptions& o = o_;
  const CudaParamBuffers& b = pb_;
  std::vector<cuda::AdamWTensor> tensors;
  first_tensor->clear();
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    first_tensor->push_back(static_cast<int>(tensors.size()));
    const ShardRange own = o.shard_optimizer
                               ? ShardOf(layout_.units[u].numel, o.shard_rank, o.shard_world)
                               : ShardRange{0, layout_.units[u].numel};
    const int64_t state_base = o.shard_optimizer ? pb_.shard_offset[u] - own.begin
                                                 : pb_.unit_offset[u];
    float* g = o.shard_optimizer ? b.grad_shard : b.grads;
    for (const TensorSlot& t : layout_.units[u].tensors) {
      const int64_t lo = std::max(own.begin, t.offset);
      const int64_t hi = std::min(own.end, t.offset + t.numel);
      if (lo >= hi) continue;
      const int64_t so = state_base + lo;
      bf16* out = o.shard_params ? nullptr : b.params + pb_.unit_offset[u] + lo;
      tensors.push_back({b.master + so, out, g + so, b.m + so, b.v + so, hi - lo,
                         t.weight_decay ? weight_decay : 0.0f,
                         b.grads16 ? b.grads16 + pb_.unit_offset[u] + lo : nullptr});
    }
  }
  if (tensors.empty()) {
    tensors.push_back({b.master, nullptr, o.shard_optimizer ? b.grad_shard : b.grads, b.m, b.v,
                       0, 0.0f});
  }
  return tensors;
}

Status ParamStore::CopyUnits(const UnitBuffers& host, float* device, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, host));
  for (size_t u = 0; u < host.size(); ++u) {
    FORGE_CUDA_CHECK(cudaMemcpyAsync(device + pb_.unit_offset[u], host[u].data(),
                                     host[u].size() * sizeof(float), cudaMemcpyHostToDevice,
                                     stream));
  }
  return Status::Ok();
}

Status ParamStore::ReadUnits(const float* device, UnitBuffers* host, cudaStream_t stream) {
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

Status ParamStore::CopySlots(const UnitBuffers& host, float* device, cudaStream_t stream) {
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
Status ParamStore::UploadParams(const UnitBuffers& master, cudaStream_t stream) {
  const CudaParamBuffers& b = pb_;
  if (o_.shard_params) {  // the fp32 slots only (padding stays 0)
    FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, master).Annotate("SetParams"));
    FORGE_RETURN_IF_ERROR(CopySlots(master, b.master, stream));
    FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return Status::Ok();
  }
  float* full = o_.shard_optimizer ? b.grads : b.master;
  FORGE_RETURN_IF_ERROR(CopyUnits(master, full, stream).Annotate("SetParams"));
  FORGE_RETURN_IF_ERROR(cuda::CastFloatToBf16(b.params, full, flat_, stream));
  if (o_.shard_optimizer) FORGE_RETURN_IF_ERROR(CopySlots(master, b.master, stream));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status ParamStore::DownloadParams(UnitBuffers* master, cudaStream_t stream) {
  if (o_.shard_optimizer) {
    return Status::Precondition("cuda model: sharded master weights are gathered by the "
                                "data-parallel layer");
  }
  return ReadUnits(pb_.master, master, stream);
}

Status ParamStore::DownloadGrads(UnitBuffers* grads, cudaStream_t stream) {
  if (o_.shard_params) {
    return Status::Precondition("cuda model: fsdp gradients are gathered by the data-parallel "
                                "layer");
  }
  if (pb_.grads16) {  // the summed gradient lives in bf16 (grads16); widening is exact
    FORGE_RETURN_IF_ERROR(cuda::CastBf16ToFloat(pb_.grads, pb_.grads16, flat_, stream));
  }
  return ReadUnits(pb_.grads, grads, stream);
}

Status ParamStore::UploadMoments(const UnitBuffers& m, const UnitBuffers& v,
                                 cudaStream_t stream) {
  if (o_.shard_optimizer) {
    FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, m).Annotate("SetMoments (m)"));
    FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, v).Annotate("SetMoments (v)"));
    FORGE_RETURN_IF_ERROR(CopySlots(m, pb_.m, stream));
    FORGE_RETURN_IF_ERROR(CopySlots(v, pb_.v, stream));
  } else {
    FORGE_RETURN_IF_ERROR(CopyUnits(m, pb_.m, stream).Annotate("SetMoments (m)"));
    FORGE_RETURN_IF_ERROR(CopyUnits(v, pb_.v, stream).Annotate("SetMoments (v)"));
  }
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status ParamStore::DownloadMoments(UnitBuffers* m, UnitBuffers* v, cudaStream_t stream) {
  if (o_.shard_optimizer) {
    return Status::Precondition("cuda model: sharded moments are gathered by the data-parallel "
                                "layer");
  }
  FORGE_RETURN_IF_ERROR(ReadUnits(pb_.m, m, stream));
  return ReadUnits(pb_.v, v, stream);
}

Status ParamStore::ZeroMoments(cudaStream_t stream) {
  FORGE_CUDA_CHECK(cudaMemsetAsync(pb_.m, 0, state_flat_ * sizeof(float), stream));
  FORGE_CUDA_CHECK(cudaMemsetAsync(pb_.v, 0, state_flat_ * sizeof(float), stream));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status ParamStore::ZeroGrads(cudaStream_t stream) {
  FORGE_CUDA_CHECK(cudaMemsetAsync(pb_.grads, 0, flat_ * sizeof(float), stream));
  return Status::Ok();
}

}  // namespace forge
