// GPU SwiGLU forward/backward vs the float32 CPU reference on the same bf16 inputs.
// Tolerance: bf16 outputs, max |got - ref| / max |ref| < 1e-2 (checked separately for the gate
// and up halves of the gradient).
#include <gtest/gtest.h>

#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/swiglu.h"

namespace forge {
namespace {

using test::bf16;
using test::DeviceBuffer;

// Gate (first ffn columns of each row) or up (last ffn) half of a [N, 2*ffn] buffer.
std::vector<float> Half(const std::vector<float>& x, int64_t N, int ffn, bool up) {
  std::vector<float> h;
  h.reserve(size_t(N) * ffn);
  for (int64_t n = 0; n < N; ++n) {
    const float* r = x.data() + n * 2 * ffn + (up ? ffn : 0);
    h.insert(h.end(), r, r + ffn);
  }
  return h;
}

void CheckSwiGlu(int64_t N, int ffn, uint64_t seed) {
  SCOPED_TRACE("N=" + std::to_string(N) + " ffn=" + std::to_string(ffn));
  // Gate values over a wide range so that both tails of the sigmoid are exercised.
  const std::vector<float> gate_up = test::RandomNormalBf16(size_t(N) * 2 * ffn, 3.0f, seed);
  const std::vector<float> dout = test::RandomNormalBf16(size_t(N) * ffn, 1.0f, seed + 1);
  DeviceBuffer<bf16> d_gu(test::ToBf16(gate_up)), d_dout(test::ToBf16(dout));

  DeviceBuffer<bf16> d_out(size_t(N) * ffn);
  d_out.Poison();
  ASSERT_STATUS_OK(cuda::SwiGluForward(d_out.data(), d_gu.data(), N, ffn, nullptr));
  std::vector<float> ref_out(size_t(N) * ffn);
  cpu::SwiGluForward(ref_out.data(), gate_up.data(), N, ffn);
  EXPECT_TRUE(test::MaxRelClose(test::ToFloat(d_out.Download()), ref_out, 1e-2)) << "out";

  DeviceBuffer<bf16> d_dgu(size_t(N) * 2 * ffn);
  d_dgu.Poison();  // overwritten, every element
  ASSERT_STATUS_OK(
      cuda::SwiGluBackward(d_dgu.data(), d_dout.data(), d_gu.data(), N, ffn, nullptr));
  std::vector<float> ref_dgu(size_t(N) * 2 * ffn);
  cpu::SwiGluBackward(ref_dgu.data(), dout.data(), gate_up.data(), N, ffn);
  const std::vector<float> got_dgu = test::ToFloat(d_dgu.Download());
  EXPECT_TRUE(test::MaxRelClose(Half(got_dgu, N, ffn, false), Half(ref_dgu, N, ffn, false), 1e-2))
      << "dgate";
  EXPECT_TRUE(test::MaxRelClose(Half(got_dgu, N, ffn, true), Half(ref_dgu, N, ffn, true), 1e-2))
      << "dup";
}

TEST(GpuSwiGlu, Gpt350mShapeMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckSwiGlu(4 * 1024, 2816, 301);
}

TEST(GpuSwiGlu, TinyShapeMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckSwiGlu(256, 384, 302);
}

TEST(GpuSwiGlu, OddWidthScalarPathMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckSwiGlu(7, 13, 303);
}

}  // namespace
}  // namespace forge
