// Our own Hopper GEMM (kernels/cuda/gemm_wgmma.cu) against the CPU reference, and its fused
// epilogues bit for bit against the plain GEMM followed by the kernel each one replaces (so the
// model's results do not depend on which path ran). Needs an sm_90 GPU (skips elsewhere).
//
// Tolerances against the float reference: BF16 output rounding, ||got - ref|| / ||ref|| < 4e-3
// for the GEMM (inputs are exact in bf16, so only the output rounding and the summation order
// differ) and 1e-2 after RoPE/SwiGLU (whose inputs are that rounded output). The FP8 form is
// held to the dequantised product (1e-2: its MMAs accumulate at the tensor cores' own
// precision, as cuBLASLt's fast accumulation does) and to cuBLASLt's fast-accumulation GEMM.
#include "kernels/cuda/gemm_wgmma.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fp8_fused_test_util.h"
#include "gpu_test_util.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"

namespace forge {
namespace {

using cuda::bf16;
using cuda::WgmmaEpilogue;
using cuda::WgmmaGemmArgs;
using test::DeviceBuffer;

// D[M, N] = A[M, K] B[N, K]^T in double (gpu_test_util.h), rounded to float for the CPU
// epilogue references.
std::vector<float> CpuGemm(const std::vector<float>& a, const std::vector<float>& b, int64_t M,
                           int64_t N, int64_t K) {
  const std::vector<double> d = test::RefGemm(a, b, M, N, K, /*trans_a=*/false, /*trans_b=*/true);
  return std::vector<float>(d.begin(), d.end());
}

std::vector<uint16_t> Bits(const DeviceBuffer<bf16>& d) {
  const std::vector<bf16> h = d.Download();
  std::vector<uint16_t> bits(h.size());
  std::memcpy(bits.data(), h.data(), h.size() * 2);
  return bits;
}

int64_t Mismatches(const std::vector<uint16_t>& x, const std::vector<uint16_t>& y) {
  if (x.size() != y.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) bad += x[i] != y[i];
  return bad;
}

bool AllFinite(const std::vector<float>& x) {
  for (float v : x) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// Random bf16 operands A [M, K] and B [N, K], on the host (as floats) and the device.
struct Operands {
  std::vector<float> a, b;
  DeviceBuffer<bf16> da, db;
  Operands(int64_t M, int64_t N, int64_t K, uint64_t seed)
      : a(test::RandomUniformBf16(size_t(M * K), -1.0f, 1.0f, seed)),
        b(test::RandomUniformBf16(size_t(N * K), -1.0f, 1.0f, seed + 1)),
        da(test::ToBf16(a)),
        db(test::ToBf16(b)) {}
};

// b [N, K] row-major as [K, N]: an N-major operand.
std::vector<float> Transposed(const std::vector<float>& b, int64_t N, int64_t K) {
  std::vector<float> bt(b.size());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) bt[size_t(k * N + n)] = b[size_t(n * K + k)];
  }
  return bt;
}

WgmmaGemmArgs Args(int64_t M, int64_t N, int64_t K, const Operands& o, void* d) {
  WgmmaGemmArgs g;
  g.M = M, g.N = N, g.K = K, g.A = o.da.data(), g.B = o.db.data(), g.D = d;
  return g;
}

struct Shape {
  int64_t M, N, K;
  std::string Name() const {
    return "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
  }
};

TEST(GpuWgmmaGemm, MatchesCpuReference) {
  FORGE_SKIP_WITHOUT_SM90();
  // One tile; several tiles and K-tiles (more K-tiles than pipeline stages); a long K.
  for (const Shape s : {Shape{128, 256, 64}, Shape{384, 512, 192}, Shape{256, 768, 1024}}) {
    SCOPED_TRACE(s.Name());
    const Operands o(s.M, s.N, s.K, uint64_t(s.M + s.N + s.K));
    DeviceBuffer<bf16> d(size_t(s.M * s.N));
    d.Poison();
    ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(Args(s.M, s.N, s.K, o, d.data()), nullptr));
    const std::vector<float> got = test::ToFloat(d.Download());
    ASSERT_TRUE(AllFinite(got)) << "an output element was not written";
    const std::vector<float> ref = CpuGemm(o.a, o.b, s.M, s.N, s.K);
    EXPECT_LT(test::RelFrobenius(got, ref), 4e-3);

    // One persistent CTA walks every tile: the pipeline's stage phases carry across tiles and
    // the staging buffer is reused; the result must not change.
    DeviceBuffer<bf16> d1(size_t(s.M * s.N));
    d1.Poison();
    WgmmaGemmArgs g = Args(s.M, s.N, s.K, o, d1.data());
    g.ctas = 1;
    ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(g, nullptr));
    EXPECT_EQ(Mismatches(Bits(d1), Bits(d)), 0);

    // The tile order (tile_order.h) moves no result: row-major, and bands of 2 tile rows (at 3
    // tile rows the last band holds one), beside the default's bands above.
    for (int rows : {1, 2}) {
      SCOPED_TRACE("group_rows " + std::to_string(rows));
      d1.Poison();
      g = Args(s.M, s.N, s.K, o, d1.data());
      g.group_rows = rows;
      ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(g, nullptr));
      EXPECT_EQ(Mismatches(Bits(d1), Bits(d)), 0);
    }
  }
}

// An N-major B ([K, N], the backward's dX = dY W) is read as the K-major B^T: the same products
// summed in the same order, so bit for bit the K-major GEMM on a transposed copy, and close to
// the CPU. Shapes as above plus gpt350m's QKV dgrad (K 3072 -> N 1024) at 512 rows (its down
// projection's dgrad, N 2816, is not a multiple of 256).
TEST(GpuWgmmaGemm, NMajorBIsTheTransposedKMajorBBitForBit) {
  FORGE_SKIP_WITHOUT_SM90();
  for (const Shape s : {Shape{128, 256, 64}, Shape{384, 512, 192}, Shape{256, 768, 1024},
                        Shape{512, 1024, 3072}}) {
    SCOPED_TRACE(s.Name());
    const Operands o(s.M, s.N, s.K, uint64_t(3 * s.M + s.N + s.K));
    const DeviceBuffer<bf16> dbt(test::ToBf16(Transposed(o.b, s.N, s.K)));
    DeviceBuffer<bf16> k_major(size_t(s.M * s.N)), n_major(size_t(s.M * s.N));
    ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(Args(s.M, s.N, s.K, o, k_major.data()), nullptr));
    n_major.Poison();
    WgmmaGemmArgs g = Args(s.M, s.N, s.K, o, n_major.data());
    g.B = dbt.data(), g.b_n_major = true;
    ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(g, nullptr));
    const std::vector<float> got = test::ToFloat(n_major.Download());
    ASSERT_TRUE(AllFinite(got)) << "an output element was not written";
    EXPECT_EQ(Mismatches(Bits(n_major), Bits(k_major)), 0);
    EXPECT_LT(test::RelFrobenius(got, CpuGemm(o.a, o.b, s.M, s.N, s.K)), 4e-3);
  }
}

// RoPE in the epilogue == plain GEMM then RopeApply, bit for bit, and close to the CPU's GEMM
// then RoPE. MHA (4 + 4 + 4 heads of 64) and GQA (8 query heads, 4 KV heads).
TEST(GpuWgmmaGemm, RopeEpilogueIsGemmThenRopeBitForBit) {
  FORGE_SKIP_WITHOUT_SM90();
  const int B = 2, T = 128, hd = 64, K = 192;
  const float theta = 10000.0f;
  const test::DeviceBuffer<float> freqs = test::RopeFreqs(hd, theta);
  const int64_t M = int64_t{B} * T;
  DeviceBuffer<float2> table(size_t(T) * hd / 2);
  ASSERT_STATUS_OK(cuda::RopeSinCosTable(table.data(), T, hd, freqs.data(), nullptr));
  for (const auto [H, KV] : {std::pair{4, 4}, std::pair{8, 4}}) {
    SCOPED_TRACE("H=" + std::to_string(H) + " KV=" + std::to_string(KV));
    const int64_t N = int64_t{H + 2 * KV} * hd;
    const Operands o(M, N, K, uint64_t(10 * H + KV));
    DeviceBuffer<bf16> plain(size_t(M * N)), fused(size_t(M * N));
    ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(Args(M, N, K, o, plain.data()), nullptr));
    ASSERT_STATUS_OK(cuda::RopeApply(plain.data(), B, T, H, KV, hd, freqs.data(), false, nullptr));
    fused.Poison();
    WgmmaGemmArgs g = Args(M, N, K, o, fused.data());
    g.epilogue = WgmmaEpilogue::kRope;
    g.epi.rope_sin_cos = table.data(), g.epi.T = T, g.epi.hd = hd;
    g.epi.rot_cols = (H + KV) * hd;
    ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(g, nullptr));
    EXPECT_EQ(Mismatches(Bits(fused), Bits(plain)), 0);

    std::vector<float> ref = CpuGemm(o.a, o.b, M, N, K);
    test::RoundBf16InPlace(ref);
    cpu::RopeApply(ref.data(), B, T, H, KV, hd, theta, false);
    const std::vector<float> got = test::ToFloat(fused.Download());
    ASSERT_TRUE(AllFinite(got));
    EXPECT_LT(test::RelFrobenius(got, ref), 1e-2);
  }
}

// SwiGLU in the epilogue: gu == the plain GEMM's output and h == SwiGluForward(gu), bit for
// bit; h close to the CPU's. A CTA computes a tile's h from its staged gu during its next tile's
// main loop, so also with persistent CTAs walking several tiles (ctas 1 and 4 of 6), in bands
// of 2 tile rows (tile_order.h; column by column here) and with one K-tile (every share of h at
// the first).
TEST(GpuWgmmaGemm, SwiGluEpilogueIsGemmThenSwiGluBitForBit) {
  FORGE_SKIP_WITHOUT_SM90();
  const int64_t M = 256, ffn = 384;
  for (const int64_t K : {128, 64}) {
    const Operands o(M, 2 * ffn, K, 77 + K);
    DeviceBuffer<bf16> gu_plain(size_t(M * 2 * ffn)), h_plain(size_t(M * ffn));
    ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(Args(M, 2 * ffn, K, o, gu_plain.data()), nullptr));
    ASSERT_STATUS_OK(cuda::SwiGluForward(h_plain.data(), gu_plain.data(), M, int(ffn), nullptr));
    std::vector<float> ref_gu = CpuGemm(o.a, o.b, M, 2 * ffn, K);
    test::RoundBf16InPlace(ref_gu);
    std::vector<float> ref_h(size_t(M * ffn));
    cpu::SwiGluForward(ref_h.data(), ref_gu.data(), M, int(ffn));
    for (const auto [ctas, rows] : {std::pair{0, 0}, {1, 0}, {4, 0}, {0, 2}, {4, 2}}) {
      SCOPED_TRACE("K " + std::to_string(K) + ", ctas " + std::to_string(ctas) + ", group_rows " +
                   std::to_string(rows));
      DeviceBuffer<bf16> gu(size_t(M * 2 * ffn)), h(size_t(M * ffn));
      gu.Poison();
      h.Poison();
      WgmmaGemmArgs g = Args(M, 2 * ffn, K, o, h.data());
      g.epilogue = WgmmaEpilogue::kSwiGlu;
      g.epi.gu = gu.data(), g.epi.ffn = int(ffn);
      g.ctas = ctas, g.group_rows = rows;
      ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(g, nullptr));
      EXPECT_EQ(Mismatches(Bits(gu), Bits(gu_plain)), 0) << "gu";
      EXPECT_EQ(Mismatches(Bits(h), Bits(h_plain)), 0) << "h";
      const std::vector<float> got = test::ToFloat(h.Download());
      ASSERT_TRUE(AllFinite(got));
      EXPECT_LT(test::RelFrobenius(got, ref_h), 1e-2);
    }
  }
}

// SwiGLU's backward in the epilogue of dh = dy W (N-major W): dgu == SwiGluBackward(dh, gu) on
// the plain GEMM's dh, bit for bit, and close to the CPU's. A CTA computes a tile's dgu during
// its next tile's main loop (16 vectors a thread, spread over the K-tiles), so also with
// persistent CTAs walking several tiles, in bands of 2 tile rows (of 3: the last band holds
// one), one K-tile (all 16 at once) and 20 (some K-tiles take none).
TEST(GpuWgmmaGemm, SwiGluBackwardEpilogueIsGemmThenSwiGluBackwardBitForBit) {
  FORGE_SKIP_WITHOUT_SM90();
  const int64_t M = 384, ffn = 512;
  const std::vector<float> gu_host = test::RandomUniformBf16(size_t(M * 2 * ffn), -3.f, 3.f, 91);
  const DeviceBuffer<bf16> gu(test::ToBf16(gu_host));
  for (const int64_t K : {128, 64, 1280}) {
    const Operands o(M, ffn, K, 31 + K);  // o.b is W^T [ffn, K]; the GEMM reads W [K, ffn]
    const DeviceBuffer<bf16> dw(test::ToBf16(Transposed(o.b, ffn, K)));
    DeviceBuffer<bf16> dh(size_t(M * ffn)), dgu_plain(size_t(M * 2 * ffn));
    WgmmaGemmArgs plain = Args(M, ffn, K, o, dh.data());
    plain.B = dw.data(), plain.b_n_major = true;
    ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(plain, nullptr));
    ASSERT_STATUS_OK(
        cuda::SwiGluBackward(dgu_plain.data(), dh.data(), gu.data(), M, int(ffn), nullptr));
    std::vector<float> ref_dh = CpuGemm(o.a, o.b, M, ffn, K);
    test::RoundBf16InPlace(ref_dh);
    std::vector<float> ref_dgu(size_t(M * 2 * ffn));
    cpu::SwiGluBackward(ref_dgu.data(), ref_dh.data(), gu_host.data(), M, int(ffn));
    for (const auto [ctas, rows] : {std::pair{0, 0}, {1, 0}, {5, 0}, {0, 2}, {5, 2}}) {
      SCOPED_TRACE("K " + std::to_string(K) + ", ctas " + std::to_string(ctas) + ", group_rows " +
                   std::to_string(rows));
      DeviceBuffer<bf16> dgu(size_t(M * 2 * ffn));
      dgu.Poison();
      WgmmaGemmArgs g = plain;
      g.D = dgu.data();
      g.epilogue = WgmmaEpilogue::kSwiGluBackward;
      g.epi.gu = const_cast<bf16*>(gu.data()), g.epi.ffn = int(ffn);
      g.ctas = ctas, g.group_rows = rows;
      ASSERT_STATUS_OK(cuda::WgmmaGemmBf16(g, nullptr));
      EXPECT_EQ(Mismatches(Bits(dgu), Bits(dgu_plain)), 0);
      const std::vector<float> got = test::ToFloat(dgu.Download());
      ASSERT_TRUE(AllFinite(got)) << "an element of dgu was not written";
      EXPECT_LT(test::RelFrobenius(got, ref_dgu), 1e-2);
    }
  }
}

// A [M, K] and B [N, K] in E4M3 with their dequantisation scales on the device (16 bytes
// apart, as the model's slots are).
struct Fp8Operands {
  test::Fp8Operand a, b;
  DeviceBuffer<float> scales;
  Fp8Operands(int64_t M, int64_t N, int64_t K, uint64_t seed)
      : a(M, K, 1.0f, 100.0f, seed),
        b(N, K, 0.05f, 3000.0f, seed + 1),
        scales(std::vector<float>{a.scale_inv, 0, 0, 0, b.scale_inv}) {}
  WgmmaGemmArgs Args(int64_t M, int64_t N, int64_t K, void* d) const {
    WgmmaGemmArgs g;
    g.M = M, g.N = N, g.K = K, g.A = a.dev.data(), g.B = b.dev.data(), g.D = d;
    g.epi.a_scale = scales.data(), g.epi.b_scale = scales.data() + 4;
    return g;
  }
};

// The FP8 GEMM against the dequantised product and against cuBLASLt's FP8 GEMM with fast
// accumulation on the same bytes and scales; one persistent CTA gives the same bits.
TEST(GpuWgmmaGemm, Fp8MatchesDequantisedProductAndCublasLt) {
  FORGE_SKIP_WITHOUT_SM90();
  cuda::GemmRunner runner;
  ASSERT_STATUS_OK(runner.Init());
  // One tile and one K-tile; more K-tiles than stages; gpt350m's gate/up K.
  for (const Shape s : {Shape{128, 256, 128}, Shape{384, 512, 512}, Shape{256, 768, 1024}}) {
    SCOPED_TRACE(s.Name());
    const Fp8Operands o(s.M, s.N, s.K, uint64_t(s.M + s.N + s.K));
    DeviceBuffer<bf16> d(size_t(s.M * s.N)), d1(size_t(s.M * s.N)), ref_lt(size_t(s.M * s.N));
    d.Poison();
    d1.Poison();
    ASSERT_STATUS_OK(cuda::WgmmaGemmFp8(o.Args(s.M, s.N, s.K, d.data()), nullptr));
    const std::vector<float> got = test::ToFloat(d.Download());
    ASSERT_TRUE(AllFinite(got)) << "an output element was not written";
    const std::vector<double> ref =
        test::RefGemm(o.a.deq, o.b.deq, s.M, s.N, s.K, /*trans_a=*/false, /*trans_b=*/true);
    EXPECT_LT(test::RelFrobenius(got, ref), 1e-2);

    cuda::GemmArgs lt;
    lt.M = s.M, lt.N = s.N, lt.K = s.K;
    lt.A = o.a.dev.data(), lt.B = o.b.dev.data(), lt.D = ref_lt.data();
    lt.trans_a = false, lt.trans_b = true;
    lt.a_type = cuda::DType::kE4M3, lt.b_type = cuda::DType::kE4M3;
    lt.d_type = cuda::DType::kBf16;
    lt.a_scale = o.scales.data(), lt.b_scale = o.scales.data() + 4;
    lt.fast_accum = true;
    ASSERT_STATUS_OK(runner.Run(lt, nullptr));
    EXPECT_LT(test::RelFrobenius(got, test::ToFloat(ref_lt.Download())), 4e-3);

    WgmmaGemmArgs g = o.Args(s.M, s.N, s.K, d1.data());
    g.ctas = 1;
    ASSERT_STATUS_OK(cuda::WgmmaGemmFp8(g, nullptr));
    EXPECT_EQ(Mismatches(Bits(d1), Bits(d)), 0);
  }
}

// FP8 with SwiGLU: gu bit for bit the plain FP8 GEMM's, and h's E4M3 bytes (row-major and
// transposed), amax and scale_inv bit for bit SwiGluForward on that gu followed by
// CastTransposeToFp8, which is what the model's separate path writes (SwiGluForwardFp8 is
// tested equal to that pair). K of 1, 2 and 8 K-tiles (the first two take every share of h at
// the last K-tile), 1/4/all CTAs, a scale that saturates.
TEST(GpuWgmmaGemm, Fp8SwiGluEpilogueIsGemmThenSwiGluThenCastBitForBit) {
  FORGE_SKIP_WITHOUT_SM90();
  const int64_t M = 256, ffn = 384;
  for (const int64_t K : {128, 256, 1024}) {
    const Fp8Operands o(M, 2 * ffn, K, 91 + K);
    DeviceBuffer<bf16> gu_plain(size_t(M * 2 * ffn)), h_plain(size_t(M * ffn));
    ASSERT_STATUS_OK(cuda::WgmmaGemmFp8(o.Args(M, 2 * ffn, K, gu_plain.data()), nullptr));
    ASSERT_STATUS_OK(cuda::SwiGluForward(h_plain.data(), gu_plain.data(), M, int(ffn), nullptr));
    for (const float scale : {64.0f, 4000.0f}) {
      for (const int ctas : {0, 1, 4}) {
        SCOPED_TRACE("K " + std::to_string(K) + ", scale " + std::to_string(scale) + ", ctas " +
                     std::to_string(ctas));
        DeviceBuffer<bf16> gu(size_t(M * 2 * ffn));
        test::Fp8CastOut h(size_t(M * ffn), scale);
        gu.Poison();
        h.q.Poison();
        h.qt.Poison();
        WgmmaGemmArgs g = o.Args(M, 2 * ffn, K, h.q.data());
        g.epilogue = WgmmaEpilogue::kSwiGlu;
        g.epi.gu = gu.data(), g.epi.ffn = int(ffn);
        g.epi.h_t = h.qt.data(), g.epi.h_scale = h.scale(), g.epi.h_amax = h.amax();
        g.epi.h_scale_inv = h.scale_inv();
        g.ctas = ctas;
        ASSERT_STATUS_OK(cuda::WgmmaGemmFp8(g, nullptr));
        EXPECT_EQ(Mismatches(Bits(gu), Bits(gu_plain)), 0) << "gu";
        test::ExpectSameAsCast(h_plain.data(), M, ffn, cuda::DType::kE4M3, scale, h, "h");
      }
    }
  }
}

// FP8 with RoPE (the FP8 forward's QKV projection): the plain FP8 GEMM followed by RopeApply,
// bit for bit, with 1 and all CTAs; close to the CPU's dequantised product then RoPE. MHA and
// GQA, K of one K-tile and of gpt350m's width.
TEST(GpuWgmmaGemm, Fp8RopeEpilogueIsGemmThenRopeBitForBit) {
  FORGE_SKIP_WITHOUT_SM90();
  const int B = 2, T = 128, hd = 64;
  const float theta = 10000.0f;
  const test::DeviceBuffer<float> freqs = test::RopeFreqs(hd, theta);
  const int64_t M = int64_t{B} * T;
  DeviceBuffer<float2> table(size_t(T) * hd / 2);
  ASSERT_STATUS_OK(cuda::RopeSinCosTable(table.data(), T, hd, freqs.data(), nullptr));
  for (const auto [H, KV, K] : {std::tuple{4, 4, 128}, std::tuple{8, 4, 1024}}) {
    SCOPED_TRACE("H=" + std::to_string(H) + " KV=" + std::to_string(KV) +
                 " K=" + std::to_string(K));
    const int64_t N = int64_t{H + 2 * KV} * hd;
    const Fp8Operands o(M, N, K, uint64_t(7 * H + KV + K));
    DeviceBuffer<bf16> plain(size_t(M * N));
    ASSERT_STATUS_OK(cuda::WgmmaGemmFp8(o.Args(M, N, K, plain.data()), nullptr));
    ASSERT_STATUS_OK(cuda::RopeApply(plain.data(), B, T, H, KV, hd, freqs.data(), false, nullptr));
    for (const int ctas : {0, 1}) {
      SCOPED_TRACE("ctas " + std::to_string(ctas));
      DeviceBuffer<bf16> fused(size_t(M * N));
      fused.Poison();
      WgmmaGemmArgs g = o.Args(M, N, K, fused.data());
      g.epilogue = WgmmaEpilogue::kRope;
      g.epi.rope_sin_cos = table.data(), g.epi.T = T, g.epi.hd = hd;
      g.epi.rot_cols = (H + KV) * hd;
      g.ctas = ctas;
      ASSERT_STATUS_OK(cuda::WgmmaGemmFp8(g, nullptr));
      EXPECT_EQ(Mismatches(Bits(fused), Bits(plain)), 0);
      std::vector<float> ref = CpuGemm(o.a.deq, o.b.deq, M, N, K);
      test::RoundBf16InPlace(ref);
      cpu::RopeApply(ref.data(), B, T, H, KV, hd, theta, false);
      const std::vector<float> got = test::ToFloat(fused.Download());
      ASSERT_TRUE(AllFinite(got)) << "an output element was not written";
      EXPECT_LT(test::RelFrobenius(got, ref), 1e-2);
    }
  }
}

TEST(GpuWgmmaGemm, Fp8RejectsWhatItCannotTake) {
  FORGE_SKIP_WITHOUT_SM90();
  const Fp8Operands o(128, 256, 128, 9);
  DeviceBuffer<bf16> d(size_t(128 * 256));
  const Status k64 = cuda::WgmmaGemmFp8(o.Args(128, 256, 64, d.data()), nullptr);
  EXPECT_FALSE(k64.ok());
  EXPECT_NE(k64.ToString().find("K of 128"), std::string::npos) << k64.ToString();
  WgmmaGemmArgs no_scales = o.Args(128, 256, 128, d.data());
  no_scales.epi.b_scale = nullptr;
  EXPECT_FALSE(cuda::WgmmaGemmFp8(no_scales, nullptr).ok());
  WgmmaGemmArgs n_major = o.Args(128, 256, 128, d.data());
  n_major.b_n_major = true;
  EXPECT_FALSE(cuda::WgmmaGemmCheck(n_major, /*fp8=*/true).ok());
  WgmmaGemmArgs rope = o.Args(128, 256, 128, d.data());
  rope.epilogue = WgmmaEpilogue::kRope;
  rope.epi.T = 128, rope.epi.hd = 64, rope.epi.rot_cols = 256;
  EXPECT_TRUE(cuda::WgmmaGemmCheck(rope, /*fp8=*/true).ok());
  rope.epi.hd = 32;
  EXPECT_FALSE(cuda::WgmmaGemmCheck(rope, /*fp8=*/true).ok());
  rope.epi.hd = 64;  // no (sin, cos) table
  EXPECT_FALSE(cuda::WgmmaGemmFp8(rope, nullptr).ok());
  WgmmaGemmArgs bwd = o.Args(128, 256, 128, d.data());
  bwd.epilogue = WgmmaEpilogue::kSwiGluBackward;
  bwd.b_n_major = true, bwd.epi.gu = d.data(), bwd.epi.ffn = 256;
  EXPECT_TRUE(cuda::WgmmaGemmCheck(bwd).ok());
  EXPECT_FALSE(cuda::WgmmaGemmCheck(bwd, /*fp8=*/true).ok());
  WgmmaGemmArgs swiglu = o.Args(128, 256, 128, d.data());
  swiglu.epilogue = WgmmaEpilogue::kSwiGlu;
  swiglu.epi.gu = d.data(), swiglu.epi.ffn = 128;  // no h_t or h slots
  const Status st = cuda::WgmmaGemmFp8(swiglu, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("h_t"), std::string::npos) << st.ToString();
}

TEST(GpuWgmmaGemm, RejectsWhatItCannotTile) {
  FORGE_SKIP_WITHOUT_SM90();
  const Operands o(128, 256, 64, 5);
  DeviceBuffer<bf16> d(size_t(128 * 256));
  const Status rows = cuda::WgmmaGemmBf16(Args(100, 256, 64, o, d.data()), nullptr);
  EXPECT_FALSE(rows.ok());
  EXPECT_NE(rows.ToString().find("multiple of 128"), std::string::npos) << rows.ToString();
  EXPECT_FALSE(cuda::WgmmaGemmBf16(Args(128, 300, 64, o, d.data()), nullptr).ok());
  EXPECT_FALSE(cuda::WgmmaGemmBf16(Args(128, 256, 40, o, d.data()), nullptr).ok());
  WgmmaGemmArgs rope = Args(128, 256, 64, o, d.data());
  rope.epilogue = WgmmaEpilogue::kRope;  // no table, head width 0
  EXPECT_FALSE(cuda::WgmmaGemmBf16(rope, nullptr).ok());
  WgmmaGemmArgs swiglu = Args(128, 256, 64, o, d.data());
  swiglu.epilogue = WgmmaEpilogue::kSwiGlu;  // no gu
  EXPECT_FALSE(cuda::WgmmaGemmBf16(swiglu, nullptr).ok());
  WgmmaGemmArgs n_major_rope = rope;  // an N-major B takes the plain or SwiGLU-backward epilogue
  n_major_rope.b_n_major = true;
  const Status nm = cuda::WgmmaGemmCheck(n_major_rope);
  EXPECT_FALSE(nm.ok());
  EXPECT_NE(nm.ToString().find("N-major"), std::string::npos) << nm.ToString();
  WgmmaGemmArgs bwd = Args(128, 256, 64, o, d.data());
  bwd.epilogue = WgmmaEpilogue::kSwiGluBackward;
  bwd.epi.gu = d.data(), bwd.epi.ffn = 256;  // K-major B
  EXPECT_FALSE(cuda::WgmmaGemmCheck(bwd).ok());
  bwd.b_n_major = true, bwd.epi.ffn = 128;  // ffn != N
  EXPECT_FALSE(cuda::WgmmaGemmCheck(bwd).ok());
  bwd.epi.ffn = 256;
  EXPECT_TRUE(cuda::WgmmaGemmCheck(bwd).ok());
  WgmmaGemmArgs order = Args(128, 256, 64, o, d.data());
  order.group_rows = -1;
  EXPECT_FALSE(cuda::WgmmaGemmCheck(order).ok());
}

}  // namespace
}  // namespace forge
