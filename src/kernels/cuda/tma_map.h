// Host side of our warpgroup-MMA kernels (gemm_wgmma.cu, flash_backward.cu): tensor maps for
// the tensor copy engine (TMA) in the 128-byte swizzle, and ptxas's register allocation of a
// kernel (a setmaxnreg split is only safe with the allocation it was sized for).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/status.h"

namespace forge::cuda {

// A [rows, cols] row-major bf16 (elem_bytes 2) or 8-bit (1) matrix moved in boxes of
// box_rows x 128 bytes (the 128-byte swizzle's row); rows are cols * elem_bytes apart.
Status SwizzledMap(const void* base, int64_t rows, int64_t cols, int box_rows, CUtensorMap* map,
                   int elem_bytes = 2);

// ptxas's registers a thread for `kernel`, asked of the runtime once per kernel (the launches
// that check it are on the step's path).
StatusOr<int> KernelRegisters(const void* kernel);

}  // namespace forge::cuda
