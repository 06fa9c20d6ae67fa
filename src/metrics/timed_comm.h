// Counting collective times into a worker's metrics (comm_time_sink.h says what the two
// quantities are):
//   CommTimeCounter  the sink: exposed wait -> forge_comm_seconds_total{op} and a CommWaitClock
//                    (the per-step wait the straggler watch subtracts); collective seconds ->
//                    forge_collective_seconds_total{op}. NCCL reports into it directly
//                    (NcclComm::SetTimeSink).
//   MakeTimedComm    a host Comm that forwards every collective to another and counts the host
//                    time blocked in each one's Wait / WaitOnStream as both (a host wait is the
//                    whole collective as the caller sees it, and all of it exposed). Start calls
//                    are not timed (they only post the collective).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "worker/parallel/comm.h"
#include "worker/parallel/comm_time_sink.h"

namespace forge {

class WorkerMetrics;

// The host time this process has spent waiting for collectives, all ops together; read from
// any thread (the worker agent reports it per step record, for the coordinator's straggler
// watch).
class CommWaitClock {
 public:
  void Add(double seconds) {
    if (seconds > 0) ns_.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
  }
  double seconds() const { return double(ns_.load(std::memory_order_relaxed)) * 1e-9; }

 private:
  std::atomic<int64_t> ns_{0};
};

// `metrics` and `clock` (either may be null) must outlive this.
class CommTimeCounter final : public CommTimeSink {
 public:
  CommTimeCounter(WorkerMetrics* metrics, CommWaitClock* clock)
      : metrics_(metrics), clock_(clock) {}
  void AddCollectiveSeconds(CollectiveOp op, double seconds) override;
  void AddExposedWaitSeconds(CollectiveOp op, double seconds) override;

 private:
  WorkerMetrics* metrics_;
  CommWaitClock* clock_;
};

// Owns `inner`; `metrics` and `clock` (either may be null) must outlive the result.
std::unique_ptr<Comm> MakeTimedComm(std::unique_ptr<Comm> inner, WorkerMetrics* metrics,
                                    CommWaitClock* clock = nullptr);

}  // namespace forge
