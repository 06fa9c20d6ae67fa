// RMSNorm forward/backward: bf16 rows, fp32 statistics, fp32 weight gradient.
//
// Bytes moved and design (bandwidth-bound, one warp per row, 16-byte loads):
// - Forward: reads x (2Nd) once, keeping the row in registers between the sum of squares and
//   the scaling; writes out (2Nd) and rstd (4N); w (2d) stays in L1/L2.
// - Backward: reads x, dout and dx (6Nd; 4Nd when overwriting dx) and rstd (4N), writes dx
//   (2Nd); x, dout and the old dx of a row are all loaded before the first use (one memory
//   round trip per row) and stay in registers between the dot product and the dx update.
//   dw is reduced
//   without atomics: each warp keeps its rows' dw contributions in registers, the block's
//   warps add theirs into one shared row in warp order, each block writes that partial row
//   to the workspace (P*d*4 bytes, P <= 256 blocks), and a second kernel adds the P partial
//   rows to dw in a fixed order. P depends on N only, so the result is bitwise reproducible.
// Requirements (Status::Invalid otherwise): d % 8 == 0, d <= 2048, 16-byte aligned pointers.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rmsnorm_math.cuh"

namespace forge::cuda {
namespace {

constexpr int kMaxD = 2048;         // 8 vectors of 8 columns per lane
constexpr int kFwdThreads = 128;    // 4 rows per block
constexpr int kBwdThreads = 256;    // 8 warps
constexpr int kBwdWarps = kBwdThreads / 32;
// Partial dw rows in the workspace. 256: at ~120 registers a thread two 256-thread blocks fit
// an SM, so 256 blocks are one wave on a 132-SM H100, and each block's dw merge (8 barriers)
// is spread over 64 rows (512 blocks of 32 rows took 1.94 waves; measured on H100 at gpt350m
// size: 57.8 -> 52.6 us a call, 48 calls a step).
constexpr int kMaxBwdBlocks = 256;

int BackwardBlocks(int64_t N) {
  return static_cast<int>(std::clamp<int64_t>(CeilDiv(N, kBwdWarps), 1, kMaxBwdBlocks));
}

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
  const float r = 1.0f / sqrtf(ss * inv_d + eps);
  if (lane == 0 && rstd != nullptr) rstd[row] = r;
  if (out == nullptr) return;  // statistics only (the FP8 path quantises the output itself)
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

// Block b handles rows [b * R, min(N, (b + 1) * R)), warp w every kBwdWarps-th row of them.
// Dynamic shared memory: d floats.
// ACC_DX: dx += the row's gradient (else dx = it, and the old dx is not read).
template <int V, bool ACC_DX>
__global__ void __launch_bounds__(kBwdThreads)
    RmsNormBackwardKernel(bf16* __restrict__ dx, float* __restrict__ dw_partial,
                          const bf16* __restrict__ dout, const bf16* __restrict__ x,
                          const bf16* __restrict__ w, const float* __restrict__ rstd, int64_t N,
                          int d, int64_t rows_per_block) {
  extern __shared__ float s_dw[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t begin = int64_t{blockIdx.x} * rows_per_block;
  const int64_t end = std::min<int64_t>(N, begin + rows_per_block);
  const float inv_d = 1.0f / static_cast<float>(d);

  float dw_acc[V][8];
#pragma unroll
  for (int k = 0; k < V; ++k) {
#pragma unroll
    for (int j = 0; j < 8; ++j) dw_acc[k][j] = 0.0f;
  }

  for (int64_t row = begin + warp; row < end; row += kBwdWarps) {
    const bf16* xr = x + row * d;
    const bf16* gr = dout + row * d;
    bf16* dxr = dx + row * d;
    uint4 xv[V], gv[V], dv[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = (k * 32 + lane) * 8;
      xv[k] = make_uint4(0, 0, 0, 0);
      gv[k] = make_uint4(0, 0, 0, 0);
      dv[k] = make_uint4(0, 0, 0, 0);
      if (c < d) {
        xv[k] = Load16(xr + c);
        gv[k] = Load16(gr + c);
        if constexpr (ACC_DX) dv[k] = Load16(dxr + c);
      }
    }
    const float r = rstd[row];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = (k * 32 + lane) * 8;
      if (c < d) {
        float xf[8], gf[8], wf[8];
        UnpackBf16x8(xv[k], xf);
        UnpackBf16x8(gv[k], gf);
        UnpackBf16x8(Load16(w + c), wf);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          dot += wf[j] * gf[j] * xf[j];
          dw_acc[k][j] += gf[j] * xf[j] * r;
        }
      }
    }
    dot = WarpSum(dot);
    const float cr = dot * r * r * r * inv_d;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = (k * 32 + lane) * 8;
      if (c < d) {
        float xf[8], gf[8], wf[8], df[8];
        UnpackBf16x8(xv[k], xf);
        UnpackBf16x8(gv[k], gf);
        UnpackBf16x8(Load16(w + c), wf);
        UnpackBf16x8(dv[k], df);  // zeros when overwriting
#pragma unroll
        for (int j = 0; j < 8; ++j) df[j] += r * wf[j] * gf[j] - cr * xf[j];
        Store16(dxr + c, PackBf16x8(df));
      }
    }
  }

  // Warps add their partial dw into the shared row one after another (fixed order).
  for (int turn = 0; turn < kBwdWarps; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int c = (k * 32 + lane) * 8;
        if (c < d) {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            s_dw[c + j] = turn == 0 ? dw_acc[k][j] : s_dw[c + j] + dw_acc[k][j];
          }
        }
      }
    }
    __syncthreads();
  }
  float* part = dw_partial + int64_t{blockIdx.x} * d;
  for (int c = threadIdx.x; c < d; c += kBwdThreads) part[c] = s_dw[c];
}

// dw[c] (+)= sum of the partial rows partial[b][c], b < num_partials, in a fixed order: thread
// row ty sums b = ty, ty + 32, ... (loads unrolled, so each thread has several in flight), then
// the 32 sums are added in ty order. A block (8, 32) handles 8 columns, so d / 8 blocks spread
// the ~2 MB of partials (L2-resident: just written) over the SMs; with 32-column blocks the
// reduction ran on d / 32 SMs, latency-bound (8 us per call at d = 1024, 49 calls a step).
constexpr int kDwCols = 8;
constexpr int kDwRows = 32;

__global__ void __launch_bounds__(kDwCols * kDwRows)
    RmsNormDwReduceKernel(float* __restrict__ dw, const float* __restrict__ partial,
                          int num_partials, int d, bool accumulate) {
  __shared__ float s[kDwRows][kDwCols + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * kDwCols + tx;
  float acc = 0.0f;
  if (c < d) {
#pragma unroll 8
    for (int b = ty; b < num_partials; b += kDwRows) acc += partial[int64_t{b} * d + c];
  }
  s[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < d) {
    float t = s[0][tx];
#pragma unroll
    for (int k = 1; k < kDwRows; ++k) t += s[k][tx];
    dw[c] = accumulate ? dw[c] + t : t;
  }
}

Status CheckShape(const char* fn, int64_t N, int d) {
  if (N < 0 || d <= 0 || d % 8 != 0 || d > kMaxD) {
    return Status::Invalid(std::string(fn) + ": need N >= 0 and d % 8 == 0, d <= " +
                           std::to_string(kMaxD) + "; got N=" + std::to_string(N) +
                           " d=" + std::to_string(d));
  }
  return Status::Ok();
}

}  // namespace

Status RmsNormForward(bf16* out, float* rstd, const bf16* x, const bf16* w, int64_t N, int d,
                      float eps, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckShape("RmsNormForward", N, d));
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
                       const float* rstd, int64_t N, int d, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream, bool accumulate_dx,
                       bool accumulate_dw) {
  FORGE_RETURN_IF_ERROR(CheckShape("RmsNormBackward", N, d));
  if (!IsAligned(dx, 16) || !IsAligned(dout, 16) || !IsAligned(x, 16) || !IsAligned(w, 16)) {
    return Status::Invalid("RmsNormBackward: dx, dout, x and w must be 16-byte aligned");
  }
  if (dx == dout) return Status::Invalid("RmsNormBackward: dx must not alias dout");
  if (N == 0) {
    // No rows: the gradient of w is zero, which overwriting must still store.
    if (!accumulate_dw) {
      FORGE_CUDA_CHECK(cudaMemsetAsync(dw, 0, size_t(d) * sizeof(float), stream));
    }
    return Status::Ok();
  }
  const size_t need = RmsNormBackwardWorkspace(N, d);
  if (workspace == nullptr || workspace_bytes < need || !IsAligned(workspace, 16)) {
    return Status::Invalid("RmsNormBackward: workspace needs " + std::to_string(need) +
                           " bytes; got " + std::to_string(workspace_bytes));
  }
  auto* partial = static_cast<float*>(workspace);
  const int blocks = BackwardBlocks(N);
  const int64_t rows_per_block = CeilDiv(N, blocks);
  const size_t smem = size_t(d) * sizeof(float);
  const int v = static_cast<int>(CeilDiv(d, 256));
  switch (v) {
#define FORGE_RMS_BWD(V)                                                                \
  case V:                                                                               \
    if (accumulate_dx) {                                                                \
      RmsNormBackwardKernel<V, true><<<blocks, kBwdThreads, smem, stream>>>(            \
          dx, partial, dout, x, w, rstd, N, d, rows_per_block);                         \
    } else {                                                                            \
      RmsNormBackwardKernel<V, false><<<blocks, kBwdThreads, smem, stream>>>(           \
          dx, partial, dout, x, w, rstd, N, d, rows_per_block);                         \
    }                                                                                   \
    break;
    FORGE_RMS_BWD(1)
    FORGE_RMS_BWD(2)
    FORGE_RMS_BWD(3)
    FORGE_RMS_BWD(4)
    FORGE_RMS_BWD(5)
    FORGE_RMS_BWD(6)
    FORGE_RMS_BWD(7)
    FORGE_RMS_BWD(8)
#undef FORGE_RMS_BWD
    default:
      return Status::Internal("RmsNormBackward: no kernel for d=" + std::to_string(d));
  }
  FORGE_CUDA_LAUNCH_CHECK();
  RmsNormDwReduceKernel<<<static_cast<unsigned>(CeilDiv(d, kDwCols)), dim3(kDwCols, kDwRows), 0,
                          stream>>>(dw, partial, blocks, d, accumulate_dw);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
