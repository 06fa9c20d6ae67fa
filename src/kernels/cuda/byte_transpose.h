// Transpose of a matrix of bytes (an FP8 tensor already quantised): out [cols, rows] from in
// [rows, cols]. For an FP8 operand whose row-major copy comes out of a kernel that cannot
// write the transposed one (the cross-entropy kernel's E5M2 dlogits, one block per row: the
// FP8 LM head's weight gradient needs dlogits^T K-major).
//
// Needs rows and cols multiples of 64 and 16-byte aligned buffers (TransposeBytesSupported).
// Test: tests/gpu/byte_transpose_test.cc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"

namespace forge::cuda {

bool TransposeBytesSupported(int64_t rows, int64_t cols, const void* out, const void* in);
Status TransposeBytes(void* out, const void* in, int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace forge::cuda
