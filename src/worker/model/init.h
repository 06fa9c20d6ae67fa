// Parameter initialisation, identical on every backend and machine: computed on the host with
// a counter-based RNG keyed by (seed, unit, element), so the same seed gives the same weights
// whatever the world size or sharding. model.init gpt2 (default): matrices ~ N(0, init_std);
// residual output projections (wo, w_down) ~ N(0, init_std / sqrt(2 * n_layer)). model.init
// torch (PyTorch's module defaults, for like-for-like runs beside a PyTorch model): the
// embedding ~ N(0, 1), block matrices ~ U(+-1/sqrt(fan_in)). Norm weights = 1 in both.
#pragma once

#include <cstdint>

#include "worker/model/param_layout.h"
#include "worker/model/unit_buffers.h"

namespace forge {

void InitParams(const ModelConfig& m, const ParamLayout& layout, uint64_t seed, UnitBuffers* params);

}  // namespace forge
