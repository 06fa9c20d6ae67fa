// BF16 type and small conversion helpers shared by the kernels.
#pragma once

#include <cuda_bf16.h>

namespace forge::cuda {

using bf16 = __nv_bfloat16;

}  // namespace forge::cuda
