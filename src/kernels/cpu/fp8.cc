// Exact float <-> FP8 conversion with integer arithmetic on the float's bits (no rounding by
// the host FPU is involved, so the result does not depend on its mode).
#include "kernels/cpu/fp8.h"

#include <cmath>
#include <cstring>

namespace forge::cpu {
namespace {

struct Layout {
  int exp_bits, man_bits, bias;
  uint8_t max_code;       // largest finite magnitude code
  uint8_t overflow_code;  // kNoSat result for a too-large magnitude (Inf or NaN)
};

constexpr Layout kE4M3{4, 3, 7, 0x7E, 0x7F};
constexpr Layout kE5M2{5, 2, 15, 0x7B, 0x7C};

const Layout& LayoutOf(Fp8Format f) { return f == Fp8Format::kE4M3 ? kE4M3 : kE5M2; }

}  // namespace

float Fp8Max(Fp8Format f) { return f == Fp8Format::kE4M3 ? kE4M3Max : kE5M2Max; }

const char* Fp8FormatName(Fp8Format f) { return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2"; }

uint8_t FloatToFp8(float x, Fp8Format f, Fp8Saturation sat) {
  const Layout& L = LayoutOf(f);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 31) << 7);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kFp8CanonicalNaN;
  const uint8_t overflow =
      (sat == Fp8Saturation::kSatFinite ? L.max_code : L.overflow_code) | sign;
  if (a == 0x7F800000u) return overflow;
  const int fexp = static_cast<int>(a >> 23);
  // Float subnormals (< 2^-126) are far below half the smallest FP8 subnormal: +-0.
  if (fexp == 0) return sign;

  // |x| = mant * 2^(fexp - 150). The FP8 result is k * 2^(eff - man_bits) with eff the
  // binary exponent of |x|, but no lower than the subnormal exponent 1 - bias.
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  const int e_x = fexp - 127;
  const int eff = e_x > 1 - L.bias ? e_x : 1 - L.bias;
  const int shift = (eff - L.man_bits) - (fexp - 150);  // mantissa bits dropped, >= 20
  uint32_t k;
  if (shift >= 25) {
    k = 0;  // mant < 2^24 <= half a quantum: rounds to zero
  } else {
    k = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (k & 1u))) ++k;  // nearest, ties to even
  }
  // Normal and subnormal encodings are both ((eff + bias - 1) << man_bits) + k: for a normal
  // the implicit bit of k carries into the exponent field, and a mantissa that rounded up to
  // 2^(man_bits + 1) carries one further, which is the next binade's encoding.
  const int code = ((eff + L.bias - 1) << L.man_bits) + static_cast<int>(k);
  if (code > L.max_code) return overflow;
  return static_cast<uint8_t>(code) | sign;
}

float Fp8ToFloat(uint8_t bits, Fp8Format f) {
  const Layout& L = LayoutOf(f);
  const bool neg = bits & 0x80u;
  const int mag = bits & 0x7F;
  const int field = mag >> L.man_bits;
  const int man = mag & ((1 << L.man_bits) - 1);
  const int top_field = (1 << L.exp_bits) - 1;
  float v;
  if (f == Fp8Format::kE4M3 && mag == 0x7F) {
    v = std::nanf("");
  } else if (f == Fp8Format::kE5M2 && field == top_field) {
    v = man == 0 ? INFINITY : std::nanf("");
  } else if (field == 0) {
    v = std::ldexp(static_cast<float>(man), 1 - L.bias - L.man_bits);
  } else {
    v = std::ldexp(static_cast<float>((1 << L.man_bits) + man), field - L.bias - L.man_bits);
  }
  return neg ? -v : v;
}

}  // namespace forge::cpu
