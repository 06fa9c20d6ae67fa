// hsdp's two groupings of a world of W = R x G ranks (G = parallel.shard_group_size, R = W/G):
//
//   shard group i    ranks iG .. iG+G-1 (consecutive: the GPUs of one node). The model's state
//                    is sharded over it exactly as fsdp shards it over a world of G
//                    (model/shard_layout.h, world G); its collectives (all-gather of the params,
//                    reduce-scatter of the gradients) stay on the fast intra-node links.
//   replica group j  ranks j, G+j, 2G+j, ... : the ranks that hold shard j. After the
//                    reduce-scatter, each gradient shard is all-reduced over it (1/G of the
//                    gradient crosses the slow inter-node links), so every replica group holds
//                    bitwise the same shards, moments and weights.
//
// Rank r = iG + j is rank j of shard group i and rank i of replica group j.
//
// Data order. The CPU backend sums gradients in the canonical order of sum_order.h, which for
// W a power of two splits the global micro-steps by their index mod 2, mod 4, ... The
// two-level sum (shard group first, then replicas) is that order when the micro-steps of the
// ranks of one shard group are R apart: rank iG + j reads the micro-steps at data position
// p = jR + i (micro-steps kW + p). Then the first log2 R splits separate the replica index i,
// and the rest is the canonical sum over the shard group: hsdp on R x G ranks (both powers of
// two) is bitwise one process, as ddp and fsdp are. For every other mode p = r.
#pragma once

#include <memory>

#include "common/config.h"
#include "common/status.h"
#include "worker/parallel/comm.h"

namespace forge {

struct HybridGroups {
  int shard_size = 1;  // G
  int replicas = 1;    // R
  int shard_rank = 0;  // j: rank within the shard group
  int replica_rank = 0;  // i: rank within the replica group (= which shard group)
};

// Error naming parallel.shard_group_size unless it divides the world (hsdp only; Ok for every
// other mode).
Status CheckShardGroupSize(const ParallelConfig& p, int world);

// The groups of `rank` (hsdp; precondition: CheckShardGroupSize is Ok).
HybridGroups HybridGroupsOf(int rank, int world, int shard_group_size);

// The data position of `rank` (see above): the sampler's rank argument (data/sampler.h).
int DataRank(const ParallelConfig& p, int rank, int world);

// The two sub-communicators of hsdp, split from `world` (collective over it: every rank calls
// it at the same point). A group of one rank gets a world-1 local comm.
struct HybridComms {
  std::unique_ptr<Comm> shard;    // the shard group: world G, rank j
  std::unique_ptr<Comm> replica;  // the replica group: world R, rank i
};
StatusOr<HybridComms> SplitHybridComms(Comm* world, int shard_group_size);

}  // namespace forge
