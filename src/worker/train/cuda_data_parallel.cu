#include "worker/train/cuda_data_parallel.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cuda/adamw.h"  // CastFloatToBf16, CastBf16ToFloat
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/fp8_scale_update.h"
#include "worker/model/fp8_linears.h"
#include "worker/model/shard_layout.h"
#include "worker/train/fp8_gather_rule.h"
#include "worker/train/lookup_apart_rule.h"

namespace forge {
namespace {

// dst[i] += src[i]: accumulates a later micro-step's reduce-scattered gradient slot (fsdp).
__global__ void AddKernel(float* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    dst[i] += src[i];
  }
}

// fsdp's FP8 slot amaxes of `blocks` blocks: a 16-byte slot (four floats) per linear weight of
// each block, as the casts write them and AmaxFoldKernel reads them.
size_t SlotAmaxBytes(int blocks) { return size_t(blocks) * kLinearKinds * 4 * sizeof(float); }

// *dst[i] = max(*dst[i], src[4 i]) for amaxes (non-negative floats, NaN patterns above Inf's:
// compared as their bits, as the casts fold them; src in 16-byte slots, as casts take them).
__global__ void AmaxFoldKernel(float* const* __restrict__ dst, const float* __restrict__ src,
                               int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const float a = src[4 * i];
  if (__float_as_uint(a) > __float_as_uint(*dst[i])) *dst[i] = a;
}

// out[i] = bf16(slot[pack[i]]) for i < mine, 0 up to n (the padding of a rank's packed part);
// rounded to nearest, as every cast of the fp32 slots is.
__global__ void PackKernel(cuda::bf16* __restrict__ out, const float* __restrict__ slot,
                           const int64_t* __restrict__ pack, int64_t mine, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    out[i] = __float2bfloat16_rn(i < mine ? slot[pack[i]] : 0.0f);
  }
}

// unit[dst[j]] = gathered[src[j]]: the packed parts back at their unit offsets.
__global__ void UnpackKernel(cuda::bf16* __restrict__ unit, const cuda::bf16* __restrict__ gathered,
                             const int64_t* __restrict__ dst, const int64_t* __restrict__ src,
                             int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < n; j += stride) {
    unit[dst[j]] = gathered[src[j]];
  }
}

}  // namespace

CudaDataParallel::CudaDataParallel(NcclComm* comm, const ModeRules& rules, CudaModel* model,
                                   GradReduce grad_reduce, DdpAllReduce ddp_allreduce)
    : comm_(comm),
      rules_(rules),
      model_(model),
      grad_reduce_(grad_reduce),
      ddp_allreduce_(ddp_allreduce) {}

CudaDataParallel::~CudaDataParallel() {
  // The NCCL stream may still read or write the buffers below.
  if (nccl_stream_) cudaStreamSynchronize(nccl_stream_);
  if (replica_stream_) cudaStreamSynchronize(replica_stream_);
  for (cudaEvent_t e : params_gathered_) cudaEventDestroy(e);
  for (cudaEvent_t e : {shard_point_, replica_point_}) {
    if (e) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : {compute_point_, comm_point_, root_gathered_[0], root_gathered_[1],
                        root_rs_done_, gathered_[0], gathered_[1], released_[0], released_[1],
                        rs_done_[0], rs_done_[1]}) {
    if (e) cudaEventDestroy(e);
  }
  for (void* p : allocations_) cudaFree(p);
}

StatusOr<std::unique_ptr<CudaDataParallel>> CudaDataParallel::Create(
    NcclComm* comm, const ModeRules& rules, CudaModel* model, GradReduce grad_reduce,
    DdpAllReduce ddp_allreduce, bool comm_windows, NcclComm* replica, bool fp8_gather,
    bool symmetric_memory) {
  if (comm == nullptr || model == nullptr)
    return Status::Invalid("CudaDataParallel: null comm/model");
  const bool fsdp_like = rules.shard_params;
  if (grad_reduce == GradReduce::kBf16 && fsdp_like) {
    return Status::Invalid(std::string("CudaDataParallel: parallel.grad_reduce bf16 is not "
                                       "supported with parallel.mode ") +
                           ParallelModeName(rules.mode) +
                           " (its gradients are reduce-scattered in fp32)");
  }
  if (rules.reduce_over_replicas != (replica != nullptr && replica->world() > 1)) {
    return Status::Invalid("CudaDataParallel: hsdp needs a replica comm of more than one rank "
                           "(and only hsdp takes one)");
  }
  if (ddp_allreduce == DdpAllReduce::kCopyEngine &&
      (rules.sharded() || grad_reduce != GradReduce::kFp32)) {
    return Status::Invalid("CudaDataParallel: parallel.ddp_allreduce copy_engine needs "
                           "parallel.mode ddp and parallel.grad_reduce fp32");
  }
  std::unique_ptr<CudaDataParallel> dp(
      new CudaDataParallel(comm, rules, model, grad_reduce, ddp_allreduce));
  dp->replica_ = replica;
  dp->comm_windows_ = comm_windows;
  dp->fp8_gather_ = fp8_gather && fsdp_like;  // what InitFp8Gather may set up
  dp->symmetric_memory_ = symmetric_memory;
  FORGE_RETURN_IF_ERROR(dp->Init());
  return StatusOr<std::unique_ptr<CudaDataParallel>>(std::move(dp));
}

// A buffer collectives write or read whole on the shard comm: symmetric NCCL memory, owned by
// the comm, where Create was asked for it (NcclComm::AllocSymmetric); else AllocDevice's.
Status CudaDataParallel::AllocCollective(void** p, size_t bytes) {
  if (!symmetric_memory_) return AllocDevice(p, bytes);
  FORGE_ASSIGN_OR_RETURN(*p, comm_->AllocSymmetric(bytes));
  return Status::Ok();
}

Status CudaDataParallel::AllocDevice(void** p, size_t bytes) {
  FORGE_CUDA_CHECK(cudaMalloc(p, std::max<size_t>(bytes, 256)));
  allocations_.push_back(*p);
  FORGE_CUDA_CHECK(cudaMemset(*p, 0, std::max<size_t>(bytes, 256)));
  return Status::Ok();
}

Status CudaDataParallel::Init() {
  rank_ = comm_->rank();
  world_ = comm_->world();
  nccl_stream_ = static_cast<cudaStream_t>(comm_->stream());
  if (replica_ != nullptr) {
    replicas_ = replica_->world();
    replica_stream_ = static_cast<cudaStream_t>(replica_->stream());
    replica_->SetProducerStream(nullptr);
    for (cudaEvent_t* e : {&shard_point_, &replica_point_})
      FORGE_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  if (Fp8Linears* f8 = model_->fp8()) {  // ShareFp8Amax: [max(world, R) + 1, both groups]
    const auto slots = f8->amax_slots();
    void* p = nullptr;
    FORGE_RETURN_IF_ERROR(AllocDevice(&p, size_t(std::max(world_, replicas_) + 1) *
                                              size_t(slots[0].count + slots[1].count) *
                                              sizeof(float)));
    fp8_gathered_ = static_cast<float*>(p);
  }
  comm_->SetProducerStream(nullptr);  // ordering is explicit, through the events below
  const size_t U = model_->layout().units.size();
  std::vector<ModeUnit> units;
  for (const UnitLayout& u : model_->layout().units) units.push_back({u.name, u.numel});
  exec_ = std::make_unique<ModeExecutor>(rules_, comm_, replica_, std::move(units));
  const CudaParamBuffers& pb = model_->param_buffers();
  const bool ok = pb.slot.size() == U && (!sharded() || pb.grad_shard != nullptr) &&
                  (fsdp() == (pb.params == nullptr)) &&
                  (ddp_bf16() == (pb.grads16 != nullptr));
  if (!ok) {
    return Status::Precondition("CudaDataParallel: the model was not created for " +
                                std::string(ParallelModeName(rules_.mode)) + " over " +
                                std::to_string(world_) + " ranks");
  }
  for (cudaEvent_t* e : {&compute_point_, &comm_point_}) {
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  params_gathered_.resize(U);
  for (cudaEvent_t& e : params_gathered_) {
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  gather_pending_.assign(U, false);
  if (grad_reduce_ == GradReduce::kBf16 && sharded()) {
    // zero's reduce-scatter (and ComputeGradients' all-reduce) casts at most the padded
    // world * slot.
    int64_t largest = 0;
    for (size_t u = 0; u < U; ++u) {
      largest = std::max({largest, model_->layout().units[u].numel, int64_t{world_} * pb.slot[u]});
    }
    FORGE_RETURN_IF_ERROR(AllocDevice(reinterpret_cast<void**>(&comm_bf16_),
                                      size_t(largest) * sizeof(cuda::bf16)));
  }
  if (ddp_allreduce_ == DdpAllReduce::kCopyEngine) FORGE_RETURN_IF_ERROR(EnableCopyEngine());

  if (fsdp()) {
    slot_lookup_ = FsdpLooksUpInSlots(model_->config(), rules_, world_, model_->tokens_per_micro());
    FORGE_RETURN_IF_ERROR(InitFsdp());
    auto fwd = [this](int u, cudaStream_t s) { return OnFsdpForward(u, s); };
    auto bwd = [this](int u, cudaStream_t s) { return OnFsdpBackward(u, s); };
    auto window = [this](int u, cudaStream_t s) { return OnForwardWindow(u, s); };
    for (CudaModelHooks* h : {&read_hooks_, &grad_hooks_, &allreduce_hooks_}) {
      h->before_forward = fwd;
      h->before_backward = bwd;
      if (comm_windows_) h->forward_window = window;
    }
  } else {
    auto before = [this](int u, cudaStream_t s) { return OnBeforeForward(u, s); };
    read_hooks_.before_forward = before;
    grad_hooks_.before_forward = before;
    allreduce_hooks_.before_forward = before;
  }
  // ddp with a tied embedding: its gradient's LM-head part is summed during the backward (in
  // block L-1's comm window) and the lookup rows of every rank added after it, where that moves
  // fewer bytes at the step's end than the whole gradient's all-reduce (lookup_apart_rule.h).
  const bool ddp_lookup =
      TakeLookupApart(model_->config(), rules_, grad_reduce_, world_, model_->tokens_per_micro());
  if (ddp_lookup || slot_lookup_) {
    const int64_t rows = int64_t{world_} * model_->tokens_per_micro();
    const int64_t d = model_->config().d_model;
    FORGE_RETURN_IF_ERROR(AllocCollective(reinterpret_cast<void**>(&lookup_dx_),
                                          size_t(rows * d) * sizeof(cuda::bf16)));
    FORGE_RETURN_IF_ERROR(AllocCollective(reinterpret_cast<void**>(&lookup_tokens_),
                                          size_t(rows) * sizeof(int32_t)));
    lookup_ws_bytes_ = cuda::EmbeddingBackwardWorkspace(rows, model_->config().padded_vocab());
    FORGE_RETURN_IF_ERROR(AllocDevice(&lookup_ws_, lookup_ws_bytes_));
  }
  if (ddp_lookup) {
    allreduce_hooks_.lookup_grad = [this](const cuda::bf16* dx0, const int32_t* tokens,
                                          int64_t n, cudaStream_t s) {
      return OnLookupGrad(dx0, tokens, n, s);
    };
  }
  if (slot_lookup_) {
    auto rows = [this](const int32_t* tokens, int64_t n, cuda::bf16* out, cudaStream_t s) {
      return OnSlotLookup(tokens, n, out, s);
    };
    auto grad = [this](const cuda::bf16* dx0, const int32_t* tokens, int64_t n,
                       cudaStream_t s) { return OnSlotLookupGrad(dx0, tokens, n, s); };
    for (CudaModelHooks* h : {&read_hooks_, &grad_hooks_, &allreduce_hooks_}) h->lookup_rows = rows;
    grad_hooks_.lookup_grad = allreduce_hooks_.lookup_grad = grad;
  }
  grad_hooks_.grad_ready = [this](int u, cudaEvent_t c, cudaEvent_t w) {
    return OnGradReady(u, c, w, /*all_reduce=*/false);
  };
  allreduce_hooks_.grad_ready = [this](int u, cudaEvent_t c, cudaEvent_t w) {
    return OnGradReady(u, c, w, /*all_reduce=*/!fsdp());
  };
  if (comm_windows_) {
    auto window = [this](int u, cudaStream_t s) { return OnCommWindow(u, s); };
    grad_hooks_.comm_window = window;
    allreduce_hooks_.comm_window = window;
  }
  // Every AllocDevice above zeroed its buffer on the legacy stream, which the non-blocking
  // compute and NCCL streams do not wait for: finish those memsets once, here.
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

// parallel.ddp_allreduce copy_engine: the flat gradient buffer registered for the copy-engine
// all-reduce (NcclComm::EnableCopyEngineAllReduce). A rank that cannot map its peers (another
// host, no peer access) fails every rank's setup: the config asked for it, so no silent NCCL.
Status CudaDataParallel::EnableCopyEngine() {
  const CudaParamBuffers& pb = model_->param_buffers();
  const auto& units = model_->layout().units;
  int64_t count = 0, largest = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    count = std::max(count, pb.unit_offset[u] + units[u].numel);
    largest = std::max(largest, units[u].numel);
  }
  return comm_->EnableCopyEngineAllReduce(pb.grads, count, largest)
      .Annotate("parallel.ddp_allreduce: copy_engine");
}

// ---- plumbing ------------------------------------------------------------------------------

Status CudaDataParallel::CommWaits(cudaEvent_t e) {
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(nccl_stream_, e, 0));
  return Status::Ok();
}

Status CudaDataParallel::CommWaitsStream(cudaStream_t s) {
  FORGE_CUDA_CHECK(cudaEventRecord(compute_point_, s));
  return CommWaits(compute_point_);
}

// Every wait of the compute stream on the NCCL stream goes through here: with a time sink on
// the comm, the stall is timed (exposed wait; comm_time_sink.h).
Status CudaDataParallel::ComputeWaits(cudaStream_t compute, cudaEvent_t e, CollectiveOp op) {
  return waits_.Wait(compute, e, op, comm_->time_sink() != nullptr);
}

void CudaDataParallel::CountCommTimes() {
  waits_.Collect(comm_->time_sink());
  comm_->CountFinished();
  if (replica_ != nullptr) replica_->CountFinished();
}

// Collectives are issued and their handles dropped: the NCCL stream runs in order, so one
// event after its last collective covers all of them (timeouts stay with the comm's watchdog).
Status CudaDataParallel::JoinComm(cudaStream_t compute) {
  FORGE_RETURN_IF_ERROR(IssueWaiting());  // none should be left; never drop one
  FORGE_CUDA_CHECK(cudaEventRecord(comm_point_, nccl_stream_));
  FORGE_RETURN_IF_ERROR(ComputeWaits(compute, comm_point_, comm_->last_op()));
  if (replica_ != nullptr) {
    FORGE_CUDA_CHECK(cudaEventRecord(replica_point_, replica_stream_));
    FORGE_RETURN_IF_ERROR(ComputeWaits(compute, replica_point_, replica_->last_op()));
  }
  return Status::Ok();
}

Status CudaDataParallel::ReplicaWaitsShard() {
  FORGE_CUDA_CHECK(cudaEventRecord(shard_point_, nccl_stream_));
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(replica_stream_, shard_point_, 0));
  return Status::Ok();
}

Status CudaDataParallel::SumOverReplicas(float* buf, int64_t n, const char* what,
                                         cudaStream_t compute) {
  // After the compute stream's writes (and the shard comm's, which waited for them).
  FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
  FORGE_RETURN_IF_ERROR(ReplicaWaitsShard());
  FORGE_RETURN_IF_ERROR(replica_->AllReduceSum(buf, n, DType::kF32, what).status());
  return JoinComm(compute);
}

// ---- gradients -----------------------------------------------------------------------------

// With comm windows, a unit whose gradient is complete waits for the next block's window
// (CudaModelHooks::comm_window: that block's attention backward) unless no window comes any
// more (block 0, the embedding), when it and anything still waiting start at once.
Status CudaDataParallel::OnGradReady(int u, cudaEvent_t compute_done, cudaEvent_t wgrad_done,
                                     bool all_reduce) {
  const ParamLayout& layout = model_->layout();
  if (u == layout.embedding_unit()) {
    // The model announces the tied embedding early exactly when its hooks take the lookup.
    const CudaModelHooks& h = all_reduce ? allreduce_hooks_ : grad_hooks_;
    emb_lookup_apart_ = h.lookup_grad != nullptr;
  }
  if (!comm_windows_) return IssueGradCollective(u, compute_done, wgrad_done, all_reduce);
  waiting_.push_back({u, compute_done, wgrad_done, all_reduce});
  // The root units announced at the backward's start (the final norm, and the tied
  // embedding's LM-head part when its lookup part goes apart) wait for block L-1's window.
  const bool early_root = u == layout.final_norm_unit() ||
                          (u == layout.embedding_unit() && emb_lookup_apart_);
  const bool window_ahead = block_of(u) >= 1 || (early_root && layout.units.size() > 2);
  return window_ahead ? Status::Ok() : IssueWaiting();
}

Status CudaDataParallel::OnLookupGrad(const cuda::bf16* dx0, const int32_t* tokens, int64_t n,
                                      cudaStream_t compute) {
  const int64_t d = model_->config().d_model;
  FORGE_RETURN_IF_ERROR(CheckLookupRows(n));
  const int emb = model_->layout().embedding_unit();
  const CudaParamBuffers& pb = model_->param_buffers();
  FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));  // dx0 and the tokens are written
  FORGE_RETURN_IF_ERROR(IssueWaiting());            // the NCCL stream runs in order
  FORGE_RETURN_IF_ERROR(
      comm_->AllGather(dx0, lookup_dx_, n * d, DType::kBF16, "embedding lookup rows").status());
  // Token ids are 4 bytes: an all-gather moves bytes, whatever the type says.
  FORGE_RETURN_IF_ERROR(
      comm_->AllGather(tokens, lookup_tokens_, n, DType::kF32, "embedding lookup tokens")
          .status());
  // After the embedding's all-reduce (issued in block L-1's window, earlier on this stream):
  // every rank adds the same rows in the same order, so the ranks stay bitwise equal.
  // Into the gradient the all-reduce summed: grads16 with ddp's bf16 sums, else grads.
  auto add_rows = [&](auto* grad) {
    return cuda::EmbeddingBackward(grad + pb.unit_offset[emb], lookup_dx_, lookup_tokens_,
                                   n * world_, int(d), model_->config().padded_vocab(), lookup_ws_,
                                   lookup_ws_bytes_, nccl_stream_);
  };
  FORGE_RETURN_IF_ERROR(ddp_bf16() ? add_rows(pb.grads16) : add_rows(pb.grads));
  return model_->SumUnitSquares(emb, nccl_stream_);  // its share of the grad norm, now whole
}

StatusOr<CudaDataParallel::EmbeddingSlot> CudaDataParallel::LookupSlot(int64_t n) const {
  FORGE_RETURN_IF_ERROR(CheckLookupRows(n));
  const ParamLayout& layout = model_->layout();
  const int emb = layout.embedding_unit();
  const ShardRange r = ShardOf(layout.units[size_t(emb)].numel, rank_, world_);
  return EmbeddingSlot{emb, r.begin, r.end};
}

// The lookup buffers hold world x the micro-batch's tokens.
Status CudaDataParallel::CheckLookupRows(int64_t n) const {
  if (n <= model_->tokens_per_micro()) return Status::Ok();
  return Status::Internal("CudaDataParallel: " + std::to_string(n) +
                          " lookup rows a rank, more than the micro-batch's tokens");
}

Status CudaDataParallel::OnSlotLookup(const int32_t* tokens, int64_t n, cuda::bf16* out,
                                      cudaStream_t compute) {
  FORGE_ASSIGN_OR_RETURN(const EmbeddingSlot es, LookupSlot(n));
  const int emb = es.unit;
  const CudaParamBuffers& pb = model_->param_buffers();
  FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));  // the tokens are there, `out` is free
  FORGE_RETURN_IF_ERROR(model_->WaitUpdated(emb, nccl_stream_));  // AdamW wrote the slot
  // Token ids are 4 bytes: an all-gather moves bytes, whatever the type says.
  FORGE_RETURN_IF_ERROR(
      comm_->AllGather(tokens, lookup_tokens_, n, DType::kF32, "embedding lookup tokens")
          .status());
  const int d = model_->config().d_model;
  FORGE_RETURN_IF_ERROR(cuda::EmbeddingRowsFromSlot(lookup_dx_, lookup_tokens_, n * world_, d,
                                                    pb.master + pb.shard_offset[emb], es.lo,
                                                    es.hi, nccl_stream_));
  FORGE_RETURN_IF_ERROR(
      comm_->ReduceScatterSum(lookup_dx_, out, n * d, DType::kBF16, "embedding lookup rows")
          .status());
  FORGE_CUDA_CHECK(cudaEventRecord(root_gathered_[0], nccl_stream_));
  FORGE_RETURN_IF_ERROR(ComputeWaits(compute, root_gathered_[0], CollectiveOp::kReduceScatter));
  // What the forward needs next, after the rows on the NCCL stream: block 1, the final unit.
  const int L = int(model_->layout().units.size()) - 2;
  if (L > 1) FORGE_RETURN_IF_ERROR(Ensure(1, compute, /*wait=*/false));
  return EnsureRoot(1, compute, /*wait=*/false);
}

Status CudaDataParallel::OnSlotLookupGrad(const cuda::bf16* dx0, const int32_t* tokens,
                                          int64_t n, cudaStream_t compute) {
  FORGE_ASSIGN_OR_RETURN(const EmbeddingSlot es, LookupSlot(n));
  const int emb = es.unit;
  const CudaParamBuffers& pb = model_->param_buffers();
  const int d = model_->config().d_model;
  FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));  // dx0 and the tokens are written
  FORGE_RETURN_IF_ERROR(IssueWaiting());            // the NCCL stream runs in order
  // The slot's new sum replaces the gradient a deferred update may still be reading.
  FORGE_RETURN_IF_ERROR(model_->WaitUpdated(emb, nccl_stream_));
  FORGE_RETURN_IF_ERROR(
      comm_->AllGather(dx0, lookup_dx_, n * d, DType::kBF16, "embedding lookup rows").status());
  FORGE_RETURN_IF_ERROR(
      comm_->AllGather(tokens, lookup_tokens_, n, DType::kF32, "embedding lookup tokens")
          .status());
  float* slot = pb.grad_shard + pb.shard_offset[emb];
  if (first_micro_) {  // the step's first micro-step writes the slot, later ones add
    FORGE_CUDA_CHECK(cudaMemsetAsync(slot, 0, size_t(pb.slot[emb]) * sizeof(float), nccl_stream_));
  }
  FORGE_RETURN_IF_ERROR(cuda::EmbeddingBackwardToSlot(
      slot, es.lo, es.hi, lookup_dx_, lookup_tokens_, n * world_, n, d,
      model_->config().padded_vocab(), lookup_ws_, lookup_ws_bytes_, nccl_stream_));
  // hsdp: the shard group's sum, once complete, over the replicas as every unit's slot.
  if (replica_ == nullptr || !last_micro_) return Status::Ok();
  FORGE_RETURN_IF_ERROR(ReplicaWaitsShard());
  return replica_->AllReduceSum(slot, pb.slot[emb], DType::kF32, "embedding (replicas)").status();
}

Status CudaDataParallel::OnCommWindow(int unit, cudaStream_t compute) {
  if (!waiting_.empty()) {
    FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
    FORGE_RETURN_IF_ERROR(IssueWaiting());
  }
  // fsdp: the block the backward reaches next, gathered from here (see the header comment).
  const int l = block_of(unit);
  return fsdp() && l > 0 ? Ensure(l - 1, compute, /*wait=*/false) : Status::Ok();
}

Status CudaDataParallel::IssueWaiting() {
  std::vector<WaitingUnit> w;
  w.swap(waiting_);
  for (const WaitingUnit& x : w) {
    FORGE_RETURN_IF_ERROR(IssueGradCollective(x.unit, x.compute_done, x.wgrad_done, x.all_reduce));
  }
  return Status::Ok();
}

// Gradient buckets are whole units: the NCCL stream waits for the unit's last writes on both
// streams, then the executor sums it (mode_executor.h, through the storage hooks below). Later
// units' backward keeps running on the compute streams.
Status CudaDataParallel::IssueGradCollective(int u, cudaEvent_t compute_done,
                                             cudaEvent_t wgrad_done, bool all_reduce) {
  FORGE_RETURN_IF_ERROR(CommWaits(compute_done));
  if (wgrad_done != nullptr) FORGE_RETURN_IF_ERROR(CommWaits(wgrad_done));
  return exec_->ReduceGrad(u, GradPass{.all_reduce = all_reduce, .last_micro = last_micro_}, this,
                           /*pending=*/nullptr);
}

// Everything below runs on the NCCL stream, in order, so comm_bf16_ is free again once the
// previous unit's widening was enqueued (see the header comment).
StatusOr<GradBuffers> CudaDataParallel::GradToReduce(int u, CollectiveOp op) {
  const CudaParamBuffers& pb = model_->param_buffers();
  const bool all = op == CollectiveOp::kAllReduce;
  // The slot's new sum replaces the gradient a deferred update may still be reading (the
  // unit's gather waited for that update already, earlier on this stream: a no-op then).
  if (sharded()) FORGE_RETURN_IF_ERROR(model_->WaitUpdated(u, nccl_stream_));
  if (fsdp()) {
    // Into the slot on the step's first micro-step; later ones in place, into this rank's
    // slot of the gradient buffer itself (NCCL takes recv = send + rank * count), then added
    // into the slot (GradReduced): no scratch slot.
    float* g = FsdpGradBuffer(u);
    return GradBuffers{
        g, first_micro_ ? pb.grad_shard + pb.shard_offset[u] : g + rank_ * pb.slot[u],
        DType::kF32};
  }
  float* g = pb.grads + pb.unit_offset[u];
  if (ddp_bf16()) {  // in grads16, where the norm and AdamW read it
    FORGE_RETURN_IF_ERROR(model_->CastUnitGradsToBf16(u, nccl_stream_));
    return GradBuffers{pb.grads16 + pb.unit_offset[u], nullptr, DType::kBF16};
  }
  if (grad_reduce_ == GradReduce::kBf16) {
    // Rounded into comm_bf16_. A reduce-scatter reads the padded unit (world * slot, zero
    // beyond numel) in place: this rank's sum lands at slot `rank` of the buffer.
    const int64_t slot = pb.slot[u];
    const int64_t n = all ? model_->layout().units[u].numel : world_ * slot;
    FORGE_RETURN_IF_ERROR(cuda::CastFloatToBf16(comm_bf16_, g, n, nccl_stream_));
    return GradBuffers{comm_bf16_, all ? nullptr : comm_bf16_ + rank_ * slot, DType::kBF16};
  }
  // Padded unit for a reduce-scatter: world * slot elements, zero beyond numel.
  return GradBuffers{g, all ? nullptr : pb.grad_shard + pb.shard_offset[u], DType::kF32};
}

Status CudaDataParallel::GradReduced(int u, CollectiveOp op, CommWork* /*work*/) {
  const CudaParamBuffers& pb = model_->param_buffers();
  if (fsdp()) {
    if (first_micro_) return Status::Ok();
    AddKernel<<<256, 256, 0, nccl_stream_>>>(pb.grad_shard + pb.shard_offset[u],
                                             FsdpGradBuffer(u) + rank_ * pb.slot[u], pb.slot[u]);
    FORGE_CUDA_LAUNCH_CHECK();
    return Status::Ok();
  }
  // ddp: the summed gradient is final on the NCCL stream right after the all-reduce, so its
  // share of the grad norm is taken there, overlapping the rest of the backward (the tied
  // embedding's once its lookup rows are added: OnLookupGrad).
  if (!sharded()) {
    if (u == model_->layout().embedding_unit() && emb_lookup_apart_) return Status::Ok();
    return model_->SumUnitSquares(u, nccl_stream_);
  }
  if (grad_reduce_ != GradReduce::kBf16) return Status::Ok();
  if (op == CollectiveOp::kAllReduce) {
    return cuda::CastBf16ToFloat(pb.grads + pb.unit_offset[u], comm_bf16_,
                                 model_->layout().units[u].numel, nccl_stream_);
  }
  return cuda::CastBf16ToFloat(pb.grad_shard + pb.shard_offset[u], comm_bf16_ + rank_ * pb.slot[u],
                               pb.slot[u], nccl_stream_);
}

// hsdp (fsdp's reduce-scatter): the slot is this shard group's complete sum; the other groups'
// are added on the replica comm's stream, while the shard stream goes on with the next units.
StatusOr<float*> CudaDataParallel::HandOverToReplicas(int u, CollectiveOp op,
                                                      CommWork* /*work*/) {
  if (op != CollectiveOp::kReduceScatter)
    return Status::Precondition("CudaDataParallel: hsdp sums gradient slots over replicas");
  FORGE_RETURN_IF_ERROR(ReplicaWaitsShard());
  const CudaParamBuffers& pb = model_->param_buffers();
  return pb.grad_shard + pb.shard_offset[u];
}

// fsdp: the gradient buffer is free for its next unit once the NCCL stream passed here.
Status CudaDataParallel::GradDone(int u) {
  if (!fsdp()) return Status::Ok();
  const int l = block_of(u);
  if (l < 0) {
    FORGE_CUDA_CHECK(cudaEventRecord(root_rs_done_, nccl_stream_));
    root_rs_pending_ = true;
  } else {
    FORGE_CUDA_CHECK(cudaEventRecord(rs_done_[l % 2], nccl_stream_));
    rs_pending_[l % 2] = true;
  }
  return Status::Ok();
}

// zero: this rank's slot of the bf16 copy (just written by AdamW) is at slot `rank` of the
// padded unit, where the in-place all-gather reads it.
void* CudaDataParallel::ParamsToGather(int u, DType* dtype) {
  const CudaParamBuffers& pb = model_->param_buffers();
  *dtype = DType::kBF16;
  return pb.params + pb.unit_offset[u];
}

Status CudaDataParallel::ParamsGathered(int u) {
  FORGE_CUDA_CHECK(cudaEventRecord(params_gathered_[u], nccl_stream_));
  gather_pending_[u] = true;
  return Status::Ok();
}

Status CudaDataParallel::OnBeforeForward(int u, cudaStream_t compute) {
  if (!gather_pending_[u]) return Status::Ok();
  return ComputeWaits(compute, params_gathered_[u], CollectiveOp::kAllGather);
}

Status CudaDataParallel::SumLoss(float* stats, cudaStream_t compute) {
  FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
  FORGE_RETURN_IF_ERROR(comm_->AllReduceSum(stats, 1, DType::kF32, "loss").status());
  FORGE_RETURN_IF_ERROR(JoinComm(compute));
  if (replica_ != nullptr) return SumOverReplicas(stats, 1, "loss (replicas)", compute);
  return Status::Ok();
}

Status CudaDataParallel::Optimize(const cuda::AdamWHyper* hyper, float* stats,
                                  cudaStream_t compute) {
  // The comm the norm's sum of squares is summed over (ModeExecutor::norm_comm): none for ddp,
  // which took every unit's share of the norm after its all-reduce (every backward completes
  // every unit, and JoinComm ordered them); the shard group in the sharded modes.
  Comm* norm_comm = exec_->norm_comm();
  FORGE_RETURN_IF_ERROR(norm_comm == nullptr ? model_->GradSumSquaresFromUnits(stats + 1, compute)
                                             : model_->GradSumSquares(stats + 1, compute));
  if (model_->fp8() != nullptr) {
    // fsdp's FP8 gather: the weights' amaxes of the slot casts this step's passes used.
    if (fp8_slots_valid_) {
      const int n = int(model_->layout().units.size() - 2) * kLinearKinds;
      AmaxFoldKernel<<<(n + 255) / 256, 256, 0, compute>>>(fp8_weight_amax_, fp8_slot_amax_, n);
      FORGE_CUDA_LAUNCH_CHECK();
    }
    FORGE_RETURN_IF_ERROR(ShareFp8Amax(compute));
  }
  if (norm_comm == nullptr) {
    // Identical gradients everywhere: the local norm is the global one. A spike-gated update
    // (CudaModel::set_spike_gate) reads the global loss, so the loss is summed first then.
    if (model_->spike_gated()) {
      FORGE_RETURN_IF_ERROR(SumLoss(stats, compute));
      return model_->ClipAndUpdate(hyper, stats + 1, compute);
    }
    FORGE_RETURN_IF_ERROR(model_->ClipAndUpdate(hyper, stats + 1, compute));
    return SumLoss(stats, compute);
  }
  // [loss, sum of squares of this rank's slots] summed over the shard group in one collective.
  FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
  FORGE_RETURN_IF_ERROR(
      norm_comm->AllReduceSum(stats, 2, DType::kF32, "loss and grad norm").status());
  FORGE_RETURN_IF_ERROR(JoinComm(compute));
  // hsdp: the loss over the other replica groups too. The norm is complete (every replica
  // group holds the same summed slots), but each shard group summed it in its own NCCL order:
  // replica 0's value goes to all, so every rank clips by the same factor.
  if (replica_ != nullptr) {
    FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
    FORGE_RETURN_IF_ERROR(ReplicaWaitsShard());
    FORGE_RETURN_IF_ERROR(
        replica_->AllReduceSum(stats, 1, DType::kF32, "loss (replicas)").status());
    FORGE_RETURN_IF_ERROR(
        replica_->Broadcast(stats + 1, 1, DType::kF32, 0, "grad norm (replicas)").status());
    FORGE_RETURN_IF_ERROR(JoinComm(compute));
  }
  FORGE_RETURN_IF_ERROR(model_->ClipAndUpdate(hyper, stats + 1, compute));
  // The deferred AdamW of this rank's slots starts now on the model's update stream; each
  // unit's next gather waits for that unit's update (deferred_update.h).
  FORGE_RETURN_IF_ERROR(model_->BeginUpdate(compute));
  if (!fsdp()) return GatherParams(compute);
  // The slots change: every gathered copy is stale. Gather the next step's first units now.
  ParamsChanged();
  FORGE_RETURN_IF_ERROR(EnsureRoot(0, compute, /*wait=*/false));
  const int L = int(model_->layout().units.size()) - 2;
  if (L > 0) FORGE_RETURN_IF_ERROR(Ensure(0, compute, false));
  // Looked up in the slots, the embedding's rows come first at the next forward: block 1 and
  // the final unit follow them there (OnSlotLookup).
  if (slot_lookup_) return Status::Ok();
  if (L > 1) FORGE_RETURN_IF_ERROR(Ensure(1, compute, false));
  return EnsureRoot(1, compute, /*wait=*/false);
}

// Once per step, a few KB: [world][E4M3 slots][E5M2 slots] gathered, then the max per slot.
Status CudaDataParallel::ShareFp8Amax(cudaStream_t compute) {
  const auto slots = model_->fp8()->amax_slots();
  const int64_t per_rank = slots[0].count + slots[1].count;
  // The slots' maxima over the `ranks` ranks of `comm`, straight back into the slots.
  auto max_over = [&](NcclComm* comm, int ranks, const char* what) -> Status {
    // The send buffer: this rank's slots side by side (the two groups are separate arrays).
    float* send = fp8_gathered_ + int64_t{ranks} * per_rank;
    FORGE_CUDA_CHECK(cudaMemcpyAsync(send, slots[0].data, slots[0].count * sizeof(float),
                                     cudaMemcpyDeviceToDevice, compute));
    FORGE_CUDA_CHECK(cudaMemcpyAsync(send + slots[0].count, slots[1].data,
                                     slots[1].count * sizeof(float), cudaMemcpyDeviceToDevice,
                                     compute));
    FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
    if (comm == replica_) FORGE_RETURN_IF_ERROR(ReplicaWaitsShard());
    FORGE_RETURN_IF_ERROR(
        comm->AllGather(send, fp8_gathered_, per_rank, DType::kF32, what).status());
    FORGE_RETURN_IF_ERROR(JoinComm(compute));
    int64_t at = 0;
    for (const auto& g : slots) {
      FORGE_RETURN_IF_ERROR(cuda::Fp8AmaxMaxOverRanks(g.data, fp8_gathered_ + at, g.count, ranks,
                                                      per_rank, compute));
      at += g.count;
    }
    return Status::Ok();
  };
  FORGE_RETURN_IF_ERROR(max_over(comm_, world_, "fp8 amax"));
  if (replica_ == nullptr) return Status::Ok();
  // hsdp: the shard group's maxima, then the same over the replica group, so every rank of the
  // world derives the same scales.
  return max_over(replica_, replicas_, "fp8 amax (replicas)");
}

// zero, after AdamW: every unit's params all-gathered in place (ParamsToGather) once the
// unit's (deferred) update wrote its slot, each unit's gather an event the next forward waits
// for just before the unit.
Status CudaDataParallel::GatherParams(cudaStream_t compute) {
  FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
  for (int u = 0; u < exec_->units(); ++u) {
    FORGE_RETURN_IF_ERROR(model_->WaitUpdated(u, nccl_stream_));
    FORGE_RETURN_IF_ERROR(exec_->GatherAfterUpdate(u, this, /*pending=*/nullptr));
  }
  return Status::Ok();
}

Status CudaDataParallel::GatherSlots(State which, UnitBuffers* out, cudaStream_t compute) {
  if (!sharded()) return Status::Precondition("GatherSlots: not sharded");
  FORGE_RETURN_IF_ERROR(model_->FlushUpdate(compute));  // the slots as of the last update
  const CudaParamBuffers& pb = model_->param_buffers();
  const float* src = which == State::kMaster ? pb.master
                     : which == State::kM    ? pb.m
                     : which == State::kV    ? pb.v
                                             : pb.grad_shard;
  const auto& units = model_->layout().units;
  out->resize(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    // Scratch between steps: the gradient buffer (zero) or fsdp's largest gradient buffer.
    float* scratch = fsdp() ? root_grads_[0] : pb.grads + pb.unit_offset[u];
    FORGE_CUDA_CHECK(cudaMemcpyAsync(scratch + rank_ * pb.slot[u], src + pb.shard_offset[u],
                                     pb.slot[u] * sizeof(float), cudaMemcpyDeviceToDevice,
                                     compute));
    FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
    FORGE_RETURN_IF_ERROR(exec_->GatherShards(int(u), scratch + rank_ * pb.slot[u], scratch,
                                              DType::kF32, "gather", /*pending=*/nullptr));
    FORGE_RETURN_IF_ERROR(JoinComm(compute));
    (*out)[u].resize(units[u].numel);
    FORGE_CUDA_CHECK(cudaMemcpyAsync((*out)[u].data(), scratch, units[u].numel * sizeof(float),
                                     cudaMemcpyDeviceToHost, compute));
  }
  FORGE_CUDA_CHECK(cudaStreamSynchronize(compute));
  return Status::Ok();
}

void CudaDataParallel::ParamsChanged() {
  root_valid_[0] = root_valid_[1] = false;
  slots_new_ = true;
  fp8_slots_valid_ = false;
  holder_[0] = holder_[1] = -1;
}

// ---- fsdp ----------------------------------------------------------------------------------

float* CudaDataParallel::FsdpGradBuffer(int unit) const {
  const int l = block_of(unit);
  return l >= 0 ? block_grads_[l % 2]
                : root_grads_[unit == model_->layout().embedding_unit() ? 0 : 1];
}

int CudaDataParallel::block_of(int unit) const {
  const ParamLayout& l = model_->layout();
  if (unit == l.embedding_unit() || unit == l.final_norm_unit()) return -1;
  return unit - l.block_unit(0);
}

Status CudaDataParallel::InitFsdp() {
  const ParamLayout& layout = model_->layout();
  int64_t largest = 0;
  for (const UnitLayout& unit : layout.units) {
    largest = std::max(largest, PaddedSize(unit.numel, world_));
  }
  // An untied head sits in the final unit, whose gradient is reduce-scattered during the
  // blocks' backward, before the embedding backward writes the embedding's: the two units'
  // gradients share one buffer then (OnFsdpBackward orders them).
  share_root_grads_ = layout.head_unit != layout.embedding_unit();
  const int roots[2] = {layout.embedding_unit(), layout.final_norm_unit()};
  for (int i = 0; i < 2; ++i) {
    const int64_t n = PaddedSize(layout.units[roots[i]].numel, world_);
    // Looked up in the slots, the embedding table is never gathered.
    if (i > 0 || !slot_lookup_)
      FORGE_RETURN_IF_ERROR(AllocCollective(reinterpret_cast<void**>(&root_params_[i]), n * 2));
    // The embedding's gradient buffer doubles as GatherSlots' scratch: sized for any unit.
    const int64_t g = i == 0 ? largest : n;
    if (i == 1 && share_root_grads_)
      root_grads_[1] = root_grads_[0];
    else
      FORGE_RETURN_IF_ERROR(AllocCollective(reinterpret_cast<void**>(&root_grads_[i]), g * 4));
    model_->BindUnit(roots[i], root_params_[i], root_grads_[i]);
  }
  const int L = int(layout.units.size()) - 2;
  if (L > 0) {
    const int64_t n = PaddedSize(layout.units[layout.block_unit(0)].numel, world_);
    for (int b = 0; b < 2; ++b) {
      FORGE_RETURN_IF_ERROR(AllocCollective(reinterpret_cast<void**>(&block_params_[b]), n * 2));
      FORGE_RETURN_IF_ERROR(AllocCollective(reinterpret_cast<void**>(&block_grads_[b]), n * 4));
    }
  }
  FORGE_RETURN_IF_ERROR(InitFp8Gather(fp8_gather_));
  for (cudaEvent_t* e : {&root_gathered_[0], &root_gathered_[1], &root_rs_done_, &gathered_[0],
                         &gathered_[1], &released_[0], &released_[1], &rs_done_[0],
                         &rs_done_[1]}) {
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  return Status::Ok();
}

// This rank's fp32 slot of unit u cast to bf16 (rounded to nearest, the bits AdamW wrote when
// it kept a bf16 copy) into its part of `full` (the padded unit), on the NCCL stream. AdamW
// keeps no bf16 copy of the slots: FSDP2, too, casts as it gathers. The cast takes every SM it
// can get, since the gather waits for it (a grid capped at 64 blocks made the llama3-8b step
// 1.3% slower: the root units' cast at the step's start is exposed).
Status CudaDataParallel::CastSlot(int u, cuda::bf16* full) {
  const CudaParamBuffers& pb = model_->param_buffers();
  return cuda::CastFloatToBf16(full + int64_t{rank_} * pb.slot[u],
                               pb.master + pb.shard_offset[u], pb.slot[u], nccl_stream_);
}

// Unit u in bf16 into `full`: this rank's slot cast into its part, then gathered in place.
Status CudaDataParallel::GatherCastSlot(int u, cuda::bf16* full) {
  FORGE_RETURN_IF_ERROR(CastSlot(u, full));
  const cuda::bf16* mine = full + int64_t{rank_} * model_->param_buffers().slot[u];
  return exec_->GatherShards(u, mine, full, DType::kBF16, "params", /*pending=*/nullptr);
}

Status CudaDataParallel::EnsureRoot(int i, cudaStream_t compute, bool wait) {
  const ParamLayout& layout = model_->layout();
  if (slots_new_) {
    // New slots or scales: the E4M3 casts of the slots, where no cast measures first (the
    // scale is known before the cast), each block's before its first gather (Ensure).
    fp8_slots_valid_ = fp8_gather_ && !model_->fp8()->measuring();
    if (fp8_slots_valid_) {
      const int L = int(layout.units.size()) - 2;
      FORGE_CUDA_CHECK(cudaMemsetAsync(fp8_slot_amax_, 0, SlotAmaxBytes(L), compute));
      fp8_slot_cast_.assign(size_t(L), false);
    }
    // The slots' casts and gathers that follow on the NCCL stream come after this reset and
    // after the update, where it ran on the compute stream (not deferred: WaitUpdated is then
    // no wait at all).
    FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
    slots_new_ = false;
  }
  if (root_params_[i] == nullptr) return Status::Ok();  // the table looked up in the slots
  if (!root_valid_[i]) {
    const int u = i == 0 ? layout.embedding_unit() : layout.final_norm_unit();
    FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
    FORGE_RETURN_IF_ERROR(model_->WaitUpdated(u, nccl_stream_));  // AdamW wrote the slot
    FORGE_RETURN_IF_ERROR(GatherCastSlot(u, root_params_[i]));
    FORGE_CUDA_CHECK(cudaEventRecord(root_gathered_[i], nccl_stream_));
    root_valid_[i] = true;
  }
  if (wait) return ComputeWaits(compute, root_gathered_[i], CollectiveOp::kAllGather);
  return Status::Ok();
}

// Block `layer` into buffer layer % 2 (unless it is there): the gather waits until the
// buffer's previous holder was released by the compute stream.
Status CudaDataParallel::Ensure(int layer, cudaStream_t compute, bool wait) {
  const int b = layer % 2;
  const int u = model_->layout().block_unit(layer);
  if (holder_[b] != layer) {
    const CudaParamBuffers& pb = model_->param_buffers();
    if (released_pending_[b]) FORGE_RETURN_IF_ERROR(CommWaits(released_[b]));
    else FORGE_RETURN_IF_ERROR(CommWaitsStream(compute));
    released_pending_[b] = false;
    FORGE_RETURN_IF_ERROR(model_->WaitUpdated(u, nccl_stream_));  // AdamW wrote the slot
    holder_fp8_[b] = fp8_slots_valid_;
    if (fp8_slots_valid_) {
      if (!fp8_slot_cast_[size_t(layer)]) {
        // From the slot's bf16 values (the weights the model would cast itself), made in this
        // rank's part of the bf16 unit, which the E4M3 path reads only the norms of.
        FORGE_RETURN_IF_ERROR(CastSlot(u, block_params_[b]));
        FORGE_RETURN_IF_ERROR(
            CastFp8Slot(layer, block_params_[b] + int64_t{rank_} * pb.slot[u], nccl_stream_));
      }
      fp8_slot_cast_[size_t(layer)] = true;
      // The norm weights packed per rank, gathered and put back in the bf16 unit; the linear
      // weights' E4M3 bytes gathered as bf16 pairs (fp8_slot_ is even) into the FP8 unit.
      const std::string& name = model_->layout().units[u].name;
      PackKernel<<<64, 256, 0, nccl_stream_>>>(nl_send_, pb.master + pb.shard_offset[u],
                                               nl_pack_, nl_mine_, nl_max_);
      FORGE_CUDA_LAUNCH_CHECK();
      FORGE_RETURN_IF_ERROR(
          comm_->AllGather(nl_send_, nl_gathered_, nl_max_, DType::kBF16, "params (norms) " + name)
              .status());
      UnpackKernel<<<64, 256, 0, nccl_stream_>>>(block_params_[b], nl_gathered_, nl_dst_,
                                                 nl_src_, nl_count_);
      FORGE_CUDA_LAUNCH_CHECK();
      FORGE_RETURN_IF_ERROR(comm_->AllGather(fp8_slots_ + int64_t{layer} * fp8_slot_,
                                             block_params8_[b], fp8_slot_ / 2, DType::kBF16,
                                             "params (e4m3) " + name)
                                .status());
      ++fp8_block_gathers_;
    } else {
      FORGE_RETURN_IF_ERROR(GatherCastSlot(u, block_params_[b]));
    }
    FORGE_CUDA_CHECK(cudaEventRecord(gathered_[b], nccl_stream_));
    holder_[b] = layer;
  }
  if (wait) {
    FORGE_RETURN_IF_ERROR(ComputeWaits(compute, gathered_[b], CollectiveOp::kAllGather));
    model_->BindUnit(u, block_params_[b], block_grads_[b]);
  }
  return Status::Ok();
}

// fsdp in FP8: where the E4M3 gather applies (ChooseFp8Gather, fp8_gather_rule.h; see the file
// comment); the note says which path runs and why. Every block has the same layout and slot.
Status CudaDataParallel::InitFp8Gather(bool enabled) {
  fp8_gather_ = false;
  Fp8Linears* f8 = model_->fp8();
  const ParamLayout& layout = model_->layout();
  const int L = int(layout.units.size()) - 2;
  if (f8 == nullptr || L <= 0) return Status::Ok();
  const int u0 = layout.block_unit(0);
  const int64_t slot = model_->param_buffers().slot[u0];
  const Fp8GatherChoice choice = ChooseFp8Gather(model_->config(), f8->recipe(), world_, enabled);
  fp8_gather_note_ = choice.note;
  if (!choice.e4m3) return Status::Ok();
  // The rule saw this model's shapes and this comm's slots (Create's precondition).
  if (!f8->TakesCastWeights() || slot != ShardSize(layout.units[u0].numel, world_)) {
    return Status::Internal("fsdp fp8 gather: the model's FP8 weights or slots are not those "
                            "the gather rule was given");
  }
  fp8_gather_ = true;
  fp8_slot_ = slot;

  // The block's non-linear elements, in unit order, and each rank's share of them.
  const int64_t numel = layout.units[u0].numel;
  std::vector<bool> linear(size_t(numel), false);
  for (const BlockLinear& w : layout.linears) {
    std::fill(linear.begin() + w.offset, linear.begin() + w.offset + w.numel(), true);
  }
  std::vector<int64_t> dst, src, pack;
  nl_max_ = MostNormElementsPerSlot(numel, layout.linears, world_);
  std::vector<int64_t> seen(size_t(world_), 0);
  for (int64_t i = 0; i < numel; ++i) {
    if (linear[size_t(i)]) continue;
    const int64_t r = i / slot;
    dst.push_back(i);
    src.push_back(r * nl_max_ + seen[size_t(r)]++);
    if (r == rank_) pack.push_back(i - r * slot);
  }
  nl_count_ = int64_t(dst.size());
  nl_mine_ = int64_t(pack.size());
  auto upload = [&](int64_t** p, const std::vector<int64_t>& v) -> Status {
    FORGE_RETURN_IF_ERROR(AllocDevice(reinterpret_cast<void**>(p), v.size() * sizeof(int64_t)));
    FORGE_CUDA_CHECK(cudaMemcpy(*p, v.data(), v.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    return Status::Ok();
  };
  FORGE_RETURN_IF_ERROR(upload(&nl_dst_, dst));
  FORGE_RETURN_IF_ERROR(upload(&nl_src_, src));
  FORGE_RETURN_IF_ERROR(upload(&nl_pack_, pack));
  FORGE_RETURN_IF_ERROR(AllocDevice(reinterpret_cast<void**>(&nl_send_), nl_max_ * 2));
  FORGE_RETURN_IF_ERROR(
      AllocDevice(reinterpret_cast<void**>(&nl_gathered_), int64_t{world_} * nl_max_ * 2));

  FORGE_RETURN_IF_ERROR(AllocDevice(reinterpret_cast<void**>(&fp8_slots_), int64_t{L} * slot));
  for (uint8_t*& p : block_params8_) {
    FORGE_RETURN_IF_ERROR(AllocCollective(reinterpret_cast<void**>(&p), int64_t{world_} * slot));
  }
  FORGE_RETURN_IF_ERROR(
      AllocDevice(reinterpret_cast<void**>(&fp8_slot_amax_), SlotAmaxBytes(L)));
  std::vector<float*> amax;
  for (int l = 0; l < L; ++l) {
    for (int k = 0; k < kLinearKinds; ++k) amax.push_back(f8->WeightScaling(l, LinearKind(k)).amax);
  }
  FORGE_RETURN_IF_ERROR(
      AllocDevice(reinterpret_cast<void**>(&fp8_weight_amax_), amax.size() * sizeof(float*)));
  FORGE_CUDA_CHECK(cudaMemcpy(fp8_weight_amax_, amax.data(), amax.size() * sizeof(float*),
                              cudaMemcpyHostToDevice));
  auto fp8_weights = [this](int u) { return GatheredFp8(u); };
  for (CudaModelHooks* h : {&read_hooks_, &grad_hooks_, &allreduce_hooks_}) {
    h->fp8_weights = fp8_weights;
  }
  return Status::Ok();
}

// Each weight's part in this rank's slot of block `l` (its bf16 values in `slot16`), cast with
// the weight's scale, its amax into the block's amax slots (zeroed by EnsureRoot; Optimize
// folds them into the model's).
Status CudaDataParallel::CastFp8Slot(int l, const cuda::bf16* slot16, cudaStream_t s) {
  Fp8Linears* f8 = model_->fp8();
  const ParamLayout& layout = model_->layout();
  const int64_t lo = int64_t{rank_} * fp8_slot_, hi = lo + fp8_slot_;
  for (int k = 0; k < kLinearKinds; ++k) {
    const BlockLinear& w = layout.linears[size_t(k)];
    const int64_t a = std::max(lo, w.offset), b = std::min(hi, w.offset + w.numel());
    if (a >= b) continue;
    const Fp8Linears::SlotPtrs q = f8->WeightScaling(l, LinearKind(k));
    FORGE_RETURN_IF_ERROR(cuda::CastToFp8(
        fp8_slots_ + int64_t{l} * fp8_slot_ + (a - lo),
        slot16 + (a - lo), 1, b - a, cuda::DType::kE4M3, q.scale,
        fp8_slot_amax_ + (l * kLinearKinds + k) * 4, q.scale_inv, s));
  }
  return Status::Ok();
}

const uint8_t* CudaDataParallel::GatheredFp8(int unit) const {
  const int l = block_of(unit);
  if (l < 0) return nullptr;
  const int b = l % 2;
  return holder_[b] == l && holder_fp8_[b] ? block_params8_[b] : nullptr;
}

// Everything enqueued on the compute stream so far may read block `layer`'s buffer; the
// buffer's next gather waits for it.
Status CudaDataParallel::Release(int layer, cudaStream_t compute) {
  const int b = layer % 2;
  if (holder_[b] != layer) return Status::Ok();
  FORGE_CUDA_CHECK(cudaEventRecord(released_[b], compute));
  released_pending_[b] = true;
  return Status::Ok();
}

Status CudaDataParallel::OnFsdpForward(int u, cudaStream_t compute) {
  const int L = int(model_->layout().units.size()) - 2;
  const int l = block_of(u);
  if (l < 0) {
    if (u != model_->layout().embedding_unit()) return EnsureRoot(1, compute, /*wait=*/true);
    // Start of a pass: the root gradient buffers are rewritten by this pass's backward.
    if (root_rs_pending_) {
      FORGE_RETURN_IF_ERROR(ComputeWaits(compute, root_rs_done_, CollectiveOp::kReduceScatter));
      root_rs_pending_ = false;
    }
    FORGE_RETURN_IF_ERROR(EnsureRoot(0, compute, /*wait=*/true));
    if (L > 0) FORGE_RETURN_IF_ERROR(Ensure(0, compute, /*wait=*/false));
    // The final unit after block 0 (looked up in the slots: after the rows, OnSlotLookup).
    return slot_lookup_ ? Status::Ok() : EnsureRoot(1, compute, /*wait=*/false);
  }
  if (l > 0) FORGE_RETURN_IF_ERROR(Release(l - 1, compute));
  FORGE_RETURN_IF_ERROR(Ensure(l, compute, /*wait=*/true));
  // With comm windows the next block's gather starts at this block's attention instead.
  if (l + 1 < L && !comm_windows_) FORGE_RETURN_IF_ERROR(Ensure(l + 1, compute, false));
  return Status::Ok();
}

Status CudaDataParallel::OnForwardWindow(int u, cudaStream_t compute) {
  const int L = int(model_->layout().units.size()) - 2;
  const int l = block_of(u);
  return l >= 0 && l + 1 < L ? Ensure(l + 1, compute, /*wait=*/false) : Status::Ok();
}

Status CudaDataParallel::OnFsdpBackward(int u, cudaStream_t compute) {
  const int L = int(model_->layout().units.size()) - 2;
  const int l = block_of(u);
  if (l < 0) {
    // The embedding backward writes the gradient buffer the final unit shares: that unit's
    // reduce-scatter (issued by block 0's GradReady at the latest) must have read it. Looked
    // up in the slots, the lookup's rows go straight to the slot instead.
    if (u == model_->layout().embedding_unit() && share_root_grads_ && root_rs_pending_ &&
        !slot_lookup_) {
      FORGE_RETURN_IF_ERROR(ComputeWaits(compute, root_rs_done_, CollectiveOp::kReduceScatter));
      root_rs_pending_ = false;
    }
    return Status::Ok();
  }
  if (l + 1 < L) FORGE_RETURN_IF_ERROR(Release(l + 1, compute));
  FORGE_RETURN_IF_ERROR(Ensure(l, compute, /*wait=*/true));
  // The gradient buffer's previous contents (block l+2) must have been reduce-scattered. The
  // weight-gradient stream forks from the compute stream after this wait, so it is ordered too.
  const int b = l % 2;
  if (rs_pending_[b]) {
    FORGE_RETURN_IF_ERROR(ComputeWaits(compute, rs_done_[b], CollectiveOp::kReduceScatter));
    rs_pending_[b] = false;
  }
  // With comm windows the next block's gather starts at this block's attention (OnCommWindow).
  if (l > 0 && !comm_windows_) FORGE_RETURN_IF_ERROR(Ensure(l - 1, compute, /*wait=*/false));
  return Status::Ok();
}

}  // namespace forge
