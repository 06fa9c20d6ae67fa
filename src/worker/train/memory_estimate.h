// What one training process needs in memory for a config, estimated before anything is
// allocated, so that a model too large for the machine (every dimension fits an int, not the
// memory: n_layer 100000, d_model 10^9, seq_len 2*10^9) is refused with the estimate and the
// keys that make it large, instead of dying in std::bad_alloc or the OOM killer.
//
// The estimate counts the buffers the backends allocate whatever happens (weights, gradients,
// AdamW moments, saved activations, the CPU backend's attention probabilities), per rank, in
// double precision (the products of such dimensions overflow 64-bit integers): a lower bound
// of what the process will hold, so a config it refuses can never fit, and one it accepts may
// still be tight.
#pragma once

#include <string>

#include "common/config.h"
#include "common/status.h"

namespace forge {

struct MemoryEstimate {
  double weights = 0;      // bytes per rank: master weights (and the device's bf16 copy)
  double gradients = 0;    // full and sharded gradient buffers
  double moments = 0;      // AdamW m and v
  double activations = 0;  // what the forward keeps for the backward, plus scratch
  double total() const { return weights + gradients + moments + activations; }
};

// backend: kCpu or kCuda (resolved, not kAuto); world: data-parallel ranks (>= 1).
MemoryEstimate EstimateTrainingMemory(const RunConfig& cfg, Backend backend, int world);

// InvalidArgument when the estimate exceeds available_bytes, saying both, the parts, and the
// config keys that make the largest part large ("... reduce model.n_layer (100000) ..."); Ok
// otherwise. `where` names the memory ("this host's available memory", "GPU 0's free memory").
Status CheckTrainingMemory(const RunConfig& cfg, Backend backend, int world,
                           double available_bytes, const std::string& where);

// Host memory this process could still take: MemAvailable of /proc/meminfo, lowered to the
// room left under its cgroup's memory.max when there is one; < 0 when neither can be read.
double HostAvailableMemoryBytes();

}  // namespace forge
