#include "kernels/cpu/fp8_cast.h"

#include <algorithm>
#include <cstring>

namespace forge::cpu {

uint32_t AbsMaxBits(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    m = std::max(m, u & 0x7FFFFFFFu);
  }
  return m;
}

float AbsMax(const float* x, int64_t n) {
  const uint32_t m = AbsMaxBits(x, n);
  float f;
  std::memcpy(&f, &m, 4);
  return f;
}

float CastToFp8(const float* x, int64_t rows, int64_t cols, float scale, Fp8Format format,
                uint8_t* out, uint8_t* out_t) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float scaled = x[r * cols + c] * scale;  // one float multiply, as on the GPU
      const uint8_t q = FloatToFp8(scaled, format, Fp8Saturation::kSatFinite);
      if (out) out[r * cols + c] = q;
      if (out_t) out_t[c * rows + r] = q;
    }
  }
  return AbsMax(x, rows * cols);
}

}  // namespace forge::cpu
