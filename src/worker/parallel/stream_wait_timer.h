// The exposed part of a device wait: how long a stream stood still at cudaStreamWaitEvent for
// work on another stream (the compute stream waiting for the NCCL stream's collectives).
// Wait() records a timing event on the waiting stream before the wait and one after it; their
// difference is the stall (about 0 when the awaited work was done in time). Collect() reads
// the pairs that completed, in order, and never blocks: call it once per step (e.g. after the
// step's final sync, or at the start of the next step) and the stalls arrive a step late at
// most. CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <deque>
#include <vector>

#include "common/status.h"
#include "worker/parallel/comm_time_sink.h"

namespace forge {

class StreamWaitTimer {
 public:
  StreamWaitTimer() = default;
  StreamWaitTimer(const StreamWaitTimer&) = delete;
  StreamWaitTimer& operator=(const StreamWaitTimer&) = delete;
  ~StreamWaitTimer();

  // `stream` waits for `event`; with `timed` the stall is measured and later reported against
  // `op`. Not for use during CUDA graph capture.
  Status Wait(cudaStream_t stream, cudaEvent_t event, CollectiveOp op, bool timed);
  // Reports every completed stall to `sink` (dropped when null) as exposed wait, oldest first.
  void Collect(CommTimeSink* sink);
  // Stalls recorded and not yet collected.
  size_t pending() const { return pending_.size(); }

 private:
  struct Pair {
    cudaEvent_t before = nullptr, after = nullptr;
    CollectiveOp op = CollectiveOp::kBarrier;
  };
  std::deque<Pair> pending_;
  std::vector<Pair> free_;
};

}  // namespace forge
