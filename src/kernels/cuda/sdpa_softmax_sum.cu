// Bandwidth-bound (reads dO and O, 4 * B*T*H*hd bytes; writes B*H*T floats). A block takes
// 32 consecutive tokens: it reads their rows of dO and O with 16-byte loads, fully coalesced
// (a token's H*hd values are contiguous), and each group of hd/8 adjacent lanes holds one
// head's row, reduced by shuffles in a fixed order. The sums go to shared memory as [H][32]
// and leave as 32 consecutive floats per head (the output is [B, H, T]: writing each sum
// where it was computed would scatter 4-byte stores T floats apart).
#include "kernels/cuda/sdpa_softmax_sum.cuh"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTokens = 32;  // per block
constexpr int kMaxHeads = 256;
constexpr int kUnroll = 4;

template <int G>  // lanes per head: hd / 8
__global__ void __launch_bounds__(kThreads)
    SoftmaxSumKernel(float* __restrict__ sum, const bf16* __restrict__ dout,
                     const bf16* __restrict__ out, int64_t n_tokens, int T, int H) {
  extern __shared__ float s_sum[];  // [H][kTokens]
  const int64_t first = int64_t{blockIdx.x} * kTokens;
  const int vecs_per_token = H * G;
  const int total = kTokens * vecs_per_token;
  // Every head's G lanes sit in one warp, aligned (kThreads and vecs_per_token are multiples
  // of G, G divides 32), and total is a multiple of 32, so the lanes of a warp take the same
  // path. kUnroll vectors of each operand are loaded before the first is used (memory-level
  // parallelism: a block has only total / kThreads vectors per thread).
  for (int i0 = threadIdx.x; i0 < total; i0 += kThreads * kUnroll) {
    uint4 a[kUnroll], b[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kThreads;
      const int tl = i / vecs_per_token, v = i % vecs_per_token;
      a[u] = b[u] = make_uint4(0, 0, 0, 0);
      if (i < total && first + tl < n_tokens) {
        const int64_t e = (first + tl) * vecs_per_token * 8 + int64_t{v} * 8;
        a[u] = Load16(dout + e);
        b[u] = Load16(out + e);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * kThreads;
      if (i >= total) break;  // uniform across the warp
      float x[8], y[8], acc = 0.0f;
      UnpackBf16x8(a[u], x);
      UnpackBf16x8(b[u], y);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc += x[j] * y[j];
#pragma unroll
      for (int o = G / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      const int tl = i / vecs_per_token, v = i % vecs_per_token;
      if (v % G == 0) s_sum[(v / G) * kTokens + tl] = acc;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < H * kTokens; i += kThreads) {
    const int h = i / kTokens, tl = i % kTokens;
    const int64_t token = first + tl;
    if (token >= n_tokens) continue;
    const int64_t b = token / T, t = token % T;
    sum[(b * H + h) * T + t] = s_sum[i];
  }
}

}  // namespace

Status SoftmaxSum(float* sum, const bf16* dout, const bf16* out, int B, int T, int H, int hd,
                  cudaStream_t stream) {
  const int g = hd / 8;
  if (B < 0 || T < 0 || H <= 0 || H > kMaxHeads || hd % 8 != 0 || g < 1 || g > 32 ||
      (g & (g - 1)) != 0) {
    return Status::Invalid("SoftmaxSum: need H in [1, " + std::to_string(kMaxHeads) +
                           "] and hd = 8 * (a power of two <= 32); got H=" + std::to_string(H) +
                           " hd=" + std::to_string(hd));
  }
  if (!IsAligned(dout, 16) || !IsAligned(out, 16) || sum == nullptr) {
    return Status::Invalid("SoftmaxSum: dout and out must be 16-byte aligned, sum non-null");
  }
  const int64_t n = int64_t{B} * T;
  if (n == 0) return Status::Ok();
  const unsigned blocks = static_cast<unsigned>(CeilDiv(n, kTokens));
  const size_t smem = size_t(H) * kTokens * sizeof(float);
  switch (g) {
#define FORGE_SOFTMAX_SUM(G)                                                               \
  case G:                                                                                  \
    SoftmaxSumKernel<G><<<blocks, kThreads, smem, stream>>>(sum, dout, out, n, T, H);      \
    break;
    FORGE_SOFTMAX_SUM(1)
    FORGE_SOFTMAX_SUM(2)
    FORGE_SOFTMAX_SUM(4)
    FORGE_SOFTMAX_SUM(8)
    FORGE_SOFTMAX_SUM(16)
    FORGE_SOFTMAX_SUM(32)
#undef FORGE_SOFTMAX_SUM
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
