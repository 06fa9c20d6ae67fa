// Where one GPU takes each unit's share of the gradient norm (CudaModel::UnitSumSquares): on
// the weight-gradient stream, on a stream of its own beside it, or not per unit (one pass over
// the whole gradient at the step's end). Its own header so that CUDA-free callers
// (CudaBackendOptions) can name it.
#pragma once

namespace forge {

enum class UnitSumSquaresAt { kWgradStream, kSideStream, kEnd };

}  // namespace forge
