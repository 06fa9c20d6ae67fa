// Device helpers shared by the fused kernels: 16-byte bf16 vectors (8 values) unpacked to
// fp32, a 4x4 byte transpose, alignment tests, and warp/block reductions whose summation order
// is fixed (so the kernels built on them are bitwise reproducible for a given launch shape).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16.h"

namespace forge::cuda {

inline __host__ __device__ bool IsAligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// 8 bf16 values in one 16-byte word <-> 8 floats (exact widening; round-to-nearest-even on
// narrowing, as __float2bfloat16_rn).
__device__ __forceinline__ float2 UnpackBf16x2(uint32_t bits) {
  __nv_bfloat162 h;
  memcpy(&h, &bits, 4);  // a register move; avoids pointer casts that force local memory
  return __bfloat1622float2(h);
}
// v rounded to bf16 (to nearest, ties to even) and back: what a bf16 store keeps of it, for
// the kernels that must compute from exactly that value without storing it.
__device__ __forceinline__ float RoundBf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &h, 4);
  return bits;
}

// o[e] = byte e of a, b, c, d (a's in the lowest byte): a 4x4 byte transpose in 8 PRMTs.
__device__ __forceinline__ void Transpose4x4Bytes(uint32_t a, uint32_t b, uint32_t c, uint32_t d,
                                                  uint32_t* o0, uint32_t* o1, uint32_t* o2,
                                                  uint32_t* o3) {
  const uint32_t ab_lo = __byte_perm(a, b, 0x5140), ab_hi = __byte_perm(a, b, 0x7362);
  const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
  *o0 = __byte_perm(ab_lo, cd_lo, 0x5410), *o1 = __byte_perm(ab_lo, cd_lo, 0x7632);
  *o2 = __byte_perm(ab_hi, cd_hi, 0x5410), *o3 = __byte_perm(ab_hi, cd_hi, 0x7632);
}

// An 8 x 8 byte block, row k in r[k] (byte e of row k = column e): c[e] = column e (row k in
// byte k).
__device__ __forceinline__ void Transpose8x8Bytes(const uint2 (&r)[8], uint2 (&c)[8]) {
  Transpose4x4Bytes(r[0].x, r[1].x, r[2].x, r[3].x, &c[0].x, &c[1].x, &c[2].x, &c[3].x);
  Transpose4x4Bytes(r[4].x, r[5].x, r[6].x, r[7].x, &c[0].y, &c[1].y, &c[2].y, &c[3].y);
  Transpose4x4Bytes(r[0].y, r[1].y, r[2].y, r[3].y, &c[4].x, &c[5].x, &c[6].x, &c[7].x);
  Transpose4x4Bytes(r[4].y, r[5].y, r[6].y, r[7].y, &c[4].y, &c[5].y, &c[6].y, &c[7].y);
}

__device__ __forceinline__ void UnpackBf16x8(const uint4& u, float (&f)[8]) {
  const float2 a = UnpackBf16x2(u.x), b = UnpackBf16x2(u.y), c = UnpackBf16x2(u.z),
               d = UnpackBf16x2(u.w);
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x,
  f[7] = d.y;
}

__device__ __forceinline__ uint4 PackBf16x8(const float (&f)[8]) {
  return make_uint4(PackBf16x2(f[0], f[1]), PackBf16x2(f[2], f[3]), PackBf16x2(f[4], f[5]),
                    PackBf16x2(f[6], f[7]));
}

// p must be 16-byte aligned.
__device__ __forceinline__ uint4 Load16(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void Store16(void* p, const uint4& u) {
  *reinterpret_cast<uint4*>(p) = u;
}

// VEC = 8: 16 bytes of bf16 as floats (p 16-byte aligned); VEC = 1: one element (the scalar
// path kernels take for odd widths or unaligned buffers).
template <int VEC>
__device__ __forceinline__ void LoadVec(const bf16* p, float (&f)[VEC]) {
  static_assert(VEC == 8 || VEC == 1, "VEC is 8 or 1");
  if constexpr (VEC == 8) {
    UnpackBf16x8(Load16(p), f);
  } else {
    f[0] = __bfloat162float(*p);
  }
}
template <int VEC>
__device__ __forceinline__ void StoreVec(bf16* p, const float (&f)[VEC]) {
  static_assert(VEC == 8 || VEC == 1, "VEC is 8 or 1");
  if constexpr (VEC == 8) {
    Store16(p, PackBf16x8(f));
  } else {
    *p = __float2bfloat16_rn(f[0]);
  }
}

// Butterfly reductions: every lane ends with the same value, combined in the same order on
// every run.
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` is 32 floats of shared memory; the function may be called repeatedly with the same
// scratch (it synchronises before returning).
__device__ __forceinline__ float BlockSum(float x, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n_warps = blockDim.x / 32;
  x = WarpSum(x);
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float t = lane < n_warps ? scratch[lane] : 0.0f;
  t = WarpSum(t);
  __syncthreads();  // scratch may be reused by the caller right away
  return t;
}

}  // namespace forge::cuda
