// What the CUDA backend's model (worker/model/cuda_model.h) can run of the model knobs: a
// config asking for one it does not implement is refused at start-up, naming the key, rather
// than training a different model. The CPU reference (worker/model/cpu_model.h) runs them all.
#pragma once

#include "common/config.h"
#include "common/status.h"

namespace forge {

// InvalidArgument "model.<key>: ... not supported by the cuda backend yet ..." for the first
// knob the CUDA model lacks: a head_dim other than d_model / n_head, an untied LM head, RoPE
// frequency scaling, QK-norm.
Status CheckCudaSupportsModel(const ModelConfig& m);

}  // namespace forge
