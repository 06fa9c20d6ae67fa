#include "worker/train/copy_engine_all_reduce.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_check.h"

namespace forge {
namespace {

constexpr int kReduceThreads = 256;
constexpr int kReduceMaxBlocks = 1024;

// mine[i] = sum over senders s = 0 .. world-1 of their chunk element i, in that order, with
// this rank's own value (mine[i]) at its place; the others come from their receive slots.
__global__ void __launch_bounds__(kReduceThreads)
    ReduceChunkKernel(float* __restrict__ mine, const float* __restrict__ recv,
                      int64_t slot_elems, int64_t recv_offset, int64_t len, int me, int world) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < len;
       i += int64_t{gridDim.x} * blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < world; ++s) {
      if (s == me) {
        acc += mine[i];
      } else {
        const int slot = s < me ? s : s - 1;
        acc += recv[slot * slot_elems + recv_offset + i];
      }
    }
    mine[i] = acc;
  }
}

// [begin, begin + len) of chunk c of a range of n elements split into `world` chunks.
std::pair<int64_t, int64_t> Chunk(int64_t n, int world, int c) {
  const int64_t q = (n + world - 1) / world;
  const int64_t begin = std::min(n, int64_t{c} * q);
  return {begin, std::min(n, begin + q) - begin};
}

// What each rank tells the others about its buffers: IPC handles for ranks in other
// processes, the pointers themselves for ranks in the same process (threads, as in the tests:
// CUDA does not open a process's own IPC handles), where the device pointers are valid as they
// are (unified addressing).
struct Exported {
  cudaIpcMemHandle_t handle[2];  // gradient, receive buffer
  uint64_t pid;
  uint64_t ptr[2];
  int64_t device;
};
constexpr int kExportedDoubles = (sizeof(Exported) + sizeof(double) - 1) / sizeof(double);

}  // namespace

CopyEngineAllReduce::CopyEngineAllReduce(NcclComm* comm, float* grads,
                                         std::vector<std::pair<int64_t, int64_t>> ranges)
    : comm_(comm), grads_(grads), ranges_(std::move(ranges)) {}

CopyEngineAllReduce::~CopyEngineAllReduce() {
  for (size_t p = 0; p < opened_.size(); ++p) {
    if (!opened_[p]) continue;
    if (peer_grads_[p]) cudaIpcCloseMemHandle(peer_grads_[p]);
    if (peer_recv_[p]) cudaIpcCloseMemHandle(peer_recv_[p]);
  }
  if (recv_) cudaFree(recv_);
  if (barrier_) cudaFree(barrier_);
}

StatusOr<std::unique_ptr<CopyEngineAllReduce>> CopyEngineAllReduce::Create(
    NcclComm* comm, float* grads, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  if (comm == nullptr || grads == nullptr) {
    return Status::Invalid("CopyEngineAllReduce: null comm or gradient buffer");
  }
  std::unique_ptr<CopyEngineAllReduce> a(new CopyEngineAllReduce(comm, grads, ranges));
  FORGE_RETURN_IF_ERROR(a->Init().Annotate("copy-engine all-reduce, rank " +
                                           std::to_string(comm->rank())));
  return StatusOr<std::unique_ptr<CopyEngineAllReduce>>(std::move(a));
}

Status CopyEngineAllReduce::Init() {
  rank_ = comm_->rank();
  world_ = comm_->world();
  stream_ = static_cast<cudaStream_t>(comm_->stream());
  for (const auto& [offset, n] : ranges_) {
    if (offset < 0 || n < 0) return Status::Invalid("negative range");
    recv_offset_.push_back(slot_elems_);
    slot_elems_ += (n + world_ - 1) / world_;
  }
  const size_t recv_bytes = size_t(std::max(1, world_ - 1)) * size_t(std::max<int64_t>(1, slot_elems_)) *
                            sizeof(float);
  FORGE_CUDA_CHECK(cudaMalloc(&recv_, recv_bytes));
  FORGE_CUDA_CHECK(cudaMalloc(&barrier_, sizeof(float)));
  FORGE_CUDA_CHECK(cudaMemset(barrier_, 0, sizeof(float)));

  // Every rank's buffers (Exported) to every rank, through NCCL.
  Exported mine{};
  FORGE_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle[0], grads_));
  FORGE_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle[1], recv_));
  mine.pid = static_cast<uint64_t>(getpid());
  mine.ptr[0] = reinterpret_cast<uint64_t>(grads_);
  mine.ptr[1] = reinterpret_cast<uint64_t>(recv_);
  int device = 0;
  FORGE_CUDA_CHECK(cudaGetDevice(&device));
  mine.device = device;
  double* dev = nullptr;
  FORGE_CUDA_CHECK(cudaMalloc(&dev, size_t(world_ + 1) * kExportedDoubles * sizeof(double)));
  std::vector<double> all(size_t(world_) * kExportedDoubles);
  Status st = [&]() -> Status {
    double* send = dev + size_t(world_) * kExportedDoubles;
    FORGE_CUDA_CHECK(cudaMemset(send, 0, kExportedDoubles * sizeof(double)));
    FORGE_CUDA_CHECK(cudaMemcpy(send, &mine, sizeof(mine), cudaMemcpyHostToDevice));
    FORGE_ASSIGN_OR_RETURN(
        CommWorkPtr w, comm_->AllGather(send, dev, kExportedDoubles, DType::kF64, "buffers"));
    FORGE_RETURN_IF_ERROR(w->Wait());
    FORGE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    FORGE_CUDA_CHECK(cudaMemcpy(all.data(), dev, all.size() * sizeof(double),
                                cudaMemcpyDeviceToHost));
    return Status::Ok();
  }();
  cudaFree(dev);
  FORGE_RETURN_IF_ERROR(st);
  peer_grads_.assign(size_t(world_), nullptr);
  peer_recv_.assign(size_t(world_), nullptr);
  opened_.assign(size_t(world_), false);
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    Exported e;
    std::memcpy(&e, all.data() + size_t(p) * kExportedDoubles, sizeof(e));
    if (e.pid == mine.pid) {
      peer_grads_[size_t(p)] = reinterpret_cast<float*>(e.ptr[0]);
      peer_recv_[size_t(p)] = reinterpret_cast<float*>(e.ptr[1]);
      const cudaError_t pe = cudaDeviceEnablePeerAccess(static_cast<int>(e.device), 0);
      if (pe == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();  // fine
      else FORGE_CUDA_CHECK(pe);
      continue;
    }
    void* g = nullptr;
    void* r = nullptr;
    FORGE_CUDA_CHECK(cudaIpcOpenMemHandle(&g, e.handle[0], cudaIpcMemLazyEnablePeerAccess));
    peer_grads_[size_t(p)] = static_cast<float*>(g);
    FORGE_CUDA_CHECK(cudaIpcOpenMemHandle(&r, e.handle[1], cudaIpcMemLazyEnablePeerAccess));
    peer_recv_[size_t(p)] = static_cast<float*>(r);
    opened_[size_t(p)] = true;
  }
  // The memsets above ran on the legacy stream; the NCCL stream does not wait for it.
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

Status CopyEngineAllReduce::Barrier(const std::string& what) {
  return comm_->AllReduceSum(barrier_, 1, DType::kF32, what).status();
}

Status CopyEngineAllReduce::AllReduceSum(int i, const std::string& what) {
  if (i < 0 || size_t(i) >= ranges_.size()) {
    return Status::Invalid("CopyEngineAllReduce: no range " + std::to_string(i));
  }
  const auto [offset, n] = ranges_[size_t(i)];
  if (n == 0) return Status::Ok();
  const auto [my_begin, my_len] = Chunk(n, world_, rank_);
  for (int p = 0; p < world_; ++p) {  // 1. chunk p to rank p
    if (p == rank_) continue;
    const auto [begin, len] = Chunk(n, world_, p);
    if (len == 0) continue;
    float* dst = peer_recv_[size_t(p)] + int64_t{Slot(rank_, p)} * slot_elems_ +
                 recv_offset_[size_t(i)];
    FORGE_CUDA_CHECK(cudaMemcpyAsync(dst, grads_ + offset + begin, size_t(len) * sizeof(float),
                                     cudaMemcpyDefault, stream_));
  }
  FORGE_RETURN_IF_ERROR(Barrier(what + " (chunks in)"));  // 2.
  if (my_len > 0) {                                        // 3.
    const int blocks = static_cast<int>(
        std::clamp<int64_t>((my_len + kReduceThreads - 1) / kReduceThreads, 1, kReduceMaxBlocks));
    ReduceChunkKernel<<<blocks, kReduceThreads, 0, stream_>>>(
        grads_ + offset + my_begin, recv_, slot_elems_, recv_offset_[size_t(i)], my_len, rank_,
        world_);
    FORGE_CUDA_LAUNCH_CHECK();
    for (int p = 0; p < world_; ++p) {  // 4. the sum to every rank
      if (p == rank_) continue;
      FORGE_CUDA_CHECK(cudaMemcpyAsync(peer_grads_[size_t(p)] + offset + my_begin,
                                       grads_ + offset + my_begin,
                                       size_t(my_len) * sizeof(float), cudaMemcpyDefault,
                                       stream_));
    }
  }
  return Barrier(what + " (sums out)");  // 5.
}

}  // namespace forge
