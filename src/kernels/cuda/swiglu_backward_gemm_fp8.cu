// dh = dy W_down in FP8 with SwiGLU's backward fused, on warpgroups of their own (see the
// header for what it computes).
//
// Why this shape: the SwiGLU backward is bandwidth work (gate/up in, dgate/dup and their
// transposes out: 64 KiB a 64 x 128 tile against ~2.2 us of FP8 MMAs), and every form that ran
// it in the MMA warpgroups' epilogue (+4 to +6 ms a step at gpt350m B 16) left the tensor cores
// waiting while it did. Here the MMA warpgroup only stages each finished dh tile (bf16,
// double-buffered) and goes on with the next one, while an epilogue warpgroup turns the staged
// tile into the outputs from gate/up that the copy engine (TMA) brought into shared memory
// ahead of it. Keeping gate/up in the epilogue's registers instead, 8 rows ahead, holds 32 KiB
// in flight an SM, HBM at ~1 TB/s, and the kernel at 455 us against the separate path's 260;
// the copy engine keeps a whole tile's 32 KiB in flight per buffer without registers (this
// form: ~205 us under ncu on an H100 at gpt350m B 16, docs/performance.md).
//
// Per CTA (persistent, one per SM; tiles of 64 rows x 128 columns of dh in tile_order.h's
// order; local tile i of a CTA goes to buffer set i & 1):
// - producer warp (warpgroup 3): one thread streams K-tiles (128) of dy (64 x 128 bytes) and
//   W_down^T (128 x 128) into a 5-stage ring, and each tile's gate and up (64 x 128 bf16 each,
//   as 64-column boxes) into its buffer set's gate/up buffer, all by TMA in the 128-byte swizzle;
// - MMA warpgroup (2): wgmma m64n128k32 from the ring, then dh = acc * dy_scale_inv *
//   w_scale_inv rounded to bf16 into the set's staging buffer (rows 272 bytes apart: a
//   fragment's 8 rows x 4 quads hit 32 different banks), published by `staged_full`;
// - epilogue warpgroups (0 and 1: set i & 1's tiles): warp w takes rows 16w..16w+15, lanes
//   0-15 the 8-column vectors 0-15 of rows 16w..16w+7, lanes 16-31 those of 16w+8..16w+15, so
//   a lane holds an 8 x 8 byte block of dgate and of dup, transposed in registers and staged
//   over the set's dh (read by then) as two 128 x 64 byte tiles the copy engine stores into
//   the transposed output; it frees the set's gate/up buffer (`gu_free`) after its reads and
//   the staging buffer (`staged_free`) once the copy engine has read the tiles.
#include "kernels/cuda/swiglu_backward_gemm_fp8.h"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/swiglu_math.cuh"
#include "kernels/cuda/tile_order.h"
#include "kernels/cuda/tma_map.h"
#include "kernels/cuda/wgmma_mma.cuh"
#include "kernels/cuda/wgmma_util.cuh"

namespace forge::cuda {
namespace {

constexpr int kBM = 64, kBN = 128, kBK = 128, kStages = 5;
constexpr int kTileBytesA = kBM * kBK, kTileBytesB = kBN * kBK;
constexpr int kStageBytes = kTileBytesA + kTileBytesB;
constexpr int kStagedRowBytes = kBN * 2 + 16;  // padded: see the fragment writes
constexpr int kStagedBytes = kBM * kStagedRowBytes;
constexpr int kGuBoxBytes = kBM * 128;     // 64 rows x 64 bf16 columns
// The epilogue's transposed E5M2 tiles (128 columns x 64 rows each) reuse the staging buffer.
constexpr int kTransposedTileBytes = kBN * kBM;
static_assert(2 * kTransposedTileBytes <= kStagedBytes);
constexpr int kGuBytes = 4 * kGuBoxBytes;  // gate 2 boxes, then up 2 boxes
constexpr int kMmaWg = 2, kProducerWg = 3;
constexpr int kThreads = 128 * 4;
constexpr int kSmemBytes =
    kStages * kStageBytes + 2 * kGuBytes + 2 * kStagedBytes + 1024 + (2 * kStages + 8) * 8;

template <bool kDyE4M3>
__global__ void __launch_bounds__(kThreads, 1)
    SwiGluBackwardGemmKernel(const __grid_constant__ CUtensorMap map_dy,
                             const __grid_constant__ CUtensorMap map_w,
                             const __grid_constant__ CUtensorMap map_gu,
                             const __grid_constant__ CUtensorMap map_t, SwiGluBackwardGemmFp8Args a,
                             int tiles_m, int tiles_n, int group_rows, int tiles) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = AlignedDynamicSmem(smem_raw);
  uint8_t* gu = smem + kStages * kStageBytes;  // [2] (1024-aligned: the swizzle's pattern)
  uint8_t* staged = gu + 2 * kGuBytes;         // [2]
  uint64_t* full = reinterpret_cast<uint64_t*>(staged + 2 * kStagedBytes);
  uint64_t* empty = full + kStages;
  uint64_t* staged_full = empty + kStages;  // [2]: a dh tile is staged
  uint64_t* staged_free = staged_full + 2;  // [2]: the epilogue is done with it
  uint64_t* gu_full = staged_free + 2;      // [2]: a tile's gate/up has landed
  uint64_t* gu_free = gu_full + 2;          // [2]: the epilogue has read it
  const int wg = threadIdx.x / 128;
  const int ktiles = int(a.K / kBK);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], 128);
    }
    for (int b = 0; b < 2; ++b) {
      MbarInit(&staged_full[b], 128);
      MbarInit(&staged_free[b], 1);
      MbarInit(&gu_full[b], 1);
      MbarInit(&gu_free[b], 128);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == kProducerWg) {
    if (threadIdx.x == kProducerWg * 128) {
      int it = 0, local = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++local) {
        const TileCoord at = TileAt(tile, tiles_m, tiles_n, group_rows);
        const int m0 = at.row * kBM, n0 = at.col * kBN;
        // This tile's gate/up first: the epilogue needs it only after the MMAs, so it lands
        // well ahead; the set's buffer is free once the epilogue has read its last tile.
        const int b = local & 1;
        if (local >= 2) MbarWait(&gu_free[b], ((local >> 1) + 1) & 1);
        uint8_t* g = gu + b * kGuBytes;
        MbarExpectTx(&gu_full[b], kGuBytes);
        for (int box = 0; box < 4; ++box) {
          const int col = (box < 2 ? 0 : a.ffn) + n0 + 64 * (box % 2);
          TmaLoad2d(g + box * kGuBoxBytes, &map_gu, &gu_full[b], col, m0);
        }
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
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32, quad = lane % 4;
    const int row0 = warp * 16 + lane / 4;
    const float dq = *a.dy_scale_inv * *a.w_scale_inv;
    int it = 0, local = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++local) {
      float acc[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.f;
      int prev_s = -1;
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % kStages;
        MbarWait(&full[s], (it / kStages) & 1);
        const uint8_t* st = smem + s * kStageBytes;
        const uint64_t da = SmemDesc(st), db = SmemDesc(st + kTileBytesA);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kBK / 32; ++kk) {
          WgmmaM64N128K32Fp8<!kDyE4M3>(acc, da + 2 * kk, db + 2 * kk, 1);
        }
        WgmmaCommit();
        WgmmaWait<1>();
        if (prev_s >= 0) MbarArrive(&empty[prev_s]);
        prev_s = s;
      }
      WgmmaWait<0>();
      MbarArrive(&empty[prev_s]);
      // Stage dh (bf16, as the GEMM would store it) once the epilogue has read this set's
      // previous tile. Fragment i of lane l in warp w: row w*16 + l/4 (+8 for i%4 >= 2),
      // column 8*(i/4) + 2*(l%4) + i%2.
      const int b = local & 1;
      if (local >= 2) MbarWait(&staged_free[b], ((local >> 1) + 1) & 1);
      uint8_t* out = staged + b * kStagedBytes;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
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
    // Epilogue warpgroup b: the CTA's local tiles b, b + 2, ...
    const int b = wg, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int v = lane % 16, rows = 16 * warp + 8 * (lane / 16);  // vector v of 8 rows
    const int64_t ffn = a.ffn, ld = 2 * ffn;
    const float s = *a.scale;
    uint8_t* out = static_cast<uint8_t*>(a.dgate_up);
    const uint8_t* g_in = gu + b * kGuBytes + (v / 8) * kGuBoxBytes;
    uint8_t* set_staged = staged + b * kStagedBytes;
    const uint8_t* dh_in = set_staged + 16 * v;
    uint32_t amax2 = 0;  // two bf16 magnitudes' bits
    int local = b;
    for (int tile = blockIdx.x + b * int(gridDim.x); tile < tiles;
         tile += 2 * int(gridDim.x), local += 2) {
      const TileCoord at = TileAt(tile, tiles_m, tiles_n, group_rows);
      const int m0 = at.row * kBM, n0 = at.col * kBN;
      const int64_t r0 = m0 + rows, c = n0 + 8 * v;
      const uint32_t parity = (local >> 1) & 1;
      MbarWait(&gu_full[b], parity);
      MbarWait(&staged_full[b], parity);
      uint2 qg[8], qu[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int row = rows + k;
        const uint32_t off = StagedOffset(row, v % 8, 0);  // the 128-byte swizzle of a box row
        float g[8], u[8], dh[8], f[2][8];
        uint32_t packed[2][4];
        UnpackBf16x8(Load16(g_in + off), g);
        UnpackBf16x8(Load16(g_in + 2 * kGuBoxBytes + off), u);
        UnpackBf16x8(Load16(dh_in + row * kStagedRowBytes), dh);
        SwiGluGradsRounded8(g, u, dh, f, packed);
        // The magnitudes' max on the packed bf16 pairs: one instruction a pair.
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          amax2 = fp8tile::AbsMaxBf16x2(amax2, packed[0][q]);
          amax2 = fp8tile::AbsMaxBf16x2(amax2, packed[1][q]);
        }
        qg[k] = fp8tile::QuantizeFp8x8<__NV_E5M2>(f[0], s);
        qu[k] = fp8tile::QuantizeFp8x8<__NV_E5M2>(f[1], s);
        uint8_t* o = out + (r0 + k) * ld + c;
        *reinterpret_cast<uint2*>(o) = qg[k];
        *reinterpret_cast<uint2*>(o + ffn) = qu[k];
      }
      MbarArrive(&gu_free[b]);  // every read of the set's gate/up is done
      // The transposed outputs: each lane's 8 x 8 blocks, transposed in registers, go into the
      // set's staging buffer (its dh has been read by the whole warpgroup after this barrier)
      // as two tiles of 128 columns x 64 rows (dgate^T, dup^T) in the 64-byte swizzle (16-byte
      // unit u of row R at u ^ (R / 2 % 4)), which the copy engine stores as whole rows. Each
      // 8 bytes stored straight to global memory lands in its own row of dgate_up_t (M bytes
      // apart), which costs ~23 us a layer. Lane v starts at column v % 8 (its
      // block rotated by v), so a warp's 8-byte stores fall on 16 bank pairs, not one.
      WarpgroupBarrier(b);
      uint2 col[2][8];
      Transpose8x8Bytes(qg, col[0]);
      Transpose8x8Bytes(qu, col[1]);
#pragma unroll
      for (int bit = 1; bit < 8; bit <<= 1) {
        const bool on = (v & bit) != 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint2 r[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) r[e] = on ? col[h][(e + bit) % 8] : col[h][e];
#pragma unroll
          for (int e = 0; e < 8; ++e) col[h][e] = r[e];
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int R = 8 * v + (e + v) % 8;  // the tile's column
        const int off = R * 64 + ((((rows >> 4) ^ (R >> 1)) & 3) << 4) + (rows & 8);
        *reinterpret_cast<uint2*>(set_staged + off) = col[0][e];
        *reinterpret_cast<uint2*>(set_staged + kTransposedTileBytes + off) = col[1][e];
      }
      FenceProxyAsyncShared();
      WarpgroupBarrier(b);
      if (t == 0) {  // the set is free for the MMA warpgroup once the copy engine has read it
        TmaStore2d(&map_t, set_staged, m0, n0);
        TmaStore2d(&map_t, set_staged + kTransposedTileBytes, m0, int(ffn) + n0);
        BulkCommit();
        BulkWaitRead();
        MbarArrive(&staged_free[b]);
      }
    }
    if (t == 0) BulkWait();
    fp8tile::WarpAmaxToGlobal(fp8tile::Bf16x2AbsBits(amax2), a.amax, lane);
    if (blockIdx.x == 0 && threadIdx.x == 0) *a.scale_inv = 1.0f / s;
  }
}

}  // namespace

Status SwiGluBackwardGemmFp8Check(const SwiGluBackwardGemmFp8Args& a) {
  const std::string shape = " (M=" + std::to_string(a.M) + " K=" + std::to_string(a.K) +
                            " ffn=" + std::to_string(a.ffn) + ")";
  if (a.M <= 0 || a.M % kBM || a.K <= 0 || a.K % kBK || a.ffn <= 0 || a.ffn % kBN)
    return Status::Invalid("SwiGluBackwardGemmFp8: M must be a multiple of 64, K and ffn of 128" +
                           shape);
  if (!IsAligned(a.gate_up, 16) || !IsAligned(a.dgate_up, 8) || !IsAligned(a.dgate_up_t, 16) ||
      !IsAligned(a.dy, 16) || !IsAligned(a.w_t, 16))
    return Status::Invalid("SwiGluBackwardGemmFp8: unaligned buffers" + shape);
  if (a.group_rows < 0)
    return Status::Invalid("SwiGluBackwardGemmFp8: group_rows must be 0 (the default) or more");
  return Status::Ok();
}

Status SwiGluBackwardGemmFp8(const SwiGluBackwardGemmFp8Args& a, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckSm90("SwiGluBackwardGemmFp8"));
  FORGE_RETURN_IF_ERROR(SwiGluBackwardGemmFp8Check(a));
  if (!a.dy || !a.w_t || !a.gate_up || !a.dgate_up || !a.dgate_up_t || !a.dy_scale_inv ||
      !a.w_scale_inv)
    return Status::Invalid("SwiGluBackwardGemmFp8: missing operand");
  FORGE_RETURN_IF_ERROR(
      CheckFp8CastArgs("SwiGluBackwardGemmFp8", DType::kE5M2, a.scale, a.amax, a.scale_inv));
  if (!a.amax || !a.scale_inv)
    return Status::Invalid("SwiGluBackwardGemmFp8: needs the amax and scale_inv slots");
  CUtensorMap map_dy, map_w;
  FORGE_RETURN_IF_ERROR(SwizzledMap(a.dy, a.M, a.K, kBM, &map_dy, 1));
  FORGE_RETURN_IF_ERROR(SwizzledMap(a.w_t, a.ffn, a.K, kBN, &map_w, 1));
  CUtensorMap map_gu;  // [M, 2 ffn] bf16 in boxes of 64 rows x 64 columns
  FORGE_RETURN_IF_ERROR(SwizzledMap(a.gate_up, a.M, 2 * int64_t{a.ffn}, kBM, &map_gu));
  CUtensorMap map_t;  // [2 ffn, M] E5M2 stored in boxes of 128 rows x 64 bytes
  FORGE_RETURN_IF_ERROR(
      SwizzledMap(a.dgate_up_t, 2 * int64_t{a.ffn}, a.M, kBN, &map_t, 1, /*row_bytes=*/64));
  FORGE_ASSIGN_OR_RETURN(const int sms, DeviceSmCount());
  FORGE_ASSIGN_OR_RETURN(const int group_rows, LaunchGroupRows(a.group_rows, a.ffn * a.K));
  const int tiles_m = int(a.M / kBM), tiles_n = a.ffn / kBN, tiles = tiles_m * tiles_n;
  const int grid = a.ctas > 0 ? std::min(a.ctas, tiles) : std::min(tiles, sms);
  const auto kernel = a.dy_e4m3 ? SwiGluBackwardGemmKernel<true> : SwiGluBackwardGemmKernel<false>;
  FORGE_RETURN_IF_ERROR(AllowDynamicSmem(kernel, kSmemBytes));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(map_dy, map_w, map_gu, map_t, a, tiles_m, tiles_n,
                                                 group_rows, tiles);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
