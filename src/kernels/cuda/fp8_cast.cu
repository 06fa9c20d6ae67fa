// FP8 cast kernels (see fp8_cast.cuh for the contract).
//
// Bandwidth-bound. CastToFp8 reads 2 and writes 1 byte per element: one thread per 8 elements
// (a 16-byte bf16 load, an 8-byte fp8 store of four cvt.rn.satfinite x2 results), grid-stride;
// any other shape or alignment takes one element per thread. CastTransposeToFp8 goes through
// 64x64 tiles: 256 threads (32 x 8) read a tile row-wise (a warp reads 32 consecutive
// elements), convert, write the row-major fp8 directly and the bytes into shared memory
// (rows padded to 68 bytes so the column reads below hit 32 different banks), then write the
// transposed tile row-wise from it. Partial tiles at the edges are bounds-checked, so any
// rows/cols work.
// The model's shapes (rows and cols multiples of 64, aligned buffers: every bf16 activation
// and gradient of a training step) take CastTransposeVecKernel instead, which the byte-wide
// kernel left at ~40% of HBM bandwidth in the FP8 step's profile: per 64x64 tile, each of 256
// threads loads 8 bf16 (16 bytes) twice, stores 8 fp8 bytes row-major, and after the barrier
// gathers 8 bytes down a tile column for one 8-byte transposed store. A warp then covers 4
// rows x 128 B of input, 4 x 64 B of each output. Tile rows are 68 bytes apart, so the
// column gathers of a warp (8 row groups, 4 columns) hit at most 2 threads' words per bank.
#include <cuda_fp8.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.cuh"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 16384;
constexpr int kTile = 64;
constexpr int kTileThreadsX = 32, kTileThreadsY = 8;
constexpr int kMaxTileBlocks = 4096;

template <__nv_fp8_interpretation_t F>
__device__ __forceinline__ uint8_t ToFp8(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, F));
}
// Two values in one cvt; `lo` lands in the low byte (the lower address).
template <__nv_fp8_interpretation_t F>
__device__ __forceinline__ uint32_t ToFp8x2(float lo, float hi) {
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, F));
}

__device__ __forceinline__ uint32_t AbsBits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

__device__ __forceinline__ uint32_t WarpMaxU32(uint32_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Folds every thread's `m` (|x| bits) into *amax: warp max, block max over the warps, one
// atomicMax per block on the float's bits. Every thread of the block must call it; the block
// has a multiple of 32 threads.
__device__ __forceinline__ void BlockAmaxToGlobal(uint32_t m, float* amax) {
  __shared__ uint32_t warp_max[32];
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  const int lane = tid % 32, warp = tid / 32;
  const int n_warps = blockDim.x * blockDim.y / 32;
  m = WarpMaxU32(m);
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    uint32_t t = lane < n_warps ? warp_max[lane] : 0u;
    t = WarpMaxU32(t);
    // 0 cannot raise a zeroed amax: skip the atomic.
    if (lane == 0 && t != 0u) atomicMax(reinterpret_cast<unsigned int*>(amax), t);
  }
}

__device__ __forceinline__ float ToFloat(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(float v) { return v; }

template <__nv_fp8_interpretation_t F, int VEC>
__global__ void __launch_bounds__(kThreads)
    CastKernel(uint8_t* __restrict__ out, const bf16* __restrict__ x, int64_t n,
               const float* __restrict__ scale, float* __restrict__ amax,
               float* __restrict__ scale_inv) {
  const float s = *scale;
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / s;
  uint32_t m = 0;
  const int64_t chunks = n / VEC;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < chunks;
       i += int64_t{gridDim.x} * blockDim.x) {
    float f[VEC];
    LoadVec<VEC>(x + i * VEC, f);
#pragma unroll
    for (int k = 0; k < VEC; ++k) m = max(m, AbsBits(f[k]));
    if (!out) continue;  // amax only
    if constexpr (VEC == 8) {
      const uint32_t lo = ToFp8x2<F>(f[0] * s, f[1] * s) | (ToFp8x2<F>(f[2] * s, f[3] * s) << 16);
      const uint32_t hi = ToFp8x2<F>(f[4] * s, f[5] * s) | (ToFp8x2<F>(f[6] * s, f[7] * s) << 16);
      *reinterpret_cast<uint2*>(out + i * 8) = make_uint2(lo, hi);
    } else {
      out[i] = ToFp8<F>(f[0] * s);
    }
  }
  if (amax) BlockAmaxToGlobal(m, amax);
}

template <__nv_fp8_interpretation_t F, typename T>
__global__ void __launch_bounds__(kTileThreadsX* kTileThreadsY)
    CastTransposeKernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                        const T* __restrict__ x, int64_t rows, int64_t cols,
                        const float* __restrict__ scale, float* __restrict__ amax,
                        float* __restrict__ scale_inv) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float s = *scale;
  const int tx = threadIdx.x, ty = threadIdx.y;
  if (scale_inv && blockIdx.x == 0 && tx == 0 && ty == 0) *scale_inv = 1.0f / s;
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  const int64_t tiles = (rows + kTile - 1) / kTile * tiles_c;
  uint32_t m = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
#pragma unroll
    for (int i = 0; i < kTile / kTileThreadsY; ++i) {
      const int r = ty + kTileThreadsY * i;
#pragma unroll
      for (int j = 0; j < kTile / kTileThreadsX; ++j) {
        const int c = tx + kTileThreadsX * j;
        const int64_t gr = r0 + r, gc = c0 + c;
        if (gr < rows && gc < cols) {
          const float v = ToFloat(x[gr * cols + gc]);
          m = max(m, AbsBits(v));
          const uint8_t q = ToFp8<F>(v * s);
          if (out) out[gr * cols + gc] = q;
          tile[r][c] = q;
        }
      }
    }
    if (out_t) {  // uniform over the block: the barriers are safe
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kTile / kTileThreadsY; ++i) {
        const int c = ty + kTileThreadsY * i;
#pragma unroll
        for (int j = 0; j < kTile / kTileThreadsX; ++j) {
          const int r = tx + kTileThreadsX * j;
          const int64_t gr = r0 + r, gc = c0 + c;
          if (gr < rows && gc < cols) out_t[gc * rows + gr] = tile[r][c];
        }
      }
      __syncthreads();  // the tile is rewritten by the next iteration
    }
  }
  if (amax) BlockAmaxToGlobal(m, amax);
}

constexpr int kVecTileStride = kTile + 4;  // bytes between tile rows in shared memory

template <__nv_fp8_interpretation_t F>
__global__ void __launch_bounds__(kThreads)
    CastTransposeVecKernel(uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                           const bf16* __restrict__ x, int64_t rows, int64_t cols,
                           const float* __restrict__ scale, float* __restrict__ amax,
                           float* __restrict__ scale_inv) {
  __shared__ __align__(16) uint8_t tile[kTile * kVecTileStride];
  const float s = *scale;
  const int tid = threadIdx.x;
  if (scale_inv && blockIdx.x == 0 && tid == 0) *scale_inv = 1.0f / s;
  const int64_t tiles_c = cols / kTile;
  const int64_t tiles = rows / kTile * tiles_c;
  constexpr int kChunks = kTile * kTile / 8;  // 8-element pieces per tile
  uint32_t m = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_c * kTile, c0 = t % tiles_c * kTile;
#pragma unroll
    for (int k = 0; k < kChunks / kThreads; ++k) {
      const int chunk = tid + kThreads * k;
      const int r = chunk / 8, c8 = chunk % 8 * 8;
      float f[8];
      LoadVec<8>(x + (r0 + r) * cols + c0 + c8, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) m = max(m, AbsBits(f[e]));
      const uint32_t lo = ToFp8x2<F>(f[0] * s, f[1] * s) | (ToFp8x2<F>(f[2] * s, f[3] * s) << 16);
      const uint32_t hi = ToFp8x2<F>(f[4] * s, f[5] * s) | (ToFp8x2<F>(f[6] * s, f[7] * s) << 16);
      if (out) *reinterpret_cast<uint2*>(out + (r0 + r) * cols + c0 + c8) = make_uint2(lo, hi);
      uint32_t* row = reinterpret_cast<uint32_t*>(tile + r * kVecTileStride + c8);
      row[0] = lo;
      row[1] = hi;
    }
    if (out_t) {  // uniform over the block: the barriers are safe
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kChunks / kThreads; ++k) {
        const int chunk = tid + kThreads * k;
        const int c = chunk / 8, r8 = chunk % 8 * 8;
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          lo |= uint32_t{tile[(r8 + e) * kVecTileStride + c]} << (8 * e);
          hi |= uint32_t{tile[(r8 + 4 + e) * kVecTileStride + c]} << (8 * e);
        }
        *reinterpret_cast<uint2*>(out_t + (c0 + c) * rows + r0 + r8) = make_uint2(lo, hi);
      }
      __syncthreads();  // the tile is rewritten by the next iteration
    }
  }
  if (amax) BlockAmaxToGlobal(m, amax);
}

Status CheckArgs(const char* what, int64_t rows, int64_t cols, DType format, const float* scale,
                 const float* amax, const float* scale_inv) {
  const std::string w = what;
  if (rows < 0 || cols < 0) {
    return Status::Invalid(w + ": bad shape rows=" + std::to_string(rows) +
                           " cols=" + std::to_string(cols));
  }
  if (format != DType::kE4M3 && format != DType::kE5M2) {
    return Status::Invalid(w + ": format must be E4M3 or E5M2");
  }
  if (!scale) return Status::Invalid(w + ": scale pointer is required");
  const void* ptrs[] = {scale, amax, scale_inv};
  const char* names[] = {"scale", "amax", "scale_inv"};
  for (int i = 0; i < 3; ++i) {
    if (ptrs[i] && !IsAligned(ptrs[i], 16)) {
      return Status::Invalid(w + ": " + names[i] +
                             " pointer must be 16-byte aligned (cuBLASLt's rule for the "
                             "scale/amax slots it shares)");
    }
  }
  return Status::Ok();
}

template <typename T>
Status LaunchCastTranspose(const char* what, void* out, void* out_t, const T* x, int64_t rows,
                           int64_t cols, DType format, const float* scale, float* amax,
                           float* scale_inv, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckArgs(what, rows, cols, format, scale, amax, scale_inv));
  if (!out && !out_t && rows * cols > 0) {
    return Status::Invalid(std::string(what) + ": no output given");
  }
  const int64_t tiles = CeilDiv(rows, kTile) * CeilDiv(cols, kTile);
  const int blocks = static_cast<int>(std::clamp<int64_t>(tiles, 1, kMaxTileBlocks));
  const dim3 block(kTileThreadsX, kTileThreadsY);
  auto* o = static_cast<uint8_t*>(out);
  auto* ot = static_cast<uint8_t*>(out_t);
  if constexpr (std::is_same_v<T, bf16>) {
    if (rows % kTile == 0 && cols % kTile == 0 && IsAligned(x, 16) && IsAligned(out, 8) &&
        IsAligned(out_t, 8)) {
      if (format == DType::kE4M3) {
        CastTransposeVecKernel<__NV_E4M3>
            <<<blocks, kThreads, 0, stream>>>(o, ot, x, rows, cols, scale, amax, scale_inv);
      } else {
        CastTransposeVecKernel<__NV_E5M2>
            <<<blocks, kThreads, 0, stream>>>(o, ot, x, rows, cols, scale, amax, scale_inv);
      }
      FORGE_CUDA_LAUNCH_CHECK();
      return Status::Ok();
    }
  }
  if (format == DType::kE4M3) {
    CastTransposeKernel<__NV_E4M3, T>
        <<<blocks, block, 0, stream>>>(o, ot, x, rows, cols, scale, amax, scale_inv);
  } else {
    CastTransposeKernel<__NV_E5M2, T>
        <<<blocks, block, 0, stream>>>(o, ot, x, rows, cols, scale, amax, scale_inv);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace

Status CastToFp8(void* out, const bf16* x, int64_t rows, int64_t cols, DType format,
                 const float* scale, float* amax, float* scale_inv, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckArgs("CastToFp8", rows, cols, format, scale, amax, scale_inv));
  const int64_t n = rows * cols;
  if (!out && !amax && n > 0) return Status::Invalid("CastToFp8: neither out nor amax given");
  auto* o = static_cast<uint8_t*>(out);
  // At least one block even for an empty tensor: it still writes scale_inv.
  if (n % 8 == 0 && IsAligned(x, 16) && IsAligned(out, 8)) {
    const int blocks =
        static_cast<int>(std::clamp<int64_t>(CeilDiv(n / 8, kThreads), 1, kMaxBlocks));
    if (format == DType::kE4M3) {
      CastKernel<__NV_E4M3, 8><<<blocks, kThreads, 0, stream>>>(o, x, n, scale, amax, scale_inv);
    } else {
      CastKernel<__NV_E5M2, 8><<<blocks, kThreads, 0, stream>>>(o, x, n, scale, amax, scale_inv);
    }
  } else {
    const int blocks =
        static_cast<int>(std::clamp<int64_t>(CeilDiv(n, kThreads), 1, kMaxBlocks));
    if (format == DType::kE4M3) {
      CastKernel<__NV_E4M3, 1><<<blocks, kThreads, 0, stream>>>(o, x, n, scale, amax, scale_inv);
    } else {
      CastKernel<__NV_E5M2, 1><<<blocks, kThreads, 0, stream>>>(o, x, n, scale, amax, scale_inv);
    }
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status CastTransposeToFp8(void* out, void* out_t, const bf16* x, int64_t rows, int64_t cols,
                          DType format, const float* scale, float* amax, float* scale_inv,
                          cudaStream_t stream) {
  return LaunchCastTranspose("CastTransposeToFp8(bf16)", out, out_t, x, rows, cols, format,
                             scale, amax, scale_inv, stream);
}

Status CastTransposeToFp8(void* out, void* out_t, const float* x, int64_t rows, int64_t cols,
                          DType format, const float* scale, float* amax, float* scale_inv,
                          cudaStream_t stream) {
  return LaunchCastTranspose("CastTransposeToFp8(fp32)", out, out_t, x, rows, cols, format,
                             scale, amax, scale_inv, stream);
}

}  // namespace forge::cuda
