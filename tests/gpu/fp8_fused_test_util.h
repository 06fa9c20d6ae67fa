// What the tests of the fused FP8 producers share (swiglu_fp8, rope_fp8, rmsnorm_fp8, the FP8
// GEMMs): FP8 operands made on the host, the outputs of a fused kernel (both FP8 orientations
// and the scale/amax/scale_inv slots) and the check that they are bit for bit what
// CastTransposeToFp8 makes of the BF16 kernel's output.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/fp8_cast.h"

namespace forge::test {

// FP8 outputs [rows, cols] and [cols, rows], and scale / amax / scale_inv in 16-byte slots.
struct Fp8CastOut {
  DeviceBuffer<uint8_t> q, qt;
  DeviceBuffer<float> slots{12};
  Fp8CastOut(size_t n, float scale) : q(n), qt(n) {
    std::vector<float> h(12, 0.0f);
    h[0] = scale;
    slots.Upload(h);
  }
  const float* scale() { return slots.data(); }
  float* amax() { return slots.data() + 4; }
  float* scale_inv() { return slots.data() + 8; }
};

// An FP8 operand: random normal values quantised on the host with `scale` (the cast's
// convention, q = sat(x * scale)), its bytes on the device, what a GEMM sees of it (q / scale)
// and the 1 / scale the GEMM dequantises with.
struct Fp8Operand {
  std::vector<float> deq;
  DeviceBuffer<uint8_t> dev;
  float scale_inv = 0.0f;
  Fp8Operand(int64_t rows, int64_t cols, float stddev, float scale, uint64_t seed,
             cpu::Fp8Format format = cpu::Fp8Format::kE4M3) {
    const std::vector<float> x = RandomNormal(size_t(rows * cols), stddev, seed);
    std::vector<uint8_t> q(x.size());
    deq.resize(x.size());
    scale_inv = 1.0f / scale;
    for (size_t i = 0; i < x.size(); ++i) {
      q[i] = cpu::FloatToFp8(x[i] * scale, format);
      deq[i] = cpu::Fp8ToFloat(q[i], format) * scale_inv;
    }
    dev = DeviceBuffer<uint8_t>(q);
  }
};

// Casts the BF16 kernel's output `ref` [rows, cols] with the same scale and expects `fused`
// (already written by the fused kernel) to hold the same bytes, amax and scale_inv.
inline void ExpectSameAsCast(const bf16* ref, int64_t rows, int64_t cols, cuda::DType format,
                             float scale, Fp8CastOut& fused, const std::string& what) {
  Fp8CastOut want(size_t(rows * cols), scale);
  ASSERT_STATUS_OK(cuda::CastTransposeToFp8(want.q.data(), want.qt.data(), ref, rows, cols,
                                            format, want.scale(), want.amax(), want.scale_inv(),
                                            nullptr));
  const size_t n = size_t(rows * cols);
  const auto a = fused.q.Download(), b = want.q.Download();
  const auto at = fused.qt.Download(), bt = want.qt.Download();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n), 0) << what << ": row-major FP8 differs";
  EXPECT_EQ(std::memcmp(at.data(), bt.data(), n), 0) << what << ": transposed FP8 differs";
  const std::vector<float> got = fused.slots.Download(), ref_slots = want.slots.Download();
  EXPECT_EQ(got, ref_slots) << what << ": scale / amax / scale_inv";
  EXPECT_GT(got[4], 0.0f) << what << ": no amax recorded";
}

}  // namespace forge::test
