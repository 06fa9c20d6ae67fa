// Host side of our warpgroup-MMA kernels (gemm_wgmma.cu, flash_backward.cu): tensor maps for
// the tensor copy engine (TMA) in the 128-byte swizzle, ptxas's register allocation of a
// kernel (a setmaxnreg split is only safe with the allocation it was sized for), and the
// device facts both launchers need.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace forge::cuda {

// A [rows, cols] row-major bf16 (elem_bytes 2) or 8-bit (1) matrix moved in boxes of
// box_rows x 128 bytes (the 128-byte swizzle's row); rows are cols * elem_bytes apart.
// row_bytes 64: boxes of box_rows x 64 bytes in the 64-byte swizzle instead.
Status SwizzledMap(const void* base, int64_t rows, int64_t cols, int box_rows, CUtensorMap* map,
                   int elem_bytes = 2, int row_bytes = 128);

// Ok if ptxas gave `kernel` the `launch` registers a thread its setmaxnreg split assumes
// (RegisterSplit, wgmma_util.cuh); else an error naming `name` (another allocation would hang
// the split's .inc). The runtime is asked once per kernel (the launches are on the step's path).
Status CheckLaunchRegisters(const void* kernel, int launch, const std::string& name);

// Ok on an sm_90 GPU (Hopper: the kernels are built for sm_90a only); else an error naming
// `name` and this device's architecture.
Status CheckSm90(const std::string& name);

// The current device's SM count (the persistent kernels' grid); asked per launch (cheap).
StatusOr<int> DeviceSmCount();

// The tile-order band a persistent GEMM launch takes (tile_order.h): `asked` when > 0, else
// TileGroupRows for a B operand of b_bytes on the current device's L2; asked per launch too.
StatusOr<int> LaunchGroupRows(int asked, int64_t b_bytes);

}  // namespace forge::cuda
