// FP8 cast kernels (see fp8_cast.h for the contract).
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
// and gradient of a training step) take the vectorised tile kernel of fp8_tile_cast.cuh
// instead (the byte-wide kernel ran at ~40% of HBM bandwidth in the FP8 step's profile).
#include <cuda_fp8.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/fp8_tile_cast.cuh"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 16384;
constexpr int kTile = 64;
constexpr int kTileThreadsX = 32, kTileThreadsY = 8;
constexpr int kMaxTileBlocks = 4096;

using fp8tile::AbsBits;
using fp8tile::BlockAmaxToGlobal;
using fp8tile::ToFp8;
using fp8tile::QuantizeFp8x8;

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
      *reinterpret_cast<uint2*>(out + i * 8) = QuantizeFp8x8<F>(f, s);
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

Status CheckArgs(const char* what, int64_t rows, int64_t cols, DType format, const float* scale,
                 const float* amax, const float* scale_inv) {
  if (rows < 0 || cols < 0) {
    return Status::Invalid(std::string(what) + ": bad shape rows=" + std::to_string(rows) +
                           " cols=" + std::to_string(cols));
  }
  return CheckFp8CastArgs(what, format, scale, amax, scale_inv);
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
    if (fp8tile::TileShapeOk(rows, cols, out, out_t) && IsAligned(x, 16)) {
      fp8tile::LaunchTileCast(format == DType::kE4M3, out, out_t, fp8tile::Bf16Source{x, cols},
                              rows, cols, cols, 0, scale, amax, scale_inv, stream);
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

Status CheckFp8CastArgs(const std::string& what, DType format, const float* scale,
                        const float* amax, const float* scale_inv) {
  if (format != DType::kE4M3 && format != DType::kE5M2) {
    return Status::Invalid(what + ": format must be E4M3 or E5M2");
  }
  if (!scale) return Status::Invalid(what + ": scale pointer is required");
  const void* ptrs[] = {scale, amax, scale_inv};
  const char* names[] = {"scale", "amax", "scale_inv"};
  for (int i = 0; i < 3; ++i) {
    if (ptrs[i] && !IsAligned(ptrs[i], 16)) {
      return Status::Invalid(what + ": " + names[i] +
                             " pointer must be 16-byte aligned (cuBLASLt's rule for the "
                             "scale/amax slots it shares)");
    }
  }
  return Status::Ok();
}

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

bool CastTransposeGroupSupported(const Fp8CastJob* jobs, int n) {
  if (n < 1 || n > fp8tile::kMaxGroupJobs) return false;
  for (int i = 0; i < n; ++i) {
    const Fp8CastJob& j = jobs[i];
    if (j.rows <= 0 || j.cols <= 0 || !j.out || !j.out_t || !IsAligned(j.x, 16) ||
        !fp8tile::TileShapeOk(j.rows, j.cols, j.out, j.out_t)) {
      return false;
    }
  }
  return true;
}

Status CastTransposeGroupToFp8(const Fp8CastJob* jobs, int n, DType format,
                               cudaStream_t stream) {
  if (!CastTransposeGroupSupported(jobs, n)) {
    return Status::Invalid("CastTransposeGroupToFp8: 1-" +
                           std::to_string(fp8tile::kMaxGroupJobs) +
                           " tensors with both outputs, all on the 64x64 tile path");
  }
  fp8tile::GroupJobs g;
  g.n = n;
  int64_t tiles = 0;
  for (int i = 0; i < n; ++i) {
    const Fp8CastJob& j = jobs[i];
    FORGE_RETURN_IF_ERROR(CheckArgs("CastTransposeGroupToFp8", j.rows, j.cols, format, j.scale,
                                    j.amax, j.scale_inv));
    g.job[i] = fp8tile::GroupJob{j, tiles};
    tiles += j.rows / fp8tile::kTile * (j.cols / fp8tile::kTile);
  }
  if (tiles > 0x7fffffff) return Status::Invalid("CastTransposeGroupToFp8: too many tiles");
  const unsigned blocks = static_cast<unsigned>(tiles);
  if (format == DType::kE4M3) {
    fp8tile::TileCastGroupKernel<__NV_E4M3><<<blocks, fp8tile::kThreads, 0, stream>>>(g);
  } else {
    fp8tile::TileCastGroupKernel<__NV_E5M2><<<blocks, fp8tile::kThreads, 0, stream>>>(g);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
