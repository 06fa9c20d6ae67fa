#include "worker/parallel/mode_rules.h"

#include <algorithm>

namespace forge {

ModeRules ModeRulesFor(const ParallelConfig& p, int world) {
  ModeRules r;
  world = std::max(1, world);
  ParallelMode mode = p.mode;
  int shard_world = world;
  if (mode == ParallelMode::kHsdp) {
    shard_world = std::clamp(p.shard_group_size, 1, world);
    if (shard_world == world) {
      mode = ParallelMode::kFsdp;
    } else if (shard_world == 1) {
      mode = ParallelMode::kDdp;
    }
  }
  r.mode = mode;
  if (mode == ParallelMode::kDdp) return r;
  r.shard_world = shard_world;
  r.shard_optimizer = true;
  r.shard_params = mode == ParallelMode::kFsdp || mode == ParallelMode::kHsdp;
  r.free_full_grads = mode != ParallelMode::kZero1;
  r.gather_after_update = mode == ParallelMode::kZero1 || mode == ParallelMode::kZero2;
  r.reduce_over_replicas = mode == ParallelMode::kHsdp;
  return r;
}

}  // namespace forge
