// FP8 cast (CPU reference for cuda/fp8_cast): out = sat(x * scale) in E4M3 or E5M2, an
// optional transposed copy, and the amax of |x| (before scaling) exactly as the GPU computes
// it (see AbsMaxBits).
#pragma once

#include <cstdint>

#include "kernels/cpu/fp8.h"

namespace forge::cpu {

// The amax as the bit pattern of a non-negative float: the largest (bits(x) & 0x7FFFFFFF).
// Non-negative floats order like their bit patterns, so this is max |x| for finite inputs;
// an Inf gives Inf and a NaN gives a NaN (NaN patterns are above Inf's), so a non-finite
// tensor always yields a non-finite amax. Empty input: 0.
uint32_t AbsMaxBits(const float* x, int64_t n);
float AbsMax(const float* x, int64_t n);

// x [rows, cols] row-major. out [rows, cols] and/or out_t [cols, rows] (either may be null):
// FloatToFp8(x * scale, format, kSatFinite), the product rounded to float first. Returns
// AbsMax(x).
float CastToFp8(const float* x, int64_t rows, int64_t cols, float scale, Fp8Format format,
                uint8_t* out, uint8_t* out_t);

}  // namespace forge::cpu
