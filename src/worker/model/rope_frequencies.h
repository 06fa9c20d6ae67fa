// The RoPE inverse frequencies a model config asks for (model.rope_theta, model.rope_scaling,
// head_dim), for the CPU kernels (kernels/cpu/rope.h).
#pragma once

#include <vector>

#include "common/config.h"

namespace forge {

std::vector<double> RopeFrequencies(const ModelConfig& m);

}  // namespace forge
