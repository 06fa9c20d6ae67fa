// How a unit's flat parameter buffer (param_layout.h) is split over the ranks for ZeRO, FSDP
// and sharded checkpoints. One rule, used by every backend and by the checkpoint format:
//
//   A unit of n elements over W ranks has shard size S = round_up(ceil(n / W), kShardAlign)
//   and padded size P = W * S. Rank r owns elements [min(r*S, n), min((r+1)*S, n)): W
//   contiguous slices in rank order, equal except for the last non-empty one(s), which are
//   shorter or empty (a small unit may live on the first rank(s) only).
//
// Collectives run on padded buffers of P elements (NCCL's reduce-scatter/all-gather need equal
// counts per rank): rank r's slot is [r*S, (r+1)*S); elements [n, P) are padding (zero in
// gradients, ignored in parameters). Aligning S to kShardAlign elements keeps every slot on a
// 128-byte boundary in fp32 (64 bytes in bf16) for vectorised device kernels.
#pragma once

#include <algorithm>
#include <cstdint>

namespace forge {

inline constexpr int64_t kShardAlign = 32;

struct ShardRange {
  int64_t begin = 0, end = 0;  // element range within the unit
  int64_t size() const { return end - begin; }
};

// S: elements per rank slot (0 only for an empty unit).
inline int64_t ShardSize(int64_t numel, int world) {
  const int64_t per = (numel + world - 1) / world;
  return (per + kShardAlign - 1) / kShardAlign * kShardAlign;
}

// P = world * S.
inline int64_t PaddedSize(int64_t numel, int world) { return ShardSize(numel, world) * world; }

// The elements rank `rank` owns (possibly empty).
inline ShardRange ShardOf(int64_t numel, int rank, int world) {
  const int64_t s = ShardSize(numel, world);
  return {std::min(numel, s * rank), std::min(numel, s * (rank + 1))};
}

}  // namespace forge
