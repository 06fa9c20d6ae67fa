// Whether fsdp (and hsdp inside its shard groups) all-gathers the blocks' four linear weights
// as E4M3 bytes in FP8 training (cuda_data_parallel.h, "fsdp"), decided from the config and
// the shard world alone: the data-parallel layer at start-up, the memory estimate and
// `forge plan` all ask here, so they decide alike.
//
// The E4M3 gather needs, in this order (the first one missing is the reason given):
//   - the gather on (CudaBackendOptions::fp8_gather; tests turn it off to compare the paths);
//   - the delayed recipe: each rank casts its slot of a weight with the weight's scale, known
//     before the cast only when it comes from the amax history (current scaling takes it from
//     the whole weight's amax);
//   - every linear weight's rows and columns a multiple of 64: the model makes the backward's
//     transposed copy from the gathered bytes with a byte transpose of 64x64 tiles;
//   - an even slot per rank (the bytes move as bf16 pairs) and every weight's offset in its
//     block a multiple of 16 (the FP8 GEMMs' 16-byte alignment).
// Where it is not met the weights are gathered in bf16 and cast before each pass. Either way
// the first step (whose casts measure their tensors) gathers bf16.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "common/config.h"
#include "worker/model/param_layout.h"

namespace forge {

struct Fp8GatherChoice {
  bool e4m3 = false;  // the blocks' linear weights travel as E4M3 (after the first step)
  std::string why;    // why not ("" where e4m3)
  std::string note;   // the start-up log line: which path runs and why ("" where no fsdp fp8)
};

// fsdp in FP8 over `shard_world` ranks with model `m`.
Fp8GatherChoice ChooseFp8Gather(const ModelConfig& m, Fp8Recipe recipe, int shard_world,
                                bool enabled = true);

// The same for a run on `world` ranks: no (note "") unless precision.compute is fp8 and
// parallel.mode shards the parameters (fsdp, hsdp) over more than one rank.
Fp8GatherChoice ChooseFp8Gather(const RunConfig& cfg, int world);

// Where the E4M3 gather runs, a block's other elements (its norm weights) travel in a second,
// bf16 all-gather of each rank's share, padded to the largest: that share, the most elements
// outside `linears` that one rank's slot of a `block_numel`-element block holds.
int64_t MostNormElementsPerSlot(int64_t block_numel,
                                const std::array<BlockLinear, kBlockLinears>& linears,
                                int shard_world);

}  // namespace forge
