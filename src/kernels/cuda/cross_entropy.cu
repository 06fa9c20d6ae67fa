// Fused softmax + cross-entropy (+ its gradient, in place) over bf16 logits, fp32 math.
//
// Bytes moved and design (bandwidth-bound): each row of 2V bytes (100 KB at V = 50304) is read
// from device memory once and, when write_grad, written once. One 512-thread block per row;
// pass 1 loads the row with 16-byte loads, kBatch per thread in flight before the first use,
// into a shared-memory copy of the row (up to kMaxCachedVecs vectors, 56320 columns; columns
// beyond that are re-read in pass 2) while keeping an online (max, sum of exp) pair per
// thread; the pairs are combined across the block in a fixed tree. Pass 2 turns the cached
// values into (softmax - onehot) * dloss and stores them over the logits. Each thread reads
// back only the vectors it cached itself, so the passes need no barrier of their own. The row
// cache lives in shared memory rather than registers so that two rows fit on an SM at once
// (2 x 100 KB of the 227 KB): one row's exp pass overlaps the other's loads (a register
// cache allowed one 1024-thread row per SM, alternating memory and MUFU phases).
// Exponentials are taken base 2 on logits pre-scaled by log2(e) (one MUFU.EX2 each). The
// target logit is read before any thread writes (the block reduction's barriers order it).
// Rows whose length is not a multiple of 8 (or a misaligned buffer) take a scalar path.
// A target outside [0, V) gives loss NaN and no onehot term (no out-of-bounds access).
// The FP8 variant (kFp8) also writes the gradient as E5M2 into its own buffer in pass 2,
// quantised from the bf16-rounded value it stores, so it is bitwise CastToFp8 of the bf16
// dlogits without reading them again (the FP8 LM head's dgrad operand); when every GEMM that
// reads dlogits takes the E5M2 copy, the bf16 store is left out (write_bf16 false: the row is
// read once and written once in 1 byte a value instead of 3).
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_tile_cast.cuh"

namespace forge::cuda {
namespace {

constexpr int kThreads = 1024;          // scalar path and MeanReduce
constexpr int kVecThreads = 512;        // vector path: two rows per SM
constexpr int kBatch = 8;               // 16-byte loads per thread in flight in pass 1
constexpr int kMaxCachedVecs = 7040;    // 110 KB of shared memory: 56320 columns
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

// The FP8 copy of the gradient (kFp8 only): grad8 [n, V] E5M2, quantised with *scale; the
// amax of |dlogits| max-accumulated into *amax; *scale_inv = 1 / *scale.
struct Fp8GradOut {
  bool write_bf16 = true;  // also store the bf16 dlogits over the logits
  uint8_t* grad8 = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
  float* scale_inv = nullptr;
};

// Dynamic shared memory: min(V / 8, kMaxCachedVecs) 16-byte vectors.
template <bool kFp8>
__global__ void __launch_bounds__(kVecThreads, 2)
    CrossEntropyVecKernel(bf16* __restrict__ logits, float* __restrict__ losses,
                          const int32_t* __restrict__ targets, int V, float dloss,
                          bool write_grad, Fp8GradOut f8) {
  extern __shared__ uint4 s_row[];
  __shared__ MaxSum s_red[32];
  const int64_t row = blockIdx.x;
  bf16* lr = logits + row * V;
  const int nvec = V / 8;
  const int cached = min(nvec, kMaxCachedVecs);
  const int tid = threadIdx.x;
  const int tgt = targets[row];
  const bool tgt_ok = tgt >= 0 && tgt < V;
  // Read before any write below: writes come after BlockCombine's barrier.
  const float target_logit = tid == 0 && tgt_ok ? __bfloat162float(lr[tgt]) : NAN;

  MaxSum st = {-INFINITY, 0.0f};
  for (int base = 0; base < nvec; base += kBatch * kVecThreads) {
    uint4 u[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int idx = base + k * kVecThreads + tid;
      u[k] = idx < nvec ? Load16(lr + int64_t{idx} * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int idx = base + k * kVecThreads + tid;
      if (idx < nvec) {
        if (idx < cached) s_row[idx] = u[k];
        float x[8];
        UnpackBf16x8(u[k], x);
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j] *= kLog2e;
        Accumulate8(st, x);
      }
    }
  }
  const MaxSum tot = BlockCombine(st, s_red);
  if (tid == 0) WriteLoss(losses, row, tot, target_logit);
  if (!write_grad) return;

  const float scale = __frcp_rn(tot.s) * dloss;  // (1 / sum) * dloss, as the reference
  float s8 = 0.0f;
  uint32_t m8 = 0;  // two |dlogits| bf16 magnitudes' bits (AbsMaxBf16x2)
  if constexpr (kFp8) {
    s8 = *f8.scale;
    if (f8.scale_inv && row == 0 && tid == 0) *f8.scale_inv = 1.0f / s8;
  }
  // The onehot term touches one vector of the row: tested once a vector, not once a value (this
  // pass is arithmetic-bound in the FP8 form, whose only store is one byte a value).
  const int tgt_vec = tgt_ok ? tgt / 8 : -1;
  for (int idx = tid; idx < nvec; idx += kVecThreads) {
    const uint4 u = idx < cached ? s_row[idx] : Load16(lr + int64_t{idx} * 8);
    float x[8];
    UnpackBf16x8(u, x);
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j] = exp2f(x[j] * kLog2e - tot.m) * scale;
    if (idx == tgt_vec) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (idx * 8 + j == tgt) x[j] -= dloss;
      }
    }
    if (!kFp8 || f8.write_bf16) Store16(lr + int64_t{idx} * 8, PackBf16x8(x));
    if constexpr (kFp8) {
      // Rounded to bf16 in pairs (one cvt a pair), the amax taken on the packed pairs.
      float q[8];
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        const uint32_t p = PackBf16x2(x[j], x[j + 1]);
        m8 = fp8tile::AbsMaxBf16x2(m8, p);
        q[j] = __uint_as_float(p << 16);
        q[j + 1] = __uint_as_float(p & 0xFFFF0000u);
      }
      constexpr auto F = __NV_E5M2;
      *reinterpret_cast<uint2*>(f8.grad8 + row * V + int64_t{idx} * 8) =
          fp8tile::QuantizeFp8x8<F>(q, s8);
    }
  }
  if constexpr (kFp8) fp8tile::BlockAmaxToGlobal(fp8tile::Bf16x2AbsBits(m8), f8.amax);
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

template <bool kFp8>
Status LaunchVec(bf16* logits, float* losses, const int32_t* targets, int64_t n, int V,
                 float dloss, bool write_grad, const Fp8GradOut& f8, cudaStream_t stream) {
  const size_t smem = size_t(std::min(V / 8, kMaxCachedVecs)) * sizeof(uint4);
  FORGE_RETURN_IF_ERROR(AllowDynamicSmem(CrossEntropyVecKernel<kFp8>, smem));
  CrossEntropyVecKernel<kFp8><<<static_cast<unsigned>(n), kVecThreads, smem, stream>>>(
      logits, losses, targets, V, dloss, write_grad, f8);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status CheckShape(const char* what, int64_t n, int V) {
  if (n < 0 || n > 0x7fffffff || V <= 0) {
    return Status::Invalid(std::string(what) + ": bad shape n=" + std::to_string(n) +
                           " V=" + std::to_string(V));
  }
  return Status::Ok();
}

}  // namespace

Status CrossEntropyForwardBackwardFp8Grad(bf16* logits, float* losses, const int32_t* targets,
                                          int64_t n, int V, float dloss, uint8_t* grad8,
                                          const float* scale, float* amax, float* scale_inv,
                                          bool write_bf16, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckShape("CrossEntropyForwardBackwardFp8Grad", n, V));
  if (!CrossEntropyFp8GradSupported(V, logits, grad8) || scale == nullptr || amax == nullptr) {
    return Status::Invalid("CrossEntropyForwardBackwardFp8Grad: needs V a multiple of 8 (got " +
                           std::to_string(V) +
                           "), 16-byte aligned logits, 8-byte aligned grad8, scale and amax");
  }
  if (n == 0) return Status::Ok();
  return LaunchVec<true>(logits, losses, targets, n, V, dloss, /*write_grad=*/true,
                         Fp8GradOut{write_bf16, grad8, scale, amax, scale_inv}, stream);
}

bool CrossEntropyFp8GradSupported(int V, const void* logits, const void* grad8) {
  return V > 0 && V % 8 == 0 && IsAligned(logits, 16) && grad8 != nullptr && IsAligned(grad8, 8);
}

Status CrossEntropyForwardBackward(bf16* logits, float* losses, const int32_t* targets,
                                   int64_t n, int V, float dloss, bool write_grad,
                                   cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckShape("CrossEntropyForwardBackward", n, V));
  if (n == 0) return Status::Ok();
  const unsigned grid = static_cast<unsigned>(n);
  if (V % 8 == 0 && IsAligned(logits, 16)) {
    return LaunchVec<false>(logits, losses, targets, n, V, dloss, write_grad, Fp8GradOut{},
                            stream);
  }
  CrossEntropyScalarKernel<<<grid, kThreads, 0, stream>>>(logits, losses, targets, V, dloss,
                                                          write_grad);
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
