// RMSNorm forward/backward: bf16 rows, fp32 statistics, fp32 weight gradient.
//
// Bytes moved and design (bandwidth-bound, one warp per row, 16-byte loads):
// - Forward: reads x (2Nd) once, keeping the row in registers between the sum of squares and
//   the scaling; writes out (2Nd) and rstd (4N); w (2d) stays in L1/L2.
// - Backward: the kernel and its launcher live in rmsnorm_backward.cuh (shared with the FP8
//   variant, rmsnorm_fp8.cu); one warp per row, a deterministic two-pass dw reduction.
// - Rows wider than 2048 (Llama 3's 3072 and 4096) take the wide kernels below: the row does not
//   fit a warp's registers, so each pass streams it (the second read of a row hits L1/L2), and
//   the backward's per-column dw sums live in shared memory, one row of d floats per warp,
//   merged in warp order into the same per-block partials and fixed-order reduction.
// Requirements (Status::Invalid otherwise): d % 8 == 0, d <= 8192, 16-byte aligned pointers.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/rmsnorm.h"
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

// ---- rows wider than kMaxD ------------------------------------------------------------------

constexpr int kMaxWideD = 8192;
constexpr int kWideBwdWarps = 4;  // their dw rows: 4 x 8192 x 4 bytes = 128 KiB at most
constexpr int kWideBwdThreads = 32 * kWideBwdWarps;

Status CheckWideShape(const char* fn, int64_t N, int d) {
  if (N < 0 || d % 8 != 0 || d > kMaxWideD) {
    return Status::Invalid(std::string(fn) + ": need N >= 0 and d % 8 == 0, d <= " +
                           std::to_string(kMaxWideD) + "; got N=" + std::to_string(N) +
                           " d=" + std::to_string(d));
  }
  return Status::Ok();
}

// One warp a row; lane `lane` owns columns [c, c + 8) for c = lane * 8 + k * 256.
__global__ void __launch_bounds__(kFwdThreads)
    RmsNormForwardWideKernel(bf16* __restrict__ out, float* __restrict__ rstd,
                             const bf16* __restrict__ x, const bf16* __restrict__ w, int64_t N,
                             int d, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * (kFwdThreads / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const bf16* xr = x + row * d;
  float ss = 0.0f;
  for (int c = lane * 8; c < d; c += 256) {
    float f[8];
    UnpackBf16x8(Load16(xr + c), f);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
  }
  const float r = RmsNormRstd(WarpSum(ss), 1.0f / static_cast<float>(d), eps);
  if (lane == 0 && rstd != nullptr) rstd[row] = r;
  bf16* outr = out + row * d;
  for (int c = lane * 8; c < d; c += 256) {
    float f[8], wf[8], y[8];
    UnpackBf16x8(Load16(xr + c), f);
    UnpackBf16x8(Load16(w + c), wf);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = RmsNormScale(f[j], r, wf[j]);
    Store16(outr + c, PackBf16x8(y));
  }
}

// Block b takes rows [b R, min(N, (b + 1) R)), warp w every kWideBwdWarps-th of them; dynamic
// shared memory: one dw row of d floats per warp. dx (+)= r w g - (r^3 / d) sum(w g x) x.
template <bool ACC_DX>
__global__ void __launch_bounds__(kWideBwdThreads)
    RmsNormBackwardWideKernel(bf16* __restrict__ dx, float* __restrict__ dw_partial,
                              const bf16* __restrict__ dout, const bf16* __restrict__ x,
                              const bf16* __restrict__ w, const float* __restrict__ rstd,
                              int64_t N, int d, int64_t rows_per_block) {
  extern __shared__ __align__(16) float s_dw[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* my_dw = s_dw + int64_t{warp} * d;  // each lane touches only its own columns
  for (int c = lane * 8; c < d; c += 256) {
#pragma unroll
    for (int j = 0; j < 8; ++j) my_dw[c + j] = 0.0f;
  }
  const int64_t begin = int64_t{blockIdx.x} * rows_per_block;
  const int64_t end = std::min<int64_t>(N, begin + rows_per_block);
  const float inv_d = 1.0f / static_cast<float>(d);
  for (int64_t row = begin + warp; row < end; row += kWideBwdWarps) {
    const bf16* xr = x + row * d;
    const bf16* gr = dout + row * d;
    bf16* dxr = dx + row * d;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int c = lane * 8; c < d; c += 256) {
      float xf[8], gf[8], wf[8];
      UnpackBf16x8(Load16(xr + c), xf);
      UnpackBf16x8(Load16(gr + c), gf);
      UnpackBf16x8(Load16(w + c), wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) dot += wf[j] * gf[j] * xf[j];
    }
    const float cr = WarpSum(dot) * r * r * r * inv_d;
    for (int c = lane * 8; c < d; c += 256) {
      float xf[8], gf[8], wf[8], df[8] = {};
      UnpackBf16x8(Load16(xr + c), xf);
      UnpackBf16x8(Load16(gr + c), gf);
      UnpackBf16x8(Load16(w + c), wf);
      if constexpr (ACC_DX) UnpackBf16x8(Load16(dxr + c), df);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        df[j] += r * wf[j] * gf[j] - cr * xf[j];
        my_dw[c + j] += gf[j] * xf[j] * r;
      }
      Store16(dxr + c, PackBf16x8(df));
    }
  }
  __syncthreads();
  float* part = dw_partial + int64_t{blockIdx.x} * d;
  for (int c = threadIdx.x; c < d; c += kWideBwdThreads) {
    float t = s_dw[c];
#pragma unroll
    for (int k = 1; k < kWideBwdWarps; ++k) t += s_dw[int64_t{k} * d + c];
    part[c] = t;
  }
}

// The forward's pointer checks and its grid (a warp a row), for both widths' kernels.
StatusOr<unsigned> ForwardBlocks(const bf16* out, const bf16* x, const bf16* w, int64_t N) {
  if (out == nullptr) return Status::Invalid("RmsNormForward: null out");
  if (!IsAligned(out, 16) || !IsAligned(x, 16) || !IsAligned(w, 16)) {
    return Status::Invalid("RmsNormForward: out, x and w must be 16-byte aligned");
  }
  const int64_t blocks = CeilDiv(N, kFwdThreads / 32);
  if (blocks > 0x7fffffff) return Status::Invalid("RmsNormForward: N too large");
  return static_cast<unsigned>(blocks);
}

Status RmsNormForwardWide(bf16* out, float* rstd, const bf16* x, const bf16* w, int64_t N,
                          int d, float eps, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckWideShape("RmsNormForward", N, d));
  FORGE_ASSIGN_OR_RETURN(const unsigned blocks, ForwardBlocks(out, x, w, N));
  if (N == 0) return Status::Ok();
  RmsNormForwardWideKernel<<<blocks, kFwdThreads, 0, stream>>>(out, rstd, x, w, N, d, eps);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status RmsNormBackwardWide(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w,
                           const float* rstd, int64_t N, int d, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream, bool accumulate_dx,
                           bool accumulate_dw, const RmsNormDwReduce& dw_reduce) {
  FORGE_RETURN_IF_ERROR(CheckWideShape("RmsNormBackward", N, d));
  if (!IsAligned(dx, 16) || !IsAligned(dout, 16) || !IsAligned(x, 16) || !IsAligned(w, 16))
    return Status::Invalid("RmsNormBackward: dx, dout, x and w must be 16-byte aligned");
  if (dx == dout) return Status::Invalid("RmsNormBackward: dx must not alias dout");
  if (N == 0) {
    if (!accumulate_dw) FORGE_CUDA_CHECK(cudaMemsetAsync(dw, 0, size_t(d) * sizeof(float), stream));
    return Status::Ok();
  }
  const size_t need = RmsNormBackwardWorkspace(N, d);
  if (workspace == nullptr || workspace_bytes < need || !IsAligned(workspace, 16))
    return Status::Invalid("RmsNormBackward: workspace needs " + std::to_string(need) +
                           " bytes; got " + std::to_string(workspace_bytes));
  const int blocks = BackwardBlocks(N);
  const int64_t rows_per_block = CeilDiv(N, blocks);
  const size_t smem = size_t(kWideBwdWarps) * d * sizeof(float);
  auto* partial = static_cast<float*>(workspace);
  auto launch = [&](auto kernel) -> Status {
    FORGE_RETURN_IF_ERROR(AllowDynamicSmem(kernel, smem));
    kernel<<<blocks, kWideBwdThreads, smem, stream>>>(dx, partial, dout, x, w, rstd, N, d,
                                                      rows_per_block);
    FORGE_CUDA_LAUNCH_CHECK();
    return Status::Ok();
  };
  FORGE_RETURN_IF_ERROR(accumulate_dx ? launch(RmsNormBackwardWideKernel<true>)
                                      : launch(RmsNormBackwardWideKernel<false>));
  return LaunchDwReduce(dw, partial, blocks, d, accumulate_dw, stream, dw_reduce);
}

}  // namespace

Status RmsNormForward(bf16* out, float* rstd, const bf16* x, const bf16* w, int64_t N, int d,
                      float eps, cudaStream_t stream) {
  if (d > kMaxD) return RmsNormForwardWide(out, rstd, x, w, N, d, eps, stream);
  FORGE_RETURN_IF_ERROR(CheckShape("RmsNormForward", N, d));
  FORGE_ASSIGN_OR_RETURN(const unsigned blocks, ForwardBlocks(out, x, w, N));
  if (N == 0) return Status::Ok();
  const int v = static_cast<int>(CeilDiv(d, 256));
  const dim3 grid(blocks);
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
  if (d > kMaxD) {
    return RmsNormBackwardWide(dx, dw, dout, x, w, rstd, N, d, workspace, workspace_bytes,
                               stream, accumulate_dx, accumulate_dw, dw_reduce);
  }
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
