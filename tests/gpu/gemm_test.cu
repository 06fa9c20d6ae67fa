// GemmRunner (cuBLASLt) against a double-precision CPU product of the same bf16 / fp8 inputs:
// the three linear-layer forms the model uses, accumulation, the plan cache, FP8 with scales
// and amax, and the layouts FP8 must reject.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cuda/gemm.cuh"

namespace forge::cuda {
namespace {

using test::DeviceBuffer;
using test::RandomNormal;
using test::RoundBf16InPlace;
using test::ToBf16;
using test::ToFloat;

// D[M, N] = A * op(B) with A [M, K] (or [K, M] if trans_a) and B [N, K] (trans_b) or [K, N].
std::vector<double> RefGemm(const std::vector<float>& A, const std::vector<float>& B, int64_t M,
                            int64_t N, int64_t K, bool trans_a, bool trans_b) {
  std::vector<double> D(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = trans_a ? A[size_t(k * M + m)] : A[size_t(m * K + k)];
        const double b = trans_b ? B[size_t(n * K + k)] : B[size_t(k * N + n)];
        s += a * b;
      }
      D[size_t(m * N + n)] = s;
    }
  }
  return D;
}

// ||got - ref||_F / ||ref||_F; non-finite entries (unwritten, poisoned) make it infinite.
double RelFrobenius(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct LinearShape {
  int64_t tokens, in, out;
};

// Shapes with and without multiples of 64, one with odd sizes (2-byte aligned rows).
const LinearShape kShapes[] = {{128, 256, 192}, {200, 72, 136}, {37, 29, 53}};

class GpuGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FORGE_SKIP_WITHOUT_GPU();
    ASSERT_STATUS_OK(runner_.Init());
  }
  GemmRunner runner_;
};

// out[N, O] = x[N, I] W[O, I]^T, bf16 out.
TEST_F(GpuGemmTest, ForwardLinearMatchesCpu) {
  for (const LinearShape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "tokens " << s.tokens << " in " << s.in << " out "
                                      << s.out);
    std::vector<float> x = RandomNormal(size_t(s.tokens * s.in), 1.0f, 1);
    std::vector<float> w = RandomNormal(size_t(s.out * s.in), 0.05f, 2);
    RoundBf16InPlace(x);
    RoundBf16InPlace(w);
    DeviceBuffer<bf16> dx(ToBf16(x)), dw(ToBf16(w)), dy(size_t(s.tokens * s.out));
    dy.Poison();
    GemmArgs g;
    g.M = s.tokens, g.N = s.out, g.K = s.in;
    g.A = dx.data(), g.B = dw.data(), g.D = dy.data();
    g.trans_a = false, g.trans_b = true;
    ASSERT_STATUS_OK(runner_.Run(g, nullptr));
    const auto ref = RefGemm(x, w, s.tokens, s.out, s.in, false, true);
    EXPECT_LT(RelFrobenius(ToFloat(dy.Download()), ref), 1e-2);
  }
}

// dx[N, I] = dout[N, O] W[O, I], bf16 out.
TEST_F(GpuGemmTest, BackwardDataMatchesCpu) {
  for (const LinearShape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "tokens " << s.tokens << " in " << s.in << " out "
                                      << s.out);
    std::vector<float> dout = RandomNormal(size_t(s.tokens * s.out), 1.0f, 3);
    std::vector<float> w = RandomNormal(size_t(s.out * s.in), 0.05f, 4);
    RoundBf16InPlace(dout);
    RoundBf16InPlace(w);
    DeviceBuffer<bf16> ddout(ToBf16(dout)), dw(ToBf16(w)), ddx(size_t(s.tokens * s.in));
    ddx.Poison();
    GemmArgs g;
    g.M = s.tokens, g.N = s.in, g.K = s.out;
    g.A = ddout.data(), g.B = dw.data(), g.D = ddx.data();
    g.trans_a = false, g.trans_b = false;
    ASSERT_STATUS_OK(runner_.Run(g, nullptr));
    const auto ref = RefGemm(dout, w, s.tokens, s.in, s.out, false, false);
    EXPECT_LT(RelFrobenius(ToFloat(ddx.Download()), ref), 1e-2);
  }
}

// dW[O, I] += dout^T x in fp32, twice (two micro-steps) onto a non-zero start.
TEST_F(GpuGemmTest, WeightGradAccumulatesInFp32) {
  for (const LinearShape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "tokens " << s.tokens << " in " << s.in << " out "
                                      << s.out);
    std::vector<float> dout = RandomNormal(size_t(s.tokens * s.out), 1.0f, 5);
    std::vector<float> x = RandomNormal(size_t(s.tokens * s.in), 1.0f, 6);
    std::vector<float> dw0 = RandomNormal(size_t(s.out * s.in), 1.0f, 7);
    RoundBf16InPlace(dout);
    RoundBf16InPlace(x);
    DeviceBuffer<bf16> ddout(ToBf16(dout)), dx(ToBf16(x));
    DeviceBuffer<float> ddw(dw0);
    GemmArgs g;
    g.M = s.out, g.N = s.in, g.K = s.tokens;
    g.A = ddout.data(), g.B = dx.data(), g.D = ddw.data();
    g.trans_a = true, g.trans_b = false;
    g.d_type = DType::kFp32;
    g.accumulate = true;
    const auto prod = RefGemm(dout, x, s.out, s.in, s.tokens, true, false);

    ASSERT_STATUS_OK(runner_.Run(g, nullptr));
    std::vector<double> ref(prod.size());
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = dw0[i] + prod[i];
    EXPECT_LT(RelFrobenius(ddw.Download(), ref), 1e-5);

    ASSERT_STATUS_OK(runner_.Run(g, nullptr));
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += prod[i];
    EXPECT_LT(RelFrobenius(ddw.Download(), ref), 1e-5);
  }
}

// bf16 inputs, fp32 output without accumulation, alpha != 1: every element written, tight.
TEST_F(GpuGemmTest, Fp32OutputWithAlpha) {
  const LinearShape s{96, 160, 80};
  std::vector<float> x = RandomNormal(size_t(s.tokens * s.in), 1.0f, 8);
  std::vector<float> w = RandomNormal(size_t(s.out * s.in), 0.05f, 9);
  RoundBf16InPlace(x);
  RoundBf16InPlace(w);
  DeviceBuffer<bf16> dx(ToBf16(x)), dw(ToBf16(w));
  DeviceBuffer<float> dy(size_t(s.tokens * s.out));
  dy.Poison();
  GemmArgs g;
  g.M = s.tokens, g.N = s.out, g.K = s.in;
  g.A = dx.data(), g.B = dw.data(), g.D = dy.data();
  g.d_type = DType::kFp32;
  g.alpha = 0.5f;
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));
  auto ref = RefGemm(x, w, s.tokens, s.out, s.in, false, true);
  for (double& v : ref) v *= 0.5;
  EXPECT_LT(RelFrobenius(dy.Download(), ref), 1e-5);
}

// Residual add folded into the GEMM: y (bf16) += x W^T.
TEST_F(GpuGemmTest, Bf16AccumulateAddsToOutput) {
  const LinearShape s{128, 192, 256};
  std::vector<float> x = RandomNormal(size_t(s.tokens * s.in), 1.0f, 10);
  std::vector<float> w = RandomNormal(size_t(s.out * s.in), 0.05f, 11);
  std::vector<float> y0 = RandomNormal(size_t(s.tokens * s.out), 1.0f, 12);
  RoundBf16InPlace(x);
  RoundBf16InPlace(w);
  RoundBf16InPlace(y0);
  DeviceBuffer<bf16> dx(ToBf16(x)), dw(ToBf16(w)), dy(ToBf16(y0));
  GemmArgs g;
  g.M = s.tokens, g.N = s.out, g.K = s.in;
  g.A = dx.data(), g.B = dw.data(), g.D = dy.data();
  g.accumulate = true;
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));
  auto ref = RefGemm(x, w, s.tokens, s.out, s.in, false, true);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];
  EXPECT_LT(RelFrobenius(ToFloat(dy.Download()), ref), 1e-2);
}

// One heuristic query per key: same shape with other (equally aligned) buffers reuses it.
TEST_F(GpuGemmTest, PlanIsCachedPerKey) {
  const LinearShape s{64, 128, 96};
  DeviceBuffer<bf16> x1(size_t(s.tokens * s.in)), x2(size_t(s.tokens * s.in));
  DeviceBuffer<bf16> w(size_t(s.out * s.in)), y1(size_t(s.tokens * s.out)),
      y2(size_t(s.tokens * s.out));
  for (auto* b : {&x1, &x2, &w}) {
    ASSERT_CUDA_OK(cudaMemset(b->data(), 0, b->bytes()));
  }
  GemmArgs g;
  g.M = s.tokens, g.N = s.out, g.K = s.in;
  g.A = x1.data(), g.B = w.data(), g.D = y1.data();
  EXPECT_EQ(runner_.plan_count(), 0u);
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));
  EXPECT_EQ(runner_.plan_count(), 1u);
  g.A = x2.data(), g.D = y2.data();
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));
  EXPECT_EQ(runner_.plan_count(), 1u);
  g.M = 32;  // another shape: a new plan
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));
  EXPECT_EQ(runner_.plan_count(), 2u);
  g.M = s.tokens;
  g.accumulate = true;  // beta = 1 is another key
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));
  EXPECT_EQ(runner_.plan_count(), 3u);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
}

// E4M3 x E4M3 -> bf16 with per-tensor scales and amax(D), against the dequantised product.
TEST_F(GpuGemmTest, Fp8E4M3WithScalesAndAmax) {
  const int64_t M = 128, N = 256, K = 512;  // tokens, out, in
  std::vector<float> x = RandomNormal(size_t(M * K), 3.0f, 13);
  std::vector<float> w = RandomNormal(size_t(N * K), 0.05f, 14);
  auto absmax = [](const std::vector<float>& v) {
    float m = 0.0f;
    for (float e : v) m = std::max(m, std::fabs(e));
    return m;
  };
  const float sx = absmax(x) / 448.0f, sw = absmax(w) / 448.0f;  // E4M3 max is 448
  std::vector<__nv_fp8_e4m3> qx(x.size()), qw(w.size());
  std::vector<float> x_deq(x.size()), w_deq(w.size());
  for (size_t i = 0; i < x.size(); ++i) {
    qx[i] = __nv_fp8_e4m3(x[i] / sx);
    x_deq[i] = float(qx[i]) * sx;
  }
  for (size_t i = 0; i < w.size(); ++i) {
    qw[i] = __nv_fp8_e4m3(w[i] / sw);
    w_deq[i] = float(qw[i]) * sw;
  }
  DeviceBuffer<__nv_fp8_e4m3> dqx(qx), dqw(qw);
  DeviceBuffer<bf16> dy(size_t(M * N));
  // amax starts far above the answer: cuBLASLt must set it, not fold into it.
  DeviceBuffer<float> scales(std::vector<float>{sx, sw}), amax(std::vector<float>{1e30f});
  dy.Poison();
  GemmArgs g;
  g.M = M, g.N = N, g.K = K;
  g.A = dqx.data(), g.B = dqw.data(), g.D = dy.data();
  g.trans_a = false, g.trans_b = true;
  g.a_type = DType::kE4M3, g.b_type = DType::kE4M3, g.d_type = DType::kBf16;
  g.a_scale = scales.data(), g.b_scale = scales.data() + 1;
  g.d_amax = amax.data();
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));

  const auto ref = RefGemm(x_deq, w_deq, M, N, K, false, true);
  const std::vector<float> got = ToFloat(dy.Download());
  EXPECT_LT(RelFrobenius(got, ref), 5e-2);
  double ref_max = 0.0;
  for (double v : ref) ref_max = std::max(ref_max, std::fabs(v));
  const float got_amax = amax.Download()[0];
  EXPECT_NEAR(got_amax, ref_max, 1e-2 * ref_max);
  EXPECT_NEAR(got_amax, absmax(got), 1e-2 * ref_max);
}

// FP8 only in cuBLASLt's TN layout, e4m3/e5m2 mixes only; bad type combinations rejected.
TEST_F(GpuGemmTest, RejectsUnsupportedLayoutsAndTypes) {
  DeviceBuffer<uint8_t> a(64 * 64), b(64 * 64);
  DeviceBuffer<float> d(64 * 64);
  GemmArgs g;
  g.M = 64, g.N = 64, g.K = 64;
  g.A = a.data(), g.B = b.data(), g.D = d.data();
  g.a_type = DType::kE4M3, g.b_type = DType::kE4M3, g.d_type = DType::kBf16;

  GemmArgs bad = g;
  bad.trans_b = false;  // backward-data form
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.trans_a = true;  // weight-gradient form
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.a_type = bad.b_type = DType::kE5M2;
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.b_type = DType::kBf16;  // fp8 x bf16
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.d_type = DType::kE4M3;  // no fp8 output (no D scale in GemmArgs)
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.K = 40;  // fp8 needs multiples of 16
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.a_type = bad.b_type = DType::kBf16;
  bad.d_amax = d.data();  // amax only for fp8
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(runner_.plan_count(), 0u);
}

}  // namespace
}  // namespace forge::cuda
