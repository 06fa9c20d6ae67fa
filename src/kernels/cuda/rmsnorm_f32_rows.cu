// One block per output row; per-thread double partial sums, then a fixed-order block sum.
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rmsnorm_f32_rows.h"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    RmsNormF32RowsKernel(bf16* __restrict__ out, const float* __restrict__ x,
                         const int32_t* __restrict__ rows, const bf16* __restrict__ w, int d,
                         float eps) {
  __shared__ double red[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* xr = x + (rows ? int64_t{rows[r]} : r) * d;
  double ss = 0.0;
  for (int j = threadIdx.x; j < d; j += kThreads) ss += double(xr[j]) * double(xr[j]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  double total = 0.0;
  for (int i = 0; i < kThreads / 32; ++i) total += red[i];
  const float rstd = static_cast<float>(1.0 / sqrt(total / d + double(eps)));
  bf16* o = out + r * d;
  for (int j = threadIdx.x; j < d; j += kThreads)
    o[j] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(xr[j], rstd), __bfloat162float(w[j])));
}

}  // namespace

Status RmsNormF32Rows(bf16* out, const float* x, const int32_t* rows, const bf16* w, int64_t R,
                      int d, float eps, cudaStream_t stream) {
  if (R < 0 || d <= 0) return Status::Invalid("RmsNormF32Rows: bad shape d=" + std::to_string(d));
  if (R == 0) return Status::Ok();
  RmsNormF32RowsKernel<<<static_cast<unsigned>(R), kThreads, 0, stream>>>(out, x, rows, w, d, eps);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
