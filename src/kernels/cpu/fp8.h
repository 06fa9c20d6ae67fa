// FP8 number formats on the host (OCP FP8, as NVIDIA's __nv_fp8_e4m3 / __nv_fp8_e5m2):
//   E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; max 448; no Inf; NaN = S.1111.111
//         (0x7F / 0xFF); smallest subnormal 2^-9.
//   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; max 57344; Inf = S.11111.00
//         (0x7C / 0xFC); NaN = S.11111.{01,10,11}; smallest subnormal 2^-16.
//
// FloatToFp8 rounds to nearest, ties to even, exactly (every float, subnormal results
// included), and is the oracle the GPU cast kernels are tested against bit for bit. With
// kSatFinite (what the training casts use, and what the GPU's cvt.rn.satfinite does) a value
// beyond the largest finite one, infinities included, becomes +-max; with kNoSat it becomes
// E5M2's +-Inf or E4M3's NaN (sign kept). A NaN input gives the canonical positive NaN 0x7F
// in both formats and both modes (what cuda_fp8.hpp specifies: the input NaN is replaced by
// +NaN before conversion).
#pragma once

#include <cstdint>

namespace forge::cpu {

enum class Fp8Format { kE4M3, kE5M2 };
enum class Fp8Saturation { kSatFinite, kNoSat };

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;
inline constexpr uint8_t kFp8CanonicalNaN = 0x7F;

// Largest finite value of the format.
float Fp8Max(Fp8Format f);
const char* Fp8FormatName(Fp8Format f);

uint8_t FloatToFp8(float x, Fp8Format f, Fp8Saturation sat = Fp8Saturation::kSatFinite);
// Exact (every FP8 value is a float).
float Fp8ToFloat(uint8_t bits, Fp8Format f);

}  // namespace forge::cpu
