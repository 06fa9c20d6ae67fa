// Where a communicator reports how long its collectives took (the worker's metrics:
// metrics/timed_comm.h counts them into forge_comm_seconds_total and the per-step collective
// wait the coordinator's straggler watch subtracts from the step time). Two quantities, kept
// apart because on a GPU they differ:
//   collective seconds  how long each collective ran, start to end. Host communicators (MPI,
//                       local, host-staged): the time the caller was blocked in its Wait. NCCL:
//                       the time its kernels ran on the communicator's stream (CUDA events
//                       around each collective), peers' lateness included; this overlaps the
//                       compute it was issued behind, so it is not time the step lost.
//   exposed wait        how long the step's own work stood still for collectives. Host
//                       communicators: the same blocked time. NCCL: the time the compute stream
//                       stalled at its waits on the communicator's stream (CUDA events before
//                       and after each wait), counted against the collective the wait was for
//                       (the last one before it, where a wait covers several).
// Implementations are called from any thread (NCCL's watchdog among them).
#pragma once

#include "worker/parallel/comm.h"

namespace forge {

class CommTimeSink {
 public:
  virtual ~CommTimeSink() = default;
  virtual void AddCollectiveSeconds(CollectiveOp op, double seconds) = 0;
  virtual void AddExposedWaitSeconds(CollectiveOp op, double seconds) = 0;
};

}  // namespace forge
