// Global grad-norm (deterministic) and multi-tensor AdamW over fp32 master weights.
//
// Bytes moved and design (bandwidth-bound, one launch for all tensors):
// - GlobalGradNorm: reads every gradient once (4 bytes/element). A fixed grid of
//   kNormBlocks x kNormThreads threads walks the tensors in descriptor order with a grid-stride
//   loop (float4 loads where aligned); each thread's fp32 sum, the block's fixed-tree sum, and
//   the final single-block sum of the kNormBlocks partials (workspace, fixed layout) are all
//   in a fixed order independent of timing: bitwise reproducible.
// - AdamWMultiTensor: reads p, g, m, v (16 B/element) and writes p, m, v and the bf16 copy
//   (14 B/element): float4 loads/stores where every buffer of a tensor is aligned, grid-stride
//   over the tensors in order. Scalars (lr, step, clip scale) come from device memory, so the
//   launch can be captured in a CUDA graph. The update is written with explicit
//   round-to-nearest operations in the reference's order (no fused multiply-add), so it gives
//   the same fp32 results as cpu::AdamWUpdate on the same inputs.
// - Casts: 8 elements per thread (two float4 and one 16-byte bf16 vector).
#include <algorithm>
#include <string>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grid_stride.cuh"

namespace forge::cuda {
namespace {

constexpr int kNormBlocks = 512;
constexpr int kNormThreads = 512;
constexpr int kAdamBlocks = 1024;
constexpr int kAdamThreads = 256;
constexpr int kCastThreads = 256;
constexpr int kCastMaxBlocks = 8192;
constexpr int kFinishThreads = 1024;
static_assert(kNormBlocks <= kFinishThreads);

// Four consecutive gradient values (vector index i) and one (index i), from fp32 or bf16
// gradients (AdamWTensor::grad16): the same elements in the same order either way.
__device__ __forceinline__ float4 Load4(const float* __restrict__ g, int64_t i) {
  return reinterpret_cast<const float4*>(g)[i];
}
__device__ __forceinline__ float4 Load4(const bf16* __restrict__ g, int64_t i) {
  const uint2 u = reinterpret_cast<const uint2*>(g)[i];
  const float2 a = UnpackBf16x2(u.x), b = UnpackBf16x2(u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float Load1(const float* __restrict__ g, int64_t i) { return g[i]; }
__device__ __forceinline__ float Load1(const bf16* __restrict__ g, int64_t i) {
  return __bfloat162float(g[i]);
}

// Adds this thread's share (grid-stride from tid) of the squares of g[0, n) to acc, in order.
// The vector path is taken on 16-byte alignment for both types, so bf16 values sum bitwise as
// their fp32 widening does.
template <typename T>
__device__ __forceinline__ void AddSquares(const T* __restrict__ g, int64_t n, int64_t tid,
                                           int64_t stride, float& acc) {
  int64_t scalar_begin = 0;
  if (IsAligned(g, 16)) {
    const int64_t n4 = n / 4;
    for (int64_t i = tid; i < n4; i += stride) {
      const float4 v = Load4(g, i);
      acc += v.x * v.x;
      acc += v.y * v.y;
      acc += v.z * v.z;
      acc += v.w * v.w;
    }
    scalar_begin = n4 * 4;
  }
  for (int64_t i = scalar_begin + tid; i < n; i += stride) {
    const float x = Load1(g, i);
    acc += x * x;
  }
}

__global__ void __launch_bounds__(kNormThreads)
    GradNormPartialKernel(const AdamWTensor* __restrict__ tensors, int num_tensors,
                          float* __restrict__ partial) {
  __shared__ float scratch[32];
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  float acc = 0.0f;
  for (int t = 0; t < num_tensors; ++t) {
    if (tensors[t].grad16 != nullptr) {
      AddSquares(tensors[t].grad16, tensors[t].n, tid, stride, acc);
    } else {
      AddSquares(tensors[t].grad, tensors[t].n, tid, stride, acc);
    }
  }
  const float total = BlockSum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// One contiguous gradient range (a unit's), same grid and order per block as above.
template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    SumSquaresPartialKernel(const T* __restrict__ g, int64_t n, float* __restrict__ partial) {
  __shared__ float scratch[32];
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  float acc = 0.0f;
  AddSquares(g, n, tid, int64_t{gridDim.x} * blockDim.x, acc);
  const float total = BlockSum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// min(1, max_norm / (norm + 1e-6)); 1 when clipping is off. A non-finite sum of squares (an
// Inf/NaN gradient: an overflowed step) gives NaN, which tells AdamW to skip the step.
__device__ __forceinline__ float ClipScale(float sumsq, float max_norm) {
  if (!isfinite(sumsq)) return __int_as_float(0x7fc00000);
  if (!(max_norm > 0.0f)) return 1.0f;
  const float s = max_norm / (sqrtf(sumsq) + 1e-6f);
  return s < 1.0f ? s : (s >= 1.0f ? 1.0f : s);
}

// Any number of partials: thread t sums t, t + kFinishThreads, ... in order, then a fixed tree.
__global__ void __launch_bounds__(kFinishThreads)
    PartialsFinishKernel(const float* __restrict__ partial, int64_t count, float max_norm,
                         float* __restrict__ sumsq_out, float* __restrict__ clip_scale_out) {
  __shared__ float scratch[32];
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += kFinishThreads) acc += partial[i];
  const float total = BlockSum(acc, scratch);
  if (threadIdx.x == 0) {
    sumsq_out[0] = total;
    clip_scale_out[0] = ClipScale(total, max_norm);
  }
}

__global__ void ClipScaleKernel(const float* __restrict__ sumsq, float max_norm,
                                float* __restrict__ clip_scale_out) {
  clip_scale_out[0] = ClipScale(sumsq[0], max_norm);
}

struct AdamWConsts {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, bc1, bc2, grad_scale;
};

// The reference's arithmetic, one rounding per operation, in its order.
__device__ __forceinline__ void AdamWElement(float& p, float g, float& m, float& v,
                                             const AdamWConsts& c, float wd) {
  const float gi = __fmul_rn(g, c.grad_scale);
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, gi));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(c.one_minus_beta2, gi), gi));
  const float mhat = __fdiv_rn(m, c.bc1);
  const float vhat = __fdiv_rn(v, c.bc2);
  const float step = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), c.eps)),
                               __fmul_rn(wd, p));
  p = __fsub_rn(p, __fmul_rn(c.lr, step));
}

__global__ void __launch_bounds__(kAdamThreads)
    AdamWKernel(const AdamWTensor* __restrict__ tensors, int num_tensors,
                const AdamWHyper* __restrict__ hyper, const float* __restrict__ grad_scale,
                int64_t* __restrict__ skipped_steps, const int* __restrict__ gate) {
  if (gate != nullptr && *gate == 0) return;
  // A non-finite clip scale marks a step whose gradients overflowed: nothing is updated
  // (weights, moments and the bf16 copy keep their values), the step is only counted.
  if (grad_scale != nullptr && !isfinite(*grad_scale)) {
    if (skipped_steps != nullptr && blockIdx.x == 0 && threadIdx.x == 0) ++*skipped_steps;
    return;
  }
  const AdamWHyper h = *hyper;
  AdamWConsts c;
  c.lr = h.lr;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.one_minus_beta1 = 1.0f - h.beta1;
  c.one_minus_beta2 = 1.0f - h.beta2;
  c.eps = h.eps;
  // Bias corrections in double, as the reference.
  c.bc1 = static_cast<float>(1.0 - pow(static_cast<double>(h.beta1), static_cast<double>(h.step)));
  c.bc2 = static_cast<float>(1.0 - pow(static_cast<double>(h.beta2), static_cast<double>(h.step)));
  c.grad_scale = grad_scale != nullptr ? *grad_scale : 1.0f;

  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int t = 0; t < num_tensors; ++t) {
    const AdamWTensor T = tensors[t];
    int64_t scalar_begin = 0;
    const bool g16 = T.grad16 != nullptr;
    if (IsAligned(T.param, 16) && (g16 ? IsAligned(T.grad16, 8) : IsAligned(T.grad, 16)) &&
        IsAligned(T.m, 16) && IsAligned(T.v, 16) && IsAligned(T.param_bf16, 8)) {
      const int64_t n4 = T.n / 4;
      for (int64_t i = tid; i < n4; i += stride) {
        float4 p = reinterpret_cast<const float4*>(T.param)[i];
        const float4 g = g16 ? Load4(T.grad16, i) : Load4(T.grad, i);
        float4 m = reinterpret_cast<const float4*>(T.m)[i];
        float4 v = reinterpret_cast<const float4*>(T.v)[i];
        AdamWElement(p.x, g.x, m.x, v.x, c, T.weight_decay);
        AdamWElement(p.y, g.y, m.y, v.y, c, T.weight_decay);
        AdamWElement(p.z, g.z, m.z, v.z, c, T.weight_decay);
        AdamWElement(p.w, g.w, m.w, v.w, c, T.weight_decay);
        reinterpret_cast<float4*>(T.param)[i] = p;
        reinterpret_cast<float4*>(T.m)[i] = m;
        reinterpret_cast<float4*>(T.v)[i] = v;
        if (T.param_bf16 != nullptr) {
          reinterpret_cast<uint2*>(T.param_bf16)[i] =
              make_uint2(PackBf16x2(p.x, p.y), PackBf16x2(p.z, p.w));
        }
      }
      scalar_begin = n4 * 4;
    }
    for (int64_t i = scalar_begin + tid; i < T.n; i += stride) {
      float p = T.param[i], m = T.m[i], v = T.v[i];
      AdamWElement(p, g16 ? Load1(T.grad16, i) : Load1(T.grad, i), m, v, c, T.weight_decay);
      T.param[i] = p;
      T.m[i] = m;
      T.v[i] = v;
      if (T.param_bf16 != nullptr) T.param_bf16[i] = __float2bfloat16_rn(p);
    }
  }
}

__global__ void MarkUpdatePendingKernel(const float* __restrict__ grad_scale,
                                        int* __restrict__ gate,
                                        int64_t* __restrict__ skipped_steps) {
  const bool finite = isfinite(*grad_scale);
  *gate = finite ? 1 : 0;
  if (!finite && skipped_steps != nullptr) ++*skipped_steps;
}

__global__ void __launch_bounds__(kCastThreads)
    CastFloatToBf16Kernel(bf16* __restrict__ out, const float* __restrict__ in, int64_t n,
                          bool vec) {
  ForEachElementBy8(
      n, vec,
      [&](int64_t i) {
        const float4 a = reinterpret_cast<const float4*>(in)[2 * i];
        const float4 b = reinterpret_cast<const float4*>(in)[2 * i + 1];
        const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        Store16(out + 8 * i, PackBf16x8(f));
      },
      [&](int64_t i) { out[i] = __float2bfloat16_rn(in[i]); });
}

__global__ void __launch_bounds__(kCastThreads)
    CastBf16ToFloatKernel(float* __restrict__ out, const bf16* __restrict__ in, int64_t n,
                          bool vec) {
  ForEachElementBy8(
      n, vec,
      [&](int64_t i) {
        float f[8];
        UnpackBf16x8(Load16(in + 8 * i), f);
        reinterpret_cast<float4*>(out)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4*>(out)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
      },
      [&](int64_t i) { out[i] = __bfloat162float(in[i]); });
}

int CastBlocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>(CeilDiv(n, 8 * kCastThreads), 1, kCastMaxBlocks));
}

}  // namespace

size_t GradNormWorkspace() { return kNormBlocks * sizeof(float); }

Status GlobalGradNorm(const AdamWTensor* tensors, int num_tensors, float max_norm,
                      float* sumsq_out, float* clip_scale_out, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream) {
  if (num_tensors < 0 || (num_tensors > 0 && tensors == nullptr)) {
    return Status::Invalid("GlobalGradNorm: bad tensor list (" + std::to_string(num_tensors) +
                           " tensors)");
  }
  if (sumsq_out == nullptr || clip_scale_out == nullptr) {
    return Status::Invalid("GlobalGradNorm: null output");
  }
  if (workspace == nullptr || workspace_bytes < GradNormWorkspace() ||
      !IsAligned(workspace, 4)) {
    return Status::Invalid("GlobalGradNorm: workspace needs " +
                           std::to_string(GradNormWorkspace()) + " bytes; got " +
                           std::to_string(workspace_bytes));
  }
  auto* partial = static_cast<float*>(workspace);
  GradNormPartialKernel<<<kNormBlocks, kNormThreads, 0, stream>>>(tensors, num_tensors, partial);
  FORGE_CUDA_LAUNCH_CHECK();
  // kNormBlocks <= kFinishThreads: each finish thread takes at most one partial (0 + x is x),
  // so this is the same fixed tree a kNormBlocks-thread block would run, bit for bit.
  PartialsFinishKernel<<<1, kFinishThreads, 0, stream>>>(partial, kNormBlocks, max_norm,
                                                         sumsq_out, clip_scale_out);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

int64_t SumSquaresPartials() { return kNormBlocks; }

namespace {
template <typename T>
Status LaunchSumSquaresPartial(const char* fn, const T* g, int64_t n, float* partial,
                               cudaStream_t stream) {
  if (n < 0 || (n > 0 && g == nullptr) || partial == nullptr) {
    return Status::Invalid(std::string(fn) + ": bad arguments (n " + std::to_string(n) + ")");
  }
  SumSquaresPartialKernel<T><<<kNormBlocks, kNormThreads, 0, stream>>>(g, n, partial);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}
}  // namespace

Status SumSquaresPartial(const float* g, int64_t n, float* partial, cudaStream_t stream) {
  return LaunchSumSquaresPartial("SumSquaresPartial", g, n, partial, stream);
}

Status SumSquaresPartialBf16(const bf16* g, int64_t n, float* partial, cudaStream_t stream) {
  return LaunchSumSquaresPartial("SumSquaresPartialBf16", g, n, partial, stream);
}

Status GradNormFromPartials(const float* partial, int64_t count, float max_norm,
                            float* sumsq_out, float* clip_scale_out, cudaStream_t stream) {
  if (count <= 0 || partial == nullptr || sumsq_out == nullptr || clip_scale_out == nullptr) {
    return Status::Invalid("GradNormFromPartials: bad arguments (count " + std::to_string(count) +
                           ")");
  }
  PartialsFinishKernel<<<1, kFinishThreads, 0, stream>>>(partial, count, max_norm, sumsq_out,
                                                         clip_scale_out);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status ClipScaleFromSumSquares(const float* sumsq, float max_norm, float* clip_scale_out,
                               cudaStream_t stream) {
  if (sumsq == nullptr || clip_scale_out == nullptr) {
    return Status::Invalid("ClipScaleFromSumSquares: null pointer");
  }
  ClipScaleKernel<<<1, 1, 0, stream>>>(sumsq, max_norm, clip_scale_out);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status AdamWMultiTensor(const AdamWTensor* tensors, int num_tensors, const AdamWHyper* hyper,
                        const float* grad_scale, cudaStream_t stream, int64_t* skipped_steps,
                        const int* gate, int64_t elements) {
  if (num_tensors < 0 || (num_tensors > 0 && tensors == nullptr) || hyper == nullptr) {
    return Status::Invalid("AdamWMultiTensor: bad arguments (" + std::to_string(num_tensors) +
                           " tensors)");
  }
  if (num_tensors == 0) return Status::Ok();
  // Each thread handles float4s grid-stride; a small list needs no more blocks than that.
  const int blocks =
      elements > 0
          ? static_cast<int>(std::clamp<int64_t>(CeilDiv(elements, 4 * kAdamThreads), 1,
                                                 kAdamBlocks))
          : kAdamBlocks;
  AdamWKernel<<<blocks, kAdamThreads, 0, stream>>>(tensors, num_tensors, hyper, grad_scale,
                                                   skipped_steps, gate);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status MarkUpdatePending(const float* grad_scale, int* gate, int64_t* skipped_steps,
                         cudaStream_t stream) {
  if (grad_scale == nullptr || gate == nullptr) {
    return Status::Invalid("MarkUpdatePending: null pointer");
  }
  MarkUpdatePendingKernel<<<1, 1, 0, stream>>>(grad_scale, gate, skipped_steps);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

namespace {

// Launches one of the cast kernels over n elements (16-byte vectors when both ends allow).
template <typename Out, typename In>
Status LaunchCast(const char* name, void (*kernel)(Out*, const In*, int64_t, bool), Out* out,
                  const In* in, int64_t n, cudaStream_t stream) {
  if (n < 0) return Status::Invalid(std::string(name) + ": n < 0");
  if (n == 0) return Status::Ok();
  const bool vec = IsAligned(out, 16) && IsAligned(in, 16);
  kernel<<<CastBlocks(n), kCastThreads, 0, stream>>>(out, in, n, vec);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace

Status CastFloatToBf16(bf16* out, const float* in, int64_t n, cudaStream_t stream) {
  return LaunchCast("CastFloatToBf16", CastFloatToBf16Kernel, out, in, n, stream);
}

Status CastBf16ToFloat(float* out, const bf16* in, int64_t n, cudaStream_t stream) {
  return LaunchCast("CastBf16ToFloat", CastBf16ToFloatKernel, out, in, n, stream);
}

}  // namespace forge::cuda
