// Device FP8 scale update (see the header). n is the number of FP8 tensors of a model (a few
// hundred): a handful of blocks, negligible next to a step.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_scale_update.h"

namespace forge::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void Fp8ScaleUpdateKernel(Fp8ScaleUpdateArgs a) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= a.n) return;
  float* amax_slot = a.amax + i * a.stride;
  const float amax = *amax_slot;
  *amax_slot = 0.0f;
  if (!isfinite(amax)) {
    ++a.nonfinite[i];
    return;
  }
  float* h = a.history + i * a.window;
  h[a.recorded[i] % a.window] = amax < 0.0f ? 0.0f : amax;  // std::max(amax, 0.0f), as the host
  ++a.recorded[i];
  float m = 0.0f;  // the host's order: max from 0 over the ring
  for (int k = 0; k < a.window; ++k) m = h[k] > m ? h[k] : m;
  if (!(m > 0.0f)) return;  // nothing seen: previous scale (m is finite here)
  float s = ldexpf(a.fp8_max / m, -a.margin);  // IEEE division (no fast math), exact ldexp
  s = fminf(fmaxf(s, kFp8ScaleMin), kFp8ScaleMax);
  a.scale[i * a.stride] = s;
  a.scale_inv[i * a.stride] = 1.0f / s;
}

__global__ void AmaxMaxOverRanksKernel(float* __restrict__ amax, const float* __restrict__ gathered,
                                       int64_t n, int world, int64_t stride) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t m = 0;
    for (int r = 0; r < world; ++r)
      m = max(m, __float_as_uint(gathered[r * stride + i]) & 0x7FFFFFFFu);
    amax[i] = __uint_as_float(m);
  }
}

}  // namespace

Status Fp8AmaxMaxOverRanks(float* amax, const float* gathered, int64_t n, int world,
                           int64_t stride, cudaStream_t stream) {
  if (n < 0 || world < 1 || stride < n || (n > 0 && (amax == nullptr || gathered == nullptr)))
    return Status::Invalid("Fp8AmaxMaxOverRanks: bad arguments (n " + std::to_string(n) +
                           ", world " + std::to_string(world) + ")");
  if (n == 0) return Status::Ok();
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 1024));
  AmaxMaxOverRanksKernel<<<blocks, 256, 0, stream>>>(amax, gathered, n, world, stride);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status Fp8ScaleUpdate(const Fp8ScaleUpdateArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.stride < 1 || a.window < 1 || a.margin < 0 || a.margin > 32 ||
      !(a.fp8_max > 0.0f)) {
    return Status::Invalid("Fp8ScaleUpdate: bad arguments n=" + std::to_string(a.n) +
                           " stride=" + std::to_string(a.stride) +
                           " window=" + std::to_string(a.window) +
                           " margin=" + std::to_string(a.margin));
  }
  if (a.n == 0) return Status::Ok();
  if (!a.amax || !a.scale || !a.scale_inv || !a.history || !a.recorded || !a.nonfinite) {
    return Status::Invalid("Fp8ScaleUpdate: every array is required");
  }
  const int blocks = static_cast<int>(CeilDiv(a.n, kThreads));
  Fp8ScaleUpdateKernel<<<blocks, kThreads, 0, stream>>>(a);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
