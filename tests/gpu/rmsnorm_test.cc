// GPU RMSNorm forward/backward vs the float32 CPU reference run on the same bf16 inputs.
// Tolerances (max |got - ref| / max |ref|): bf16 outputs (out, dx) 1e-2; fp32 outputs computed
// from bf16 inputs: rstd 1e-5 (one fp32 sum of squares per row), dw 1e-4 (fp32 sums over N rows
// in a different order than the reference).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/rmsnorm.h"

namespace forge {
namespace {

using test::bf16;
using test::DeviceBuffer;

constexpr float kEps = 1e-5f;

struct Inputs {
  std::vector<float> x, w, dout, dx0, dw0;
};

Inputs MakeInputs(int64_t N, int d, uint64_t seed) {
  Inputs in;
  in.x = test::RandomNormalBf16(size_t(N) * d, 1.0f, seed);
  in.w = test::RandomUniformBf16(d, 0.5f, 1.5f, seed + 1);
  in.dout = test::RandomNormalBf16(size_t(N) * d, 1.0f, seed + 2);
  in.dx0 = test::RandomNormalBf16(size_t(N) * d, 0.5f, seed + 3);  // dx accumulates
  in.dw0 = test::RandomNormal(d, 0.5f, seed + 4);                  // dw accumulates
  return in;
}

struct BackwardResult {
  std::vector<float> dx, dw;
};

BackwardResult RunBackward(const Inputs& in, const DeviceBuffer<float>& rstd, int64_t N, int d) {
  DeviceBuffer<bf16> dx(test::ToBf16(in.dx0));
  DeviceBuffer<float> dw(in.dw0);
  DeviceBuffer<bf16> dout(test::ToBf16(in.dout)), x(test::ToBf16(in.x)), w(test::ToBf16(in.w));
  const size_t ws_bytes = cuda::RmsNormBackwardWorkspace(N, d);
  DeviceBuffer<char> ws(ws_bytes);
  ws.Poison();
  Status s = cuda::RmsNormBackward(dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                   rstd.data(), N, d, ws.data(), ws_bytes, nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return {test::ToFloat(dx.Download()), dw.Download()};
}

void CheckRmsNorm(int64_t N, int d, uint64_t seed) {
  SCOPED_TRACE("N=" + std::to_string(N) + " d=" + std::to_string(d));
  const Inputs in = MakeInputs(N, d, seed);

  // Forward.
  DeviceBuffer<bf16> x(test::ToBf16(in.x)), w(test::ToBf16(in.w));
  DeviceBuffer<bf16> out(size_t(N) * d);
  DeviceBuffer<float> rstd(N);
  out.Poison();
  rstd.Poison();
  ASSERT_STATUS_OK(cuda::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, d, kEps,
                                        nullptr));
  std::vector<float> ref_out(size_t(N) * d), ref_rstd(N);
  cpu::RmsNormForward(ref_out.data(), ref_rstd.data(), in.x.data(), in.w.data(), N, d, kEps);
  EXPECT_TRUE(test::MaxRelClose(test::ToFloat(out.Download()), ref_out, 1e-2)) << "out";
  EXPECT_TRUE(test::MaxRelClose(rstd.Download(), ref_rstd, 1e-5)) << "rstd";

  // Backward (the GPU uses its own rstd, the reference its own).
  const BackwardResult got = RunBackward(in, rstd, N, d);
  std::vector<float> ref_dx = in.dx0, ref_dw = in.dw0;
  cpu::RmsNormBackward(ref_dx.data(), ref_dw.data(), in.dout.data(), in.x.data(), in.w.data(),
                       ref_rstd.data(), N, d);
  EXPECT_TRUE(test::MaxRelClose(got.dx, ref_dx, 1e-2)) << "dx";
  EXPECT_TRUE(test::MaxRelClose(got.dw, ref_dw, 1e-4)) << "dw";
  // The gradient part alone (dx - dx0), so the accumulated start value cannot hide an error.
  std::vector<float> got_g(got.dx.size()), ref_g(got.dx.size());
  for (size_t i = 0; i < got.dx.size(); ++i) {
    got_g[i] = got.dx[i] - in.dx0[i];
    ref_g[i] = ref_dx[i] - in.dx0[i];
  }
  EXPECT_TRUE(test::MaxRelClose(got_g, ref_g, 2e-2)) << "dx - dx0";

  // Deterministic: a second backward from the same state gives the same bits.
  const BackwardResult again = RunBackward(in, rstd, N, d);
  EXPECT_TRUE(test::BitwiseEqual(got.dx, again.dx));
  EXPECT_TRUE(test::BitwiseEqual(got.dw, again.dw));
}

TEST(GpuRmsNorm, Gpt124mShapeMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckRmsNorm(4 * 1024, 768, 101);
}

TEST(GpuRmsNorm, Gpt350mShapeMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckRmsNorm(4 * 1024, 1024, 102);
}

TEST(GpuRmsNorm, SmallAndPartialWarpShapesMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckRmsNorm(37, 64, 103);    // head-dim norm: 8 of 32 lanes active
  CheckRmsNorm(5, 136, 104);    // 17 vectors: the warp's last lanes idle
  CheckRmsNorm(3, 2048, 105);   // widest row of the register kernels; fewer rows than warps
  CheckRmsNorm(1000, 128, 106); // tiny config
}

// Rows wider than 2048 (the streaming kernels): Llama 3 3B's and 8B's widths, the widest
// supported, and a width that leaves part of the last 256-column round idle.
TEST(GpuRmsNorm, WideRowsMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckRmsNorm(2 * 1024, 3072, 130);
  CheckRmsNorm(2 * 1024, 4096, 131);
  CheckRmsNorm(300, 8192, 132);
  CheckRmsNorm(5, 2056, 133);
}

// Overwrite modes (accumulate_dx / accumulate_dw = false): the outputs start poisoned (NaN),
// so any element that reads its old value or is not written fails; the result must equal the
// reference run from zero.
void CheckOverwrite(int64_t N, int d, bool acc_dx, bool acc_dw, uint64_t seed) {
  SCOPED_TRACE("N=" + std::to_string(N) + " d=" + std::to_string(d) +
               " accumulate_dx=" + std::to_string(acc_dx) +
               " accumulate_dw=" + std::to_string(acc_dw));
  const Inputs in = MakeInputs(N, d, seed);
  DeviceBuffer<bf16> x(test::ToBf16(in.x)), w(test::ToBf16(in.w)), dout(test::ToBf16(in.dout));
  DeviceBuffer<bf16> out(size_t(N) * d);
  DeviceBuffer<float> rstd(N);
  ASSERT_STATUS_OK(cuda::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, d, kEps,
                                        nullptr));
  DeviceBuffer<bf16> dx(test::ToBf16(in.dx0));
  DeviceBuffer<float> dw(in.dw0);
  if (!acc_dx) dx.Poison();
  if (!acc_dw) dw.Poison();
  const size_t ws_bytes = cuda::RmsNormBackwardWorkspace(N, d);
  DeviceBuffer<char> ws(ws_bytes);
  ws.Poison();
  ASSERT_STATUS_OK(cuda::RmsNormBackward(dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                         rstd.data(), N, d, ws.data(), ws_bytes, nullptr, acc_dx,
                                         acc_dw));
  std::vector<float> ref_out(size_t(N) * d), ref_rstd(N);
  cpu::RmsNormForward(ref_out.data(), ref_rstd.data(), in.x.data(), in.w.data(), N, d, kEps);
  std::vector<float> ref_dx = acc_dx ? in.dx0 : std::vector<float>(in.dx0.size(), 0.0f);
  std::vector<float> ref_dw = acc_dw ? in.dw0 : std::vector<float>(in.dw0.size(), 0.0f);
  cpu::RmsNormBackward(ref_dx.data(), ref_dw.data(), in.dout.data(), in.x.data(), in.w.data(),
                       ref_rstd.data(), N, d);
  EXPECT_TRUE(test::MaxRelClose(test::ToFloat(dx.Download()), ref_dx, 1e-2)) << "dx";
  EXPECT_TRUE(test::MaxRelClose(dw.Download(), ref_dw, 1e-4)) << "dw";
}

TEST(GpuRmsNorm, OverwriteModesMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  for (int mode = 0; mode < 3; ++mode) {
    const bool acc_dx = mode == 1, acc_dw = mode == 2;  // (F,F), (T,F), (F,T)
    CheckOverwrite(4 * 1024, 1024, acc_dx, acc_dw, 110 + mode);
    CheckOverwrite(37, 136, acc_dx, acc_dw, 120 + mode);
    CheckOverwrite(1000, 4096, acc_dx, acc_dw, 140 + mode);
  }
}

TEST(GpuRmsNorm, OverwriteWithNoRowsZeroesDw) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<bf16> dx(8), dout(8), x(8), w(64);
  DeviceBuffer<float> dw(64), rstd(1);
  dw.Poison();
  DeviceBuffer<char> ws(256);
  ASSERT_STATUS_OK(cuda::RmsNormBackward(dx.data(), dw.data(), dout.data(), x.data(), w.data(),
                                         rstd.data(), 0, 64, ws.data(), ws.size(), nullptr,
                                         false, false));
  for (float v : dw.Download()) ASSERT_EQ(v, 0.0f);
}

TEST(GpuRmsNorm, RejectsUnsupportedWidth) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<bf16> x(4 * 100), out(4 * 100), w(100);
  DeviceBuffer<float> rstd(4);
  EXPECT_EQ(cuda::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), 4, 100, kEps,
                                 nullptr)
                .code(),
            Code::kInvalidArgument);
  DeviceBuffer<bf16> x2(4 * 8200), out2(4 * 8200), w2(8200);
  EXPECT_EQ(cuda::RmsNormForward(out2.data(), rstd.data(), x2.data(), w2.data(), 4, 8200, kEps,
                                 nullptr)
                .code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace forge
