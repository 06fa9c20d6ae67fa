#include "kernels/cuda/spike_gate.h"

#include <cmath>

#include "kernels/cuda/cuda_check.h"

namespace forge::cuda {
namespace {

__global__ void GateSpikeKernel(const float* stats, float loss_divisor, const float* limits,
                                float* clip_scale) {
  // __fdiv_rn / __fsqrt_rn: IEEE round-to-nearest whatever the compile flags, as on the host.
  const float loss = __fdiv_rn(stats[0], loss_divisor);
  const float norm = __fsqrt_rn(stats[1]);
  if (loss > limits[0] || norm > limits[1]) *clip_scale = nanf("");
}

}  // namespace

Status GateSpike(const float* stats, float loss_divisor, const float* limits, float* clip_scale,
                 cudaStream_t stream) {
  if (stats == nullptr || limits == nullptr || clip_scale == nullptr || !(loss_divisor > 0))
    return Status::Invalid("GateSpike: bad arguments");
  GateSpikeKernel<<<1, 1, 0, stream>>>(stats, loss_divisor, limits, clip_scale);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
