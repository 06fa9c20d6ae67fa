// One block of kThreads per (row, query head). Scores: each warp takes positions j = warp,
// warp + warps, ...; its lanes split the head dimension and a butterfly sums the dot product.
// Softmax: block maximum, exp, a per-thread double partial sum then a fixed-order block sum.
// Output: the threads form groups of hd (kThreads / hd groups); group g sums the positions
// j = g mod groups in order, then the groups' partials are added in group order.
#include <cmath>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device_util.cuh"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHd = 256;
constexpr int kMaxLen = 40000;

__global__ void __launch_bounds__(kThreads)
    DecodeAttentionKernel(DecodeAttentionArgs a, float scale) {
  extern __shared__ float smem[];
  const int64_t n = blockIdx.x;
  const int h = blockIdx.y;
  const int hd = a.hd;
  float* qs = smem;                 // [hd]
  float* part = qs + kMaxHd;        // [kThreads] output partials
  double* dred = reinterpret_cast<double*>(part + kThreads);  // [kWarps]
  float* fred = reinterpret_cast<float*>(dred + kWarps);      // [kWarps]
  float* sc = fred + kWarps;        // [pos + 1]

  const int s = a.seq[n], t = a.pos[n];
  const int kvh = h / (a.n_head / a.n_kv_head);
  const int64_t kv_row = int64_t{a.n_kv_head} * hd;
  const bf16* kbase = a.k_cache + int64_t{s} * a.max_len * kv_row + int64_t{kvh} * hd;
  const bf16* vbase = a.v_cache + int64_t{s} * a.max_len * kv_row + int64_t{kvh} * hd;
  const float* q = a.q + n * a.q_stride + int64_t{h} * hd;
  for (int i = threadIdx.x; i < hd; i += kThreads) qs[i] = q[i];
  __syncthreads();

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float mx = -INFINITY;
  for (int j = warp; j <= t; j += kWarps) {
    const bf16* k = kbase + int64_t{j} * kv_row;
    float dot = 0.0f;
    for (int i = lane; i < hd; i += 32) dot += qs[i] * __bfloat162float(k[i]);
    dot = WarpSum(dot) * scale;
    if (lane == 0) sc[j] = dot;
    mx = fmaxf(mx, dot);
  }
  if (lane == 0) fred[warp] = mx;
  __syncthreads();
  mx = fred[0];
  for (int w = 1; w < kWarps; ++w) mx = fmaxf(mx, fred[w]);

  double sum = 0.0;
  for (int j = threadIdx.x; j <= t; j += kThreads) {
    const float e = expf(sc[j] - mx);
    sc[j] = e;
    sum += e;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) dred[warp] = sum;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += dred[w];
  const float inv = static_cast<float>(1.0 / total);

  const int groups = kThreads / hd;
  const int g = threadIdx.x / hd, i = threadIdx.x % hd;
  float acc = 0.0f;
  if (g < groups) {
    for (int j = g; j <= t; j += groups)
      acc += (sc[j] * inv) * __bfloat162float(vbase[int64_t{j} * kv_row + i]);
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < hd) {
    float o = part[threadIdx.x];
    for (int gg = 1; gg < groups; ++gg) o += part[gg * hd + threadIdx.x];
    a.out[n * int64_t{a.n_head} * hd + int64_t{h} * hd + threadIdx.x] = __float2bfloat16_rn(o);
  }
}

}  // namespace

Status DecodeAttention(const DecodeAttentionArgs& a, cudaStream_t stream) {
  if (a.N < 0 || a.n_head <= 0 || a.n_kv_head <= 0 || a.n_head % a.n_kv_head != 0 ||
      a.hd <= 0 || a.hd > kMaxHd || a.max_len <= 0 || a.max_len > kMaxLen)
    return Status::Invalid("DecodeAttention: unsupported shape H=" + std::to_string(a.n_head) +
                           " KV=" + std::to_string(a.n_kv_head) + " hd=" + std::to_string(a.hd) +
                           " max_len=" + std::to_string(a.max_len) + " (hd <= " +
                           std::to_string(kMaxHd) + ", max_len <= " + std::to_string(kMaxLen) +
                           ")");
  if (a.N == 0) return Status::Ok();
  const size_t smem = sizeof(float) * (kMaxHd + kThreads) + sizeof(double) * kWarps +
                      sizeof(float) * kWarps + sizeof(float) * size_t(a.max_len);
  FORGE_RETURN_IF_ERROR(AllowDynamicSmem(DecodeAttentionKernel, smem));
  const dim3 grid(static_cast<unsigned>(a.N), static_cast<unsigned>(a.n_head));
  DecodeAttentionKernel<<<grid, kThreads, smem, stream>>>(a, 1.0f / std::sqrt(float(a.hd)));
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
