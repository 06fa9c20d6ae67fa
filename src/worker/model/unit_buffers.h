// One flat float32 buffer per parameter unit (see param_layout.h). Used for master weights,
// gradients and AdamW moments on the host.
#pragma once

#include <vector>

namespace forge {

using UnitBuffers = std::vector<std::vector<float>>;

}  // namespace forge
