// ddp's gradient all-reduce with the GPUs' copy engines instead of NCCL kernels (experimental:
// FORGE_DDP_COPY_ENGINE=1, fp32 ddp on the GPUs of one host).
//
// Why: with NCCL's all-reduce overlapping the backward, the backward GEMMs run ~17% slower
// (forge-dist-bench --profile, 4 GPUs: +5.2 ms a gpt350m step) because NCCL's kernels hold SMs
// that cuBLASLt's persistent kernels count on. Here the bytes move by cudaMemcpyAsync between
// the ranks' buffers (CUDA IPC, NVLink, copy engines: no SMs), and the SMs only run a short
// reduction of this rank's chunk and two one-float NCCL all-reduces that serve as barriers.
//
// Per range (a model unit: offset, n), split into `world` chunks of q = ceil(n / world):
//   1. each rank copies chunk c of its gradient into rank c's receive buffer (its slot for the
//      sender), for every other rank c;
//   2. barrier: a one-float all-reduce on the same stream. A rank's barrier kernel starts only
//      after its own copies (stream order), and no rank's barrier ends before every rank's has
//      started, so after it every copy into this rank has landed;
//   3. this rank sums its chunk over the ranks in rank order (its own gradient at its place)
//      into its gradient, so every element is summed once, the same way on every run;
//   4. each rank copies its summed chunk into every other rank's gradient at the same place;
//   5. barrier: every rank now holds every summed chunk.
// Reuse is safe without more waits: a rank copies into a peer's receive buffer for the next
// step only after its own step-end barrier, which no rank passes before every rank reduced.
// Everything is enqueued on the NCCL stream; the caller orders it with the compute streams.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "worker/parallel/nccl_comm.h"

namespace forge {

class CopyEngineAllReduce {
 public:
  // Collective over comm's ranks. `grads` is the base of its own device allocation (IPC maps
  // whole allocations) and every rank passes the same `ranges` (offset, count) within it.
  static StatusOr<std::unique_ptr<CopyEngineAllReduce>> Create(
      NcclComm* comm, float* grads, const std::vector<std::pair<int64_t, int64_t>>& ranges);
  ~CopyEngineAllReduce();
  CopyEngineAllReduce(const CopyEngineAllReduce&) = delete;
  CopyEngineAllReduce& operator=(const CopyEngineAllReduce&) = delete;

  // grads over ranges[i], summed over the ranks in place (the same bits on every rank),
  // enqueued on the NCCL stream. `what` names it in errors.
  Status AllReduceSum(int i, const std::string& what);

 private:
  CopyEngineAllReduce(NcclComm* comm, float* grads,
                      std::vector<std::pair<int64_t, int64_t>> ranges);
  Status Init();
  Status Barrier(const std::string& what);
  int Slot(int sender, int receiver) const { return sender < receiver ? sender : sender - 1; }

  NcclComm* comm_;
  float* grads_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  std::vector<int64_t> recv_offset_;  // per range: where its chunk sits in a receive slot
  int64_t slot_elems_ = 0;
  int rank_ = 0, world_ = 1;
  cudaStream_t stream_ = nullptr;
  float* recv_ = nullptr;     // (world - 1) slots of slot_elems_
  float* barrier_ = nullptr;  // one float, summed as a barrier
  std::vector<float*> peer_grads_, peer_recv_;  // per rank (nullptr for this rank)
  std::vector<bool> opened_;                     // through IPC (else: the same process)
};

}  // namespace forge
