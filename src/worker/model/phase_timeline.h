// The profile breakdown's observer: marks each phase boundary with an event on the stream; the
// time between a mark and the next one counts to the first mark's phase. Only for profiling
// runs (never captured in graphs); the model runs single-stream while observed, since phases on
// two streams would overlap and be mis-timed.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <vector>

#include "common/status.h"
#include "worker/model/step_observer.h"

namespace forge {

class PhaseTimeline final : public StepObserver {
 public:
  PhaseTimeline() = default;
  ~PhaseTimeline() override;
  PhaseTimeline(const PhaseTimeline&) = delete;
  PhaseTimeline& operator=(const PhaseTimeline&) = delete;

  void Reset() { marks_ = 0; }
  Status OnPhase(StepPhase phase, cudaStream_t stream) override;
  // Closes the last phase; Totals synchronises on it and sums milliseconds per phase.
  Status End(cudaStream_t stream);
  Status Totals(std::array<double, static_cast<int>(StepPhase::kCount)>* ms) const;

 private:
  std::vector<cudaEvent_t> events_;  // reused across steps
  std::vector<int> phases_;          // phase of the mark with the same index (-1: end)
  size_t marks_ = 0;
};

}  // namespace forge
