// A Comm that forwards every collective to another and adds the host time spent waiting for
// each one to complete (CommWork::Wait / WaitOnStream) to forge_comm_seconds_total{op}: the
// communication the step could not hide behind compute. Start calls are not timed (they only
// post the collective).
#pragma once

#include <memory>

#include "worker/parallel/comm.h"

namespace forge {

class WorkerMetrics;

// Owns `inner`; `metrics` must outlive the result.
std::unique_ptr<Comm> MakeTimedComm(std::unique_ptr<Comm> inner, WorkerMetrics* metrics);

}  // namespace forge
