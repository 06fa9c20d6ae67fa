// dh = dy W_down in FP8 with SwiGLU's backward fused, on warpgroups of their own (see the
// header for what it computes).
//
// Why this shape: the SwiGLU backward is bandwidth work (gate/up in, dgate/dup and their
// transposes out: ~128 KiB a 64 x 256 tile against ~4.5 us of FP8 MMAs), and every form that ran
// it in the MMA warpgroups' epilogue (sessions 14, 15, 19: +4 to +6 ms a step) left the tensor
// cores waiting while it did. Here the MMA warpgroup only stages each finished dh tile (bf16,
// double-buffered) and goes on with the next tile; an epilogue warpgroup, its gate/up loads
// issued eight rows ahead (32 KiB in flight an SM), turns the staged tile into the outputs
// while the next one multiplies. So the kernel's time is the larger of the MMAs and the memory
// traffic, not their sum.
//
// Per CTA (persistent, one per SM, tiles of 64 rows x 256 columns of dh in row-major tile order):
// - producer warpgroup: one thread streams K-tiles (128) of dy (64 x 128 bytes) and W_down^T
//   (256 x 128) into a 3-stage ring by TMA (128-byte swizzle), as gemm_wgmma.cu's producer;
// - MMA warpgroup: wgmma m64n256k32 from the ring, then dh = acc * dy_scale_inv * w_scale_inv
//   rounded to bf16 into staging buffer (tile & 1) (rows 528 bytes apart: the fragment's 8 rows
//   x 4 quads hit 32 different banks), published by the `staged` mbarrier;
// - the epilogue warpgroup: warp w takes rows 16w..16w+15 of the tile, lane l columns
//   8l..8l+7, so each row's 256 columns are one warp's 512 contiguous staged bytes and its
//   gate/up reads and FP8 stores are 16 / 8 contiguous bytes a lane; after each 8 rows a lane
//   holds an 8 x 8 byte block of dgate and of dup, transposed in registers into the transposed
//   outputs' 8-byte runs (no shared memory for the transpose). The `freed` mbarrier returns
//   the buffer. (One warpgroup, not two: ptxas holds every warp to the launch's registers,
//   168 at 384 threads, and the MMA warpgroup's 128 accumulators need ~154.)
#include "kernels/cuda/swiglu_backward_gemm_fp8.cuh"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/swiglu_math.cuh"
#include "kernels/cuda/tma_map.h"
#include "kernels/cuda/wgmma_m64n256.cuh"
#include "kernels/cuda/wgmma_util.cuh"

namespace forge::cuda {
namespace {

constexpr int kBM = 64, kBN = 256, kBK = 128, kStages = 3;
constexpr int kTileBytesA = kBM * kBK, kTileBytesB = kBN * kBK;
constexpr int kStageBytes = kTileBytesA + kTileBytesB;
constexpr int kStagedRowBytes = kBN * 2 + 16;  // padded: see the fragment writes
constexpr int kStagedBytes = kBM * kStagedRowBytes;
constexpr int kMmaWg = 1, kProducerWg = 2;  // warpgroup 0: the epilogue
constexpr int kThreads = 128 * 3;
constexpr int kSmemBytes = kStages * kStageBytes + 2 * kStagedBytes + 1024 + (2 * kStages + 4) * 8;
// Registers a thread: the producer gives up what the MMA and epilogue warpgroups take.
constexpr RegisterSplit kRegs{168, 40, 232, 2};
static_assert(kRegs.fits(), "setmaxnreg: the producer must give up what the others take");

template <bool kDyE4M3>
__global__ void __launch_bounds__(kThreads, 1)
    SwiGluBackwardGemmKernel(const __grid_constant__ CUtensorMap map_dy,
                             const __grid_constant__ CUtensorMap map_w,
                             SwiGluBackwardGemmFp8Args a, int tiles_n, int tiles) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~uintptr_t(1023));
  uint8_t* staged = smem + kStages * kStageBytes;  // 2 buffers
  uint64_t* full = reinterpret_cast<uint64_t*>(staged + 2 * kStagedBytes);
  uint64_t* empty = full + kStages;
  uint64_t* staged_full = empty + kStages;  // [2]: a dh tile is staged (MMA warpgroup arrives)
  uint64_t* staged_free = staged_full + 2;  // [2]: the epilogue has read it
  const int wg = threadIdx.x / 128;
  const int ktiles = int(a.K / kBK);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], 128);
    }
    for (int b = 0; b < 2; ++b) {
      MbarInit(&staged_full[b], 128);
      MbarInit(&staged_free[b], 128);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == kProducerWg) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs.producer) : "memory");
    if (threadIdx.x == kProducerWg * 128) {
      int it = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int m0 = (tile / tiles_n) * kBM, n0 = (tile % tiles_n) * kBN;
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
          const int s = it % kStages;
          if (it >= kStages) MbarWait(&empty[s], ((it / kStages) + 1) & 1);
          uint8_t* st = smem + s * kStageBytes;
          MbarExpectTx(&full[s], kStageBytes);
          TmaLoad2d(st, &map_dy, &full[s], kt * kBK, m0);
          TmaLoad2d(st + kTileBytesA, &map_w, &full[s], kt * kBK, n0);
        }
      }
    }
  } else if (wg == kMmaWg) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs.consumer) : "memory");
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32, quad = lane % 4;
    const int row0 = warp * 16 + lane / 4;
    const float dq = *a.dy_scale_inv * *a.w_scale_inv;
    int it = 0, local = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++local) {
      float acc[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) acc[i] = 0.f;
      int prev_s = -1;
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % kStages;
        MbarWait(&full[s], (it / kStages) & 1);
        const uint8_t* st = smem + s * kStageBytes;
        const uint64_t da = SmemDesc(st), db = SmemDesc(st + kTileBytesA);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk) {
          WgmmaM64N256K32Fp8<!kDyE4M3>(acc, da + 2 * kk, db + 2 * kk, 1);
        }
        WgmmaCommit();
        WgmmaWait<1>();
        if (prev_s >= 0) MbarArrive(&empty[prev_s]);
        prev_s = s;
      }
      WgmmaWait<0>();
      MbarArrive(&empty[prev_s]);
      // Stage dh (bf16, as the GEMM would store it) once the epilogue has read this buffer's
      // previous tile. Fragment i of lane l in warp w: row w*16 + l/4 (+8 for i%4 >= 2),
      // column 8*(i/4) + 2*(l%4) + i%2.
      const int b = local & 1;
      if (local >= 2) MbarWait(&staged_free[b], ((local >> 1) + 1) & 1);
      uint8_t* out = staged + b * kStagedBytes;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float x = acc[4 * j + 2 * half] * dq, y = acc[4 * j + 2 * half + 1] * dq;
          *reinterpret_cast<uint32_t*>(out + (row0 + 8 * half) * kStagedRowBytes +
                                       (8 * j + 2 * quad) * 2) = PackBf16x2(x, y);
        }
      }
      MbarArrive(&staged_full[b]);  // release: the stores above before the epilogue's reads
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs.consumer) : "memory");
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;  // rows 16 warp.., columns 8 lane..
    const int64_t ffn = a.ffn, ld = 2 * ffn;
    const float s = *a.scale;
    uint8_t* out = static_cast<uint8_t*>(a.dgate_up);
    uint8_t* out_t = static_cast<uint8_t*>(a.dgate_up_t);
    uint32_t amax = 0;
    // Gate and up of 8 rows for this lane: slot k % 8 holds row k of the tile being worked on,
    // refilled with the row 8 ahead (into the next tile) as soon as it is used.
    uint4 g_raw[8], u_raw[8];
    auto load_row = [&](int tile, int k, int slot) {
      const int64_t m0 = int64_t(tile / tiles_n) * kBM, c = (tile % tiles_n) * kBN + 8 * lane;
      const bf16* p = a.gate_up + (m0 + 16 * warp + k) * ld + c;
      g_raw[slot] = __ldcs(reinterpret_cast<const uint4*>(p));
      u_raw[slot] = __ldcs(reinterpret_cast<const uint4*>(p + ffn));
    };
    if (blockIdx.x < tiles) {
#pragma unroll
      for (int k = 0; k < 8; ++k) load_row(blockIdx.x, k, k);
    }
    int local = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++local) {
      const int64_t m0 = int64_t(tile / tiles_n) * kBM, r0 = m0 + 16 * warp;
      const int64_t c = (tile % tiles_n) * kBN + 8 * lane;
      const int next = tile + int(gridDim.x);
      const int b = local & 1;
      MbarWait(&staged_full[b], (local >> 1) & 1);
      const uint8_t* in = staged + b * kStagedBytes + (16 * warp) * kStagedRowBytes + 16 * lane;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows 8h..8h+7 of this warp's 16
        uint2 qg[8], qu[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          float g[8], u[8], dh[8], f[2][8];
          UnpackBf16x8(g_raw[k], g);
          UnpackBf16x8(u_raw[k], u);
          if (h == 0) {
            load_row(tile, 8 + k, k);
          } else if (next < tiles) {
            load_row(next, k, k);
          }
          UnpackBf16x8(Load16(in + (8 * h + k) * kStagedRowBytes), dh);
          SwiGluGradsRounded8(g, u, dh, f);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            amax = max(amax, fp8tile::AbsBits(f[0][e]));
            amax = max(amax, fp8tile::AbsBits(f[1][e]));
          }
          qg[k] = fp8tile::QuantizeFp8x8<__NV_E5M2>(f[0], s);
          qu[k] = fp8tile::QuantizeFp8x8<__NV_E5M2>(f[1], s);
          uint8_t* o = out + (r0 + 8 * h + k) * ld + c;
          *reinterpret_cast<uint2*>(o) = qg[k];
          *reinterpret_cast<uint2*>(o + ffn) = qu[k];
        }
        if (h == 1) MbarArrive(&staged_free[b]);  // every read of the buffer is done
        uint2 col[8];
        Transpose8x8Bytes(qg, col);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          *reinterpret_cast<uint2*>(out_t + (c + e) * a.M + r0 + 8 * h) = col[e];
        }
        Transpose8x8Bytes(qu, col);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          *reinterpret_cast<uint2*>(out_t + (ffn + c + e) * a.M + r0 + 8 * h) = col[e];
        }
      }
    }
    fp8tile::WarpAmaxToGlobal(amax, a.amax, lane);
    if (blockIdx.x == 0 && threadIdx.x == 0) *a.scale_inv = 1.0f / s;
  }
}

}  // namespace

Status SwiGluBackwardGemmFp8Check(const SwiGluBackwardGemmFp8Args& a) {
  const std::string shape = " (M=" + std::to_string(a.M) + " K=" + std::to_string(a.K) +
                            " ffn=" + std::to_string(a.ffn) + ")";
  if (a.M <= 0 || a.M % kBM || a.K <= 0 || a.K % kBK || a.ffn <= 0 || a.ffn % kBN)
    return Status::Invalid("SwiGluBackwardGemmFp8: M must be a multiple of 64, K of 128 and ffn "
                           "of 256" + shape);
  if (!IsAligned(a.gate_up, 16) || !IsAligned(a.dgate_up, 8) || !IsAligned(a.dgate_up_t, 8) ||
      !IsAligned(a.dy, 16) || !IsAligned(a.w_t, 16))
    return Status::Invalid("SwiGluBackwardGemmFp8: unaligned buffers" + shape);
  return Status::Ok();
}

Status SwiGluBackwardGemmFp8(const SwiGluBackwardGemmFp8Args& a, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckSm90("SwiGluBackwardGemmFp8"));
  FORGE_RETURN_IF_ERROR(SwiGluBackwardGemmFp8Check(a));
  if (!a.dy || !a.w_t || !a.gate_up || !a.dgate_up || !a.dgate_up_t || !a.dy_scale_inv ||
      !a.w_scale_inv)
    return Status::Invalid("SwiGluBackwardGemmFp8: missing operand");
  FORGE_RETURN_IF_ERROR(CheckFp8CastArgs("SwiGluBackwardGemmFp8", DType::kE5M2, a.scale, a.amax,
                                         a.scale_inv));
  if (!a.amax || !a.scale_inv)
    return Status::Invalid("SwiGluBackwardGemmFp8: needs the amax and scale_inv slots");
  CUtensorMap map_dy, map_w;
  FORGE_RETURN_IF_ERROR(SwizzledMap(a.dy, a.M, a.K, kBM, &map_dy, 1));
  FORGE_RETURN_IF_ERROR(SwizzledMap(a.w_t, a.ffn, a.K, kBN, &map_w, 1));
  FORGE_ASSIGN_OR_RETURN(const int sms, DeviceSmCount());
  const int tiles_n = a.ffn / kBN, tiles = int(a.M / kBM) * tiles_n;
  const int grid = a.ctas > 0 ? std::min(a.ctas, tiles) : std::min(tiles, sms);
  const auto kernel = a.dy_e4m3 ? SwiGluBackwardGemmKernel<true> : SwiGluBackwardGemmKernel<false>;
  FORGE_RETURN_IF_ERROR(AllowDynamicSmem(kernel, kSmemBytes));
  FORGE_RETURN_IF_ERROR(CheckLaunchRegisters(reinterpret_cast<const void*>(kernel), kRegs.launch,
                                             "SwiGluBackwardGemmFp8"));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(map_dy, map_w, a, tiles_n, tiles);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
