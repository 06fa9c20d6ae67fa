// RMSNorm forward/backward: bf16 rows, fp32 statistics, fp32 weight gradient.
//
// Bytes moved and design (bandwidth-bound, one warp per row, 16-byte loads):
// - Forward: reads x (2Nd) once, keeping the row in registers between the sum of squares and
//   the scaling; writes out (2Nd) and rstd (4N); w (2d) stays in L1/L2.
// - Backward: the kernel and its launcher live in rmsnorm_backward.cuh (shared with the FP8
//   variant, rmsnorm_fp8.cu); one warp per row, a deterministic two-pass dw reduction.
// Requirements (Status::Invalid otherwise): d % 8 == 0, d <= 2048, 16-byte aligned pointers.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rmsnorm_backward.cuh"
#include "kernels/cuda/rmsnorm_math.cuh"

namespace forge::cuda {
namespace {

constexpr int kFwdThreads = 128;    // 4 rows per block

// Lane `lane` owns columns [(k * 32 + lane) * 8, +8) for k < V.
template <int V>
__global__ void __launch_bounds__(kFwdThreads)
    RmsNormForwardKernel(bf16* __restrict__ out, float* __restrict__ rstd,
                         const bf16* __restrict__ x, const bf16* __restrict__ w, int64_t N, int d,
                         float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * (kFwdThreads / 32) + threadIdx.x / 32;
  if (row >= N) return;  // whole warps leave together: no block barrier below
  const bf16* xr = x + row * d;
  uint4 xv[V];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int c = (k * 32 + lane) * 8;
    xv[k] = make_uint4(0, 0, 0, 0);
    if (c < d) xv[k] = Load16(xr + c);
  }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    float f[8];
    UnpackBf16x8(xv[k], f);  // zeros past d contribute nothing
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
  }
  ss = WarpSum(ss);
  const float inv_d = 1.0f / static_cast<float>(d);
  const float r = RmsNormRstd(ss, inv_d, eps);
  if (lane == 0 && rstd != nullptr) rstd[row] = r;
  bf16* outr = out + row * d;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int c = (k * 32 + lane) * 8;
    if (c < d) {
      float f[8], wf[8], y[8];
      UnpackBf16x8(xv[k], f);
      UnpackBf16x8(Load16(w + c), wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = RmsNormScale(f[j], r, wf[j]);
      Store16(outr + c, PackBf16x8(y));
    }
  }
}

}  // namespace

Status RmsNormForward(bf16* out, float* rstd, const bf16* x, const bf16* w, int64_t N, int d,
                      float eps, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckShape("RmsNormForward", N, d));
  if (out == nullptr) return Status::Invalid("RmsNormForward: null out");
  if (!IsAligned(out, 16) || !IsAligned(x, 16) || !IsAligned(w, 16)) {
    return Status::Invalid("RmsNormForward: out, x and w must be 16-byte aligned");
  }
  if (N == 0) return Status::Ok();
  const int64_t blocks = CeilDiv(N, kFwdThreads / 32);
  if (blocks > 0x7fffffff) return Status::Invalid("RmsNormForward: N too large");
  const int v = static_cast<int>(CeilDiv(d, 256));
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (v) {
#define FORGE_RMS_FWD(V)                                                                      \
  case V:                                                                                     \
    RmsNormForwardKernel<V><<<grid, kFwdThreads, 0, stream>>>(out, rstd, x, w, N, d, eps); \
    break;
    FORGE_RMS_FWD(1)
    FORGE_RMS_FWD(2)
    FORGE_RMS_FWD(3)
    FORGE_RMS_FWD(4)
    FORGE_RMS_FWD(5)
    FORGE_RMS_FWD(6)
    FORGE_RMS_FWD(7)
    FORGE_RMS_FWD(8)
#undef FORGE_RMS_FWD
    default:
      return Status::Internal("RmsNormForward: no kernel for d=" + std::to_string(d));
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

size_t RmsNormBackwardWorkspace(int64_t N, int d) {
  if (N <= 0 || d <= 0) return 0;
  return size_t(BackwardBlocks(N)) * size_t(d) * sizeof(float);
}

Status RmsNormBackward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w,
                       const float* rstd, int64_t N, int d, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream, bool accumulate_dx, bool accumulate_dw,
                       const RmsNormDwReduce& dw_reduce) {
  FORGE_RETURN_IF_ERROR(CheckRmsNormBackwardArgs("RmsNormBackward", dx, dout, x, w, N, d,
                                                 workspace, workspace_bytes));
  if (N == 0) {
    // No rows: the gradient of w is zero, which overwriting must still store.
    if (!accumulate_dw) {
      FORGE_CUDA_CHECK(cudaMemsetAsync(dw, 0, size_t(d) * sizeof(float), stream));
    }
    return Status::Ok();
  }
  return LaunchRmsNormBackward<false>(dx, dw, dout, x, w, rstd, N, d,
                                      static_cast<float*>(workspace), stream, accumulate_dx,
                                      accumulate_dw, RmsNormBwdFp8Out{}, dw_reduce);
}

}  // namespace forge::cuda
