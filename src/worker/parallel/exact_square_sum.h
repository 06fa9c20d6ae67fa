// The exact sum of squares of float32 values, for the global gradient norm.
//
// With ZeRO/FSDP each rank holds a different slice of the gradient, so a floating-point sum of
// squares would depend on where the shard boundaries fall, i.e. on the world size. Instead the
// squares are added exactly: a float is m * 2^e (m < 2^24), its square m^2 * 2^(2e) is an
// integer multiple of 2^-298, and the sum is kept as a fixed-point integer in 32-bit limbs
// (one uint64 each, so carries can wait). Integer addition is associative: the result, and so
// the clipping factor, is bitwise the same for any split over ranks and any order.
#pragma once

#include <array>
#include <cstdint>

namespace forge {

class ExactSquareSum {
 public:
  // Limbs of 32 bits cover 2^-298 .. 2^342: every float square (< 2^256) times 2^80 terms.
  static constexpr int kLimbs = 20;

  void Add(const float* x, int64_t n);
  // Adds another partial sum (e.g. one received from a rank).
  void Merge(const ExactSquareSum& other);
  // The limbs as doubles (each < 2^32 after normalising: exact), for an all-reduce sum of up
  // to 2^20 ranks; FromDoubles reads such a sum back. Slot kLimbs counts non-finite inputs.
  static constexpr int kWireSize = kLimbs + 1;
  std::array<double, kWireSize> ToDoubles() const;
  static ExactSquareSum FromDoubles(const double* wire);

  // The sum rounded to double (NaN if any input was NaN or infinite).
  double Value() const;

 private:
  void Normalize();  // propagate carries so every limb is < 2^32

  std::array<uint64_t, kLimbs> limb_{};
  uint64_t nonfinite_ = 0;
  int64_t pending_ = 0;  // additions since the last Normalize
};

}  // namespace forge
