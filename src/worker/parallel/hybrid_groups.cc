#include "worker/parallel/hybrid_groups.h"

#include <string>

namespace forge {

Status CheckShardGroupSize(const ParallelConfig& p, int world) {
  if (p.mode != ParallelMode::kHsdp) return Status::Ok();
  const int g = p.shard_group_size;
  if (g < 1 || world % g != 0)
    return Status::Invalid("parallel.shard_group_size (" + std::to_string(g) +
                           ") must divide the world size (" + std::to_string(world) +
                           "): hsdp splits the ranks into groups of that many consecutive ranks");
  return Status::Ok();
}

HybridGroups HybridGroupsOf(int rank, int world, int shard_group_size) {
  HybridGroups h;
  h.shard_size = shard_group_size;
  h.replicas = world / shard_group_size;
  h.shard_rank = rank % shard_group_size;
  h.replica_rank = rank / shard_group_size;
  return h;
}

int DataRank(const ParallelConfig& p, int rank, int world) {
  if (p.mode != ParallelMode::kHsdp || !CheckShardGroupSize(p, world).ok()) return rank;
  const HybridGroups h = HybridGroupsOf(rank, world, p.shard_group_size);
  return h.shard_rank * h.replicas + h.replica_rank;
}

StatusOr<HybridComms> SplitHybridComms(Comm* world, int shard_group_size) {
  ParallelConfig p;
  p.mode = ParallelMode::kHsdp;
  p.shard_group_size = shard_group_size;
  FORGE_RETURN_IF_ERROR(CheckShardGroupSize(p, world->world()));
  const HybridGroups h = HybridGroupsOf(world->rank(), world->world(), shard_group_size);
  HybridComms out;
  // Keys are the world rank, so each group keeps the world's rank order (j and i above).
  FORGE_ASSIGN_OR_RETURN(out.shard,
                         world->Split(h.replica_rank, world->rank(), "hsdp shard group"));
  FORGE_ASSIGN_OR_RETURN(out.replica,
                         world->Split(h.shard_rank, world->rank(), "hsdp replica group"));
  if (out.shard->world() != h.shard_size || out.shard->rank() != h.shard_rank ||
      out.replica->world() != h.replicas || out.replica->rank() != h.replica_rank)
    return Status::Internal("hsdp: the split communicators do not have the expected shape");
  return out;
}

}  // namespace forge
