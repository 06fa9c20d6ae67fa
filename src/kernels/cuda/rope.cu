// Rotary position embedding, in place on the Q and K heads of the fused bf16 qkv buffer.
//
// Bytes moved and design (bandwidth-bound): reads and writes the Q and K part of qkv once,
// 2 * 2 * B*T*(H+KV)*hd bytes; V is not touched. A thread owns one 16-byte vector (4 rotation
// pairs) at one position and applies it to kHeadsPerThread heads: the 4 sin/cos pairs
// depend only on the position and the pair, so they are computed once per thread and reused
// across the heads (full-precision sincosf is ~40 instructions; once per vector it made the
// kernel issue-bound rather than memory-bound). The heads' loads are all issued before the
// first use. Threads of a warp take consecutive vectors of a row, so each head's row segment
// (hd*2 bytes) is read and written whole. The per-pair inverse frequencies (the caller's table:
// theta^(-2i/hd), scaled as the model asks) are loaded once per block into shared memory; the
// angle t * freq and its sin/cos are fp32 (full-precision sincosf: angles reach T radians).
// Requirements: hd even and hd <= 512 (Status::Invalid otherwise); the vector path needs
// hd % 8 == 0 and a 16-byte aligned qkv, else a pair-per-thread path runs.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/rope_math.cuh"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHd = 512;
constexpr int kHeadsPerThread = 8;  // sin/cos reuse vs threads in flight (grid.y = heads / 8)

// VEC bf16 values (VEC / 2 pairs) per thread and head. Thread x-index i: position i / per_head,
// vector i % per_head; blockIdx.y picks the group of kHeadsPerThread heads.
template <int VEC>
__global__ void __launch_bounds__(kThreads, 4)
    RopeKernel(bf16* __restrict__ qkv, int64_t rows, int T, int rot_heads, int64_t row_stride,
               int hd, const float* __restrict__ inv_freq, float sign) {
  __shared__ float s_freq[kMaxHd / 2];
  const int half = hd / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    s_freq[i] = inv_freq[i];
  }
  __syncthreads();

  const int per_head = hd / VEC;
  const int64_t total = rows * per_head;
  const int h0 = blockIdx.y * kHeadsPerThread;
  const int nh = min(kHeadsPerThread, rot_heads - h0);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / per_head;
    const int v = static_cast<int>(i - row * per_head);
    const float t = static_cast<float>(row % T);
    float sn[VEC / 2], cs[VEC / 2];
#pragma unroll
    for (int q = 0; q < VEC / 2; ++q) {
      RopeSinCos(t, s_freq[v * (VEC / 2) + q], sign, &sn[q], &cs[q]);
    }
    bf16* base = qkv + row * row_stride + int64_t{h0} * hd + v * VEC;
    // Raw bf16 words in flight (4 registers per head for VEC 8), unpacked at use.
    uint32_t raw[kHeadsPerThread][VEC / 2];
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h) {
      if (h < nh) {
        const bf16* p = base + int64_t{h} * hd;
        if constexpr (VEC == 8) {
          const uint4 u = Load16(p);
          raw[h][0] = u.x, raw[h][1] = u.y, raw[h][2] = u.z, raw[h][3] = u.w;
        } else {
          // Element loads: this path also serves buffers only 2-byte aligned.
          const __nv_bfloat16_raw lo = p[0], hi = p[1];
          raw[h][0] = uint32_t{lo.x} | (uint32_t{hi.x} << 16);
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h) {
      if (h < nh) {
#pragma unroll
        for (int q = 0; q < VEC / 2; ++q) {
          const float2 x = RopeRotate(UnpackBf16x2(raw[h][q]), sn[q], cs[q]);
          raw[h][q] = PackBf16x2(x.x, x.y);
        }
        bf16* p = base + int64_t{h} * hd;
        if constexpr (VEC == 8) {
          Store16(p, make_uint4(raw[h][0], raw[h][1], raw[h][2], raw[h][3]));
        } else {
          __nv_bfloat16_raw lo, hi;
          lo.x = static_cast<uint16_t>(raw[h][0] & 0xffffu);
          hi.x = static_cast<uint16_t>(raw[h][0] >> 16);
          p[0] = lo;
          p[1] = hi;
        }
      }
    }
  }
}

// One (sin, cos) a thread: position i / (hd/2), pair i % (hd/2), with RopeKernel's functions.
__global__ void RopeSinCosKernel(float2* __restrict__ out, int T, int hd,
                                 const float* __restrict__ inv_freq) {
  const int half = hd / 2;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= T * half) return;
  float sn, cs;
  RopeSinCos(static_cast<float>(i / half), inv_freq[i % half], 1.0f, &sn, &cs);
  out[i] = make_float2(sn, cs);
}

__global__ void RopePlainFrequencyKernel(float* __restrict__ out, int hd, float theta) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < hd / 2) out[i] = static_cast<float>(pow(static_cast<double>(theta), -2.0 * i / hd));
}

}  // namespace

Status RopeApply(bf16* qkv, int B, int T, int n_head, int n_kv_head, int hd,
                 const float* inv_freq, bool inverse, cudaStream_t stream) {
  if (B < 0 || T <= 0 || n_head <= 0 || n_kv_head <= 0 || hd <= 0 || hd % 2 != 0 ||
      hd > kMaxHd || inv_freq == nullptr) {
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
  const int64_t items = rows * (vec ? hd / 8 : hd / 2);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(CeilDiv(items, kThreads), 1 << 20)),
                  static_cast<unsigned>(CeilDiv(rot_heads, kHeadsPerThread)));
  if (vec) {
    RopeKernel<8><<<grid, kThreads, 0, stream>>>(qkv, rows, T, rot_heads, row_stride, hd,
                                                 inv_freq, sign);
  } else {
    RopeKernel<2><<<grid, kThreads, 0, stream>>>(qkv, rows, T, rot_heads, row_stride, hd,
                                                 inv_freq, sign);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status RopeSinCosTable(float2* out, int T, int hd, const float* inv_freq, cudaStream_t stream) {
  if (T <= 0 || hd <= 0 || hd % 2 || inv_freq == nullptr)
    return Status::Invalid("RopeSinCosTable: bad shape T=" + std::to_string(T) +
                           " hd=" + std::to_string(hd));
  const int n = T * (hd / 2);
  RopeSinCosKernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(out, T, hd, inv_freq);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status RopePlainInverseFrequencies(float* out, int hd, float theta, cudaStream_t stream) {
  if (hd <= 0 || hd % 2 || hd > kMaxHd || !(theta > 0.0f) || out == nullptr)
    return Status::Invalid("RopePlainInverseFrequencies: bad hd=" + std::to_string(hd) +
                           " or theta");
  RopePlainFrequencyKernel<<<1, kMaxHd / 2, 0, stream>>>(out, hd, theta);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
