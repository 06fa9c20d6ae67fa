// One block per row: each thread scans a strided slice, then a tree over (value, index) pairs
// that prefers the larger value and, on equal values, the lower index.
#include <cmath>
#include <string>

#include "kernels/cuda/argmax_rows.h"
#include "kernels/cuda/cuda_check.h"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool Better(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxRowsKernel(int32_t* __restrict__ out, const float* __restrict__ x, int cols,
                     int64_t ld) {
  __shared__ float sv[kThreads];
  __shared__ int si[kThreads];
  const float* row = x + blockIdx.x * ld;
  float bv = -INFINITY;
  int bi = cols;  // sentinel above every real index
  for (int j = threadIdx.x; j < cols; j += kThreads) {
    const float v = row[j];
    if (Better(v, j, bv, bi)) bv = v, bi = j;
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && Better(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x],
                                  si[threadIdx.x])) {
      sv[threadIdx.x] = sv[threadIdx.x + s];
      si[threadIdx.x] = si[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = si[0] < cols ? si[0] : 0;
}

}  // namespace

Status ArgmaxRows(int32_t* out, const float* x, int64_t R, int cols, int64_t ld,
                  cudaStream_t stream) {
  if (R < 0 || cols <= 0 || ld < cols)
    return Status::Invalid("ArgmaxRows: bad shape cols=" + std::to_string(cols) +
                           " ld=" + std::to_string(ld));
  if (R == 0) return Status::Ok();
  ArgmaxRowsKernel<<<static_cast<unsigned>(R), kThreads, 0, stream>>>(out, x, cols, ld);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
