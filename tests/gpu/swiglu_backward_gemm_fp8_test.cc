// The FP8 down-projection input gradient with SwiGLU's backward fused
// (kernels/cuda/swiglu_backward_gemm_fp8.h): with an E4M3 dy, bit for bit our FP8 GEMM
// (WgmmaGemmFp8: the same MMAs, tested against the CPU and cuBLASLt) followed by
// SwiGluBackwardFp8 (tested against SwiGluBackward + the cast); with the E5M2 dy the model
// passes, against the CPU's dequantised product and SwiGLU backward. Needs an sm_90 GPU.
#include "kernels/cuda/swiglu_backward_gemm_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fp8_fused_test_util.h"
#include "gpu_test_util.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/swiglu_fp8.h"

namespace forge {
namespace {

using cuda::bf16;
using cuda::DType;
using test::DeviceBuffer;
using test::Fp8CastOut;
using test::Fp8Operand;

// dy [M, K], W_down^T [ffn, K] and gate/up [M, 2 ffn] of one problem, with the scale slots.
struct Problem {
  int64_t M, K;
  int ffn;
  Fp8Operand dy, w_t;
  std::vector<float> gate_up;
  DeviceBuffer<bf16> d_gate_up;
  DeviceBuffer<float> scales;
  Problem(int64_t m, int64_t k, int f, cpu::Fp8Format dy_format, uint64_t seed)
      : M(m),
        K(k),
        ffn(f),
        dy(m, k, 1.0f, dy_format == cpu::Fp8Format::kE4M3 ? 64.0f : 1024.0f, seed, dy_format),
        w_t(f, k, 0.03f, 4096.0f, seed + 1),
        gate_up(test::RandomNormalBf16(size_t(m) * 2 * f, 2.0f, seed + 2)),
        d_gate_up(test::ToBf16(gate_up)),
        scales(std::vector<float>{dy.scale_inv, 0, 0, 0, w_t.scale_inv}) {}
  cuda::SwiGluBackwardGemmFp8Args Args(Fp8CastOut& out, int ctas) {
    cuda::SwiGluBackwardGemmFp8Args a;
    a.M = M, a.K = K, a.ffn = ffn;
    a.dy = dy.dev.data(), a.w_t = w_t.dev.data();
    a.dy_scale_inv = scales.data(), a.w_scale_inv = scales.data() + 4;
    a.gate_up = d_gate_up.data();
    a.dgate_up = out.q.data(), a.dgate_up_t = out.qt.data();
    a.scale = out.scale(), a.amax = out.amax(), a.scale_inv = out.scale_inv();
    a.ctas = ctas;
    return a;
  }
};

// Several tiles a CTA (both staging buffers reused, their phases wrapping), one CTA, all; tiles
// in bands of 3 rows (tile_order.h: of 2, 6 and 8 tile rows); K of one K-tile and of
// gpt350m's width; a scale that saturates some values.
TEST(GpuSwiGluBackwardGemmFp8, IsGemmThenSwiGluBackwardBitForBit) {
  FORGE_SKIP_WITHOUT_SM90();
  for (const auto [M, K, ffn] :
       {std::tuple{128, 128, 256}, std::tuple{384, 256, 256}, std::tuple{512, 1024, 512}}) {
    Problem p(M, K, ffn, cpu::Fp8Format::kE4M3, uint64_t(M + K + ffn));
    // The reference: our plain FP8 GEMM into a bf16 dh, then SwiGLU's backward into E5M2.
    DeviceBuffer<bf16> dh(size_t(M) * ffn);
    cuda::WgmmaGemmArgs g;
    g.M = M, g.N = ffn, g.K = K, g.A = p.dy.dev.data(), g.B = p.w_t.dev.data(), g.D = dh.data();
    g.epi.a_scale = p.scales.data(), g.epi.b_scale = p.scales.data() + 4;
    ASSERT_STATUS_OK(cuda::WgmmaGemmFp8(g, nullptr));
    for (const float scale : {2.0f, 4096.0f}) {
      Fp8CastOut want(size_t(M) * 2 * ffn, scale);
      ASSERT_STATUS_OK(cuda::SwiGluBackwardFp8(
          want.q.data(), want.qt.data(), dh.data(), p.d_gate_up.data(), M, ffn, DType::kE5M2,
          want.scale(), want.amax(), want.scale_inv(), nullptr));
      for (const auto [ctas, rows] : {std::pair{0, 0}, {1, 0}, {3, 0}, {0, 3}, {3, 3}}) {
        SCOPED_TRACE("M " + std::to_string(M) + " K " + std::to_string(K) + " ffn " +
                     std::to_string(ffn) + " scale " + std::to_string(scale) + " ctas " +
                     std::to_string(ctas) + " group_rows " + std::to_string(rows));
        Fp8CastOut got(size_t(M) * 2 * ffn, scale);
        got.q.Poison();
        got.qt.Poison();
        cuda::SwiGluBackwardGemmFp8Args a = p.Args(got, ctas);
        a.dy_e4m3 = true, a.group_rows = rows;
        ASSERT_STATUS_OK(cuda::SwiGluBackwardGemmFp8(a, nullptr));
        EXPECT_EQ(got.q.Download(), want.q.Download()) << "row-major";
        EXPECT_EQ(got.qt.Download(), want.qt.Download()) << "transposed";
        EXPECT_EQ(got.slots.Download(), want.slots.Download()) << "scale / amax / scale_inv";
      }
    }
  }
}

// The model's form, dy in E5M2: the dequantised outputs against the CPU's dequantised product
// (rounded to bf16) and SwiGLU backward, within E5M2's rounding (half a step, 2^-3 relative)
// plus what the tensor cores' summation changes of dh (relative to the typical |dh|, for
// elements whose sum cancels); a whole step where that flips the rounding, which few may.
TEST(GpuSwiGluBackwardGemmFp8, E5M2GradientMatchesCpu) {
  FORGE_SKIP_WITHOUT_SM90();
  const int64_t M = 256, K = 512;
  const int ffn = 256;
  Problem p(M, K, ffn, cpu::Fp8Format::kE5M2, 77);
  std::vector<float> dh(size_t(M) * ffn);
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t c = 0; c < ffn; ++c) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double(p.dy.deq[r * K + k]) * p.w_t.deq[c * K + k];
      dh[r * ffn + c] = float(acc);
    }
  }
  test::RoundBf16InPlace(dh);
  std::vector<float> ref(size_t(M) * 2 * ffn);
  cpu::SwiGluBackward(ref.data(), dh.data(), p.gate_up.data(), M, ffn);
  const float scale = 256.0f;
  Fp8CastOut got(size_t(M) * 2 * ffn, scale);
  ASSERT_STATUS_OK(cuda::SwiGluBackwardGemmFp8(p.Args(got, 0), nullptr));
  const std::vector<uint8_t> q = got.q.Download(), qt = got.qt.Download();
  double sq = 0.0;
  for (const float x : ref) sq += double(x) * x;
  const float rms = float(std::sqrt(sq / double(ref.size())));
  int far = 0;
  std::vector<float> got_deq(q.size());
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t c = 0; c < 2 * ffn; ++c) {
      const size_t i = size_t(r * 2 * ffn + c);
      ASSERT_EQ(q[i], qt[size_t(c * M + r)]) << "transposed copy at " << r << ", " << c;
      const float v = cpu::Fp8ToFloat(q[i], cpu::Fp8Format::kE5M2) / scale;
      got_deq[i] = v;
      const float tol = std::fabs(ref[i]) / 8 + 1e-2f * rms;
      far += std::fabs(v - ref[i]) > tol;
      ASSERT_LE(std::fabs(v - ref[i]), 2 * tol) << r << ", " << c << ": " << v << " vs " << ref[i];
    }
  }
  EXPECT_LE(far, int(q.size() / 20));
  EXPECT_LT(test::RelFrobenius(got_deq, ref), 0.08);
  const std::vector<float> slots = got.slots.Download();
  EXPECT_GT(slots[4], 0.0f);
  EXPECT_EQ(slots[8], 1.0f / scale);
}

TEST(GpuSwiGluBackwardGemmFp8, RefusesWhatItCannotTile) {
  FORGE_SKIP_WITHOUT_SM90();
  Problem p(128, 128, 256, cpu::Fp8Format::kE5M2, 5);
  Fp8CastOut out(size_t(128) * 2 * 256, 1.0f);
  for (const auto [M, K, ffn] :
       {std::tuple{96, 128, 256}, std::tuple{128, 64, 256}, std::tuple{128, 128, 64}}) {
    cuda::SwiGluBackwardGemmFp8Args a = p.Args(out, 0);
    a.M = M, a.K = K, a.ffn = ffn;
    const Status st = cuda::SwiGluBackwardGemmFp8(a, nullptr);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.ToString().find("multiple of"), std::string::npos) << st.ToString();
  }
  cuda::SwiGluBackwardGemmFp8Args a = p.Args(out, 0);
  a.gate_up = nullptr;
  EXPECT_FALSE(cuda::SwiGluBackwardGemmFp8(a, nullptr).ok());
  // The transposed output leaves by TMA: 16-byte aligned.
  cuda::SwiGluBackwardGemmFp8Args t = p.Args(out, 0);
  t.dgate_up_t = static_cast<uint8_t*>(t.dgate_up_t) + 8;
  const Status st = cuda::SwiGluBackwardGemmFp8(t, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("unaligned"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace forge
