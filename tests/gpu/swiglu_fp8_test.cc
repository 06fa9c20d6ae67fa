// SwiGLU forward/backward writing FP8 directly (kernels/cuda/swiglu_fp8.h) against the two
// kernels they fuse: SwiGluForward / SwiGluBackward (tested against the CPU in swiglu_test.cc)
// followed by CastTransposeToFp8 (bit for bit with the CPU cast in fp8_cast_test.cc). Every
// output byte, the transposed copies, the amax and scale_inv must be identical.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "fp8_fused_test_util.h"
#include "gpu_test_util.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/cuda/swiglu_fp8.h"

namespace forge {
namespace {

using cuda::DType;
using test::bf16;
using test::DeviceBuffer;

using test::ExpectSameAsCast;
using test::Fp8CastOut;

void Check(int64_t N, int ffn, DType format, float scale, uint64_t seed) {
  SCOPED_TRACE("N=" + std::to_string(N) + " ffn=" + std::to_string(ffn) +
               (format == DType::kE4M3 ? " e4m3" : " e5m2"));
  const std::vector<float> gate_up = test::RandomNormalBf16(size_t(N) * 2 * ffn, 3.0f, seed);
  const std::vector<float> dout = test::RandomNormalBf16(size_t(N) * ffn, 1.0f, seed + 1);
  DeviceBuffer<bf16> d_gu(test::ToBf16(gate_up)), d_dout(test::ToBf16(dout));

  // Forward: fused vs SwiGluForward + cast.
  DeviceBuffer<bf16> sw(size_t(N) * ffn);
  ASSERT_STATUS_OK(cuda::SwiGluForward(sw.data(), d_gu.data(), N, ffn, nullptr));
  Fp8CastOut fwd(size_t(N) * ffn, scale);
  ASSERT_STATUS_OK(cuda::SwiGluForwardFp8(fwd.q.data(), fwd.qt.data(), d_gu.data(), N, ffn,
                                          format, fwd.scale(), fwd.amax(), fwd.scale_inv(),
                                          nullptr));
  ExpectSameAsCast(sw.data(), N, ffn, format, scale, fwd, "forward");

  // Backward: fused vs SwiGluBackward + cast.
  DeviceBuffer<bf16> dgu(size_t(N) * 2 * ffn);
  ASSERT_STATUS_OK(cuda::SwiGluBackward(dgu.data(), d_dout.data(), d_gu.data(), N, ffn, nullptr));
  Fp8CastOut bwd(size_t(N) * 2 * ffn, scale);
  ASSERT_STATUS_OK(cuda::SwiGluBackwardFp8(bwd.q.data(), bwd.qt.data(), d_dout.data(),
                                           d_gu.data(), N, ffn, format, bwd.scale(), bwd.amax(),
                                           bwd.scale_inv(), nullptr));
  ExpectSameAsCast(dgu.data(), N, 2 * ffn, format, scale, bwd, "backward");
}

TEST(GpuSwiGluFp8, MatchesSwiGluThenCastBitForBit) {
  FORGE_SKIP_WITHOUT_GPU();
  uint64_t seed = 700;
  for (DType f : {DType::kE4M3, DType::kE5M2}) {
    Check(64, 64, f, 1.0f, ++seed);
    Check(256, 192, f, 37.5f, ++seed);   // values saturate at this scale
    Check(1024, 2816, f, 0.25f, ++seed);  // gpt350m's ffn
  }
}

TEST(GpuSwiGluFp8, RefusesShapesTheTileKernelCannotTake) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<bf16> gu(size_t(96) * 2 * 96), dout(size_t(96) * 96);
  Fp8CastOut o(size_t(96) * 2 * 96, 1.0f);
  EXPECT_FALSE(cuda::SwiGluFp8Supported(96, 64, gu.data(), gu.data(), o.q.data(), o.qt.data()));
  EXPECT_FALSE(cuda::SwiGluForwardFp8(o.q.data(), o.qt.data(), gu.data(), 96, 64, DType::kE4M3,
                                      o.scale(), o.amax(), o.scale_inv(), nullptr)
                   .ok());
  EXPECT_FALSE(cuda::SwiGluBackwardFp8(o.q.data(), o.qt.data(), dout.data(), gu.data(), 64, 96,
                                       DType::kE5M2, o.scale(), o.amax(), o.scale_inv(), nullptr)
                   .ok());
}

}  // namespace
}  // namespace forge
