// RMSNorm writing FP8 directly (kernels/cuda/rmsnorm_fp8.h) against the two kernels each
// direction fuses:
// - forward: RmsNormForward (tested against the CPU in rmsnorm_test.cc) followed by
//   CastTransposeToFp8 (bit for bit with the CPU cast): both FP8 outputs, rstd, the amax and
//   scale_inv must be identical;
// - backward: RmsNormBackward followed by CastTransposeToFp8 of the new dx: dx, dw, both FP8
//   outputs, the amax and scale_inv must be identical, accumulating or overwriting.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fp8_fused_test_util.h"
#include "gpu_test_util.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rmsnorm_fp8.h"

namespace forge {
namespace {

using cuda::DType;
using test::bf16;
using test::DeviceBuffer;
using test::ExpectSameAsCast;
using test::Fp8CastOut;

void Check(int64_t N, int d, DType format, float scale, uint64_t seed) {
  SCOPED_TRACE("N=" + std::to_string(N) + " d=" + std::to_string(d) +
               (format == DType::kE4M3 ? " e4m3" : " e5m2"));
  const size_t n = size_t(N) * d;
  DeviceBuffer<bf16> x(test::ToBf16(test::RandomNormalBf16(n, 2.0f, seed)));
  DeviceBuffer<bf16> w(test::ToBf16(test::RandomNormalBf16(size_t(d), 1.0f, seed + 1)));
  DeviceBuffer<bf16> h(n);
  DeviceBuffer<float> rstd_ref{size_t(N)}, rstd_got{size_t(N)};
  rstd_got.Poison();
  ASSERT_STATUS_OK(cuda::RmsNormForward(h.data(), rstd_ref.data(), x.data(), w.data(), N, d,
                                        1e-5f, nullptr));
  Fp8CastOut got(n, scale);
  ASSERT_STATUS_OK(cuda::RmsNormForwardFp8(got.q.data(), got.qt.data(), rstd_got.data(), x.data(),
                                           w.data(), N, d, 1e-5f, format, got.scale(), got.amax(),
                                           got.scale_inv(), nullptr));
  ExpectSameAsCast(h.data(), N, d, format, scale, got, "rmsnorm");
  EXPECT_TRUE(test::BitwiseEqual(rstd_got.Download(), rstd_ref.Download())) << "rstd";
}

TEST(GpuRmsNormFp8, MatchesRmsNormThenCastBitForBit) {
  FORGE_SKIP_WITHOUT_GPU();
  uint64_t seed = 1100;
  for (DType f : {DType::kE4M3, DType::kE5M2}) {
    Check(256, 128, f, 1.0f, ++seed);    // the tiny test model
    Check(1024, 768, f, 32.0f, ++seed);  // gpt124m's width; saturating scale
    Check(2048, 1024, f, 0.5f, ++seed);  // gpt350m's width
  }
  Check(16384, 1024, DType::kE4M3, 1.0f, ++seed);  // gpt350m's B 16 step: 512 row bands
  Check(64 * 1100, 128, DType::kE5M2, 4.0f, ++seed);  // 2200 bands, 2048 blocks: blocks loop
  Check(128, 2048, DType::kE4M3, 2.0f, ++seed);       // the widest row the kernel takes
}

void CheckBackward(int64_t N, int d, DType format, float scale, bool accumulate, uint64_t seed) {
  SCOPED_TRACE("backward N=" + std::to_string(N) + " d=" + std::to_string(d) +
               (format == DType::kE4M3 ? " e4m3" : " e5m2") +
               (accumulate ? " accumulate" : " overwrite"));
  const size_t n = size_t(N) * d;
  DeviceBuffer<bf16> x(test::ToBf16(test::RandomNormalBf16(n, 2.0f, seed)));
  DeviceBuffer<bf16> w(test::ToBf16(test::RandomNormalBf16(size_t(d), 1.0f, seed + 1)));
  DeviceBuffer<bf16> dout(test::ToBf16(test::RandomNormalBf16(n, 0.5f, seed + 2)));
  const std::vector<bf16> dx0 = test::ToBf16(test::RandomNormalBf16(n, 0.25f, seed + 3));
  const std::vector<float> dw0 = test::RandomNormal(size_t(d), 1.0f, seed + 4);
  DeviceBuffer<bf16> h(n);
  DeviceBuffer<float> rstd{size_t(N)};
  ASSERT_STATUS_OK(cuda::RmsNormForward(h.data(), rstd.data(), x.data(), w.data(), N, d, 1e-5f,
                                        nullptr));
  const size_t ws_bytes = cuda::RmsNormBackwardWorkspace(N, d);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  DeviceBuffer<bf16> dx_ref(dx0), dx_got(dx0);
  DeviceBuffer<float> dw_ref(dw0), dw_got(dw0);
  ASSERT_STATUS_OK(cuda::RmsNormBackward(dx_ref.data(), dw_ref.data(), dout.data(), x.data(),
                                         w.data(), rstd.data(), N, d, ws.data(), ws_bytes,
                                         nullptr, accumulate, accumulate));
  Fp8CastOut got(n, scale);
  ASSERT_TRUE(cuda::RmsNormBackwardFp8Supported(N, d, got.q.data(), got.qt.data()));
  ASSERT_STATUS_OK(cuda::RmsNormBackwardFp8(dx_got.data(), dw_got.data(), dout.data(), x.data(),
                                            w.data(), rstd.data(), N, d, ws.data(), ws_bytes,
                                            accumulate, accumulate, got.q.data(), got.qt.data(),
                                            format, got.scale(), got.amax(), got.scale_inv(),
                                            nullptr));
  EXPECT_TRUE(test::BitwiseEqual(dx_got.Download(), dx_ref.Download())) << "dx";
  EXPECT_TRUE(test::BitwiseEqual(dw_got.Download(), dw_ref.Download())) << "dw";
  ExpectSameAsCast(dx_ref.data(), N, d, format, scale, got, "rmsnorm backward");
}

TEST(GpuRmsNormFp8, BackwardMatchesRmsNormBackwardThenCastBitForBit) {
  FORGE_SKIP_WITHOUT_GPU();
  uint64_t seed = 1200;
  for (bool acc : {true, false}) {
    CheckBackward(256, 128, DType::kE5M2, 1.0f, acc, seed += 5);     // the tiny model: 8 rows a block
    CheckBackward(16384, 1024, DType::kE5M2, 64.0f, acc, seed += 5);  // gpt350m B 16: 64 rows
  }
  CheckBackward(1024, 768, DType::kE4M3, 0.5f, true, seed += 5);     // gpt124m's width
  CheckBackward(24576, 1024, DType::kE5M2, 4.0f, true, seed += 5);   // B 24: 96 rows a block
  CheckBackward(128, 2048, DType::kE5M2, 2.0f, false, seed += 5);    // the widest row
}

TEST(GpuRmsNormFp8, BackwardRefusesWhatItCannotTake) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<uint8_t> q(size_t(70400) * 128), qt(size_t(70400) * 128);
  EXPECT_TRUE(cuda::RmsNormBackwardFp8Supported(16384, 1024, q.data(), qt.data()));
  EXPECT_FALSE(cuda::RmsNormBackwardFp8Supported(96, 128, q.data(), qt.data()));   // N % 64
  EXPECT_FALSE(cuda::RmsNormBackwardFp8Supported(64, 96, q.data(), qt.data()));    // d % 64
  EXPECT_FALSE(cuda::RmsNormBackwardFp8Supported(70400, 128, q.data(), qt.data()));  // 275 rows
  EXPECT_FALSE(cuda::RmsNormBackwardFp8Supported(64, 128, q.data() + 4, qt.data()));  // aligned
}

TEST(GpuRmsNormFp8, RefusesWhatTheTileKernelCannotTake) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<bf16> x(size_t(96) * 96), w(96);
  DeviceBuffer<uint8_t> o(size_t(96) * 96), ot(size_t(96) * 96);
  DeviceBuffer<float> rstd(96), slots(12);
  EXPECT_FALSE(cuda::RmsNormFp8Supported(96, 64, x.data(), w.data(), o.data(), ot.data()));
  EXPECT_FALSE(cuda::RmsNormFp8Supported(64, 2112, x.data(), w.data(), o.data(), ot.data()));
  EXPECT_FALSE(cuda::RmsNormForwardFp8(o.data(), ot.data(), rstd.data(), x.data(), w.data(), 64,
                                       96, 1e-5f, DType::kE4M3, slots.data(), slots.data() + 4,
                                       slots.data() + 8, nullptr)
                   .ok());
}

}  // namespace
}  // namespace forge
