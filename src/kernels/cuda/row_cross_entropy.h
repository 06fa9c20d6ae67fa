// Per-row cross-entropy of fp32 logits, for evaluation over the KV-cache forward
// (worker/infer/cuda_decode_backend.cc): loss[r] = log(sum_v exp(x[r, v])) - x[r, target[r]]
// over v < cols, rows `ld` floats apart. The maximum is subtracted first; the exponentials are
// summed in double. Only the losses travel back to the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"

namespace forge::cuda {

Status RowCrossEntropy(float* loss, const float* x, const int32_t* targets, int64_t R, int cols,
                       int64_t ld, cudaStream_t stream);

}  // namespace forge::cuda
