// Greedy decoding's choice on the GPU: out[r] = the index of the largest of x[r, 0:cols) (the
// lowest index among equal maxima, as std::max_element), rows `ld` floats apart. Only the
// indices travel back to the host instead of whole vocabulary rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"

namespace forge::cuda {

Status ArgmaxRows(int32_t* out, const float* x, int64_t R, int cols, int64_t ld,
                  cudaStream_t stream);

}  // namespace forge::cuda
