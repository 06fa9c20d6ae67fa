// Causal attention backward on Hopper's warpgroup MMAs (see flash_backward.h for why).
//
// Work split. One CTA tile is (batch b, kv head, kv block j of 128 keys, query head g of the
// kv head's group); CTAs are persistent and take tiles in order from a counter, a head's kv
// blocks from the last to the first (a tile's dQ additions wait only on tiles taken before it,
// so the waits always end). The tile walks its query blocks i (64 queries) from the diagonal
// up. Kv block j's tiles take 2 (T / 128 - j) query blocks, so one tile per query head rather
// than per group keeps the longest tiles short against the work each SM gets (at llama3-1b's
// GQA 4:1 and T 8192, a tile per group left the last SMs running alone at the end). Under GQA
// the group's tiles each leave their dK and dV in fp32 in the scratch, and the tile that
// finishes last (a counter per kv block) sums them in query-head order: the same bits whichever
// comes last. Per (i, j), in the transposed orientation of FlashAttention-3 so that P^T and
// dS^T come out of the MMAs already laid out as the A operand of the next ones:
//   S^T = K Q^T, dP^T = V dO^T                      (two m64n64 MMAs a warpgroup, K and V's 64
//                                                    rows of that warpgroup)
//   P^T = exp2(S^T scale log2 e - Stats log2 e)      (masked above the diagonal)
//   dS^T = P^T (dP^T - rowsum(dO O))
//   dV += P^T dO, dK += dS^T Q                       (A from registers, B transposed)
//   dQ_ij = dS K                                     (dS^T through shared memory; each
//                                                    warpgroup 32 of the 64 columns)
// dK and dV stay in registers for the whole tile; dQ_ij goes to shared memory and a writer warp
// adds it to the fp32 partial sum of query block i in global memory (bulk copy engine) once the
// block's semaphore says the kv block before it in the order has: the diagonal kv block (i / 2)
// stores, then i / 2 - 1, ..., and kv block 0 reads the sum, adds its share and writes dQ in
// bf16. Kv block j meets query block i two iterations after kv block j + 1 did, so the chain
// rarely waits. Each element of dQ is a sum in one fixed order: bitwise reproducible, nothing
// to zero first.
//
// Warp roles (384 threads, one CTA an SM): warpgroups 0 and 1 compute (232 registers a thread,
// K and V of their keys held in registers as the A operand of S^T and dP^T; 216 in the FP8 form
// without GQA, whose MMAs read them from shared memory); warpgroup 2 gives registers up (40;
// 72): its first thread streams K, V (double-buffered across tiles) and each query block's Q,
// dO and row statistics (two stages) with TMA; its second and third warps are the dQ writers
// (one a dQ buffer, so two additions are in flight).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_backward.h"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/rope_fp8.h"
#include "kernels/cuda/rope_math.cuh"
#include "kernels/cuda/tma_map.h"
#include "kernels/cuda/wgmma_mma.cuh"
#include "kernels/cuda/wgmma_util.cuh"

namespace forge::cuda {
namespace {

constexpr int kHd = 64;
constexpr int kBq = 64;    // queries a block
constexpr int kBkv = 128;  // keys a tile
constexpr int kThreads = 384;
// The compute warpgroups hold K and V of their keys in registers (see the consumer's loop)
// except in the FP8 form without GQA, which would spill; those 32 registers a thread come from
// the producer warpgroup.
template <bool kFp8, bool kSplit>
constexpr bool kKvInRegisters = kSplit || !kFp8;
constexpr RegisterSplit kRegsKv{168, 40, 232, 2};
constexpr RegisterSplit kRegsSs{168, 72, 216, 2};
static_assert(kRegsKv.fits() && kRegsSs.fits() && kRegsKv.launch == kRegsSs.launch,
              "setmaxnreg: the producer must give up what the consumers take");

// Shared memory (offsets from a 1024-byte aligned base; every swizzled tile 1024-aligned).
constexpr int kTileQ = kBq * kHd * 2;                // 8 KiB: Q or dO of one query block
constexpr int kTileK = kBkv * kHd * 2;               // 16 KiB: K or V of one tile
constexpr int kOffKv = 0;                            // 2 buffers x (K, V)
constexpr int kOffStage = kOffKv + 2 * 2 * kTileK;   // 2 stages x (Q, dO)
constexpr int kOffDsT = kOffStage + 2 * 2 * kTileQ;  // 2 buffers of dS^T [128 keys][64 q] bf16
constexpr int kDqBytes = kBq * kHd * 4;              // 16 KiB: one fp32 dQ partial
constexpr int kOffDq = kOffDsT + 2 * kTileK;         // 2 buffers
constexpr int kRsBytes = kBq * 8;                    // (Stats log2 e, rowsum(dO O)) of 64 rows
constexpr int kOffRs = kOffDq + 2 * kDqBytes;        // 2 stages
constexpr int kOffAccStage = kOffRs + 2 * kRsBytes;  // 2 writers x the sum so far (fp32)
constexpr int kOffBar = kOffAccStage + 2 * kDqBytes;
constexpr int kNumBars = 14;
// Tile slots (2 ints), jobs (2 int4 at +16), the last-of-its-kv-block flag (an int at +48).
constexpr int kOffSlots = kOffBar + kNumBars * 8;
constexpr int kSlotsBytes = 64;
constexpr int kSmemBytes = kOffSlots + kSlotsBytes + 1024;
// A tile's dK and dV in fp32, as the scratch holds them under GQA: [2 warpgroups][16 float4
// slots][128 threads] float4 (each thread's 32 dK then 32 dV values).
constexpr int kPartFloat4s = 2 * 16 * 128;
// The FP8 epilogue's byte tiles (64 rows of 64 bytes, 68 apart as fp8tile's, so the column
// gathers of the transposed stores meet at most 2 words a bank): dK and dV of each compute
// warpgroup.
constexpr int kF8Stride = fp8tile::kStride;
constexpr int kF8Tile = 64 * kF8Stride;
constexpr int kOffF8Kv = (kOffSlots + kSlotsBytes + 127) / 128 * 128;
constexpr int kSmemBytesFp8 = kOffF8Kv + 2 * 2 * kF8Tile + 1024;
static_assert(kSmemBytesFp8 <= 227 * 1024, "the FP8 epilogue's tiles must fit");

struct Params {
  const float2* rowstats;  // [B, H, T]: (Stats log2 e, rowsum(dO O))
  float* dq_acc;           // [B, H, T / 64] blocks of 64 x 64 fp32 (swizzled, see DqOffset)
  int* sems;               // [B, H, T / 64]
  int* counter;            // tiles taken
  float4* dkv_part;        // GQA: [B, KV, T / 128, group] tiles' dK and dV (kPartFloat4s each)
  int* dkv_done;           // GQA: [B, KV, T / 128] tiles of that kv block finished
  bf16* dqkv;
  int B, T, H, KV, nq, nkv, tiles, row_elems;  // row_elems = (H + 2 KV) * 64
  int group;                                   // H / KV: tiles a kv block
  float scale, scale_log2;
  // FP8 outputs (FlashBackwardFp8Out), the kernel's kFp8 form only.
  uint8_t* f8_out;
  uint8_t* f8_out_t;
  const float2* sin_cos;
  const float* f8_scale;
  float* f8_amax;
  int64_t tokens;  // B T: the transposed output's row length
};

// Named barrier over one compute warpgroup (ids 2 and 3; 1 is ComputeBarrier).
__device__ __forceinline__ void EpilogueBarrier(int wg) {
  // Immediate ids: a barrier id in a register makes ptxas reserve all 16 named barriers.
  if (wg == 0) {
    asm volatile("bar.sync 2, 128;" ::: "memory");
  } else {
    asm volatile("bar.sync 3, 128;" ::: "memory");
  }
}

__device__ __forceinline__ uint32_t AbsMax2(uint32_t m, float2 v) {
  return max(m, max(fp8tile::AbsBits(v.x), fp8tile::AbsBits(v.y)));
}

// Copies a 64 x 64 FP8 byte tile (rows kF8Stride apart) out with one warpgroup's threads (t
// this one): row-major (rows `row_stride` bytes apart, 4 bytes a thread at a time) and
// transposed (column c of the tile to out_t + c t_stride).
__device__ __forceinline__ void StoreF8Tile(const uint8_t* tile, uint8_t* out, int64_t row_stride,
                                            uint8_t* out_t, int64_t t_stride, int t) {
  for (int w = t; w < 64 * 16; w += 128) {
    const int row = w / 16, c4 = w % 16 * 4;
    *reinterpret_cast<uint32_t*>(out + row * row_stride + c4) =
        *reinterpret_cast<const uint32_t*>(tile + row * kF8Stride + c4);
  }
  fp8tile::StoreTileTransposed<128>(tile, out_t, t_stride, t);
}

// Float offset of (row, col) in a 64 x 64 fp32 dQ block: 16-byte units XORed with row % 8 inside
// each 128-byte half row, so a warp's float2 stores of 8 rows hit different banks. The global
// partial sums keep the same layout (the bulk copy moves bytes as they are).
__device__ __forceinline__ int DqOffset(int row, int col) {
  return row * 64 + (col ^ ((row & 7) << 2));
}

__device__ __forceinline__ void BulkLoad(void* dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}

__device__ __forceinline__ int LoadAcquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The producer warpgroup's waits give up after kHangNs and trap: a wait that long can only be a
// bug (an iteration takes microseconds), and a trap fails the step with a launch error instead
// of hanging the job, and the GPU, forever. Every cycle of waits in this kernel passes through
// the loader or a writer, so their bounded waits catch any deadlock; the
// compute warpgroups keep the plain wait (a timer there costs registers the MMAs need). The
// timer is read only once the first test has failed.
constexpr uint64_t kHangNs = 10000000000ull;

template <typename Ready>
__device__ __forceinline__ void WaitOrTrap(Ready ready) {
  if (ready()) return;
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (!ready()) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start > kHangNs) __trap();
  }
}

__device__ __forceinline__ void WaitBarrier(uint64_t* bar, uint32_t parity) {
  WaitOrTrap([&] { return MbarTryWait(bar, parity); });
}

__device__ __forceinline__ void WaitSemaphore(const int* sem, int value) {
  WaitOrTrap([&] { return LoadAcquire(sem) == value; });
}

__device__ __forceinline__ void StoreRelease(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// 2^x in one MUFU op, denormal results flushed (P's tiny values round to 0 in bf16 anyway;
// exp2f's denormal handling cost 8% of the kernel).
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Named barrier over the two compute warpgroups (id 1; 0 is __syncthreads).
__device__ __forceinline__ void ComputeBarrier() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// D[64 x 64] (+)= A[64 x 16] B[64 x 16]^T, both K-major tiles in shared memory.
__device__ __forceinline__ void WgmmaSsN64(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                           int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" FORGE_WGMMA_REGS_32
      "}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : FORGE_WGMMA_OUTS_32(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D[64 x 64] (+)= A[64 x 16] B[64 x 16]^T, A from registers (the accumulator layout of an
// m64n16 slice, packed to bf16 pairs), B K-major in shared memory.
__device__ __forceinline__ void WgmmaRsN64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                           int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" FORGE_WGMMA_REGS_32
      "}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : FORGE_WGMMA_OUTS_32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

// D[64 x 64] = A[64 x 64] B[64 x 64]^T over the head width, one commit group: A the warpgroup's
// 64 keys of K or V, from registers (`regs`, four m64n16 slices) or shared memory (`desc_a`),
// B 64 queries of Q or dO in shared memory.
template <bool kARegs>
__device__ __forceinline__ void KeysMma(float (&d)[32], const uint32_t (&regs)[16], uint64_t desc_a,
                                        uint64_t desc_b) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (kARegs) {
      const uint32_t a[4] = {regs[4 * k], regs[4 * k + 1], regs[4 * k + 2], regs[4 * k + 3]};
      WgmmaRsN64(d, a, desc_b + 2 * k, k);
    } else {
      WgmmaSsN64(d, desc_a + 2 * k, desc_b + 2 * k, k);
    }
  }
  WgmmaCommit();
}

// D[64 x 64] += A[64 x 16] B[16 x 64], A from registers (the accumulator layout of an
// m64n16 slice, packed to bf16 pairs), B N-major in shared memory (transposed).
__device__ __forceinline__ void WgmmaRsN64TransB(float (&d)[32], const uint32_t (&a)[4],
                                                 uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" FORGE_WGMMA_REGS_32
      "}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : FORGE_WGMMA_OUTS_32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// D[64 x 32] += A[64 x 16] B[16 x 32], both MN-major in shared memory (transposed).
__device__ __forceinline__ void WgmmaSsN32TransAB(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                  int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" FORGE_WGMMA_REGS_16
      "}, "
      "%16, %17, p, 1, 1, 1, 1;\n}\n"
      : FORGE_WGMMA_OUTS_16(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// Tile `tile` in taking order: (b, kv head, kv block j from the last), and with kSplit one
// query head g of the group (else all of them).
struct TileId {
  int b, kvh, j, kv_block;  // kv_block: (b KV + kvh) nkv + j, dkv_done's index
  int g_begin, g_end;       // the query heads of the group it walks
};
template <bool kSplit>
__device__ __forceinline__ TileId DecodeTile(const Params& p, int tile) {
  TileId id;
  int kt = tile;
  if constexpr (kSplit) {
    id.g_begin = tile % p.group;
    id.g_end = id.g_begin + 1;
    kt = tile / p.group;
  } else {
    id.g_begin = 0;
    id.g_end = p.group;
  }
  id.j = p.nkv - 1 - kt % p.nkv;
  id.kvh = (kt / p.nkv) % p.KV;
  id.b = kt / (p.nkv * p.KV);
  id.kv_block = (id.b * p.KV + id.kvh) * p.nkv + id.j;
  return id;
}

// rowstats[b, h, t] = (Stats log2 e, rowsum(dO O)): 8 threads a row of 64, 16-byte loads.
// Also zeroes the tile counter and the semaphores for the main kernel that follows on the
// stream (so no state carries over from one call, or an aborted one, to the next).
__global__ void FlashBackwardPrepKernel(const bf16* out, const bf16* dout, const float* stats,
                                        float2* rowstats, int* sems, int num_sems, int* counter,
                                        int64_t rows, int T, int H) {
  const int64_t gid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (gid == 0) *counter = 0;
  if (gid < num_sems) sems[gid] = 0;
  const int64_t row = gid / 8;  // (b, t, h) in O's layout
  const int part = int(gid % 8);
  float sum = 0.0f;
  if (row < rows) {
    float o[8], d[8];
    LoadVec<8>(out + row * kHd + part * 8, o);
    LoadVec<8>(dout + row * kHd + part * 8, d);
#pragma unroll
    for (int k = 0; k < 8; ++k) sum = fmaf(o[k], d[k], sum);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 4);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  if (row < rows && part == 0) {
    const int64_t h = row % H, t = (row / H) % T, b = row / (int64_t{H} * T);
    const int64_t idx = (b * H + h) * T + t;
    rowstats[idx] = make_float2(stats[idx] * 1.4426950408889634f, sum);
  }
}

// kFp8: the FP8 epilogue (FlashBackwardFp8Out) instead of the bf16 dQKV stores. kSplit (GQA):
// a tile per query head, dK and dV summed by the kv block's last tile.
template <bool kFp8, bool kSplit>
__global__ void __launch_bounds__(kThreads, 1)
    FlashBackwardKernel(const __grid_constant__ CUtensorMap map_q,   // qkv, 64-row boxes
                        const __grid_constant__ CUtensorMap map_kv,  // qkv, 128-row boxes
                        const __grid_constant__ CUtensorMap map_do,  // dO, 64-row boxes
                        const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = AlignedDynamicSmem(smem_raw);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kOffBar);
  uint64_t* kv_full = bars;        // K, V of a tile landed (tx)
  uint64_t* kv_empty = bars + 2;   // the compute warpgroups are done with that tile
  uint64_t* full = bars + 4;       // a stage's Q, dO and row statistics landed (tx)
  uint64_t* empty = bars + 6;      // the MMAs that read a stage completed
  uint64_t* dq_full = bars + 8;    // a dQ partial (and its job) is in shared memory
  uint64_t* dq_empty = bars + 10;  // the writer is done reading it
  uint64_t* acc_full = bars + 12;  // a writer's load of the sum so far landed (tx)
  int* tile_slot = reinterpret_cast<int*>(smem + kOffSlots);
  int4* jobs = reinterpret_cast<int4*>(smem + kOffSlots + 16);  // (b H + qh, i, j, b)
  int* last_flag = reinterpret_cast<int*>(smem + kOffSlots + 48);
  const int wg = threadIdx.x / 128;
  constexpr RegisterSplit kRegs = kKvInRegisters<kFp8, kSplit> ? kRegsKv : kRegsSs;
  const float f8_scale = kFp8 ? *p.f8_scale : 0.0f;
  uint32_t f8_amax_bits = 0;  // this thread's max |value| of its FP8 outputs (kFp8)

  if (threadIdx.x == 0) {
    for (int k = 0; k < 2; ++k) {
      MbarInit(&kv_full[k], 1);
      MbarInit(&kv_empty[k], 256);
      MbarInit(&full[k], 1);
      MbarInit(&empty[k], 256);
      MbarInit(&dq_full[k], 256);
      MbarInit(&dq_empty[k], 1);
      MbarInit(&acc_full[k], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs.producer) : "memory");
    const int wt = threadIdx.x - 256;
    if (wt == 0) {  // loader
      int it = 0;
      for (int tc = 0;; ++tc) {
        const int buf = tc & 1;
        if (tc >= 2) WaitBarrier(&kv_empty[buf], ((tc >> 1) - 1) & 1);
        const int tile = atomicAdd(p.counter, 1);
        tile_slot[buf] = tile;
        if (tile >= p.tiles) {
          MbarArrive(&kv_full[buf]);
          break;
        }
        const TileId id = DecodeTile<kSplit>(p, tile);
        const int j = id.j, kvh = id.kvh, b = id.b;
        uint8_t* kv = smem + kOffKv + buf * 2 * kTileK;
        MbarExpectTx(&kv_full[buf], 2 * kTileK);
        TmaLoad2d(kv, &map_kv, &kv_full[buf], (p.H + kvh) * kHd, b * p.T + j * kBkv);
        TmaLoad2d(kv + kTileK, &map_kv, &kv_full[buf], (p.H + p.KV + kvh) * kHd,
                  b * p.T + j * kBkv);
        for (int g = id.g_begin; g < id.g_end; ++g) {
          const int qh = kvh * p.group + g;
          for (int i = 2 * j; i < p.nq; ++i, ++it) {
            const int s = it & 1;
            if (it >= 2) WaitBarrier(&empty[s], ((it >> 1) - 1) & 1);
            uint8_t* st = smem + kOffStage + s * 2 * kTileQ;
            MbarExpectTx(&full[s], 2 * kTileQ + kRsBytes);
            TmaLoad2d(st, &map_q, &full[s], qh * kHd, b * p.T + i * kBq);
            TmaLoad2d(st + kTileQ, &map_do, &full[s], qh * kHd, b * p.T + i * kBq);
            BulkLoad(smem + kOffRs + s * kRsBytes,
                     p.rowstats + (size_t(b) * p.H + qh) * p.T + size_t(i) * kBq, kRsBytes,
                     &full[s]);
          }
        }
      }
    } else if (wt / 32 == 1 || wt / 32 == 2) {  // dQ writers: warp 1 buffer 0, warp 2 buffer 1
      const int lane = wt % 32, buf = wt / 32 - 1;
      uint64_t* acc_bar = &acc_full[buf];
      float* acc_s = reinterpret_cast<float*>(smem + kOffAccStage + buf * kDqBytes);
      const float* part = reinterpret_cast<const float*>(smem + kOffDq + buf * kDqBytes);
      int loads = 0;
      for (int n = 0;; ++n) {
        WaitBarrier(&dq_full[buf], n & 1);
        const int4 job = jobs[buf];
        if (job.x < 0) break;
        const int bhq = job.x, i = job.y, j = job.z, b = job.w, qh = bhq % p.H;
        int* sem = p.sems + size_t(bhq) * p.nq + i;
        float* acc = p.dq_acc + (size_t(bhq) * p.nq + i) * (kBq * kHd);
        // Shares are added from the diagonal kv block (i / 2, which stores) down to kv block 0
        // (which writes dQ): order = i / 2 - j. Kv block j reaches query block i two
        // iterations after kv block j + 1 did, so the wait is usually over before it starts.
        const int order = (i >> 1) - j;
        const bool first = order == 0, last = j == 0;
        // Only lane 0 waits (on the semaphore, then on the load), and the warp reconverges
        // right after each wait: lanes parked in an mbarrier wait while lane 0 spins on a
        // divergent path can starve it and hang the kernel.
        if (!first) {
          if (lane == 0) {
            WaitSemaphore(sem, order);
            asm volatile("fence.proxy.async.global;" ::: "memory");  // the bulk ops come after
          }
          __syncwarp();
        }
        if (last) {  // the sum so far + this share, scaled, in bf16 into dQ
          if (!first) {
            if (lane == 0) {
              MbarExpectTx(acc_bar, kDqBytes);
              BulkLoad(acc_s, acc, kDqBytes, acc_bar);
              WaitBarrier(acc_bar, loads & 1);
            }
            ++loads;
            __syncwarp();
          }
          bf16* dst = p.dqkv + (size_t(b) * p.T + size_t(i) * kBq) * p.row_elems + qh * kHd;
#pragma unroll 4
          for (int f = lane; f < kBq * kHd / 4; f += 32) {
            float4 v = reinterpret_cast<const float4*>(part)[f];
            if (!first) {
              const float4 a = reinterpret_cast<const float4*>(acc_s)[f];
              v = make_float4(a.x + v.x, a.y + v.y, a.z + v.z, a.w + v.w);
            }
            const int row = f / 16, col = ((f % 16) * 4) ^ ((row & 7) << 2);
            const uint2 o = {PackBf16x2(v.x * p.scale, v.y * p.scale),
                             PackBf16x2(v.z * p.scale, v.w * p.scale)};
            *reinterpret_cast<uint2*>(dst + size_t(row) * p.row_elems + col) = o;
          }
          __syncwarp();
          if (lane == 0) MbarArrive(&dq_empty[buf]);
        } else if (lane == 0) {  // store (the first share) or add this one with the bulk engine
          if (first) {
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(acc),
                         "r"(SmemAddr(part)), "n"(kDqBytes)
                         : "memory");
          } else {
            asm volatile(
                "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(
                    acc),
                "r"(SmemAddr(part)), "n"(kDqBytes)
                : "memory");
          }
          BulkCommit();
          BulkWaitRead();
          MbarArrive(&dq_empty[buf]);
          BulkWait();
          asm volatile("fence.proxy.async.global;" ::: "memory");
          __threadfence();
          StoreRelease(sem, order + 1);
        }
        __syncwarp();
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs.consumer) : "memory");
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32, quad = lane % 4;
  const int r0 = warp * 16 + lane / 4;  // this thread's first row of the warpgroup's 64
  int it = 0;
  for (int tc = 0;; ++tc) {
    const int buf = tc & 1;
    MbarWait(&kv_full[buf], (tc >> 1) & 1);
    const int tile = tile_slot[buf];
    if (tile >= p.tiles) break;
    const TileId id = DecodeTile<kSplit>(p, tile);
    const int j = id.j, kvh = id.kvh, b = id.b;
    const uint8_t* ks = smem + kOffKv + buf * 2 * kTileK;
    const uint8_t* kw = ks + wg * (kTileK / 2);  // this warpgroup's 64 keys of K and V
    const uint8_t* vw = kw + kTileK;
    const uint64_t desc_kt = SmemDescNMajor(ks + 64 * wg);
    // K and V of this warpgroup's 64 keys as the A operand of S^T = K Q^T and dP^T = V dO^T,
    // held in registers for the whole tile (the accumulator layout of an m64n16 slice: rows r0
    // and r0 + 8, columns 16 kk + 2 quad + {0, 1} and + 8), so those MMAs read only Q and dO
    // from shared memory: with both operands there, MMAs of n 64 use up its bandwidth (8-9%
    // faster at llama3-1b's shape).
    constexpr bool kKvRegs = kKvInRegisters<kFp8, kSplit>;
    const uint64_t desc_k = SmemDesc(kw), desc_v = SmemDesc(vw);
    uint32_t ka[16], va[16];
#pragma unroll
    for (int kk = 0; kk < (kKvRegs ? 4 : 0); ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int row = r0 + 8 * rr;
          const int off = row * 128 + (((2 * kk + h) ^ (row & 7)) << 4) + 4 * quad;
          ka[4 * kk + 2 * h + rr] = *reinterpret_cast<const uint32_t*>(kw + off);
          va[4 * kk + 2 * h + rr] = *reinterpret_cast<const uint32_t*>(vw + off);
        }
      }
    }
    float dv[32], dk[32];
#pragma unroll
    for (int k = 0; k < 32; ++k) dv[k] = dk[k] = 0.0f;
    for (int g = id.g_begin; g < id.g_end; ++g) {
      const int qh = kvh * p.group + g;
      for (int i = 2 * j; i < p.nq; ++i, ++it) {
        const int s = it & 1;
        MbarWait(&full[s], (it >> 1) & 1);
        const uint8_t* qs = smem + kOffStage + s * 2 * kTileQ;
        const uint8_t* dos = qs + kTileQ;
        const float4* rs = reinterpret_cast<const float4*>(smem + kOffRs + s * kRsBytes);
        float st[32], dpt[32];
        const uint64_t dqd = SmemDesc(qs), ddo = SmemDesc(dos);
        WgmmaFence();
        KeysMma<kKvRegs>(st, ka, desc_k, dqd);
        KeysMma<kKvRegs>(dpt, va, desc_v, ddo);
        // This thread's 16 query columns: 8 nj + 2 quad + {0, 1}.
        float lse[16], dd[16];
#pragma unroll
        for (int nj = 0; nj < 8; ++nj) {
          const float4 v = rs[4 * nj + quad];
          lse[2 * nj] = v.x;
          dd[2 * nj] = v.y;
          lse[2 * nj + 1] = v.z;
          dd[2 * nj + 1] = v.w;
        }
        WgmmaWait<1>();
        const bool diag = i < 2 * j + 2;
        const int key0 = j * kBkv + wg * 64 + r0, q0 = i * kBq + 2 * quad;
#pragma unroll
        for (int nj = 0; nj < 8; ++nj) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = Exp2Ftz(fmaf(st[4 * nj + e], p.scale_log2, -lse[2 * nj + (e & 1)]));
            if (diag && key0 + 8 * (e >> 1) > q0 + 8 * nj + (e & 1)) x = 0.0f;
            st[4 * nj + e] = x;
          }
        }
        WgmmaWait<0>();
        uint32_t pa[16], da[16];
#pragma unroll
        for (int nj = 0; nj < 8; ++nj) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            dpt[4 * nj + e] = st[4 * nj + e] * (dpt[4 * nj + e] - dd[2 * nj + (e & 1)]);
        }
#pragma unroll
        for (int x = 0; x < 16; ++x) {
          pa[x] = PackBf16x2(st[2 * x], st[2 * x + 1]);
          da[x] = PackBf16x2(dpt[2 * x], dpt[2 * x + 1]);
        }
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const uint32_t a[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
          WgmmaRsN64TransB(dv, a, SmemDescNMajor(dos) + 128 * kk);
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const uint32_t a[4] = {da[4 * kk], da[4 * kk + 1], da[4 * kk + 2], da[4 * kk + 3]};
          WgmmaRsN64TransB(dk, a, SmemDescNMajor(qs) + 128 * kk);
        }
        WgmmaCommit();
        // dS^T (bf16, [128 keys][64 queries], the 128-byte swizzle) for dQ = dS K.
        uint8_t* ds_s = smem + kOffDsT + (it & 1) * kTileK;
#pragma unroll
        for (int nj = 0; nj < 8; ++nj) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = wg * 64 + r0 + 8 * h;
            *reinterpret_cast<uint32_t*>(ds_s + StagedOffset(row, nj, quad)) = da[2 * nj + h];
          }
        }
        FenceProxyAsyncShared();
        ComputeBarrier();  // both warpgroups' halves of dS^T written
        float dq[16];
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          WgmmaSsN32TransAB(dq, SmemDescNMajor(ds_s) + 128 * kk, desc_kt + 128 * kk, kk);
        }
        WgmmaCommit();
        WgmmaWait<0>();
        MbarArrive(&empty[s]);
        const int db = it & 1;
        if (it >= 2) MbarWait(&dq_empty[db], ((it >> 1) - 1) & 1);
        float* dqs = reinterpret_cast<float*>(smem + kOffDq + db * kDqBytes);
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = r0 + 8 * h, col = wg * 32 + 8 * nj + 2 * quad;
            *reinterpret_cast<float2*>(dqs + DqOffset(row, col)) =
                make_float2(dq[4 * nj + 2 * h], dq[4 * nj + 2 * h + 1]);
          }
        }
        if (t == 0 && wg == 0) jobs[db] = make_int4(b * p.H + qh, i, j, b);
        FenceProxyAsyncShared();
        MbarArrive(&dq_full[db]);
      }
    }
    MbarArrive(&kv_empty[buf]);  // the tile's last MMAs (that read K) have completed
    if constexpr (kSplit) {
      // This query head's dK and dV into the scratch; the group's last tile sums them all.
      float4* part = p.dkv_part + size_t(id.kv_block * p.group + id.g_begin) * kPartFloat4s +
                     wg * 16 * 128 + t;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        part[k * 128] = make_float4(dk[4 * k], dk[4 * k + 1], dk[4 * k + 2], dk[4 * k + 3]);
        part[(8 + k) * 128] = make_float4(dv[4 * k], dv[4 * k + 1], dv[4 * k + 2], dv[4 * k + 3]);
      }
      __threadfence();
      ComputeBarrier();
      if (threadIdx.x == 0) *last_flag = atomicAdd(p.dkv_done + id.kv_block, 1) == p.group - 1;
      ComputeBarrier();
      if (!*last_flag) continue;
      __threadfence();
      const float4* parts = p.dkv_part + size_t(id.kv_block) * p.group * kPartFloat4s +
                            wg * 16 * 128 + t;
#pragma unroll
      for (int k = 0; k < 32; ++k) dk[k] = dv[k] = 0.0f;
      for (int g = 0; g < p.group; ++g, parts += kPartFloat4s) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float4 a = __ldcg(parts + k * 128), c = __ldcg(parts + (8 + k) * 128);
          dk[4 * k] += a.x, dk[4 * k + 1] += a.y, dk[4 * k + 2] += a.z, dk[4 * k + 3] += a.w;
          dv[4 * k] += c.x, dv[4 * k + 1] += c.y, dv[4 * k + 2] += c.z, dv[4 * k + 3] += c.w;
        }
      }
    }
    const size_t tok = size_t(b) * p.T + size_t(j) * kBkv + wg * 64;
    if constexpr (kFp8) {
      // dK rotated back and dV, in E5M2, through this warpgroup's two byte tiles.
      uint8_t* tk = smem + kOffF8Kv + wg * 2 * kF8Tile;
      uint8_t* tv = tk + kF8Tile;
      EpilogueBarrier(wg);  // the previous tile's stores have read both tiles
#pragma unroll
      for (int nj = 0; nj < 8; ++nj) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = r0 + 8 * h, col = 8 * nj + 2 * quad;
          const float2 k2 = RopeRotateBackBf16(
              make_float2(fp8tile::RoundBf16(dk[4 * nj + 2 * h] * p.scale),
                          fp8tile::RoundBf16(dk[4 * nj + 2 * h + 1] * p.scale)),
              __ldg(p.sin_cos + (j * kBkv + wg * 64 + row) * (kHd / 2) + col / 2));
          const float2 v2 = make_float2(fp8tile::RoundBf16(dv[4 * nj + 2 * h]),
                                        fp8tile::RoundBf16(dv[4 * nj + 2 * h + 1]));
          f8_amax_bits = AbsMax2(AbsMax2(f8_amax_bits, k2), v2);
          *reinterpret_cast<uint16_t*>(tk + row * kF8Stride + col) =
              static_cast<uint16_t>(fp8tile::ToFp8x2<__NV_E5M2>(k2.x * f8_scale, k2.y * f8_scale));
          *reinterpret_cast<uint16_t*>(tv + row * kF8Stride + col) =
              static_cast<uint16_t>(fp8tile::ToFp8x2<__NV_E5M2>(v2.x * f8_scale, v2.y * f8_scale));
        }
      }
      EpilogueBarrier(wg);
      const int64_t ck = int64_t{p.H + kvh} * kHd, cv = int64_t{p.H + p.KV + kvh} * kHd;
      StoreF8Tile(tk, p.f8_out + tok * p.row_elems + ck, p.row_elems,
                  p.f8_out_t + ck * p.tokens + tok, p.tokens, t);
      StoreF8Tile(tv, p.f8_out + tok * p.row_elems + cv, p.row_elems,
                  p.f8_out_t + cv * p.tokens + tok, p.tokens, t);
    } else {
      bf16* rows = p.dqkv + tok * p.row_elems;
#pragma unroll
      for (int nj = 0; nj < 8; ++nj) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          bf16* row = rows + size_t(r0 + 8 * h) * p.row_elems + 8 * nj + 2 * quad;
          *reinterpret_cast<uint32_t*>(row + (p.H + kvh) * kHd) =
              PackBf16x2(dk[4 * nj + 2 * h] * p.scale, dk[4 * nj + 2 * h + 1] * p.scale);
          *reinterpret_cast<uint32_t*>(row + (p.H + p.KV + kvh) * kHd) =
              PackBf16x2(dv[4 * nj + 2 * h], dv[4 * nj + 2 * h + 1]);
        }
      }
    }
  }
  if (kFp8 && p.f8_amax) fp8tile::WarpAmaxToGlobal(f8_amax_bits, p.f8_amax, lane);
  // Tell both writers there is no more.
  for (int k = it; k < it + 2; ++k) {
    const int db = k & 1;
    if (k >= 2) MbarWait(&dq_empty[db], ((k >> 1) - 1) & 1);
    if (t == 0 && wg == 0) jobs[db] = make_int4(-1, 0, 0, 0);
    MbarArrive(&dq_full[db]);
  }
}

size_t Align256(size_t n) { return (n + 255) & ~size_t(255); }

// rowstats, dq_acc, then the ints the prep kernel zeroes (the query blocks' semaphores and,
// under GQA, the kv blocks' finished-tile counts, one run), the tile counter, and under GQA the
// tiles' dK and dV.
struct ScratchLayout {
  size_t rowstats = 0, dq_acc = 0, sems = 0, dkv_done = 0, counter = 0, dkv_part = 0, total = 0;
  int zeroed = 0;  // ints from sems on
};

ScratchLayout Layout(const FlashBackwardShape& s) {
  const size_t rows = size_t(s.B) * s.H * s.T;
  const int group = s.H / s.KV, num_sems = s.B * s.H * (s.T / kBq);
  const int kv_blocks = group > 1 ? s.B * s.KV * (s.T / kBkv) : 0;
  ScratchLayout l;
  l.rowstats = 0;
  l.dq_acc = Align256(rows * sizeof(float2));
  l.sems = l.dq_acc + Align256(rows * kHd * sizeof(float));
  l.dkv_done = l.sems + size_t(num_sems) * sizeof(int);
  l.zeroed = num_sems + kv_blocks;
  l.counter = l.sems + Align256(size_t(l.zeroed) * sizeof(int));
  l.dkv_part = l.counter + 256;
  l.total = l.dkv_part + size_t(kv_blocks) * group * kPartFloat4s * sizeof(float4);
  return l;
}

}  // namespace

Status FlashBackwardSupports(const FlashBackwardShape& s) {
  if (s.hd != kHd) return Status::Invalid("FlashBackward: head width must be 64");
  if (s.B <= 0 || s.T <= 0 || s.T % kBkv)
    return Status::Invalid("FlashBackward: T must be a positive multiple of 128");
  if (s.H <= 0 || s.KV <= 0 || s.H % s.KV)
    return Status::Invalid("FlashBackward: H must be a positive multiple of KV");
  return CheckSm90("FlashBackward");
}

size_t FlashBackwardScratchBytes(const FlashBackwardShape& s) { return Layout(s).total; }

Status FlashBackward(const FlashBackwardShape& s, const bf16* qkv, const bf16* out,
                     const bf16* dout, const float* stats, bf16* dqkv, void* scratch,
                     cudaStream_t stream, const FlashBackwardFp8Out* fp8) {
  FORGE_RETURN_IF_ERROR(FlashBackwardSupports(s));
  if (fp8 != nullptr) {
    FORGE_RETURN_IF_ERROR(CheckFp8CastArgs("FlashBackward (FP8 outputs)", DType::kE5M2, fp8->scale,
                                           fp8->amax, fp8->scale_inv));
    if (!fp8->out || !fp8->out_t || !IsAligned(fp8->out, 16) || !IsAligned(fp8->out_t, 16) ||
        !fp8->rope_sin_cos) {
      return Status::Invalid(
          "FlashBackward (FP8 outputs): out and out_t (16-byte aligned) and RoPE's (sin, cos) "
          "table are required");
    }
  }
  if (dqkv == nullptr) return Status::Invalid("FlashBackward: no dqkv output");
  const ScratchLayout l = Layout(s);
  char* base = static_cast<char*>(scratch);
  Params p{};
  p.rowstats = reinterpret_cast<const float2*>(base + l.rowstats);
  p.dq_acc = reinterpret_cast<float*>(base + l.dq_acc);
  p.sems = reinterpret_cast<int*>(base + l.sems);
  p.counter = reinterpret_cast<int*>(base + l.counter);
  p.dkv_part = reinterpret_cast<float4*>(base + l.dkv_part);
  p.dkv_done = reinterpret_cast<int*>(base + l.dkv_done);
  p.dqkv = dqkv;
  p.B = s.B;
  p.T = s.T;
  p.H = s.H;
  p.KV = s.KV;
  p.nq = s.T / kBq;
  p.nkv = s.T / kBkv;
  p.group = s.H / s.KV;
  const bool split = p.group > 1;
  p.tiles = s.B * (split ? s.H : s.KV) * p.nkv;
  p.row_elems = (s.H + 2 * s.KV) * kHd;
  p.scale = 1.0f / 8.0f;  // 1 / sqrt(64)
  p.scale_log2 = p.scale * 1.4426950408889634f;
  p.tokens = int64_t{s.B} * s.T;
  if (fp8 != nullptr) {
    p.f8_out = static_cast<uint8_t*>(fp8->out);
    p.f8_out_t = static_cast<uint8_t*>(fp8->out_t);
    p.sin_cos = fp8->rope_sin_cos;
    p.f8_scale = fp8->scale;
    p.f8_amax = fp8->amax;
  }

  CUtensorMap map_q, map_kv, map_do;
  const int64_t tokens = p.tokens;
  FORGE_RETURN_IF_ERROR(SwizzledMap(qkv, tokens, p.row_elems, kBq, &map_q));
  FORGE_RETURN_IF_ERROR(SwizzledMap(qkv, tokens, p.row_elems, kBkv, &map_kv));
  FORGE_RETURN_IF_ERROR(SwizzledMap(dout, tokens, int64_t{s.H} * kHd, kBq, &map_do));

  const int64_t rows = tokens * s.H;
  const int64_t prep_threads = std::max(rows * 8, int64_t{l.zeroed});
  FlashBackwardPrepKernel<<<unsigned((prep_threads + 255) / 256), 256, 0, stream>>>(
      out, dout, stats, reinterpret_cast<float2*>(base + l.rowstats), p.sems, l.zeroed,
      p.counter, rows, s.T, s.H);
  FORGE_CUDA_LAUNCH_CHECK();

  FORGE_ASSIGN_OR_RETURN(const int sms, DeviceSmCount());
  const auto kernel = fp8 != nullptr ? (split ? FlashBackwardKernel<true, true>
                                               : FlashBackwardKernel<true, false>)
                                     : (split ? FlashBackwardKernel<false, true>
                                              : FlashBackwardKernel<false, false>);
  const int smem_bytes = fp8 != nullptr ? kSmemBytesFp8 : kSmemBytes;
  FORGE_RETURN_IF_ERROR(AllowDynamicSmem(kernel, smem_bytes));
  FORGE_RETURN_IF_ERROR(
      CheckLaunchRegisters(reinterpret_cast<const void*>(kernel), kRegsKv.launch, "FlashBackward"));
  kernel<<<std::min(p.tiles, sms), kThreads, smem_bytes, stream>>>(map_q, map_kv, map_do, p);
  FORGE_CUDA_LAUNCH_CHECK();
  if (fp8 == nullptr) return Status::Ok();
  // dQ's rotation and casts, from the bf16 dQ the writers left (see flash_backward.h); this
  // pass also writes *scale_inv.
  return RopeBackwardFp8(fp8->out, fp8->out_t, dqkv, s.B, s.T, s.H, s.KV, kHd, fp8->rope_sin_cos,
                         DType::kE5M2, fp8->scale, fp8->amax, fp8->scale_inv, stream,
                         /*first_heads=*/s.H);
}

}  // namespace forge::cuda
