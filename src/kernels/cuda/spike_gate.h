// Loss-spike gate for the training step (the trainer's StepHyper::skip_above, decided on the
// device so the step never waits for the host): once a step's global loss and gradient sum of
// squares are known and its clip scale is written, a step whose loss or gradient norm is above
// the limits gets a NaN clip scale, which AdamW (or the deferred update's gate) treats exactly
// as a non-finite step: weights and moments unchanged, the skipped-step counter + 1.
#pragma once

#include <cuda_runtime.h>

#include "common/status.h"

namespace forge::cuda {

// stats = [loss sum, gradient sum of squares] (device); the step's loss is stats[0] /
// loss_divisor and its norm sqrtf(stats[1]), the same float operations the host uses
// (SpikeLimits::Exceeded on StepStats), so both decide alike. limits = [loss, grad norm]
// (device; +inf: none). One thread; stream-ordered and capturable.
Status GateSpike(const float* stats, float loss_divisor, const float* limits, float* clip_scale,
                 cudaStream_t stream);

}  // namespace forge::cuda
