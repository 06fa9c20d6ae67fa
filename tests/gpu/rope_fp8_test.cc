// RoPE's backward writing FP8 directly (kernels/cuda/rope_fp8.h) against the two kernels it
// fuses: RopeApply(inverse) (tested against the CPU in rope_test.cc) followed by
// CastTransposeToFp8 (bit for bit with the CPU cast). Every byte of both outputs, the amax and
// scale_inv must be identical; the V columns pass through unrotated.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fp8_fused_test_util.h"
#include "gpu_test_util.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/rope_fp8.h"

namespace forge {
namespace {

using cuda::DType;
using test::bf16;
using test::DeviceBuffer;
using test::ExpectSameAsCast;
using test::Fp8CastOut;

struct Shape {
  int B, T, H, KV, hd;
};

void Check(Shape sh, DType format, float scale, uint64_t seed) {
  SCOPED_TRACE("B=" + std::to_string(sh.B) + " T=" + std::to_string(sh.T) + " H=" +
               std::to_string(sh.H) + " KV=" + std::to_string(sh.KV) + " hd=" +
               std::to_string(sh.hd) + (format == DType::kE4M3 ? " e4m3" : " e5m2"));
  const int64_t rows = int64_t{sh.B} * sh.T, cols = int64_t{sh.H + 2 * sh.KV} * sh.hd;
  const size_t n = size_t(rows * cols);
  const test::DeviceBuffer<float> freqs = test::RopeFreqs(sh.hd, 10000.0f);
  const std::vector<float> dqkv = test::RandomNormalBf16(n, 1.0f, seed);
  DeviceBuffer<bf16> in(test::ToBf16(dqkv)), rotated(test::ToBf16(dqkv));
  ASSERT_STATUS_OK(cuda::RopeApply(rotated.data(), sh.B, sh.T, sh.H, sh.KV, sh.hd, freqs.data(),
                                   /*inverse=*/true, nullptr));
  DeviceBuffer<float2> sin_cos(size_t(sh.T) * (sh.hd / 2));
  ASSERT_STATUS_OK(cuda::RopeSinCosTable(sin_cos.data(), sh.T, sh.hd, freqs.data(), nullptr));
  Fp8CastOut got(n, scale);
  ASSERT_TRUE(cuda::RopeFp8Supported(rows, sh.H, sh.KV, sh.hd, in.data(), got.q.data(),
                                     got.qt.data()));
  ASSERT_STATUS_OK(cuda::RopeBackwardFp8(got.q.data(), got.qt.data(), in.data(), sh.B, sh.T, sh.H,
                                         sh.KV, sh.hd, sin_cos.data(), format, got.scale(),
                                         got.amax(), got.scale_inv(), nullptr));
  ExpectSameAsCast(rotated.data(), rows, cols, format, scale, got, "rope backward");
}

TEST(GpuRopeFp8, MatchesRopeThenCastBitForBit) {
  FORGE_SKIP_WITHOUT_GPU();
  uint64_t seed = 900;
  for (DType f : {DType::kE4M3, DType::kE5M2}) {
    Check({4, 64, 4, 4, 32}, f, 1.0f, ++seed);        // the tiny test model
    Check({2, 256, 8, 2, 64}, f, 64.0f, ++seed);      // GQA; saturating scale
    Check({1, 1024, 16, 16, 64}, f, 0.5f, ++seed);    // gpt350m's heads, T 1024
  }
}

TEST(GpuRopeFp8, RefusesWhatTheTileKernelCannotTake) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<bf16> in(size_t(64) * 3 * 36);
  DeviceBuffer<uint8_t> o(size_t(64) * 3 * 36), ot(size_t(64) * 3 * 36);
  EXPECT_FALSE(cuda::RopeFp8Supported(64, 1, 1, 36, in.data(), o.data(), ot.data()));  // 108 cols
  EXPECT_FALSE(cuda::RopeFp8Supported(96, 2, 1, 16, in.data(), o.data(), ot.data()));  // 96 rows
}

}  // namespace
}  // namespace forge
