// RMSNorm forward/backward: bf16 rows, fp32 statistics, fp32 weight gradient.
//
// Bytes moved and design (bandwidth-bound, one warp per row, 16-byte loads):
// - Forward: reads x (2Nd) once, keeping the row in registers between the sum of squares and
//   the scaling; writes out (2Nd) and rstd (4N); w (2d) stays in L1/L2.
// - Backward: the kernel and its launcher live in rmsnorm_backward.cuh (shared with the FP8
//   variant, rmsnorm_fp8.cu); one warp per row, a deterministic two-pass dw reduction.
// - Rows wider than 2048 (Llama 3's 3072 and 4096) take the wide kernels below: the row does not
//   fit a warp's registers. The forward streams it twice (the second read hits L1/L2); the
//   backward gives each row to a whole block, a thread per 8 columns, so every element is read
//   once and the dw sums stay in registers, written into the same per-block partials and
//   fixed-order reduction as the narrow kernel's.
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
constexpr int kWideBwdMaxThreads = kMaxWideD / 8;  // the backward: a thread per 8 columns

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

// A block a row: thread t owns columns [8 t, 8 t + 8) (blockDim.x = d / 8 rounded up to whole
// warps), so w and the thread's dw sums stay in registers and each element of x, dout and dx is
// read once. Block b takes rows [b R, min(N, (b + 1) R)) in order, loading the next row's x,
// dout (and dx) while it works on this one; a row's dot product is summed warp by warp into
// shared memory (two buffers by row parity: a warp can only write one again after the next
// row's barrier, which every warp reaches after reading it), one barrier a row.
// dx (+)= r w g - (r^3 / d) sum(w g x) x; the block's dw sums go to its partial row.
template <bool ACC_DX>
__global__ void __launch_bounds__(kWideBwdMaxThreads)
    RmsNormBackwardWideKernel(bf16* __restrict__ dx, float* __restrict__ dw_partial,
                              const bf16* __restrict__ dout, const bf16* __restrict__ x,
                              const bf16* __restrict__ w, const float* __restrict__ rstd, int64_t N,
                              int d, int64_t rows_per_block) {
  __shared__ float s_dot[2][kWideBwdMaxThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int c = threadIdx.x * 8;
  const bool mine = c < d;
  const int64_t begin = int64_t{blockIdx.x} * rows_per_block;
  const int64_t end = std::min<int64_t>(N, begin + rows_per_block);
  const float inv_d = 1.0f / static_cast<float>(d);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const uint4 wv = mine ? Load16(w + c) : zero;
  float dw_acc[8] = {};
  auto load = [&](const bf16* base, int64_t row) {
    return mine && row < end ? Load16(base + row * d + c) : zero;
  };
  uint4 xn = load(x, begin), gn = load(dout, begin), dn = ACC_DX ? load(dx, begin) : zero;
  for (int64_t row = begin; row < end; ++row) {
    const uint4 xv = xn, gv = gn, dv = dn;
    xn = load(x, row + 1);
    gn = load(dout, row + 1);
    if constexpr (ACC_DX) dn = load(dx, row + 1);
    const float r = rstd[row];
    float dot = 0.0f;
    {
      float xf[8], gf[8], wf[8];
      UnpackBf16x8(xv, xf);
      UnpackBf16x8(gv, gf);
      UnpackBf16x8(wv, wf);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        dot += wf[j] * gf[j] * xf[j];
        dw_acc[j] += gf[j] * xf[j] * r;
      }
    }
    dot = WarpSum(dot);
    const int buf = static_cast<int>((row - begin) & 1);
    if (lane == 0) s_dot[buf][warp] = dot;
    __syncthreads();
    float sum = 0.0f;
    for (int k = 0; k < warps; ++k) sum += s_dot[buf][k];
    const float cr = sum * r * r * r * inv_d;
    if (mine) {
      // Unpacked again: the packed values are what lives across the barrier (registers).
      float xf[8], gf[8], wf[8], df[8];
      UnpackBf16x8(xv, xf);
      UnpackBf16x8(gv, gf);
      UnpackBf16x8(wv, wf);
      UnpackBf16x8(dv, df);  // zeros when overwriting
#pragma unroll
      for (int j = 0; j < 8; ++j) df[j] += r * wf[j] * gf[j] - cr * xf[j];
      Store16(dx + row * d + c, PackBf16x8(df));
    }
  }
  if (mine) {
    float4* part = reinterpret_cast<float4*>(dw_partial + int64_t{blockIdx.x} * d + c);
    part[0] = make_float4(dw_acc[0], dw_acc[1], dw_acc[2], dw_acc[3]);
    part[1] = make_float4(dw_acc[4], dw_acc[5], dw_acc[6], dw_acc[7]);
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
  const unsigned threads = static_cast<unsigned>(CeilDiv(d / 8, 32) * 32);
  auto* partial = static_cast<float*>(workspace);
  auto launch = [&](auto kernel) -> Status {
    kernel<<<blocks, threads, 0, stream>>>(dx, partial, dout, x, w, rstd, N, d, rows_per_block);
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
