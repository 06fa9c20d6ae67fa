// The per-phase profile both step benchmarks print: the average of a few eager, single-stream
// steps (CudaTrainBackend::ProfileStep: events between phases), phase by phase in step order.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "worker/train/cuda_backend.h"

namespace forge::bench {

using PhaseTimes = std::vector<std::pair<std::string, double>>;

inline StatusOr<PhaseTimes> ProfilePhases(CudaTrainBackend& backend,
                                          const std::vector<MicroBatch>& micro, float lr,
                                          int64_t* step, int steps = 3) {
  PhaseTimes avg, ms;
  for (int i = 0; i < steps; ++i) {
    FORGE_RETURN_IF_ERROR(backend.ProfileStep(micro, StepHyper{lr, ++*step}, &ms));
    if (avg.empty()) avg.assign(ms.size(), {"", 0.0});
    for (size_t p = 0; p < ms.size() && p < avg.size(); ++p) {
      avg[p].first = ms[p].first;
      avg[p].second += ms[p].second / steps;
    }
  }
  return avg;
}

// {"phase": ms, ...} in any nlohmann JSON flavour.
template <class Json>
Json PhasesJson(const PhaseTimes& phases) {
  Json j = Json::object();
  for (const auto& [name, ms] : phases) j[name] = ms;
  return j;
}

}  // namespace forge::bench
