// What a step's pieces tell an observer: the phase boundaries of the work they enqueue. The
// model calls StepObserver::OnPhase where the kind of work changes (GEMMs, attention,
// elementwise kernels, ...); with no observer set (every step that is not profiled) nothing is
// called. PhaseTimeline (phase_timeline.h) is the observer that times the phases.
#pragma once

#include <cuda_runtime.h>

#include "common/status.h"

namespace forge {

// Phases of a step for the optional profile breakdown.
enum class StepPhase {
  kCopy,             // H2D tokens (and ZeroGrads when called)
  kFwdGemm,
  kFwdAttention,
  kFwdElementwise,   // embedding, norms, RoPE, SwiGLU
  kLmHeadGemm,       // tied LM-head GEMMs: logits, dhf and dWte
  kCrossEntropy,     // fused softmax + cross-entropy (+ dlogits in place)
  kBwdGemm,
  kBwdAttention,
  kBwdElementwise,
  kOptimizer,        // grad norm + AdamW
  kCount,
};
const char* StepPhaseName(StepPhase p);

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // Work enqueued on `stream` from now until the next call belongs to `phase`. Called on the
  // host while the model enqueues (never while a CUDA graph is captured).
  virtual Status OnPhase(StepPhase phase, cudaStream_t stream) = 0;
};

}  // namespace forge
