// All-reduce (fp32 sum) of buffers in one registered range, for the GPUs of one host, moved by
// the GPUs' copy engines instead of NCCL's kernels (NcclComm::EnableCopyEngineAllReduce).
//
// Why: ddp's per-unit gradient all-reduces overlap the backward, and NCCL's kernels hold SMs
// for as long as they run (~7 ms a step for gpt350m, ~16-24 SMs). Copy engines move bytes over
// NVLink without SMs; what is left on the SMs is one short elementwise sum per unit. On 2x
// H100 ddp reaches 97.8% of one GPU with it against NCCL's 97.0% (4x H100: 95.5% against
// 95.4%); the attention backward still runs ~10% slower while copies are in flight (the
// traffic itself; docs/performance.md).
//
// A unit of n floats is cut into `world` chunks (chunk c: rank c's); rank r, on the stream it
// is given (the NCCL stream: events, watchdog and ordering stay NcclComm's):
//   1. tells every peer "my unit is final" (ready flag, written into the peer's memory) and
//      waits until every peer told it the same;
//   2. copies chunk r of every peer's buffer into its scratch (one copy-engine lane per peer);
//   3. sums chunk r over ranks 0, 1, ..., world-1 in that order, into its own buffer;
//   4. copies the sum into chunk r of every peer's buffer, then sets its done flag there;
//   5. waits until every peer's done flag says its chunk arrived.
// Flags are 64-bit sequence numbers (the n-th all-reduce writes n), written and awaited with
// the driver's stream memory operations (cuStreamWriteValue64 / cuStreamWaitValue64: no SM
// spins on them); a write follows the copies of its lane in stream order and fences them.
// The sum is computed once per element in a fixed order and copied, so every rank holds the
// same bits, run after run (NCCL's ring order depends on the algorithm it picks).
//
// Safety without extra handshakes: chunk c of rank p's buffer is read (step 2) and rewritten
// (step 4) only by rank c, in that order on one stream; a rank's buffer is next written by its
// own backward only after its step 5, i.e. after every peer has finished reading it; scratch is
// reused only by the next all-reduce on the same stream. Every rank must issue the same
// all-reduces in the same order, as with any collective; a peer that never arrives leaves the
// stream waiting, which the caller's collective timeout reports.
//
// Peers are other processes of the same host (one per GPU, as forge-worker runs), mapped with
// CUDA IPC; ranks that are threads of one process are refused (see MapPeers). Create fails on
// every rank, with the reason, when any rank cannot map a peer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"

namespace forge {

class CopyEngineAllReduce {
 public:
  // Collective: all-gathers `bytes` (a multiple of 4) from every rank (rank r's at
  // all + r * bytes).
  using Exchange = std::function<Status(const void* mine, void* all, size_t bytes)>;

  // base[0, count): this rank's registered range (one cudaMalloc allocation, as the peers map
  // it whole); max_count: the largest all-reduce that will be asked for (sizes the scratch).
  static StatusOr<std::unique_ptr<CopyEngineAllReduce>> Create(int rank, int world, int device,
                                                               float* base, int64_t count,
                                                               int64_t max_count,
                                                               const Exchange& exchange);
  ~CopyEngineAllReduce();
  CopyEngineAllReduce(const CopyEngineAllReduce&) = delete;
  CopyEngineAllReduce& operator=(const CopyEngineAllReduce&) = delete;

  // Whether buf[0, n) lies in the registered range and fits the scratch.
  bool Covers(const void* buf, int64_t n) const;
  // Enqueues the all-reduce of buf[0, n) on `stream` (see the file comment).
  Status Enqueue(float* buf, int64_t n, cudaStream_t stream);
  // After a collective failed (timeout, a peer gone): sets this rank's flags past every
  // sequence number issued, so the streams waiting on them run to their end (with meaningless
  // sums) and teardown does not hang on them. Enqueues only; the comm is unusable after it.
  void Release();

 private:
  CopyEngineAllReduce() = default;
  Status Init(int rank, int world, int device, float* base, int64_t count, int64_t max_count,
              const Exchange& exchange);
  Status MapPeers(const std::vector<uint8_t>& blobs, size_t blob_bytes);
  Status Signal(cudaStream_t s, int peer, int kind, uint64_t value);
  Status SignalPeers(cudaStream_t s, int kind, uint64_t value);  // Signal to every peer
  // work(p, lane) on every peer's lane, forked from `s` and joined back into it.
  Status OnLanes(cudaStream_t s, const std::function<Status(int peer, cudaStream_t lane)>& work);
  Status Await(cudaStream_t s, int kind, uint64_t value);

  int rank_ = 0, world_ = 1, device_ = 0;
  float* base_ = nullptr;
  int64_t count_ = 0, chunk_cap_ = 0;
  uint64_t* flags_ = nullptr;            // [2][world]: ready, done (this rank's, peers write)
  float* scratch_ = nullptr;             // [world][chunk_cap] (this rank's slot unused)
  std::vector<float*> peer_base_;        // CUDA IPC mappings (null until opened); [rank_] base_
  std::vector<uint64_t*> peer_flags_;    // the same for the flags; [rank_] flags_
  std::vector<cudaStream_t> lanes_;      // one copy-engine lane per peer
  std::vector<cudaEvent_t> lane_done_;
  cudaEvent_t fork_ = nullptr;
  cudaStream_t release_ = nullptr;  // Release's writes (the others may be stuck)
  uint64_t* release_values_ = nullptr;  // pinned host source of Release's copy
  uint64_t seq_ = 0;
  void* write_value_ = nullptr;  // cuStreamWriteValue64
  void* wait_value_ = nullptr;   // cuStreamWaitValue64
};

}  // namespace forge
