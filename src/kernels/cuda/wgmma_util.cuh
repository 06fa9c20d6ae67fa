// Hopper building blocks shared by our warpgroup-MMA kernels (gemm_wgmma.cu, flash_backward.cu):
// mbarriers, TMA loads and stores, shared-memory matrix descriptors for tiles in the 128-byte
// swizzle, wgmma's fence / commit / wait and named barriers. Device code only; the host side
// (tensor maps, the register check) is tma_map.h.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace forge::cuda {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The kernel's dynamic shared memory aligned to 1024 bytes (the 128-byte swizzle's pattern)
// by pointer arithmetic on the shared array itself, so the compiler still knows that every
// access through it is to shared memory (ld/st.shared). Rounding the address as an integer
// lost that: every staged load and store became a generic one, which waits on the L1TEX
// scoreboard like a global load (0.6-0.8 ms a gpt350m step: docs/performance.md).
__device__ __forceinline__ uint8_t* AlignedDynamicSmem(uint8_t* raw) {
  return raw + ((1024u - (SmemAddr(raw) & 1023u)) & 1023u);
}

__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count));
}

__device__ __forceinline__ void MbarExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}

// The register split of a warp-specialised CTA (setmaxnreg): its producer warpgroup shrinks to
// `producer` registers a thread and its `consumer_wgs` compute warpgroups grow to `consumer`.
// The CTA starts with ptxas's allocation, `launch` a thread (checked at launch:
// CheckLaunchRegisters), and an .inc that the pool cannot cover waits forever (a split asking
// 208 with only 96 given up hangs): fits() must hold.
struct RegisterSplit {
  int launch, producer, consumer, consumer_wgs;
  constexpr bool fits() const {
    return (launch - producer) * 128 >= (consumer - launch) * 128 * consumer_wgs;
  }
};

// One mbarrier.try_wait (the hardware may suspend the thread for a while before it answers):
// whether the phase of the given parity has completed.
__device__ __forceinline__ bool MbarTryWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(SmemAddr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  while (!MbarTryWait(bar, parity)) {
  }
}

__device__ __forceinline__ void TmaLoad2d(void* dst, const CUtensorMap* map, uint64_t* bar, int x,
                                          int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(SmemAddr(bar)), "r"(x), "r"(y)
      : "memory");
}

// Shared-memory matrix descriptor of a K-major tile written by TMA with the 128-byte swizzle:
// rows of 64 bf16 (128 bytes), 8-row groups 1024 bytes apart (stride byte offset); the leading
// byte offset is unused for this swizzle.
__device__ __forceinline__ uint64_t SmemDesc(const void* p) {
  const uint64_t addr = SmemAddr(p);
  uint64_t desc = (addr & 0x3FFFF) >> 4;
  desc |= uint64_t(1) << 16;
  desc |= uint64_t(1024 >> 4) << 32;
  desc |= uint64_t(1) << 62;
  return desc;
}

// The same for an N-major B tile: four 64-column chunks of 64 K-rows x 128 bytes, 8 KiB apart
// (leading byte offset: from one 64-column chunk to the next), 8-row groups along K 1024 bytes
// apart (stride byte offset). Advancing K by 16 rows moves the start by 2048 bytes.
constexpr int kNMajorChunkBytes = 64 * 128;
__device__ __forceinline__ uint64_t SmemDescNMajor(const void* p) {
  const uint64_t addr = SmemAddr(p);
  uint64_t desc = (addr & 0x3FFFF) >> 4;
  desc |= uint64_t(kNMajorChunkBytes >> 4) << 16;
  desc |= uint64_t(1024 >> 4) << 32;
  desc |= uint64_t(1) << 62;
  return desc;
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void TmaStore2d(const CUtensorMap* map, const void* src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(SmemAddr(src)), "r"(x), "r"(y)
               : "memory");
}

// Generic-proxy writes to shared memory made visible to the async proxy (wgmma, TMA and bulk
// copies) that reads them next.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The bulk copy engine's groups (TMA stores, bulk copies and reductions from shared memory):
// close the group of the operations issued so far; wait until at most 0 groups are pending,
// either only their reads of shared memory (the buffer may be rewritten) or their writes too.
__device__ __forceinline__ void BulkCommit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void BulkWait() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Named barrier over one consumer warpgroup (ids 1 and 2; 0 is __syncthreads).
__device__ __forceinline__ void WarpgroupBarrier(int wg) {
  asm volatile("bar.sync %0, 128;" ::"r"(wg + 1) : "memory");
}

// Byte offset of the bf16 pair at (row, column 8 * unit + 2 * quad) in a staged 64-column chunk
// (128-byte rows, 128-byte swizzle: the 16-byte unit is XORed with row % 8, as TMA expects; a
// warp's 8 rows x 4 quads then land on 32 different banks).
__device__ __forceinline__ uint32_t StagedOffset(int row, int unit, int quad) {
  return uint32_t(row * 128 + ((unit ^ (row % 8)) * 16) + quad * 4);
}

}  // namespace forge::cuda
