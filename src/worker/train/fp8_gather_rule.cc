#include "worker/train/fp8_gather_rule.h"

#include <cstdint>

#include <algorithm>

#include "worker/model/param_layout.h"
#include "worker/model/shard_layout.h"
#include "worker/parallel/mode_rules.h"

namespace forge {

Fp8GatherChoice ChooseFp8Gather(const ModelConfig& m, Fp8Recipe recipe, int shard_world,
                                bool enabled) {
  // Every block has one layout; the layout of one block is the layout of all.
  ModelConfig one = m;
  one.n_layer = 1;
  // Widths beyond 2^24 are no device's (and their block would overflow the layout's sums).
  const int64_t kWidest = int64_t{1} << 24;
  const int64_t widths[] = {m.d_model, m.ffn, (int64_t{m.n_head} + 2 * m.n_kv_head) * m.head_dim()};
  bool addressable = true;
  for (int64_t w : widths) addressable = addressable && w > 0 && w <= kWidest;
  const char* why = nullptr;
  if (!enabled) {
    why = "the FP8 gather is off";
  } else if (recipe != Fp8Recipe::kDelayed) {
    why = "current scaling takes each cast's scale from the whole weight's amax, which no "
          "rank's slot knows before the cast";
  } else if (!addressable) {
    why = "a weight is wider than 2^24 elements";
  } else {
    const ParamLayout layout = MakeParamLayout(one);
    for (const BlockLinear& w : layout.linears) {
      if (why == nullptr && (w.rows % 64 != 0 || w.cols % 64 != 0))
        why = "a weight's rows or columns are not a multiple of 64 (the byte transpose's tile)";
    }
    const int64_t slot = ShardSize(layout.units[size_t(layout.block_unit(0))].numel,
                                   shard_world < 1 ? 1 : shard_world);
    if (why == nullptr && slot % 2 != 0)
      why = "a block's slot has an odd element count (the bytes move as bf16 pairs)";
    for (const BlockLinear& w : layout.linears) {
      if (why == nullptr && w.offset % 16 != 0)
        why = "a weight's offset in its block is not 16-byte aligned";
    }
  }
  Fp8GatherChoice c;
  if (why != nullptr) {
    c.why = why;
    c.note = "fsdp fp8 weights: gathered in bf16 and cast before each pass (" + c.why + ")";
    return c;
  }
  c.e4m3 = true;
  c.note =
      "fsdp fp8 weights: gathered as E4M3 (half the bytes of bf16), each rank casting its slot "
      "with the delayed scales; the first step gathers bf16 and casts (its casts measure)";
  return c;
}

Fp8GatherChoice ChooseFp8Gather(const RunConfig& cfg, int world) {
  Fp8GatherChoice c;
  if (cfg.precision.compute != Precision::kFp8) {
    c.why = "precision.compute is not fp8";
    return c;
  }
  const ModeRules rules = ModeRulesFor(cfg.parallel, world);
  if (world <= 1 || !rules.shard_params || rules.shard_world <= 1) {
    c.why = "parallel.mode does not shard the parameters over more than one rank";
    return c;
  }
  return ChooseFp8Gather(cfg.model, cfg.precision.fp8.recipe, rules.shard_world);
}

int64_t MostNormElementsPerSlot(int64_t block_numel,
                                const std::array<BlockLinear, kBlockLinears>& linears,
                                int shard_world) {
  const int world = std::max(1, shard_world);
  const int64_t slot = ShardSize(block_numel, world);
  int64_t most = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t lo = std::min(block_numel, r * slot), hi = std::min(block_numel, lo + slot);
    int64_t n = hi - lo;  // the linear weights do not overlap: subtract each one's part
    for (const BlockLinear& w : linears)
      n -= std::max<int64_t>(0, std::min(hi, w.offset + w.numel()) - std::max(lo, w.offset));
    most = std::max(most, n);
  }
  return most;
}

}  // namespace forge
