// The RMSNorm backward kernel and its launcher, shared by RmsNormBackward (rmsnorm.cu) and
// RmsNormBackwardFp8 (rmsnorm_fp8.cu), which also writes the new dx as FP8 (row-major and
// transposed) for the linear layer whose output gradient it is. Included by those two files
// only (kernels in an anonymous namespace).
//
// Bytes moved and design (bandwidth-bound, one warp per row, 16-byte loads): reads x, dout and
// dx (6Nd; 4Nd when overwriting dx) and rstd (4N), writes dx (2Nd); x, dout and the old dx of
// a row are all loaded before the first use (one memory round trip per row) and stay in
// registers between the dot product and the dx update. dw is reduced without atomics: each
// warp keeps its rows' dw contributions in registers, the block's warps add theirs into one
// shared row in warp order, each block writes that partial row to the workspace (P*d*4 bytes,
// P <= 256 blocks), and a second kernel adds the P partial rows to dw in a fixed order. P
// depends on N only, so the result is bitwise reproducible.
//
// FP8 output: each row's new dx, rounded to bf16 exactly as it is stored, is quantised with
// *scale (the tile cast's conversions, fp8_tile_cast.cuh) and stored row-major at once and
// into a shared-memory band of the block's rows; after the block's rows (and the dw merge's
// barriers), the band is written transposed, 8 rows of a column per store. amax is
// max-accumulated and scale_inv written as CastTransposeToFp8 does, so the result is bit for
// bit RmsNormBackward followed by that cast (the dw partials are the same code and order).
// The cast's separate pass re-read dx (2Nd) and wrote the FP8 copies; here only the writes
// remain. Needs rows per block a multiple of 8 (N a multiple of 64 gives that) and the band
// in shared memory (RmsNormBackwardFp8Supported).
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common/status.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace forge::cuda {
namespace {

constexpr int kMaxD = 2048;  // 8 vectors of 8 columns per lane
constexpr int kBwdThreads = 256;  // 8 warps
constexpr int kBwdWarps = kBwdThreads / 32;
// Partial dw rows in the workspace. 256: at ~120 registers a thread two 256-thread blocks fit
// an SM, so 256 blocks are one wave on a 132-SM H100, and each block's dw merge (8 barriers)
// is spread over 64 rows (512 blocks of 32 rows took 1.94 waves; measured on H100 at gpt350m
// size: 57.8 -> 52.6 us a call, 48 calls a step).
constexpr int kMaxBwdBlocks = 256;
constexpr int kBandPad = 4;  // bytes after each FP8 band row (bank spread for the gathers)
constexpr size_t kMaxBwdSmem = 200 * 1024;

int BackwardBlocks(int64_t N) {
  return static_cast<int>(std::clamp<int64_t>(CeilDiv(N, kBwdWarps), 1, kMaxBwdBlocks));
}

Status CheckShape(const char* fn, int64_t N, int d) {
  if (N < 0 || d <= 0 || d % 8 != 0 || d > kMaxD) {
    return Status::Invalid(std::string(fn) + ": need N >= 0 and d % 8 == 0, d <= " +
                           std::to_string(kMaxD) + "; got N=" + std::to_string(N) +
                           " d=" + std::to_string(d));
  }
  return Status::Ok();
}

// The checks RmsNormBackward and RmsNormBackwardFp8 share (no workspace needed for N = 0).
Status CheckRmsNormBackwardArgs(const char* fn, const bf16* dx, const bf16* dout, const bf16* x,
                                const bf16* w, int64_t N, int d, const void* workspace,
                                size_t workspace_bytes) {
  FORGE_RETURN_IF_ERROR(CheckShape(fn, N, d));
  if (!IsAligned(dx, 16) || !IsAligned(dout, 16) || !IsAligned(x, 16) || !IsAligned(w, 16)) {
    return Status::Invalid(std::string(fn) + ": dx, dout, x and w must be 16-byte aligned");
  }
  if (dx == dout) return Status::Invalid(std::string(fn) + ": dx must not alias dout");
  if (N == 0) return Status::Ok();
  const size_t need = RmsNormBackwardWorkspace(N, d);
  if (workspace == nullptr || workspace_bytes < need || !IsAligned(workspace, 16)) {
    return Status::Invalid(std::string(fn) + ": workspace needs " + std::to_string(need) +
                           " bytes; got " + std::to_string(workspace_bytes));
  }
  return Status::Ok();
}

// The FP8 copy of the new dx (unused without FP8).
struct RmsNormBwdFp8Out {
  uint8_t* out = nullptr;    // [N, d]
  uint8_t* out_t = nullptr;  // [d, N]
  const float* scale = nullptr;
  float* amax = nullptr;
  float* scale_inv = nullptr;
};

// Block b handles rows [b * R, min(N, (b + 1) * R)), warp w every kBwdWarps-th row of them.
// Dynamic shared memory: d floats (the dw merge), then with FP8 the band [R][d + kBandPad].
// ACC_DX: dx += the row's gradient (else dx = it, and the old dx is not read).
template <int V, bool ACC_DX, bool FP8, __nv_fp8_interpretation_t F>
__global__ void __launch_bounds__(kBwdThreads)
    RmsNormBackwardKernel(bf16* __restrict__ dx, float* __restrict__ dw_partial,
                          const bf16* __restrict__ dout, const bf16* __restrict__ x,
                          const bf16* __restrict__ w, const float* __restrict__ rstd, int64_t N,
                          int d, int64_t rows_per_block, RmsNormBwdFp8Out q) {
  extern __shared__ __align__(16) float s_dw[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t begin = int64_t{blockIdx.x} * rows_per_block;
  const int64_t end = std::min<int64_t>(N, begin + rows_per_block);
  const float inv_d = 1.0f / static_cast<float>(d);
  [[maybe_unused]] uint8_t* band = reinterpret_cast<uint8_t*>(s_dw + d);  // FP8 only
  [[maybe_unused]] const int band_stride = d + kBandPad;
  [[maybe_unused]] float s = 1.0f;
  [[maybe_unused]] uint32_t m = 0;
  if constexpr (FP8) {
    s = *q.scale;
    if (q.scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *q.scale_inv = 1.0f / s;
  }

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
        if constexpr (FP8) {
          float v[8];  // the stored bf16 values, as the cast would read them
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            v[j] = fp8tile::RoundBf16(df[j]);
            m = max(m, fp8tile::AbsBits(v[j]));
          }
          const uint2 v8 = fp8tile::QuantizeFp8x8<F>(v, s);
          *reinterpret_cast<uint2*>(q.out + row * d + c) = v8;
          // Band rows are d + 4 bytes apart: 4-byte aligned, not always 8.
          uint32_t* b = reinterpret_cast<uint32_t*>(band + (row - begin) * band_stride + c);
          b[0] = v8.x;
          b[1] = v8.y;
        }
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

  if constexpr (FP8) {
    // The band (complete since the merge's barriers) transposed: column c, rows 8g..8g+7 of
    // the block per 8-byte store; g varies fastest so a column's bytes go out contiguously.
    const int64_t rows_here = end > begin ? end - begin : 0;
    const int groups = static_cast<int>(rows_here / 8);
    for (int i = threadIdx.x; i < groups * d; i += kBwdThreads) {
      const int g = i % groups, c = i / groups;
      *reinterpret_cast<uint2*>(q.out_t + int64_t{c} * N + begin + g * 8) =
          fp8tile::GatherColumn8(band + (g * 8) * band_stride + c, band_stride);
    }
    if (q.amax) fp8tile::BlockAmaxToGlobal(m, q.amax);
  }
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

// The dw reduction of `blocks` partial rows, on `stream` or (dw_reduce.fork) on dw_reduce.stream
// ordered after what `stream` has enqueued.
inline Status LaunchDwReduce(float* dw, const float* partial, int blocks, int d, bool accumulate,
                             cudaStream_t stream, const RmsNormDwReduce& dw_reduce) {
  cudaStream_t reduce_stream = stream;
  if (dw_reduce.fork != nullptr) {
    FORGE_CUDA_CHECK(cudaEventRecord(dw_reduce.fork, stream));
    FORGE_CUDA_CHECK(cudaStreamWaitEvent(dw_reduce.stream, dw_reduce.fork, 0));
    reduce_stream = dw_reduce.stream;
  }
  RmsNormDwReduceKernel<<<static_cast<unsigned>(CeilDiv(d, kDwCols)), dim3(kDwCols, kDwRows), 0,
                          reduce_stream>>>(dw, partial, blocks, d, accumulate);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

// One launch of a backward kernel instance (the switch below picks V and ACC_DX).
struct BwdLaunch {
  bf16* dx;
  float* partial;
  const bf16* dout;
  const bf16* x;
  const bf16* w;
  const float* rstd;
  int64_t N;
  int d;
  int64_t rows_per_block;
  RmsNormBwdFp8Out q;
  int blocks;
  size_t smem;
  cudaStream_t stream;
};

template <class Kernel>
Status LaunchBwdKernel(Kernel kernel, const BwdLaunch& a) {
  FORGE_RETURN_IF_ERROR(AllowDynamicSmem(kernel, a.smem));
  kernel<<<a.blocks, kBwdThreads, a.smem, a.stream>>>(a.dx, a.partial, a.dout, a.x, a.w, a.rstd,
                                                      a.N, a.d, a.rows_per_block, a.q);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

// The kernel instance for d's vector count v (d <= 8 * 256) and the accumulation mode.
template <bool FP8, __nv_fp8_interpretation_t F>
Status LaunchBwdForWidth(int v, bool accumulate_dx, const BwdLaunch& args) {
  switch (v) {
#define FORGE_RMS_BWD(V)                                                                  \
  case V:                                                                                 \
    return accumulate_dx ? LaunchBwdKernel(RmsNormBackwardKernel<V, true, FP8, F>, args)  \
                         : LaunchBwdKernel(RmsNormBackwardKernel<V, false, FP8, F>, args);
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
      return Status::Internal("RmsNormBackward: no kernel for d=" + std::to_string(args.d));
  }
}

// Dynamic shared memory of the backward kernel (with the FP8 band or without).
size_t RmsNormBackwardSmem(int64_t N, int d, bool fp8) {
  const int64_t rows_per_block = CeilDiv(N, BackwardBlocks(N));
  return size_t(d) * sizeof(float) + (fp8 ? size_t(rows_per_block) * (d + kBandPad) : 0);
}

// The kernel, then the dw reduction. Arguments already checked by the caller (RmsNormBackward / RmsNormBackwardFp8).
template <bool FP8, __nv_fp8_interpretation_t F = __NV_E4M3>
Status LaunchRmsNormBackward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w,
                             const float* rstd, int64_t N, int d, float* partial,
                             cudaStream_t stream, bool accumulate_dx, bool accumulate_dw,
                             const RmsNormBwdFp8Out& q, const RmsNormDwReduce& dw_reduce) {
  const int blocks = BackwardBlocks(N);
  const int64_t rows_per_block = CeilDiv(N, blocks);
  const size_t smem = RmsNormBackwardSmem(N, d, FP8);
  const int v = static_cast<int>(CeilDiv(d, 256));
  const BwdLaunch args{dx, partial, dout, x, w, rstd, N, d, rows_per_block, q, blocks, smem,
                       stream};
  FORGE_RETURN_IF_ERROR((LaunchBwdForWidth<FP8, F>(v, accumulate_dx, args)));
  return LaunchDwReduce(dw, partial, blocks, d, accumulate_dw, stream, dw_reduce);
}

}  // namespace
}  // namespace forge::cuda
