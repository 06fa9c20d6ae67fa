// Parameter initialisation, identical on every backend and machine: computed on the host with
// a counter-based RNG keyed by (seed, unit, element), so the same seed gives the same weights
// whatever the world size or sharding. Matrices ~ N(0, init_std); residual output projections
// (wo, w_down) ~ N(0, init_std / sqrt(2 * n_layer)); norm weights = 1.
#pragma once

#include <cstdint>

#include "worker/model/param_layout.h"
#include "worker/model/unit_buffers.h"

namespace forge {

void InitParams(const ModelConfig& m, const ParamLayout& layout, uint64_t seed, UnitBuffers* params);

}  // namespace forge
