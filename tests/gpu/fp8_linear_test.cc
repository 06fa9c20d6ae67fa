// One FP8 linear layer end to end on the building blocks: bf16 activations and fp32 master
// weights cast to E4M3 by the cast kernels with delayed-scaling scales (a first step records
// the amaxes, RecordAmax turns them into scales), gradients cast to E5M2 with current
// scaling, and the three GEMMs of the layer through GemmRunner's FP8 path (TN, scale_inv
// pointers written by the casts):
//   forward  y  = x W^T      A = x  [M, K]   B = W   [N, K]
//   dgrad    dx = dy W       A = dy [M, N]   B = W^T [K, N]   (transposed weight copy)
//   wgrad    dW = dy^T x     A = dy^T [N, M] B = x^T [K, M]   (transposed copies)
// Each is compared with a BF16 GEMM of the dequantised inputs and with a double-precision
// product of them; the references read the row-major FP8 copies in the untransposed layouts,
// so a wrong transposed copy cannot match its own reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/fp8_cast.h"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/gemm.h"
#include "worker/model/fp8_scaling.h"

namespace forge {
namespace {

using cuda::DType;
using cuda::GemmArgs;
using test::bf16;
using test::DeviceBuffer;

using test::RefGemm;
using test::RelFrobenius;

// What the GEMM sees: q * scale_inv.
std::vector<float> Dequantise(const std::vector<uint8_t>& q, cpu::Fp8Format f, float scale_inv) {
  std::vector<float> out(q.size());
  for (size_t i = 0; i < q.size(); ++i) out[i] = cpu::Fp8ToFloat(q[i], f) * scale_inv;
  return out;
}

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

class GpuFp8Linear : public ::testing::Test {
 protected:
  void SetUp() override {
    FORGE_SKIP_WITHOUT_GPU();
    ASSERT_STATUS_OK(runner_.Init());
    runner_.set_autotune(false);
  }

  // D [M, N] bf16 = op(A) op(B) for fp8 A/B (TN) with dequantising scales.
  std::vector<float> Fp8Gemm(const void* A, DType at, const float* a_sinv, const void* B,
                             DType bt, const float* b_sinv, int64_t M, int64_t N, int64_t K) {
    DeviceBuffer<bf16> d(size_t(M * N));
    d.Poison();
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.A = A, g.B = B, g.D = d.data();
    g.trans_a = false, g.trans_b = true;
    g.a_type = at, g.b_type = bt, g.d_type = DType::kBf16;
    g.a_scale = a_sinv, g.b_scale = b_sinv;
    const Status st = runner_.Run(g, nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return test::ToFloat(d.Download());
  }

  // The same product in BF16 from host float operands (rounded to bf16).
  std::vector<float> Bf16Gemm(const std::vector<float>& A, const std::vector<float>& B,
                              int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b) {
    DeviceBuffer<bf16> a(test::ToBf16(A)), b(test::ToBf16(B)), d(size_t(M * N));
    d.Poison();
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.A = a.data(), g.B = b.data(), g.D = d.data();
    g.trans_a = trans_a, g.trans_b = trans_b;
    const Status st = runner_.Run(g, nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return test::ToFloat(d.Download());
  }

  cuda::GemmRunner runner_;
};

TEST_F(GpuFp8Linear, GemmsMatchBf16GemmOfDequantisedInputs) {
  // tokens, in, out: multiples of 16 (cuBLASLt FP8) but not of the 64-wide cast tile.
  const int64_t M = 208, K = 272, N = 144;
  std::vector<float> x = test::RandomNormalBf16(size_t(M * K), 1.5f, 41);
  for (size_t i = 0; i < x.size(); i += 997) x[i] = test::RoundBf16(x[i] * 20.0f);  // outliers
  const std::vector<float> w = test::RandomNormal(size_t(N * K), 0.05f, 42);
  const std::vector<float> dy = test::RandomNormalBf16(size_t(M * N), 1e-3f, 43);
  DeviceBuffer<bf16> d_x(test::ToBf16(x)), d_dy(test::ToBf16(dy));
  DeviceBuffer<float> d_w(w);

  Fp8Config cfg;  // delayed, window 16, margin 0
  const Fp8ScalingParams e4 = Fp8ParamsFromConfig(cfg, cpu::Fp8Format::kE4M3);
  Fp8Config cur = cfg;
  cur.recipe = Fp8Recipe::kCurrent;
  const Fp8ScalingParams e5 = Fp8ParamsFromConfig(cur, cpu::Fp8Format::kE5M2);
  Fp8ScaleState sx = MakeFp8ScaleState(e4), sw = MakeFp8ScaleState(e4),
                sg = MakeFp8ScaleState(e5);

  // Scale, amax and scale_inv slots 16 bytes apart in one allocation.
  enum Slot { kXScale, kXAmax, kXInv, kWScale, kWAmax, kWInv, kGScale, kGAmax, kGInv, kSlots };
  DeviceBuffer<float> slots(kSlots * 4);
  auto slot = [&](Slot s) { return slots.data() + 4 * s; };
  auto upload_scales = [&] {
    std::vector<float> h(kSlots * 4, 0.0f);
    h[4 * kXScale] = sx.scale, h[4 * kWScale] = sw.scale, h[4 * kGScale] = sg.scale;
    slots.Upload(h);
  };
  auto amax_of = [&](Slot s) { return slots.Download()[4 * s]; };

  DeviceBuffer<uint8_t> xq(size_t(M * K)), xq_t(size_t(M * K)), wq(size_t(N * K)),
      wq_t(size_t(N * K)), gq(size_t(M * N)), gq_t(size_t(M * N));

  // Step 0 (delayed scaling's history starts empty: scale 1): the casts record the amaxes.
  upload_scales();
  ASSERT_STATUS_OK(cuda::CastTransposeToFp8(xq.data(), xq_t.data(), d_x.data(), M, K,
                                            DType::kE4M3, slot(kXScale), slot(kXAmax),
                                            slot(kXInv), nullptr));
  ASSERT_STATUS_OK(cuda::CastTransposeToFp8(wq.data(), wq_t.data(), d_w.data(), N, K,
                                            DType::kE4M3, slot(kWScale), slot(kWAmax),
                                            slot(kWInv), nullptr));
  const float amax_x = amax_of(kXAmax), amax_w = amax_of(kWAmax);
  EXPECT_EQ(amax_x, cpu::AbsMax(x.data(), M * K));
  EXPECT_EQ(amax_w, cpu::AbsMax(w.data(), N * K));
  ASSERT_TRUE(RecordAmax(e4, amax_x, &sx));
  ASSERT_TRUE(RecordAmax(e4, amax_w, &sw));
  EXPECT_EQ(sx.scale, 448.0f / amax_x);
  EXPECT_EQ(sw.scale, 448.0f / amax_w);

  // Current scaling for the gradient: its amax first (the cast's amax-only pass), then the
  // real cast with the scale from it.
  upload_scales();
  ASSERT_STATUS_OK(cuda::CastToFp8(nullptr, d_dy.data(), M, N, DType::kE5M2, slot(kGScale),
                                   slot(kGAmax), nullptr, nullptr));
  ASSERT_TRUE(UpdateCurrentScale(e5, amax_of(kGAmax), &sg));
  EXPECT_EQ(sg.scale, 57344.0f / cpu::AbsMax(dy.data(), M * N));

  // Step 1: the casts with the recipe's scales; they also write scale_inv for the GEMMs.
  upload_scales();
  ASSERT_STATUS_OK(cuda::CastTransposeToFp8(xq.data(), xq_t.data(), d_x.data(), M, K,
                                            DType::kE4M3, slot(kXScale), slot(kXAmax),
                                            slot(kXInv), nullptr));
  ASSERT_STATUS_OK(cuda::CastTransposeToFp8(wq.data(), wq_t.data(), d_w.data(), N, K,
                                            DType::kE4M3, slot(kWScale), slot(kWAmax),
                                            slot(kWInv), nullptr));
  ASSERT_STATUS_OK(cuda::CastTransposeToFp8(gq.data(), gq_t.data(), d_dy.data(), M, N,
                                            DType::kE5M2, slot(kGScale), slot(kGAmax),
                                            slot(kGInv), nullptr));
  const std::vector<float> h = slots.Download();
  EXPECT_EQ(BitsOf(h[4 * kXInv]), BitsOf(sx.scale_inv));
  EXPECT_EQ(BitsOf(h[4 * kWInv]), BitsOf(sw.scale_inv));
  EXPECT_EQ(BitsOf(h[4 * kGInv]), BitsOf(sg.scale_inv));

  // Dequantised operands from the row-major copies.
  const std::vector<float> x_deq = Dequantise(xq.Download(), cpu::Fp8Format::kE4M3, sx.scale_inv);
  const std::vector<float> w_deq = Dequantise(wq.Download(), cpu::Fp8Format::kE4M3, sw.scale_inv);
  const std::vector<float> g_deq = Dequantise(gq.Download(), cpu::Fp8Format::kE5M2, sg.scale_inv);

  {
    SCOPED_TRACE("forward y = x W^T");
    const auto y = Fp8Gemm(xq.data(), DType::kE4M3, slot(kXInv), wq.data(), DType::kE4M3,
                           slot(kWInv), M, N, K);
    const double vs_bf16 = RelFrobenius(y, Bf16Gemm(x_deq, w_deq, M, N, K, false, true));
    const double vs_exact = RelFrobenius(y, RefGemm(x_deq, w_deq, M, N, K, false, true));
    const double vs_unquantised = RelFrobenius(y, RefGemm(x, w, M, N, K, false, true));
    EXPECT_LT(vs_bf16, 1e-2);
    EXPECT_LT(vs_exact, 5e-3);
    EXPECT_LT(vs_unquantised, 0.1);  // E4M3's own rounding: a few percent
    RecordProperty("fwd_rel_err_vs_bf16", std::to_string(vs_bf16));
    std::printf("fp8 fwd: rel err vs bf16 gemm of dequantised %.2e, vs exact %.2e, vs "
                "unquantised %.2e\n", vs_bf16, vs_exact, vs_unquantised);
  }
  {
    SCOPED_TRACE("dgrad dx = dy W (transposed weight copy)");
    const auto dx = Fp8Gemm(gq.data(), DType::kE5M2, slot(kGInv), wq_t.data(), DType::kE4M3,
                            slot(kWInv), M, K, N);
    // Reference from the row-major W: B [N, K] is op(B) = B, i.e. trans_b = false.
    const double vs_bf16 = RelFrobenius(dx, Bf16Gemm(g_deq, w_deq, M, K, N, false, false));
    const double vs_exact = RelFrobenius(dx, RefGemm(g_deq, w_deq, M, K, N, false, false));
    EXPECT_LT(vs_bf16, 1e-2);
    EXPECT_LT(vs_exact, 5e-3);
    std::printf("fp8 dgrad: rel err vs bf16 %.2e, vs exact %.2e\n", vs_bf16, vs_exact);
  }
  {
    SCOPED_TRACE("wgrad dW = dy^T x (transposed activation and gradient copies)");
    const auto dw = Fp8Gemm(gq_t.data(), DType::kE5M2, slot(kGInv), xq_t.data(), DType::kE4M3,
                            slot(kXInv), N, K, M);
    // Reference from the row-major dy [M, N] (trans_a) and x [M, K] (B = [K_gemm, N_gemm]).
    const double vs_bf16 = RelFrobenius(dw, Bf16Gemm(g_deq, x_deq, N, K, M, true, false));
    const double vs_exact = RelFrobenius(dw, RefGemm(g_deq, x_deq, N, K, M, true, false));
    EXPECT_LT(vs_bf16, 1e-2);
    EXPECT_LT(vs_exact, 5e-3);
    std::printf("fp8 wgrad: rel err vs bf16 %.2e, vs exact %.2e\n", vs_bf16, vs_exact);
  }
}

}  // namespace
}  // namespace forge
