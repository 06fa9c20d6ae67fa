// A Comm that forwards every collective to another and adds the host time spent waiting for
// each one to complete (CommWork::Wait / WaitOnStream) to forge_comm_seconds_total{op} and to
// a CommWaitClock: the communication the step could not hide behind compute. Start calls are not timed (they only
// post the collective).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "worker/parallel/comm.h"

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

// Owns `inner`; `metrics` and `clock` (either may be null) must outlive the result.
std::unique_ptr<Comm> MakeTimedComm(std::unique_ptr<Comm> inner, WorkerMetrics* metrics,
                                    CommWaitClock* clock = nullptr);

}  // namespace forge
