// Fused softmax + cross-entropy (+ its gradient, in place) over bf16 logits, fp32 math.
//
// Bytes moved and design (bandwidth-bound, one 1024-thread block per row): each row of
// 2V bytes (100 KB at V = 50304) is read from device memory once and, when write_grad, written
// once. Pass 1 loads the row with 16-byte loads (all of a thread's loads issued before the
// first use) into registers (up to kCacheVecs vectors per thread, 57344 columns; columns
// beyond that are re-read in pass 2) while keeping an online (max, sum of exp) pair per
// thread; the pairs are combined across the block in a fixed tree. Pass 2 turns the cached
// values into (softmax - onehot) * dloss and stores them over the logits. Exponentials are
// taken base 2 on logits pre-scaled by log2(e) (one MUFU.EX2 each). The target logit is read
// before any thread writes (the block reduction's barriers order it).
// Rows whose length is not a multiple of 8 (or a misaligned buffer) take a scalar path.
// A target outside [0, V) gives loss NaN and no onehot term (no out-of-bounds access).
#include <cmath>
#include <string>

#include "kernels/cuda/cross_entropy.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace forge::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kCacheVecs = 7;  // 7 * 1024 * 8 = 57344 columns held in registers
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Online-softmax state in the base-2 domain: m = max of x*log2e, s = sum of 2^(x*log2e - m).
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum Combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};  // both empty
  return {m, a.s * exp2f(a.m - m) + b.s * exp2f(b.m - m)};
}

// Adds 8 scaled values to the state with one rescale.
__device__ __forceinline__ void Accumulate8(MaxSum& st, const float (&x2)[8]) {
  float mx = x2[0];
#pragma unroll
  for (int k = 1; k < 8; ++k) mx = fmaxf(mx, x2[k]);
  const float m = fmaxf(st.m, mx);
  if (m == -INFINITY) return;
  float s = st.s * exp2f(st.m - m);
#pragma unroll
  for (int k = 0; k < 8; ++k) s += exp2f(x2[k] - m);
  st = {m, s};
}

__device__ __forceinline__ void Accumulate1(MaxSum& st, float x2) {
  const float m = fmaxf(st.m, x2);
  if (m == -INFINITY) return;
  st = {m, st.s * exp2f(st.m - m) + exp2f(x2 - m)};
}

// Block-wide combine in a fixed tree; every thread gets the result. scratch: 32 MaxSums.
__device__ __forceinline__ MaxSum BlockCombine(MaxSum st, MaxSum* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum other = {__shfl_xor_sync(0xffffffffu, st.m, o),
                          __shfl_xor_sync(0xffffffffu, st.s, o)};
    st = Combine(st, other);
  }
  if (lane == 0) scratch[warp] = st;
  __syncthreads();
  const int n_warps = blockDim.x / 32;
  MaxSum t = lane < n_warps ? scratch[lane] : MaxSum{-INFINITY, 0.0f};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum other = {__shfl_xor_sync(0xffffffffu, t.m, o),
                          __shfl_xor_sync(0xffffffffu, t.s, o)};
    t = Combine(t, other);
  }
  return t;
}

__device__ __forceinline__ void WriteLoss(float* losses, int64_t row, MaxSum tot,
                                          float target_logit) {
  // lse = ln(sum exp(x)) = (m + log2(s)) * ln 2
  losses[row] = (tot.m + log2f(tot.s)) * kLn2 - target_logit;
}

__global__ void __launch_bounds__(kThreads, 1)
    CrossEntropyVecKernel(bf16* __restrict__ logits, float* __restrict__ losses,
                          const int32_t* __restrict__ targets, int V, float dloss,
                          bool write_grad) {
  __shared__ MaxSum s_red[32];
  const int64_t row = blockIdx.x;
  bf16* lr = logits + row * V;
  const int nvec = V / 8;
  const int tgt = targets[row];
  const bool tgt_ok = tgt >= 0 && tgt < V;
  // Read before any write below: writes come after BlockCombine's barrier.
  const float target_logit = threadIdx.x == 0 && tgt_ok ? __bfloat162float(lr[tgt]) : NAN;

  uint4 cache[kCacheVecs];
#pragma unroll
  for (int k = 0; k < kCacheVecs; ++k) {
    const int idx = k * kThreads + threadIdx.x;
    cache[k] = idx < nvec ? Load16(lr + int64_t{idx} * 8) : make_uint4(0, 0, 0, 0);
  }
  MaxSum st = {-INFINITY, 0.0f};
#pragma unroll
  for (int k = 0; k < kCacheVecs; ++k) {
    if (k * kThreads + static_cast<int>(threadIdx.x) < nvec) {
      float x[8];
      UnpackBf16x8(cache[k], x);
#pragma unroll
      for (int j = 0; j < 8; ++j) x[j] *= kLog2e;
      Accumulate8(st, x);
    }
  }
  for (int idx = kCacheVecs * kThreads + threadIdx.x; idx < nvec; idx += kThreads) {
    float x[8];
    UnpackBf16x8(Load16(lr + int64_t{idx} * 8), x);
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] *= kLog2e;
    Accumulate8(st, x);
  }
  const MaxSum tot = BlockCombine(st, s_red);
  if (threadIdx.x == 0) WriteLoss(losses, row, tot, target_logit);
  if (!write_grad) return;

  const float scale = __frcp_rn(tot.s) * dloss;  // (1 / sum) * dloss, as the reference
  auto grad8 = [&](int idx, const uint4& u) {
    float x[8];
    UnpackBf16x8(u, x);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      x[j] = exp2f(x[j] * kLog2e - tot.m) * scale;
      if (idx * 8 + j == tgt) x[j] -= dloss;
    }
    Store16(lr + int64_t{idx} * 8, PackBf16x8(x));
  };
#pragma unroll
  for (int k = 0; k < kCacheVecs; ++k) {
    const int idx = k * kThreads + threadIdx.x;
    if (idx < nvec) grad8(idx, cache[k]);
  }
  for (int idx = kCacheVecs * kThreads + threadIdx.x; idx < nvec; idx += kThreads) {
    grad8(idx, Load16(lr + int64_t{idx} * 8));
  }
}

// Any V and alignment: one column per thread per step, the row read twice.
__global__ void __launch_bounds__(kThreads)
    CrossEntropyScalarKernel(bf16* __restrict__ logits, float* __restrict__ losses,
                             const int32_t* __restrict__ targets, int V, float dloss,
                             bool write_grad) {
  __shared__ MaxSum s_red[32];
  const int64_t row = blockIdx.x;
  bf16* lr = logits + row * V;
  const int tgt = targets[row];
  const bool tgt_ok = tgt >= 0 && tgt < V;
  const float target_logit = threadIdx.x == 0 && tgt_ok ? __bfloat162float(lr[tgt]) : NAN;
  MaxSum st = {-INFINITY, 0.0f};
  for (int j = threadIdx.x; j < V; j += kThreads) {
    Accumulate1(st, __bfloat162float(lr[j]) * kLog2e);
  }
  const MaxSum tot = BlockCombine(st, s_red);
  if (threadIdx.x == 0) WriteLoss(losses, row, tot, target_logit);
  if (!write_grad) return;
  const float scale = __frcp_rn(tot.s) * dloss;
  for (int j = threadIdx.x; j < V; j += kThreads) {
    float p = exp2f(__bfloat162float(lr[j]) * kLog2e - tot.m) * scale;
    if (j == tgt) p -= dloss;
    lr[j] = __float2bfloat16_rn(p);
  }
}

// Fixed-order mean: thread t sums values t, t + 1024, ...; then a fixed tree.
__global__ void __launch_bounds__(kThreads)
    MeanReduceKernel(float* __restrict__ out, const float* __restrict__ values, int64_t n) {
  __shared__ float scratch[32];
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) acc += values[i];
  const float total = BlockSum(acc, scratch);
  if (threadIdx.x == 0) out[0] = total / static_cast<float>(n);
}

}  // namespace

Status CrossEntropyForwardBackward(bf16* logits, float* losses, const int32_t* targets,
                                   int64_t n, int V, float dloss, bool write_grad,
                                   cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff || V <= 0) {
    return Status::Invalid("CrossEntropyForwardBackward: bad shape n=" + std::to_string(n) +
                           " V=" + std::to_string(V));
  }
  if (n == 0) return Status::Ok();
  const unsigned grid = static_cast<unsigned>(n);
  if (V % 8 == 0 && IsAligned(logits, 16)) {
    CrossEntropyVecKernel<<<grid, kThreads, 0, stream>>>(logits, losses, targets, V, dloss,
                                                         write_grad);
  } else {
    CrossEntropyScalarKernel<<<grid, kThreads, 0, stream>>>(logits, losses, targets, V, dloss,
                                                            write_grad);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status MeanReduce(float* out, const float* values, int64_t n, cudaStream_t stream) {
  if (n <= 0) return Status::Invalid("MeanReduce: n must be positive, got " + std::to_string(n));
  MeanReduceKernel<<<1, kThreads, 0, stream>>>(out, values, n);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
