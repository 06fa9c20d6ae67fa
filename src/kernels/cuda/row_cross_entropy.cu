// One block per row: a block maximum, then per-thread double partial sums of exp(x - max)
// combined in a fixed order (bitwise reproducible).
#include <cmath>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/row_cross_entropy.h"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads)
    RowCrossEntropyKernel(float* __restrict__ loss, const float* __restrict__ x,
                          const int32_t* __restrict__ targets, int cols, int64_t ld) {
  __shared__ float fmx[kWarps];
  __shared__ double dsum[kWarps];
  const float* row = x + blockIdx.x * ld;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += kThreads) mx = fmaxf(mx, row[j]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) fmx[warp] = mx;
  __syncthreads();
  mx = fmx[0];
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, fmx[w]);
  double s = 0.0;
  for (int j = threadIdx.x; j < cols; j += kThreads) s += exp(double(row[j]) - double(mx));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) dsum[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) total += dsum[w];
    loss[blockIdx.x] =
        static_cast<float>(double(mx) + log(total) - double(row[targets[blockIdx.x]]));
  }
}

}  // namespace

Status RowCrossEntropy(float* loss, const float* x, const int32_t* targets, int64_t R, int cols,
                       int64_t ld, cudaStream_t stream) {
  if (R < 0 || cols <= 0 || ld < cols)
    return Status::Invalid("RowCrossEntropy: bad shape cols=" + std::to_string(cols) +
                           " ld=" + std::to_string(ld));
  if (R == 0) return Status::Ok();
  RowCrossEntropyKernel<<<static_cast<unsigned>(R), kThreads, 0, stream>>>(loss, x, targets,
                                                                           cols, ld);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
