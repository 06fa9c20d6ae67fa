// GPU RoPE (in place on the fused qkv buffer) vs the float32 CPU reference on the same bf16
// inputs, plain and with Llama 3.1's frequency scaling. Tolerance: bf16 output, max |got - ref|
// / max |ref| < 1e-2 per rotated part; the V part must be left bitwise untouched.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/rope.h"

namespace forge {
namespace {

using test::bf16;
using test::DeviceBuffer;

struct Shape {
  int B, T, H, KV, hd;
};

// Splits a [B, T, (H + 2KV) * hd] buffer into its rotated (Q, K) and V elements.
void Split(const std::vector<float>& qkv, const Shape& s, std::vector<float>* qk,
           std::vector<float>* v) {
  const int64_t row = int64_t{s.H + 2 * s.KV} * s.hd;
  const int64_t rot = int64_t{s.H + s.KV} * s.hd;
  qk->clear();
  v->clear();
  for (size_t i = 0; i < qkv.size(); ++i) {
    (int64_t(i) % row < rot ? qk : v)->push_back(qkv[i]);
  }
}

std::vector<float> GpuRope(const std::vector<float>& qkv, const Shape& s, const float* inv_freq,
                           bool inverse) {
  DeviceBuffer<bf16> d(test::ToBf16(qkv));
  Status st = cuda::RopeApply(d.data(), s.B, s.T, s.H, s.KV, s.hd, inv_freq, inverse, nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return test::ToFloat(d.Download());
}

// The kernel reads the CPU reference's inverse frequencies, rounded to fp32.
void CheckRope(const Shape& s, float theta, uint64_t seed,
               const RopeScalingConfig& scaling = {}) {
  const std::vector<double> freq = cpu::RopeInverseFrequencies(s.hd, theta, scaling);
  const DeviceBuffer<float> dfreq(std::vector<float>(freq.begin(), freq.end()));
  SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
               " H=" + std::to_string(s.H) + " KV=" + std::to_string(s.KV) +
               " hd=" + std::to_string(s.hd));
  const size_t n = size_t(s.B) * s.T * (s.H + 2 * s.KV) * s.hd;
  const std::vector<float> qkv = test::RandomNormalBf16(n, 1.0f, seed);
  std::vector<float> qk_in, v_in;
  Split(qkv, s, &qk_in, &v_in);

  for (bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    const std::vector<float> got = GpuRope(qkv, s, dfreq.data(), inverse);
    std::vector<float> ref = qkv;
    cpu::RopeApply(ref.data(), s.B, s.T, s.H, s.KV, s.hd, freq.data(), inverse);
    std::vector<float> got_qk, got_v, ref_qk, ref_v;
    Split(got, s, &got_qk, &got_v);
    Split(ref, s, &ref_qk, &ref_v);
    EXPECT_TRUE(test::MaxRelClose(got_qk, ref_qk, 1e-2));
    EXPECT_TRUE(test::BitwiseEqual(got_v, v_in)) << "V heads must not change";
    // Positions > 0 really rotate (guards against a kernel that does nothing).
    EXPECT_FALSE(test::MaxRelClose(got_qk, qk_in, 1e-2));
  }

  // Forward then inverse on the GPU gives back the input (up to two bf16 roundings).
  DeviceBuffer<bf16> d(test::ToBf16(qkv));
  ASSERT_STATUS_OK(
      cuda::RopeApply(d.data(), s.B, s.T, s.H, s.KV, s.hd, dfreq.data(), false, nullptr));
  ASSERT_STATUS_OK(
      cuda::RopeApply(d.data(), s.B, s.T, s.H, s.KV, s.hd, dfreq.data(), true, nullptr));
  EXPECT_TRUE(test::MaxRelClose(test::ToFloat(d.Download()), qkv, 2e-2));
}

TEST(GpuRope, Gpt124mShapeMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckRope({2, 1024, 12, 12, 64}, 10000.0f, 201);
}

TEST(GpuRope, GqaShapeMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckRope({2, 512, 16, 4, 128}, 500000.0f, 202);
}

// Llama 3.1's scaling as the llama3 presets use it (theta 500000, factor 32 over 8192 original
// positions), at head width 128 and 64, out to position 8191.
TEST(GpuRope, Llama3ScaledMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  RopeScalingConfig scaling;
  scaling.type = RopeScalingType::kLlama3;
  scaling.factor = 32.0f;
  CheckRope({1, 8192, 4, 1, 128}, 500000.0f, 208, scaling);
  CheckRope({1, 8192, 4, 2, 64}, 500000.0f, 209, scaling);
}

// The plain table the kernels' own tests use equals the CPU reference's, rounded to fp32.
TEST(GpuRope, PlainFrequenciesEqualTheCpuReference) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<float> f(64);
  ASSERT_STATUS_OK(cuda::RopePlainInverseFrequencies(f.data(), 128, 500000.0f, nullptr));
  const std::vector<float> got = f.Download();
  const std::vector<double> ref = cpu::RopeInverseFrequencies(128, 500000.0);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], static_cast<float>(ref[i])) << "pair " << i;
}

TEST(GpuRope, Gpt350mShapeMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckRope({2, 1024, 16, 16, 64}, 10000.0f, 204);
}

// A thread rotates a group of up to 8 heads: head counts that leave a partial last group,
// and heads of one or two vectors.
TEST(GpuRope, PartialHeadGroupsMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckRope({3, 37, 10, 3, 16}, 10000.0f, 205);  // 13 rotated heads: groups of 8 and 5
  CheckRope({1, 64, 9, 9, 8}, 10000.0f, 206);    // 18: 8, 8, 2; one vector per head
  CheckRope({2, 5, 1, 1, 32}, 10000.0f, 207);    // 2 heads, fewer threads than a warp
}

TEST(GpuRope, OddHeadDimScalarPathMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckRope({2, 17, 3, 1, 6}, 10000.0f, 203);  // hd % 8 != 0: one pair per thread
}

TEST(GpuRope, RejectsOddHeadDim) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<bf16> d(2 * 3 * 5);
  DeviceBuffer<float> f(3);
  EXPECT_EQ(cuda::RopeApply(d.data(), 1, 2, 1, 1, 5, f.data(), false, nullptr).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(cuda::RopeApply(d.data(), 1, 2, 1, 1, 6, nullptr, false, nullptr).code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace forge
