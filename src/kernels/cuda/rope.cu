// Rotary position embedding, in place on the Q and K heads of the fused bf16 qkv buffer.
//
// Bytes moved and design (bandwidth-bound): reads and writes the Q and K part of qkv once,
// 2 * 2 * B*T*(H+KV)*hd bytes; V is not touched. One thread per 16-byte vector (4 rotation
// pairs), grid-stride, so each warp streams 512 contiguous bytes. The per-pair frequencies
// theta^(-2i/hd) are computed once per block in double (as the CPU reference does) into
// shared memory; the angle t * freq and its sin/cos are fp32 (full-precision sincosf: angles
// reach T radians). Requirements: hd even and hd <= 512 (Status::Invalid otherwise); the
// vector path needs hd % 8 == 0 and a 16-byte aligned qkv, else a pair-per-thread path runs.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/rope.cuh"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHd = 512;

// VEC bf16 values (VEC / 2 pairs) per thread.
template <int VEC>
__global__ void __launch_bounds__(kThreads)
    RopeKernel(bf16* __restrict__ qkv, int64_t rows, int T, int rot_heads, int64_t row_stride,
               int hd, float theta, float sign) {
  __shared__ float s_freq[kMaxHd / 2];
  const int half = hd / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    s_freq[i] = static_cast<float>(pow(static_cast<double>(theta), -2.0 * i / hd));
  }
  __syncthreads();

  const int per_head = hd / VEC;
  const int64_t per_row = int64_t{rot_heads} * per_head;
  const int64_t total = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / per_row;
    const int rem = static_cast<int>(i % per_row);
    const int head = rem / per_head;
    const int v = rem % per_head;
    const float t = static_cast<float>(row % T);
    bf16* p = qkv + row * row_stride + int64_t{head} * hd + v * VEC;
    float f[VEC];
    if constexpr (VEC == 8) {
      UnpackBf16x8(Load16(p), f);
    } else {
      f[0] = __bfloat162float(p[0]);
      f[1] = __bfloat162float(p[1]);
    }
#pragma unroll
    for (int q = 0; q < VEC / 2; ++q) {
      float s, c;
      sincosf(t * s_freq[v * (VEC / 2) + q], &s, &c);
      s *= sign;
      const float x0 = f[2 * q], x1 = f[2 * q + 1];
      f[2 * q] = x0 * c - x1 * s;
      f[2 * q + 1] = x0 * s + x1 * c;
    }
    if constexpr (VEC == 8) {
      Store16(p, PackBf16x8(f));
    } else {
      p[0] = __float2bfloat16_rn(f[0]);
      p[1] = __float2bfloat16_rn(f[1]);
    }
  }
}

}  // namespace

Status RopeApply(bf16* qkv, int B, int T, int n_head, int n_kv_head, int hd, float theta,
                 bool inverse, cudaStream_t stream) {
  if (B < 0 || T <= 0 || n_head <= 0 || n_kv_head <= 0 || hd <= 0 || hd % 2 != 0 ||
      hd > kMaxHd || !(theta > 0.0f)) {
    return Status::Invalid("RopeApply: bad shape B=" + std::to_string(B) +
                           " T=" + std::to_string(T) + " H=" + std::to_string(n_head) +
                           " KV=" + std::to_string(n_kv_head) + " hd=" + std::to_string(hd) +
                           " (hd must be even and <= " + std::to_string(kMaxHd) + ")");
  }
  const int64_t rows = int64_t{B} * T;
  if (rows == 0) return Status::Ok();
  const int rot_heads = n_head + n_kv_head;
  const int64_t row_stride = int64_t{n_head + 2 * n_kv_head} * hd;
  const float sign = inverse ? -1.0f : 1.0f;
  const bool vec = hd % 8 == 0 && IsAligned(qkv, 16);
  const int64_t items = rows * rot_heads * (vec ? hd / 8 : hd / 2);
  const int blocks = static_cast<int>(std::min<int64_t>(CeilDiv(items, kThreads), 8192));
  if (vec) {
    RopeKernel<8><<<blocks, kThreads, 0, stream>>>(qkv, rows, T, rot_heads, row_stride, hd,
                                                   theta, sign);
  } else {
    RopeKernel<2><<<blocks, kThreads, 0, stream>>>(qkv, rows, T, rot_heads, row_stride, hd,
                                                   theta, sign);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
