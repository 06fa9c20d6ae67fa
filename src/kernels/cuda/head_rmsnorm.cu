// QK-norm (RMSNorm of each query and key head in the fused qkv buffer), forward and backward.
//
// One warp a head row of hd values (kEpt = hd / 32 consecutive values a lane), so a row's sum
// of squares and the backward's dot product are one warp butterfly each. Rows are (token, head)
// pairs over the Q and K heads only. Bandwidth-bound and small (the Q and K columns are a
// fraction of the projection's output); no vector loads.
//
// The weight gradient: each warp of the backward's fixed grid (the grid depends on the shape
// only) sums dy x rstd of its rows per column in registers, Q and K apart, and writes them to
// the workspace; a second kernel adds the warps' partials in warp order. No atomics, so the
// result is the same on every run.
#include "kernels/cuda/head_rmsnorm.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/rmsnorm_math.cuh"

namespace forge::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kThreads = 32 * kWarpsPerBlock;
constexpr int64_t kMaxBackwardBlocks = 256;  // fixed-grid cap: partials are 2 x 2048 x hd floats

int64_t Rows(const HeadNormShape& s) { return s.N * (s.H + s.KV); }

int BackwardBlocks(const HeadNormShape& s) {
  return static_cast<int>(std::clamp<int64_t>(CeilDiv(Rows(s), kWarpsPerBlock), 1,
                                              kMaxBackwardBlocks));
}

// Element offset of head row r (token r / heads, head r % heads) in qkv, and in raw.
struct RowAt {
  int64_t qkv, raw;
  bool is_q;
};
__device__ __forceinline__ RowAt Locate(int64_t r, int heads, int H, int64_t qkv_stride, int hd) {
  const int64_t n = r / heads;
  const int h = static_cast<int>(r - n * heads);
  return {n * qkv_stride + int64_t{h} * hd, r * hd, h < H};
}

template <int kEpt>
__global__ void __launch_bounds__(kThreads)
    HeadNormForwardKernel(bf16* __restrict__ qkv, bf16* __restrict__ raw, float* __restrict__ rstd,
                          const bf16* __restrict__ wq, const bf16* __restrict__ wk, int64_t rows,
                          int heads, int H, int64_t qkv_stride, int hd, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  for (int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; r < rows; r += warps) {
    const RowAt at = Locate(r, heads, H, qkv_stride, hd);
    const bf16* w = at.is_q ? wq : wk;
    bf16* row = qkv + at.qkv + lane * kEpt;
    float x[kEpt];
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kEpt; ++i) {
      x[i] = __bfloat162float(row[i]);
      sum_sq += x[i] * x[i];
      raw[at.raw + lane * kEpt + i] = row[i];
    }
    const float rs = RmsNormRstd(WarpSum(sum_sq), 1.0f / hd, eps);
    if (lane == 0) rstd[r] = rs;
#pragma unroll
    for (int i = 0; i < kEpt; ++i) {
      row[i] = __float2bfloat16_rn(RmsNormScale(x[i], rs, __bfloat162float(w[lane * kEpt + i])));
    }
  }
}

// dx = rstd (w dy) - x rstd^3 / hd * sum_j(w dy x), written over dy; partial dw of this warp's
// rows: [warp][0 = Q, 1 = K][hd].
template <int kEpt>
__global__ void __launch_bounds__(kThreads)
    HeadNormBackwardKernel(bf16* __restrict__ dqkv, float* __restrict__ partial,
                           const bf16* __restrict__ raw, const bf16* __restrict__ wq,
                           const bf16* __restrict__ wk, const float* __restrict__ rstd,
                           int64_t rows, int heads, int H, int64_t qkv_stride, int hd) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int64_t warps = int64_t{gridDim.x} * kWarpsPerBlock;
  float dwq[kEpt] = {}, dwk[kEpt] = {};
  for (int64_t r = warp; r < rows; r += warps) {
    const RowAt at = Locate(r, heads, H, qkv_stride, hd);
    const bf16* w = at.is_q ? wq : wk;
    bf16* dy_row = dqkv + at.qkv + lane * kEpt;
    const bf16* x_row = raw + at.raw + lane * kEpt;
    const float rs = rstd[r];
    float x[kEpt], dy[kEpt], wv[kEpt];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kEpt; ++i) {
      x[i] = __bfloat162float(x_row[i]);
      dy[i] = __bfloat162float(dy_row[i]);
      wv[i] = __bfloat162float(w[lane * kEpt + i]);
      dot += wv[i] * dy[i] * x[i];
    }
    const float c = WarpSum(dot) * rs * rs * rs / hd;
#pragma unroll
    for (int i = 0; i < kEpt; ++i) {
      dy_row[i] = __float2bfloat16_rn(rs * wv[i] * dy[i] - c * x[i]);
      (at.is_q ? dwq : dwk)[i] += dy[i] * x[i] * rs;
    }
  }
  float* out = partial + warp * 2 * hd + lane * kEpt;
#pragma unroll
  for (int i = 0; i < kEpt; ++i) {
    out[i] = dwq[i];
    out[hd + i] = dwk[i];
  }
}

// dw[c] (+)= sum over warps of partial[warp][c] in warp order; c over Q's then K's hd columns.
__global__ void HeadNormDwReduceKernel(float* __restrict__ dwq, float* __restrict__ dwk,
                                       const float* __restrict__ partial, int warps, int hd,
                                       bool accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= 2 * hd) return;
  float sum = 0.0f;
  for (int w = 0; w < warps; ++w) sum += partial[int64_t{w} * 2 * hd + c];
  float* dw = c < hd ? dwq + c : dwk + (c - hd);
  *dw = accumulate ? *dw + sum : sum;
}

template <typename Launch>
Status ByWidth(int hd, Launch&& launch) {
  switch (hd / 32) {
    case 1: launch.template operator()<1>(); break;
    case 2: launch.template operator()<2>(); break;
    case 4: launch.template operator()<4>(); break;
    case 8: launch.template operator()<8>(); break;
    default: return Status::Invalid("QK-norm: head width " + std::to_string(hd) + " unsupported");
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace

Status HeadRmsNormSupports(const HeadNormShape& s) {
  if (s.N < 0 || s.H <= 0 || s.KV <= 0)
    return Status::Invalid("QK-norm: bad shape N=" + std::to_string(s.N) +
                           " H=" + std::to_string(s.H) + " KV=" + std::to_string(s.KV));
  const int ept = s.hd / 32;
  if (s.hd % 32 != 0 || (ept != 1 && ept != 2 && ept != 4 && ept != 8))
    return Status::Invalid("QK-norm on cuda: head width " + std::to_string(s.hd) +
                           " unsupported (32, 64, 128 or 256)");
  return Status::Ok();
}

Status HeadRmsNormForward(bf16* qkv, bf16* raw, float* rstd, const bf16* wq, const bf16* wk,
                          const HeadNormShape& s, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(HeadRmsNormSupports(s));
  if (!qkv || !raw || !rstd || !wq || !wk) return Status::Invalid("QK-norm: null buffer");
  const int64_t rows = Rows(s);
  if (rows == 0) return Status::Ok();
  const int heads = s.H + s.KV;
  const int64_t stride = int64_t{s.H + 2 * s.KV} * s.hd;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>(CeilDiv(rows, kWarpsPerBlock), 1 << 20));
  return ByWidth(s.hd, [&]<int kEpt>() {
    HeadNormForwardKernel<kEpt><<<blocks, kThreads, 0, stream>>>(qkv, raw, rstd, wq, wk, rows,
                                                                 heads, s.H, stride, s.hd, s.eps);
  });
}

size_t HeadRmsNormBackwardWorkspace(const HeadNormShape& s) {
  return size_t(BackwardBlocks(s)) * kWarpsPerBlock * 2 * std::max(s.hd, 0) * sizeof(float);
}

Status HeadRmsNormBackward(bf16* dqkv, float* dwq, float* dwk, const bf16* raw, const bf16* wq,
                           const bf16* wk, const float* rstd, const HeadNormShape& s,
                           bool accumulate_dw, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(HeadRmsNormSupports(s));
  if (!dqkv || !dwq || !dwk || !raw || !wq || !wk || !rstd)
    return Status::Invalid("QK-norm backward: null buffer");
  if (workspace == nullptr || workspace_bytes < HeadRmsNormBackwardWorkspace(s))
    return Status::Invalid("QK-norm backward: workspace smaller than " +
                           std::to_string(HeadRmsNormBackwardWorkspace(s)) + " bytes");
  const int64_t rows = Rows(s);
  const int heads = s.H + s.KV;
  const int64_t stride = int64_t{s.H + 2 * s.KV} * s.hd;
  const int blocks = BackwardBlocks(s);
  auto* partial = static_cast<float*>(workspace);
  FORGE_RETURN_IF_ERROR(ByWidth(s.hd, [&]<int kEpt>() {
    HeadNormBackwardKernel<kEpt><<<blocks, kThreads, 0, stream>>>(
        dqkv, partial, raw, wq, wk, rstd, rows, heads, s.H, stride, s.hd);
  }));
  const int cols = 2 * s.hd;
  HeadNormDwReduceKernel<<<(cols + 255) / 256, 256, 0, stream>>>(
      dwq, dwk, partial, blocks * kWarpsPerBlock, s.hd, accumulate_dw);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
