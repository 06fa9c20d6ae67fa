// What each data-parallel mode keeps on a rank and what it moves, decided once from the config
// and the world size: the one statement of parallel.mode that the CPU backend, the CUDA backend
// (cuda_backend.cc, cuda_data_parallel.h) and the memory estimate follow. The collectives that
// carry them out are mode_executor.h's, which both backends call with their own buffers (the
// GPU unit by unit, overlapped with the backward; the CPU after the backward), so a mode means
// the same on both.
//
//          kept between steps (per rank)          gradient after the backward     after AdamW
//   ddp    params, gradient, moments: full        all-reduced                     -
//   zero1  params, gradient: full; moments: slot  reduce-scattered into a slot    params all-gathered
//   zero2  params: full; gradient, moments: slot  reduce-scattered, full freed    params all-gathered
//   fsdp   params, gradient, moments: slots       reduce-scattered, full freed    - (gathered before use)
//   hsdp   fsdp within each shard group (hybrid_groups.h), the gradient slots then all-reduced
//          over the replica group
//
// A slot is this rank's 1/shard_world of a unit (shard_layout.h). Every sharded mode sums the
// gradient norm's squares over the shard group; ddp's reduced gradient is whole on every rank,
// so its norm is local. hsdp with shard groups of one rank is ddp, with one group of the whole
// world fsdp. On one rank the rules stay those of the mode, over slots of the whole unit: the
// CPU backend runs them so (one code path for every world size); the CUDA backend has no
// data parallelism on one GPU.
#pragma once

#include "common/config.h"

namespace forge {

struct ModeRules {
  ParallelMode mode = ParallelMode::kDdp;  // as resolved (above)
  int shard_world = 1;  // ranks the state is sharded over (1: not sharded)
  bool shard_optimizer = false;       // master weights and moments: this rank's slot only
  bool shard_params = false;          // the params too, gathered before use
  bool free_full_grads = false;       // no full gradient outlives its reduce-scatter
  bool gather_after_update = false;   // updated slots all-gathered into the full params
  bool reduce_over_replicas = false;  // gradient slots (and the loss) summed over replicas too

  // Sharded modes reduce-scatter the gradient into slots; ddp all-reduces it.
  bool sharded() const { return shard_optimizer; }
};

// The rules of p.mode on `world` ranks. hsdp's parallel.shard_group_size must divide the world
// (CheckShardGroupSize); a size outside [1, world] is taken as the nearest of the two.
ModeRules ModeRulesFor(const ParallelConfig& p, int world);

}  // namespace forge
