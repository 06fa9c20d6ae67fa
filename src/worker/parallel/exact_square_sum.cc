#include "worker/parallel/exact_square_sum.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace forge {
namespace {

constexpr int kBias = 298;  // the fixed point: value = sum_k limb[k] * 2^(32k - 298)
// Each add puts < 2^32 into a limb: normalise before 2^31 of them can overflow a uint64.
constexpr int64_t kNormalizeEvery = int64_t{1} << 30;

}  // namespace

void ExactSquareSum::Add(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], 4);
    const uint32_t exp = (bits >> 23) & 0xff;
    const uint32_t frac = bits & 0x7fffff;
    if (exp == 0xff) {
      ++nonfinite_;
      continue;
    }
    if (exp == 0 && frac == 0) continue;
    // |x| = m * 2^e with m < 2^24, e in [-149, 104]; x^2 = m^2 * 2^(2e), shift = 2e + 298.
    const uint64_t m = exp == 0 ? frac : (frac | 0x800000u);
    const int e = (exp == 0 ? 1 : int(exp)) - 150;
    const int shift = 2 * e + kBias;
    const unsigned __int128 v = static_cast<unsigned __int128>(m * m) << (shift % 32);
    const int k = shift / 32;
    limb_[k] += static_cast<uint32_t>(v);
    limb_[k + 1] += static_cast<uint32_t>(v >> 32);
    limb_[k + 2] += static_cast<uint64_t>(v >> 64);
    if (++pending_ >= kNormalizeEvery) Normalize();
  }
}

void ExactSquareSum::Normalize() {
  uint64_t carry = 0;
  for (int k = 0; k < kLimbs; ++k) {
    const uint64_t t = limb_[k] + carry;  // limb < 2^62, carry < 2^32: no overflow
    limb_[k] = t & 0xffffffffu;
    carry = t >> 32;
  }
  pending_ = 0;
}

void ExactSquareSum::Merge(const ExactSquareSum& other) {
  ExactSquareSum o = other;
  o.Normalize();
  Normalize();
  for (int k = 0; k < kLimbs; ++k) limb_[k] += o.limb_[k];
  nonfinite_ += o.nonfinite_;
  Normalize();
}

std::array<double, ExactSquareSum::kWireSize> ExactSquareSum::ToDoubles() const {
  ExactSquareSum c = *this;
  c.Normalize();
  std::array<double, kWireSize> w{};
  for (int k = 0; k < kLimbs; ++k) w[k] = static_cast<double>(c.limb_[k]);
  w[kLimbs] = static_cast<double>(c.nonfinite_);
  return w;
}

ExactSquareSum ExactSquareSum::FromDoubles(const double* wire) {
  ExactSquareSum s;
  for (int k = 0; k < kLimbs; ++k) s.limb_[k] = static_cast<uint64_t>(wire[k]);
  s.nonfinite_ = static_cast<uint64_t>(wire[kLimbs]);
  s.Normalize();
  return s;
}

double ExactSquareSum::Value() const {
  if (nonfinite_ > 0) return std::numeric_limits<double>::quiet_NaN();
  ExactSquareSum c = *this;
  c.Normalize();
  // Horner from the top limb down: a fixed sequence of roundings, so equal integers give
  // equal doubles (relative error ~1e-16, far below what the clip factor can notice).
  double v = 0.0;
  for (int k = kLimbs - 1; k >= 0; --k) v = v * 4294967296.0 + static_cast<double>(c.limb_[k]);
  return std::ldexp(v, -kBias);
}

}  // namespace forge
