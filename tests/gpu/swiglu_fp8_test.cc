// SwiGLU forward/backward writing FP8 directly (kernels/cuda/swiglu_fp8.cuh) against the two
// kernels they fuse: SwiGluForward / SwiGluBackward (tested against the CPU in swiglu_test.cc)
// followed by CastTransposeToFp8 (bit for bit with the CPU cast in fp8_cast_test.cc). Every
// output byte, the transposed copies, the amax and scale_inv must be identical.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cuda/fp8_cast.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "kernels/cuda/swiglu_fp8.cuh"

namespace forge {
namespace {

using cuda::DType;
using test::bf16;
using test::DeviceBuffer;

// scale, amax, scale_inv in 16-byte slots of one buffer.
struct Slots {
  DeviceBuffer<float> buf{12};
  explicit Slots(float scale) {
    std::vector<float> h(12, 0.0f);
    h[0] = scale;
    buf.Upload(h);
  }
  const float* scale() { return buf.data(); }
  float* amax() { return buf.data() + 4; }
  float* scale_inv() { return buf.data() + 8; }
  std::vector<float> Read() const { return buf.Download(); }
};

bool SameBytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

void Check(int64_t N, int ffn, DType format, float scale, uint64_t seed) {
  SCOPED_TRACE("N=" + std::to_string(N) + " ffn=" + std::to_string(ffn) +
               (format == DType::kE4M3 ? " e4m3" : " e5m2"));
  const std::vector<float> gate_up = test::RandomNormalBf16(size_t(N) * 2 * ffn, 3.0f, seed);
  const std::vector<float> dout = test::RandomNormalBf16(size_t(N) * ffn, 1.0f, seed + 1);
  DeviceBuffer<bf16> d_gu(test::ToBf16(gate_up)), d_dout(test::ToBf16(dout));

  // Forward: fused vs SwiGluForward + cast.
  DeviceBuffer<bf16> sw(size_t(N) * ffn);
  ASSERT_STATUS_OK(cuda::SwiGluForward(sw.data(), d_gu.data(), N, ffn, nullptr));
  DeviceBuffer<uint8_t> ref(size_t(N) * ffn), ref_t(size_t(N) * ffn);
  DeviceBuffer<uint8_t> got(size_t(N) * ffn), got_t(size_t(N) * ffn);
  Slots a(scale), b(scale);
  ASSERT_STATUS_OK(cuda::CastTransposeToFp8(ref.data(), ref_t.data(), sw.data(), N, ffn, format,
                                            a.scale(), a.amax(), a.scale_inv(), nullptr));
  ASSERT_STATUS_OK(cuda::SwiGluForwardFp8(got.data(), got_t.data(), d_gu.data(), N, ffn, format,
                                          b.scale(), b.amax(), b.scale_inv(), nullptr));
  EXPECT_TRUE(SameBytes(got.Download(), ref.Download())) << "forward";
  EXPECT_TRUE(SameBytes(got_t.Download(), ref_t.Download())) << "forward transposed";
  EXPECT_EQ(b.Read(), a.Read()) << "forward amax / scale_inv";

  // Backward: fused vs SwiGluBackward + cast.
  DeviceBuffer<bf16> dgu(size_t(N) * 2 * ffn);
  ASSERT_STATUS_OK(cuda::SwiGluBackward(dgu.data(), d_dout.data(), d_gu.data(), N, ffn, nullptr));
  DeviceBuffer<uint8_t> bref(size_t(N) * 2 * ffn), bref_t(size_t(N) * 2 * ffn);
  DeviceBuffer<uint8_t> bgot(size_t(N) * 2 * ffn), bgot_t(size_t(N) * 2 * ffn);
  Slots c(scale), d(scale);
  ASSERT_STATUS_OK(cuda::CastTransposeToFp8(bref.data(), bref_t.data(), dgu.data(), N, 2 * ffn,
                                            format, c.scale(), c.amax(), c.scale_inv(), nullptr));
  ASSERT_STATUS_OK(cuda::SwiGluBackwardFp8(bgot.data(), bgot_t.data(), d_dout.data(),
                                           d_gu.data(), N, ffn, format, d.scale(), d.amax(),
                                           d.scale_inv(), nullptr));
  EXPECT_TRUE(SameBytes(bgot.Download(), bref.Download())) << "backward";
  EXPECT_TRUE(SameBytes(bgot_t.Download(), bref_t.Download())) << "backward transposed";
  EXPECT_EQ(d.Read(), c.Read()) << "backward amax / scale_inv";
  EXPECT_GT(d.Read()[4], 0.0f) << "no amax recorded";
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
  DeviceBuffer<uint8_t> o(size_t(96) * 2 * 96), ot(size_t(96) * 2 * 96);
  Slots s(1.0f);
  EXPECT_FALSE(cuda::SwiGluFp8Supported(96, 64, gu.data(), gu.data(), o.data(), ot.data()));
  EXPECT_FALSE(cuda::SwiGluForwardFp8(o.data(), ot.data(), gu.data(), 96, 64, DType::kE4M3,
                                      s.scale(), s.amax(), s.scale_inv(), nullptr)
                   .ok());
  EXPECT_FALSE(cuda::SwiGluBackwardFp8(o.data(), ot.data(), dout.data(), gu.data(), 64, 96,
                                       DType::kE5M2, s.scale(), s.amax(), s.scale_inv(), nullptr)
                   .ok());
}

}  // namespace
}  // namespace forge
