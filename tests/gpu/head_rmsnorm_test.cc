// QK-norm kernels (RMSNorm of each Q and K head inside the fused qkv buffer) against the CPU
// RMSNorm run head row by head row on the same bf16 inputs. Tolerances: outputs and input
// gradients are bf16 (max |got - ref| / max |ref| < 1e-2); the weight gradients are fp32 sums
// over every row (relative Frobenius < 1e-3 against the double-free CPU sums). V's columns
// must stay bitwise untouched and the raw copy must be the input bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/head_rmsnorm.h"

namespace forge {
namespace {

using test::bf16;
using test::DeviceBuffer;

struct Case {
  int N, H, KV, hd;
};

// Gathers the Q or K head rows of qkv ([N, (H + 2 KV) hd]) into [rows, hd].
std::vector<float> HeadRows(const std::vector<float>& qkv, const Case& c, bool q) {
  const int64_t stride = int64_t{c.H + 2 * c.KV} * c.hd;
  const int first = q ? 0 : c.H, heads = q ? c.H : c.KV;
  std::vector<float> out;
  for (int n = 0; n < c.N; ++n)
    for (int h = first; h < first + heads; ++h)
      for (int j = 0; j < c.hd; ++j) out.push_back(qkv[n * stride + int64_t{h} * c.hd + j]);
  return out;
}

std::vector<float> VColumns(const std::vector<float>& qkv, const Case& c) {
  const int64_t stride = int64_t{c.H + 2 * c.KV} * c.hd, v0 = int64_t{c.H + c.KV} * c.hd;
  std::vector<float> out;
  for (int n = 0; n < c.N; ++n)
    for (int64_t j = v0; j < stride; ++j) out.push_back(qkv[n * stride + j]);
  return out;
}

void Check(const Case& c, uint64_t seed) {
  SCOPED_TRACE("N=" + std::to_string(c.N) + " H=" + std::to_string(c.H) +
               " KV=" + std::to_string(c.KV) + " hd=" + std::to_string(c.hd));
  const float eps = 1e-5f;
  const cuda::HeadNormShape s{c.N, c.H, c.KV, c.hd, eps};
  const size_t n = size_t(c.N) * (c.H + 2 * c.KV) * c.hd;
  const std::vector<float> qkv = test::RandomNormalBf16(n, 1.5f, seed);
  const std::vector<float> wq = test::RandomUniformBf16(c.hd, 0.5f, 1.5f, seed + 1);
  const std::vector<float> wk = test::RandomUniformBf16(c.hd, 0.5f, 1.5f, seed + 2);
  const std::vector<float> dy = test::RandomNormalBf16(n, 1.0f, seed + 3);

  DeviceBuffer<bf16> d_qkv(test::ToBf16(qkv)), d_wq(test::ToBf16(wq)), d_wk(test::ToBf16(wk));
  DeviceBuffer<bf16> raw(size_t(c.N) * (c.H + c.KV) * c.hd);
  DeviceBuffer<float> rstd(size_t(c.N) * (c.H + c.KV));
  ASSERT_STATUS_OK(cuda::HeadRmsNormForward(d_qkv.data(), raw.data(), rstd.data(), d_wq.data(),
                                            d_wk.data(), s, nullptr));
  const std::vector<float> got = test::ToFloat(d_qkv.Download());
  EXPECT_TRUE(test::BitwiseEqual(VColumns(got, c), VColumns(qkv, c))) << "V must not change";
  std::vector<float> raw_want = HeadRows(qkv, c, true), k_rows = HeadRows(qkv, c, false);
  // raw is [N, H + KV, hd]: token by token, Q heads then K heads.
  {
    std::vector<float> interleaved;
    for (int t = 0; t < c.N; ++t) {
      interleaved.insert(interleaved.end(), raw_want.begin() + int64_t{t} * c.H * c.hd,
                         raw_want.begin() + int64_t{t + 1} * c.H * c.hd);
      interleaved.insert(interleaved.end(), k_rows.begin() + int64_t{t} * c.KV * c.hd,
                         k_rows.begin() + int64_t{t + 1} * c.KV * c.hd);
    }
    EXPECT_TRUE(test::BitwiseEqual(test::ToFloat(raw.Download()), interleaved)) << "raw copy";
  }

  // Per part (Q with wq, K with wk): forward output, then the backward's dx and dw.
  DeviceBuffer<bf16> d_dy(test::ToBf16(dy));
  DeviceBuffer<float> dwq(std::vector<float>(c.hd, 7.0f)), dwk(std::vector<float>(c.hd, 7.0f));
  DeviceBuffer<char> ws(cuda::HeadRmsNormBackwardWorkspace(s));
  ASSERT_STATUS_OK(cuda::HeadRmsNormBackward(d_dy.data(), dwq.data(), dwk.data(), raw.data(),
                                             d_wq.data(), d_wk.data(), rstd.data(), s,
                                             /*accumulate_dw=*/false, ws.data(), ws.bytes(),
                                             nullptr));
  const std::vector<float> dx = test::ToFloat(d_dy.Download());
  EXPECT_TRUE(test::BitwiseEqual(VColumns(dx, c), VColumns(dy, c))) << "V's gradient changed";
  const std::vector<float> dw_got[2] = {dwq.Download(), dwk.Download()};
  for (const bool q : {true, false}) {
    SCOPED_TRACE(q ? "Q" : "K");
    const std::vector<float> x = HeadRows(qkv, c, q), g = HeadRows(dy, c, q);
    const std::vector<float>& w = q ? wq : wk;
    const int64_t rows = int64_t(x.size()) / c.hd;
    std::vector<float> y(x.size()), r(rows), dx_ref(x.size(), 0.0f), dw_ref(c.hd, 0.0f);
    cpu::RmsNormForward(y.data(), r.data(), x.data(), w.data(), rows, c.hd, eps);
    cpu::RmsNormBackward(dx_ref.data(), dw_ref.data(), g.data(), x.data(), w.data(), r.data(),
                         rows, c.hd);
    EXPECT_TRUE(test::MaxRelClose(HeadRows(got, c, q), y, 1e-2)) << "forward";
    EXPECT_TRUE(test::MaxRelClose(HeadRows(dx, c, q), dx_ref, 1e-2)) << "dx";
    EXPECT_LT(test::RelFrobenius(dw_got[q ? 0 : 1], dw_ref), 1e-3) << "dw";
  }

  // accumulate_dw adds to what is there; a second run gives the same bits.
  DeviceBuffer<bf16> d_dy2(test::ToBf16(dy));
  ASSERT_STATUS_OK(cuda::HeadRmsNormBackward(d_dy2.data(), dwq.data(), dwk.data(), raw.data(),
                                             d_wq.data(), d_wk.data(), rstd.data(), s,
                                             /*accumulate_dw=*/true, ws.data(), ws.bytes(),
                                             nullptr));
  EXPECT_TRUE(test::BitwiseEqual(test::ToFloat(d_dy2.Download()), dx)) << "dx not reproducible";
  const std::vector<float> twice = dwq.Download();
  for (int j = 0; j < c.hd; ++j) EXPECT_EQ(twice[j], dw_got[0][j] + dw_got[0][j]) << j;
}

TEST(GpuHeadRmsNorm, MatchesCpuPerHead) {
  FORGE_SKIP_WITHOUT_GPU();
  Check({64, 4, 2, 32}, 301);
  Check({256, 4, 4, 64}, 302);
  Check({300, 8, 2, 128}, 303);    // more rows than the backward's fixed grid of warps
  Check({5000, 2, 1, 256}, 304);
}

TEST(GpuHeadRmsNorm, RefusesUnsupportedWidths) {
  FORGE_SKIP_WITHOUT_GPU();
  EXPECT_EQ(cuda::HeadRmsNormSupports({8, 2, 1, 48, 1e-5f}).code(), Code::kInvalidArgument);
  EXPECT_EQ(cuda::HeadRmsNormSupports({8, 2, 1, 512, 1e-5f}).code(), Code::kInvalidArgument);
  EXPECT_TRUE(cuda::HeadRmsNormSupports({8, 2, 1, 128, 1e-5f}).ok());
}

}  // namespace
}  // namespace forge
