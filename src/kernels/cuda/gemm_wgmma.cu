// BF16 GEMM of our own on Hopper's warpgroup MMA: D[M, N] = A[M, K] * B[N, K]^T (both K-major,
// the layout of a linear layer's forward, Y = X W^T), FP32 accumulation, BF16 out.
//
// Why a GEMM of our own at all: cuBLASLt has no epilogue for SwiGLU or RoPE, so those run as
// separate passes over the GEMM's output (docs/performance.md). This kernel is the base such
// epilogues are fused into; it only pays if its main loop keeps up with cuBLASLt's.
//
// Shape of the kernel (persistent: one CTA per SM walking 128x256 output tiles):
// - one producer warpgroup: a single thread streams K-tiles of A (128x64) and B (256x64) into a
//   3-stage shared-memory ring with the tensor copy engine (TMA, 128-byte swizzle), each stage
//   completing on its `full` mbarrier; an N-major B ([K, N], the backward's dX = dY W) arrives
//   as four 64-column boxes of 64 K-rows, which wgmma reads transposed (its tnsp-b bit);
// - two consumer warpgroups, each owning 64 rows x 256 columns of the tile: wgmma
//   m64n256k16 straight from the swizzled shared memory (4 per K-tile), then they release the
//   stage through its `empty` mbarrier once the MMAs that read it have completed; the output
//   tile is staged in shared memory (32 KiB a warpgroup) and stored by TMA.
// 3 stages x 48 KiB + 64 KiB of staging = 208 KiB of shared memory (+16 KiB of side buffer for
// kSwiGluBackward's prefetch slots or FP8 kSwiGlu's transposed h): one CTA per SM.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/rope_math.cuh"
#include "kernels/cuda/swiglu_math.cuh"
#include "kernels/cuda/tile_order.h"
#include "kernels/cuda/tma_map.h"
#include "kernels/cuda/wgmma_mma.cuh"
#include "kernels/cuda/wgmma_util.cuh"

namespace forge::cuda {
namespace {

constexpr int kBM = 128, kBN = 256, kBK = 64, kStages = 3;
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kTileBytesA = kBM * kBK * 2;
constexpr int kTileBytesB = kBN * kBK * 2;
constexpr int kStageBytes = kTileBytesA + kTileBytesB;
// Each consumer's output tile (64 x 256 bf16) is staged in shared memory for the TMA store, as
// four 64-column chunks of 64 rows x 128 bytes in the 128-byte swizzle.
constexpr int kOutChunkBytes = 64 * 128;
constexpr int kOutBytes = kConsumers * 4 * kOutChunkBytes;
// A side buffer after the staging, for two epilogues: kSwiGluBackward's prefetch slots (2 slots
// x 2 warpgroups x (g, u) x 128 threads x 16 bytes), or FP8 kSwiGlu's transposed h tiles (2
// warpgroups x 128 columns x 64 rows of E4M3, in the 64-byte swizzle, stored by TMA).
constexpr int kPrefetchBytes = 2 * kConsumers * 2 * 128 * 16;
constexpr int kHtTileBytes = 128 * 64;
static_assert(kConsumers * kHtTileBytes == kPrefetchBytes);
constexpr int kSideBytes = kPrefetchBytes;
// The swizzled tiles need 1024-byte alignment; the dynamic buffer is aligned by hand.
constexpr int kSmemBytes = kStages * kStageBytes + kOutBytes + 1024 + 2 * kStages * 8;
constexpr int kSmemBytesWithSide = kSmemBytes + kSideBytes;  // 230,448 of 232,448
// Registers a thread: the producer warpgroup gives up (40) what the consumers take (232).
constexpr RegisterSplit kRegs{168, 40, 232, kConsumers};
static_assert(kRegs.fits(), "setmaxnreg: the producer must give up what the consumers take");

// Persistent: CTA b takes tiles b, b + gridDim.x, ... in tile_order.h's order (row-major while
// B fits in L2, else in bands of tile rows), so the CTAs in flight share a few of A's and B's
// blocks in L2. The producer runs ahead across tile boundaries, so the next tile's first stages
// load during the epilogue; the epilogue stages the tile in shared memory and stores it with
// TMA (asynchronously: the consumer waits for that store's smem reads only at its next
// epilogue).
//
// Epilogues (each rounds the fp32 accumulator to bf16 first, then applies the same device math
// on the same bf16 values as the separate kernel it replaces, so the results are bitwise those
// of cuBLASLt's GEMM followed by that kernel whenever the GEMMs agree):
// - kPlain: D = A B^T.
// - kRope: D = A B^T with columns < rot_cols rotated pairwise (rope.cu's math; pairs are
//   adjacent columns, head width 64, position = row % T, sin/cos from a [T, 32] table).
// - kSwiGlu: B = [gate; up] (2*ffn rows); tile n covers gate rows n*128.. and the same up rows,
//   so a thread holds g and u of the same column: gu (bf16, [M, 2*ffn]) is written as the
//   GEMM's output would be, and D = silu(g) * u ([M, ffn], swiglu.cu's math). The epilogue
//   stages and stores gu only (both warpgroups' epilogues run together, so any math there
//   stalls the tensor cores); h is computed from the staged gu in shares between the next
//   tile's wgmma issues and written straight to global memory (waiting on shared memory for h,
//   or expf and an IEEE reciprocal in the two warps a scheduler that issue the MMAs, cost more
//   than the separate pass saves: docs/performance.md).
// - kSwiGluBackward (N-major B): A B is dh, the gradient of SwiGLU's output; it is staged but
//   never stored, and during the next tile's main loop each thread turns 16 vectors of it into
//   dg and du (gu read by cp.async two vectors ahead into prefetch slots, results written
//   straight to global memory): bitwise cuBLASLt's dgrad followed by SwiGluBackward.
//
// kFp8: E4M3 operands, K-tiles of 128 (the same 128-byte rows, so the same ring, swizzle and
// descriptors; an m64n256k32 MMA covers what m64n256k16 does in bf16), the accumulator
// dequantised by a_scale * b_scale before the bf16 rounding. kRope then rotates the rounded value
// as in BF16 (the FP8 forward's QKV projection: bitwise cuBLASLt's FP8 GEMM with fast accumulation
// followed by RopeApply whenever the GEMMs agree). kSwiGlu then quantises h as SwiGluForwardFp8
// does: each thread takes 8 rows of one 16-byte column vector (two rows a share), writes their
// row-major bytes as it goes and, after the fourth share, transposes the 8 x 8 bytes in registers
// into 8 bytes of each of h_t's 8 columns, which the warpgroup stages in the side buffer and
// stores by TMA (16 KiB: what the shared memory had left).
template <WgmmaEpilogue kEpi, bool kNMajorB = false, bool kFp8 = false>
__global__ void __launch_bounds__(kThreads, 1)
    WgmmaGemmKernel(const __grid_constant__ CUtensorMap map_a,
                    const __grid_constant__ CUtensorMap map_b,
                    const __grid_constant__ CUtensorMap map_d,
                    const __grid_constant__ CUtensorMap map_d2, WgmmaEpilogueArgs ea,
                    __nv_bfloat16* h_out, int tiles_m, int tiles_n, int group_rows, int tiles,
                    int k) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = AlignedDynamicSmem(smem_raw);
  uint8_t* out_smem = smem + kStages * kStageBytes;
  constexpr bool swiglu = kEpi == WgmmaEpilogue::kSwiGlu;
  constexpr bool swiglu_bwd = kEpi == WgmmaEpilogue::kSwiGluBackward;
  constexpr bool side = swiglu_bwd || (kFp8 && swiglu);
  uint8_t* prefetch = out_smem + kOutBytes;  // the side buffer (kSwiGluBackward, FP8 kSwiGlu)
  uint64_t* full = reinterpret_cast<uint64_t*>(out_smem + kOutBytes + (side ? kSideBytes : 0));
  uint64_t* empty = full + kStages;
  const int wg = threadIdx.x / 128;
  constexpr int bk = kFp8 ? 2 * kBK : kBK;  // K per K-tile (128 bytes of a row either way)
  const int ktiles = k / bk;
  constexpr int bn = swiglu ? kBN / 2 : kBN;  // output columns per tile

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], 128 * kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == kConsumers) {  // producer: one thread, few registers
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs.producer) : "memory");
    if (threadIdx.x == kConsumers * 128) {
      int it = 0;
      for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const TileCoord at = TileAt(tile, tiles_m, tiles_n, group_rows);
        const int m0 = at.row * kBM, n0 = at.col * bn;
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
          const int s = it % kStages;
          if (it >= kStages) MbarWait(&empty[s], ((it / kStages) + 1) & 1);
          uint8_t* a = smem + s * kStageBytes;
          MbarExpectTx(&full[s], kStageBytes);
          TmaLoad2d(a, &map_a, &full[s], kt * bk, m0);
          if constexpr (swiglu) {  // the map's box is 128 rows: gate rows, then the same up rows
            TmaLoad2d(a + kTileBytesA, &map_b, &full[s], kt * bk, n0);
            TmaLoad2d(a + kTileBytesA + kTileBytesB / 2, &map_b, &full[s], kt * bk, ea.ffn + n0);
          } else if constexpr (kNMajorB) {  // 64 columns x 64 K-rows a box
            for (int c = 0; c < kBN / 64; ++c) {
              TmaLoad2d(a + kTileBytesA + c * kNMajorChunkBytes, &map_b, &full[s], n0 + 64 * c,
                        kt * kBK);
            }
          } else {
            TmaLoad2d(a + kTileBytesA, &map_b, &full[s], kt * bk, n0);
          }
        }
      }
    }
  } else {
    // Consumers get the registers the producer gave up (128 accumulators + the epilogue).
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs.consumer) : "memory");
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32, quad = lane % 4;
    const int row0 = warp * 16 + lane / 4;  // this thread's first row in the warpgroup's 64
    uint8_t* my_out = out_smem + wg * 4 * kOutChunkBytes;
    // Stage the pairs (j, half) of columns [64 c, 64 c + 64) of the fragment into chunk c.
    auto stage = [&](int chunk, int unit, int half, uint32_t bits) {
      *reinterpret_cast<uint32_t*>(my_out + chunk * kOutChunkBytes +
                                   StagedOffset(row0 + 8 * half, unit, quad)) = bits;
    };
    // Publish the staged chunks to the copy engine, then store `count` of them, chunk c to
    // columns x(c) of rows [row, row + 64).
    auto store = [&](const CUtensorMap* map, int count, auto x, int row) {
      FenceProxyAsyncShared();
      WarpgroupBarrier(wg);
      if (t == 0) {
        for (int c = 0; c < count; ++c) TmaStore2d(map, my_out + c * kOutChunkBytes, x(c), row);
        BulkCommit();
      }
    };
    // The staging buffer is free again once the copy engine has read the last stores out.
    auto await_staging = [&] {
      if (t == 0) BulkWaitRead();
      WarpgroupBarrier(wg);
    };
    // SwiGLU's h of the previous tile, from its staged gu (gu's TMA store reads the same
    // buffer, so no wait), in four shares between this tile's first wgmma issues: each thread
    // takes whole 16-byte vectors (8 lanes a 128-byte row of a chunk: no bank conflicts) and
    // writes h straight to global memory (16 lanes a 256-byte run), so h needs neither
    // registers across the tile nor staging space. pending_row < 0: nothing pending.
    int pending_row = -1, pending_n0 = 0;
    // g and u of the 16-byte vector `unit` of a staged gu row (gate in chunks 0-1, up in 2-3).
    auto load_staged_gu = [&](int row, int chunk, int unit, float(&g)[8], float(&u)[8]) {
      const uint32_t off = StagedOffset(row, unit, 0);
      UnpackBf16x8(Load16(my_out + chunk * kOutChunkBytes + off), g);
      UnpackBf16x8(Load16(my_out + (chunk + 2) * kOutChunkBytes + off), u);
    };
    auto share = [&](int s) {  // vectors t + 128 v, v in [2 s, 2 s + 2), of the 64 x 128 h
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int idx = t + 128 * (2 * s + v), row = idx / 16, chunk = (idx / 8) % 2,
                  unit = idx % 8;
        float g[8], u[8], h[8];
        load_staged_gu(row, chunk, unit, g, u);
#pragma unroll
        for (int e = 0; e < 8; ++e) h[e] = SwiGluOut(g[e], u[e]);
        Store16(h_out + (pending_row + row) * int64_t(ea.ffn) + pending_n0 + chunk * 64 + unit * 8,
                PackBf16x8(h));
      }
    };
    // kFp8 (see the kernel's comment): h's E4M3 bytes of rows 8 (t / 16) + k in hq[k], column
    // vector t % 16; hmax: the largest |h| bits seen.
    float dq = 1.0f, hs = 0.0f;
    if constexpr (kFp8) dq = *ea.a_scale * *ea.b_scale;
    if constexpr (kFp8 && swiglu) hs = *ea.h_scale;
    uint2 hq[8];
    uint32_t hmax = 0;
    auto share_fp8 = [&]<int kShare>() {
      const int chunk = (t % 16) / 8, unit = t % 8, col = pending_n0 + chunk * 64 + unit * 8;
      const int row8 = (t / 16) * 8;
      uint8_t* q = reinterpret_cast<uint8_t*>(h_out);
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int row = row8 + 2 * kShare + v;
        float g[8], u[8], h[8];
        load_staged_gu(row, chunk, unit, g, u);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          h[e] = fp8tile::RoundBf16(SwiGluOut(g[e], u[e]));
          hmax = max(hmax, fp8tile::AbsBits(h[e]));
        }
        hq[2 * kShare + v] = fp8tile::QuantizeFp8x8<__NV_E4M3>(h, hs);
        *reinterpret_cast<uint2*>(q + (pending_row + row) * int64_t(ea.ffn) + col) =
            hq[2 * kShare + v];
      }
      if constexpr (kShare == 3) {
        // h_t's 8 x 8 block: c[e] is column col + e, rows row8 .. + 7. Stored to global memory
        // directly, each 8 bytes lands in its own row of h_t (M bytes apart): 23 us of the
        // kernel's 220 at gpt350m B 16 on an H100. So the warpgroup stages its 128 columns x
        // 64 rows in the 64-byte swizzle (16-byte unit u of row R at u ^ (R / 2 % 4)) and TMA
        // stores them as whole rows. Thread `unit` starts at column e = unit (its c rotated
        // by unit), so a warp's 8-byte stores fall on 16 bank pairs instead of one.
        uint2 c[8];
        Transpose8x8Bytes(hq, c);
#pragma unroll
        for (int b = 1; b < 8; b <<= 1) {
          const bool on = (unit & b) != 0;
          uint2 r[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) r[e] = on ? c[(e + b) % 8] : c[e];
#pragma unroll
          for (int e = 0; e < 8; ++e) c[e] = r[e];
        }
        uint8_t* ht = prefetch + wg * kHtTileBytes;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int R = chunk * 64 + unit * 8 + (e + unit) % 8;  // the tile's column
          const int off = R * 64 + ((((row8 >> 4) ^ (R >> 1)) & 3) << 4) + (row8 & 8);
          *reinterpret_cast<uint2*>(ht + off) = c[e];
        }
        FenceProxyAsyncShared();
        WarpgroupBarrier(wg);
        if (t == 0) {  // the staging is free again by the next tile's (await_staging)
          TmaStore2d(&map_d, ht, pending_row, pending_n0);
          BulkCommit();
        }
      }
    };
    auto share_any = [&](int s) {
      if constexpr (kFp8) {
        switch (s) {
          case 0:
            share_fp8.template operator()<0>();
            break;
          case 1:
            share_fp8.template operator()<1>();
            break;
          case 2:
            share_fp8.template operator()<2>();
            break;
          default:
            share_fp8.template operator()<3>();
            break;
        }
      } else {
        share(s);
      }
    };
    // SwiGLU's backward of the previous tile (kSwiGluBackward): its dh is staged like a plain
    // output but never stored; during this tile's main loop each thread takes 16 of its 16-byte
    // vectors (v = t + 128 i: a warp covers 512 contiguous bytes of a row), reads g and u from
    // global memory into its own prefetch slots with cp.async two vectors ahead (so no load
    // latency lands between two wgmma issues), and writes dg and du straight to global memory.
    // bwd_next: the next vector; 16 = nothing pending.
    int bwd_next = 16;
    const int64_t ld_gu = 2 * int64_t(ea.ffn);
    auto bwd_vector = [&](int i, int* row, int* col) {
      const int v = t + 128 * i;
      *row = v / 32, *col = (v % 32) * 8;
    };
    auto bwd_issue = [&](int i) {  // g and u of vector i into slot i % 2, one cp.async group
      if (i < 16) {
        int row, col;
        bwd_vector(i, &row, &col);
        const __nv_bfloat16* src = ea.gu + (pending_row + row) * ld_gu + pending_n0 + col;
        uint8_t* slot = prefetch + (i % 2) * (kConsumers * 2 * 128 * 16) + wg * (2 * 128 * 16);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(SmemAddr(slot + t * 16)),
                     "l"(src)
                     : "memory");
        asm volatile(
            "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(SmemAddr(slot + 128 * 16 + t * 16)),
            "l"(src + ea.ffn)
            : "memory");
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    };
    auto bwd_step = [&] {  // vector bwd_next: its loads have landed (one group may be pending)
      asm volatile("cp.async.wait_group 1;" ::: "memory");
      const int i = bwd_next;
      int row, col;
      bwd_vector(i, &row, &col);
      const uint8_t* slot = prefetch + (i % 2) * (kConsumers * 2 * 128 * 16) + wg * (2 * 128 * 16);
      float g[8], u[8], dy[8], dg[8], du[8];
      UnpackBf16x8(Load16(slot + t * 16), g);
      UnpackBf16x8(Load16(slot + 128 * 16 + t * 16), u);
      const int chunk = col / 64, unit = (col % 64) / 8;
      UnpackBf16x8(Load16(my_out + chunk * kOutChunkBytes + row * 128 + ((unit ^ (row % 8)) * 16)),
                   dy);
#pragma unroll
      for (int e = 0; e < 8; ++e) SwiGluGrads(g[e], u[e], dy[e], &dg[e], &du[e]);
      __nv_bfloat16* dst = h_out + (pending_row + row) * ld_gu + pending_n0 + col;
      Store16(dst, PackBf16x8(dg));
      Store16(dst + ea.ffn, PackBf16x8(du));
      bwd_issue(i + 2);  // into the slot just read (its values are in registers now)
      if (++bwd_next == 16) pending_row = -1;
    };
    // At K-tile kt: the vectors up to 16 (kt + 1) / ktiles (one a K-tile at K = 1024).
    auto bwd_pending_step = [&](int kt) {
      const int until = 16 * (kt + 1) / ktiles;
      while (bwd_next < until) bwd_step();
    };
    // At K-tile kt of the next tile: a share at each of the first four K-tiles (the rest at
    // the last, with fewer).
    auto pending_step = [&](int kt) {
      if (kt < 4) share_any(kt);
      if (kt == ktiles - 1) {
        for (int r = kt + 1; r < 4; ++r) share_any(r);
      }
      if (kt >= 3 || kt == ktiles - 1) pending_row = -1;
    };
    int it = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const TileCoord at = TileAt(tile, tiles_m, tiles_n, group_rows);
      const int m0 = at.row * kBM, n0 = at.col * bn;
      const int out_row = m0 + wg * 64;
      // RoPE: this tile's (sin, cos) loaded before the main loop, so they are in registers by
      // the epilogue. Head width 64: column 8 j + 2 quad is pair 4 (j % 8) + quad of its head,
      // so a thread needs 8 pairs at each of its 2 positions.
      float2 sc[2][8];
      const bool rotate = kEpi == WgmmaEpilogue::kRope && n0 < ea.rot_cols;
      if (rotate) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int pos = (out_row + row0 + 8 * half) % ea.T;
#pragma unroll
          for (int u = 0; u < 8; ++u) sc[half][u] = ea.rope_sin_cos[pos * 32 + 4 * u + quad];
        }
      }
      float acc[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) acc[i] = 0.f;
      int prev_s = -1;
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const int s = it % kStages;
        MbarWait(&full[s], (it / kStages) & 1);
        const uint8_t* a = smem + s * kStageBytes + wg * 64 * 128;
        const uint8_t* b = smem + s * kStageBytes + kTileBytesA;
        const uint64_t da = SmemDesc(a), db = kNMajorB ? SmemDescNMajor(b) : SmemDesc(b);
        // Per k16 step, in the descriptors' 16-byte address units: +32 bytes along a K-major
        // row, +16 rows of 128 bytes down an N-major chunk.
        constexpr uint64_t kStepB = kNMajorB ? 2048 / 16 : 2;
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          if constexpr (kFp8) {
            WgmmaM64N256K32Fp8(acc, da + 2 * kk, db + 2 * kk, 1);
          } else {
            WgmmaM64N256K16<kNMajorB ? 1 : 0>(acc, da + 2 * kk, db + kStepB * kk, 1);
          }
        }
        WgmmaCommit();
        if (swiglu && pending_row >= 0) pending_step(kt);  // the previous tile's h, under the MMAs
        if (swiglu_bwd && pending_row >= 0) bwd_pending_step(kt);
        // Keep this K-tile's MMAs in flight; the previous ones are done, so free their stage.
        WgmmaWait<1>();
        if (prev_s >= 0) MbarArrive(&empty[prev_s]);
        prev_s = s;
      }
      WgmmaWait<0>();
      MbarArrive(&empty[prev_s]);

      // Epilogue. Fragment i of lane l in warp w holds row w*16 + l/4 (+8 for i%4 >= 2) and
      // column 8*(i/4) + 2*(l%4) + i%2 of this warpgroup's 64 x 256. Every epilogue stages the
      // tile in bf16 (RoPE rotating the bf16 value, as RopeApply reads the GEMM's output).
      await_staging();
#pragma unroll
      for (int j = 0; j < 32; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float2 v = make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
          if constexpr (kFp8) v = make_float2(v.x * dq, v.y * dq);
          if (rotate) {
            v = RopeRotate(UnpackBf16x2(PackBf16x2(v.x, v.y)), sc[half][j % 8].x,
                           sc[half][j % 8].y);
          }
          stage(j / 8, j % 8, half, PackBf16x2(v.x, v.y));
        }
      }
      if constexpr (swiglu) {
        // Columns 0-127 are gate, 128-255 the same columns of up: gu (bf16, as the GEMM's
        // output), gate in chunks 0-1 and up in 2-3, stored; h follows from these staged
        // values during the next tile's main loop (pending_step; `store` made them visible to
        // the whole warpgroup).
        store(&map_d2, 4, [&](int c) { return c < 2 ? n0 + 64 * c : ea.ffn + n0 + 64 * (c - 2); },
              out_row);
        pending_row = out_row, pending_n0 = n0;
      } else if constexpr (swiglu_bwd) {
        // dh (bf16, as the separate GEMM would store it) stays staged for the next tile's main
        // loop; the barrier makes every thread's part visible to the warpgroup.
        WarpgroupBarrier(wg);
        pending_row = out_row, pending_n0 = n0, bwd_next = 0;
        bwd_issue(0);
        bwd_issue(1);
      } else {
        store(&map_d, 4, [&](int c) { return n0 + 64 * c; }, out_row);
      }
    }
    if (swiglu && pending_row >= 0) {  // the last tile's h: no main loop left to hide it
      for (int r = 0; r < 4; ++r) share_any(r);
    }
    if constexpr (kFp8 && swiglu) {  // fp8_cast.h's amax and scale_inv slots
      fp8tile::WarpAmaxToGlobal(hmax, ea.h_amax, lane);
      if (blockIdx.x == 0 && threadIdx.x == 0) *ea.h_scale_inv = 1.0f / hs;
    }
    if (swiglu_bwd) {  // the last tile's backward, likewise
      while (pending_row >= 0) bwd_step();
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    if (t == 0) BulkWait();
  }
}

}  // namespace

bool WgmmaGemmRunsHere() { return CheckSm90("WgmmaGemm").ok(); }

Status WgmmaGemmCheck(const WgmmaGemmArgs& args, bool fp8) {
  const std::string shape = " (M=" + std::to_string(args.M) + " N=" + std::to_string(args.N) +
                            " K=" + std::to_string(args.K) + ")";
  const std::string name = fp8 ? "WgmmaGemmFp8: " : "WgmmaGemmBf16: ";
  const int bk = fp8 ? 2 * kBK : kBK;
  if (args.M <= 0 || args.M % kBM || args.N % kBN || args.N <= 0 || args.K % bk || args.K <= 0)
    return Status::Invalid(name + "M must be a multiple of 128, N of 256, K of " +
                           std::to_string(bk) + shape);
  if (args.group_rows < 0)
    return Status::Invalid(name + "group_rows must be 0 (the default) or more" + shape);
  if (fp8 && (args.b_n_major || args.epilogue == WgmmaEpilogue::kSwiGluBackward))
    return Status::Invalid(name + "K-major operands and the plain, RoPE or SwiGLU epilogue only" +
                           shape);
  const bool bwd = args.epilogue == WgmmaEpilogue::kSwiGluBackward;
  if (args.b_n_major && args.epilogue != WgmmaEpilogue::kPlain && !bwd)
    return Status::Invalid(name + "an N-major B takes the plain or SwiGLU-backward epilogue only" +
                           shape);
  if (bwd && (!args.b_n_major || args.epi.ffn != args.N))
    return Status::Invalid(name + "SwiGLU's backward needs an N-major B and ffn = N" + shape);
  if (args.epilogue == WgmmaEpilogue::kSwiGlu && args.epi.ffn * 2 != args.N)
    return Status::Invalid(name + "SwiGLU needs ffn = N / 2" + shape);
  if (args.epilogue == WgmmaEpilogue::kRope &&
      (args.epi.T <= 0 || args.epi.hd != 64 || args.epi.rot_cols % kBN || args.epi.rot_cols < 0 ||
       args.epi.rot_cols > args.N))
    return Status::Invalid(
        name + "RoPE needs T > 0, head width 64 and rotated columns a multiple of 256" + shape);
  return Status::Ok();
}

namespace {

// Both entry points: the checks, the tensor maps, the launch.
Status Launch(const WgmmaGemmArgs& args, bool fp8, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(WgmmaGemmCheck(args, fp8));
  const std::string name = fp8 ? "WgmmaGemmFp8" : "WgmmaGemmBf16";
  const bool swiglu = args.epilogue == WgmmaEpilogue::kSwiGlu;
  const bool swiglu_bwd = args.epilogue == WgmmaEpilogue::kSwiGluBackward;
  const WgmmaEpilogueArgs& e = args.epi;
  if ((swiglu || swiglu_bwd) && !e.gu) return Status::Invalid(name + ": SwiGLU needs gu");
  if (args.epilogue == WgmmaEpilogue::kRope && !e.rope_sin_cos)
    return Status::Invalid(name + ": RoPE needs its (sin, cos) table");
  if (fp8 && (!e.a_scale || !e.b_scale))
    return Status::Invalid(name + ": needs the operands' a_scale and b_scale");
  if (fp8 && swiglu && (!e.h_t || !e.h_scale || !e.h_amax || !e.h_scale_inv))
    return Status::Invalid(name + ": SwiGLU needs h_t and h's scale, amax and scale_inv slots");
  const int64_t out_n = swiglu ? args.N / 2 : args.N;
  const int eb = fp8 ? 1 : 2;  // operand element bytes
  CUtensorMap map_a, map_b, map_d, map_d2;
  FORGE_RETURN_IF_ERROR(SwizzledMap(args.A, args.M, args.K, kBM, &map_a, eb));
  if (args.b_n_major) {  // [K, N]: boxes of 64 K-rows x 64 columns
    FORGE_RETURN_IF_ERROR(SwizzledMap(args.B, args.K, args.N, kBK, &map_b));
  } else {
    FORGE_RETURN_IF_ERROR(SwizzledMap(args.B, args.N, args.K, swiglu ? kBN / 2 : kBN, &map_b, eb));
  }
  // kSwiGluBackward and FP8's kSwiGlu write D from registers (no map; A's stands in); FP8's
  // kSwiGlu stores h_t ([ffn, M] bytes) in boxes of 128 rows x 64 bytes with this map.
  if (swiglu_bwd) {
    map_d = map_a;
  } else if (fp8 && swiglu) {
    FORGE_RETURN_IF_ERROR(SwizzledMap(e.h_t, e.ffn, args.M, 128, &map_d, 1, /*row_bytes=*/64));
  } else {
    FORGE_RETURN_IF_ERROR(SwizzledMap(args.D, args.M, out_n, 64, &map_d));
  }
  map_d2 = map_d;  // kSwiGlu's second output, gu
  if (swiglu) FORGE_RETURN_IF_ERROR(SwizzledMap(args.epi.gu, args.M, args.N, 64, &map_d2));
  FORGE_ASSIGN_OR_RETURN(const int sms, DeviceSmCount());
  const int tiles_m = int(args.M / kBM), tiles_n = int(out_n / (swiglu ? kBN / 2 : kBN));
  const int tiles = tiles_m * tiles_n;
  FORGE_ASSIGN_OR_RETURN(const int group_rows,
                         LaunchGroupRows(args.group_rows, args.N * args.K * eb));
  const int grid = args.ctas > 0 ? std::min(args.ctas, tiles) : std::min(tiles, sms);
  const int k = int(args.K);
  const int smem = swiglu_bwd || (fp8 && swiglu) ? kSmemBytesWithSide : kSmemBytes;
  auto launch = [&](auto kernel) -> Status {
    FORGE_RETURN_IF_ERROR(AllowDynamicSmem(kernel, smem));
    FORGE_RETURN_IF_ERROR(
        CheckLaunchRegisters(reinterpret_cast<const void*>(kernel), kRegs.launch, name));
    kernel<<<grid, kThreads, smem, stream>>>(map_a, map_b, map_d, map_d2, args.epi,
                                             static_cast<__nv_bfloat16*>(args.D), tiles_m, tiles_n,
                                             group_rows, tiles, k);
    FORGE_CUDA_LAUNCH_CHECK();
    return Status::Ok();
  };
  if (fp8) {
    switch (args.epilogue) {
      case WgmmaEpilogue::kRope:
        return launch(WgmmaGemmKernel<WgmmaEpilogue::kRope, false, true>);
      case WgmmaEpilogue::kSwiGlu:
        return launch(WgmmaGemmKernel<WgmmaEpilogue::kSwiGlu, false, true>);
      default:
        return launch(WgmmaGemmKernel<WgmmaEpilogue::kPlain, false, true>);
    }
  }
  switch (args.epilogue) {
    case WgmmaEpilogue::kPlain:
      return args.b_n_major ? launch(WgmmaGemmKernel<WgmmaEpilogue::kPlain, true>)
                            : launch(WgmmaGemmKernel<WgmmaEpilogue::kPlain>);
    case WgmmaEpilogue::kRope:
      return launch(WgmmaGemmKernel<WgmmaEpilogue::kRope>);
    case WgmmaEpilogue::kSwiGlu:
      return launch(WgmmaGemmKernel<WgmmaEpilogue::kSwiGlu>);
    case WgmmaEpilogue::kSwiGluBackward:
      return launch(WgmmaGemmKernel<WgmmaEpilogue::kSwiGluBackward, true>);
  }
  return Status::Internal(name + ": unknown epilogue");
}

}  // namespace

Status WgmmaGemmBf16(const WgmmaGemmArgs& args, cudaStream_t stream) {
  return Launch(args, /*fp8=*/false, stream);
}

Status WgmmaGemmFp8(const WgmmaGemmArgs& args, cudaStream_t stream) {
  return Launch(args, /*fp8=*/true, stream);
}

}  // namespace forge::cuda
