// GemmRunner (cuBLASLt) against a double-precision CPU product of the same bf16 / fp8 inputs:
// the three linear-layer forms the model uses, accumulation in place and from a separate C,
// the plan cache, autotuning (never disturbing the caller's data, off during graph capture),
// split-K (forced configurations and the deterministic rule on a weight-gradient shape, its
// wave model), FP8 with scales (bf16 and fp8 outputs, amax), and what FP8 must reject.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cuda/gemm.h"

namespace forge::cuda {
namespace {

using test::RelFrobenius;

using test::BitwiseEqual;
using test::DeviceBuffer;
using test::RandomNormal;
using test::RandomNormalBf16;
using test::RoundBf16InPlace;
using test::ToBf16;
using test::ToFloat;

using test::RefGemm;

// ||got - ref||_F / ||ref||_F; non-finite entries (unwritten, poisoned) make it infinite.

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
    runner_.set_autotune(true);  // whatever the environment says: every test tunes
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

// Separate addend: D = C + x W^T with C only read (bf16, forward form), and the fp32
// weight-gradient form dW = C + dout^T x. Another key than in-place accumulation.
TEST_F(GpuGemmTest, SeparateCInput) {
  const LinearShape s{128, 192, 256};
  std::vector<float> x = RandomNormal(size_t(s.tokens * s.in), 1.0f, 20);
  std::vector<float> w = RandomNormal(size_t(s.out * s.in), 0.05f, 21);
  std::vector<float> c0 = RandomNormal(size_t(s.tokens * s.out), 1.0f, 22);
  RoundBf16InPlace(x);
  RoundBf16InPlace(w);
  RoundBf16InPlace(c0);
  {
    DeviceBuffer<bf16> dx(ToBf16(x)), dw(ToBf16(w)), dc(ToBf16(c0)), dd(c0.size());
    dd.Poison();
    GemmArgs g;
    g.M = s.tokens, g.N = s.out, g.K = s.in;
    g.A = dx.data(), g.B = dw.data(), g.D = dd.data(), g.C = dc.data();
    g.accumulate = true;
    ASSERT_STATUS_OK(runner_.Run(g, nullptr));
    auto ref = RefGemm(x, w, s.tokens, s.out, s.in, false, true);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += c0[i];
    EXPECT_LT(RelFrobenius(ToFloat(dd.Download()), ref), 1e-2);
    EXPECT_TRUE(BitwiseEqual(ToFloat(dc.Download()), c0)) << "C was written";
    EXPECT_EQ(runner_.plan_count(), 1u);
    // The same shape accumulating in place is another plan.
    GemmArgs in_place = g;
    in_place.C = nullptr;
    in_place.D = dc.data();
    ASSERT_STATUS_OK(runner_.Run(in_place, nullptr));
    EXPECT_EQ(runner_.plan_count(), 2u);
    EXPECT_LT(RelFrobenius(ToFloat(dc.Download()), ref), 1e-2);
  }
  {
    // dW[out, in] = C + dout^T x, fp32.
    std::vector<float> dout = RandomNormal(size_t(s.tokens * s.out), 1.0f, 23);
    std::vector<float> cw = RandomNormal(size_t(s.out * s.in), 1.0f, 24);
    RoundBf16InPlace(dout);
    DeviceBuffer<bf16> ddout(ToBf16(dout)), dx(ToBf16(x));
    DeviceBuffer<float> dc(cw), dd(cw.size());
    dd.Poison();
    GemmArgs g;
    g.M = s.out, g.N = s.in, g.K = s.tokens;
    g.A = ddout.data(), g.B = dx.data(), g.D = dd.data(), g.C = dc.data();
    g.trans_a = true, g.trans_b = false;
    g.d_type = DType::kFp32;
    g.accumulate = true;
    ASSERT_STATUS_OK(runner_.Run(g, nullptr));
    auto ref = RefGemm(dout, x, s.out, s.in, s.tokens, true, false);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += cw[i];
    EXPECT_LT(RelFrobenius(dd.Download(), ref), 1e-5);
    EXPECT_TRUE(BitwiseEqual(dc.Download(), cw)) << "C was written";
  }
}

// Autotuning a large enough accumulating GEMM: the timing runs must not touch D (added to
// exactly once), the record is consistent, and the kept plan is bitwise stable.
TEST_F(GpuGemmTest, AutotuneLeavesAccumulatorAlone) {
  const LinearShape s{512, 1024, 768};
  std::vector<float> x = RandomNormal(size_t(s.tokens * s.in), 1.0f, 30);
  std::vector<float> w = RandomNormal(size_t(s.out * s.in), 0.05f, 31);
  std::vector<float> y0 = RandomNormal(size_t(s.tokens * s.out), 1.0f, 32);
  RoundBf16InPlace(x);
  RoundBf16InPlace(w);
  DeviceBuffer<bf16> dx(ToBf16(x)), dw(ToBf16(w));
  DeviceBuffer<float> dy(y0), dy2(y0);
  GemmArgs g;
  g.M = s.tokens, g.N = s.out, g.K = s.in;
  g.A = dx.data(), g.B = dw.data(), g.D = dy.data();
  g.d_type = DType::kFp32;
  g.accumulate = true;
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));
  auto ref = RefGemm(x, w, s.tokens, s.out, s.in, false, true);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];
  const std::vector<float> got = dy.Download();
  EXPECT_LT(RelFrobenius(got, ref), 1e-5);

  ASSERT_EQ(runner_.autotune_log().size(), 1u);
  const GemmTuneRecord& rec = runner_.autotune_log()[0];
  EXPECT_GE(rec.candidates, 1);
  EXPECT_LE(rec.candidates, GemmRunner::kMaxCandidates);
  EXPECT_GE(rec.chosen, 0);
  EXPECT_LT(rec.chosen, rec.candidates);
  if (rec.candidates > 1) {
    EXPECT_TRUE(rec.note.empty()) << rec.note;
    EXPECT_GT(rec.first_us, 0.0f);
    EXPECT_LE(rec.best_us, rec.chosen_us);
    EXPECT_LE(rec.chosen_us, rec.first_us);
    if (rec.chosen != 0) {
      EXPECT_LT(rec.chosen_us, (1.0f - GemmRunner::kTuneMargin) * rec.first_us);
    }
    EXPECT_GT(runner_.autotune_ms_total(), 0.0);
  }
  std::printf("[ autotune ] %s: %d candidates, chose %d: %.1f us (first %.1f, best %.1f); "
              "%.1f ms tuning\n",
              rec.gemm.c_str(), rec.candidates, rec.chosen, rec.chosen_us, rec.first_us,
              rec.best_us, runner_.autotune_ms_total());

  // Same plan on a second buffer: bitwise the same result.
  g.D = dy2.data();
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));
  EXPECT_EQ(runner_.plan_count(), 1u);
  EXPECT_TRUE(BitwiseEqual(dy2.Download(), got));
}

// A plan first needed while the stream is being captured takes the heuristic's first choice
// untimed: the graph computes the product, bitwise equal to an untuned runner's.
TEST_F(GpuGemmTest, PlanMadeDuringCaptureIsUntimed) {
  const LinearShape s{256, 512, 384};
  std::vector<float> x = RandomNormal(size_t(s.tokens * s.in), 1.0f, 40);
  std::vector<float> w = RandomNormal(size_t(s.out * s.in), 0.05f, 41);
  RoundBf16InPlace(x);
  RoundBf16InPlace(w);
  DeviceBuffer<bf16> dx(ToBf16(x)), dw(ToBf16(w)), dy(size_t(s.tokens * s.out)),
      dref(size_t(s.tokens * s.out));
  GemmArgs g;
  g.M = s.tokens, g.N = s.out, g.K = s.in;
  g.A = dx.data(), g.B = dw.data(), g.D = dref.data();

  // Untuned runner outside capture: also loads the kernel the capture will use.
  GemmRunner untuned;
  ASSERT_STATUS_OK(untuned.Init());
  untuned.set_autotune(false);
  ASSERT_STATUS_OK(untuned.Run(g, nullptr));
  ASSERT_EQ(untuned.autotune_log().size(), 1u);
  EXPECT_EQ(untuned.autotune_log()[0].note, "autotune off");
  const std::vector<bf16> expect = dref.Download();

  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  dy.Poison();
  g.D = dy.data();
  ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status run = runner_.Run(g, stream);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  ASSERT_STATUS_OK(run);
  ASSERT_CUDA_OK(end);
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);

  ASSERT_EQ(runner_.autotune_log().size(), 1u);
  EXPECT_NE(runner_.autotune_log()[0].note.find("capturing"), std::string::npos)
      << runner_.autotune_log()[0].note;
  EXPECT_EQ(runner_.autotune_log()[0].chosen, 0);
  EXPECT_EQ(runner_.autotune_ms_total(), 0.0);
  const std::vector<float> got = ToFloat(dy.Download());
  EXPECT_TRUE(BitwiseEqual(got, ToFloat(expect)));
  const auto ref = RefGemm(x, w, s.tokens, s.out, s.in, false, true);
  EXPECT_LT(RelFrobenius(got, ref), 1e-2);
}

// Autotuning is off after Init (engine.gemm_autotune turns it on through set_autotune).
TEST_F(GpuGemmTest, AutotuneIsOffUnlessAsked) {
  GemmRunner runner;
  ASSERT_STATUS_OK(runner.Init(1 << 20));
  EXPECT_FALSE(runner.autotune());
  runner.set_autotune(true);
  EXPECT_TRUE(runner.autotune());
}

// The margin rule (no GPU needed): keep the heuristic's first choice unless another is
// clearly faster.
TEST(GemmChooseAlgorithm, KeepsFirstChoiceWithinMargin) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(ChooseAlgorithm({100.0f}, 0.03f), 0);
  EXPECT_EQ(ChooseAlgorithm({100.0f, 98.0f, 99.0f}, 0.03f), 0);  // 2% faster: a near-tie
  EXPECT_EQ(ChooseAlgorithm({100.0f, 96.0f, 90.0f}, 0.03f), 2);  // clearly faster: fastest
  EXPECT_EQ(ChooseAlgorithm({100.0f, 120.0f}, 0.03f), 0);
  EXPECT_EQ(ChooseAlgorithm({inf, 120.0f, 110.0f}, 0.03f), 2);  // first failed: fastest ran
  EXPECT_EQ(ChooseAlgorithm({100.0f, inf, 50.0f}, 0.03f), 2);
  EXPECT_EQ(ChooseAlgorithm({inf, inf}, 0.03f), -1);
  EXPECT_EQ(ChooseAlgorithm({}, 0.03f), -1);
}

// ---- split-K -------------------------------------------------------------------------------

// dW[O, I] = dout[T, O]^T x[T, I] in double, k outermost (rank-1 updates: cache friendly for
// the long-K shapes split-K is for).
std::vector<double> RefWeightGrad(const std::vector<float>& dout, const std::vector<float>& x,
                                  int64_t T, int64_t O, int64_t I) {
  std::vector<double> D(size_t(O * I), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const float* dr = &dout[size_t(t * O)];
    const float* xr = &x[size_t(t * I)];
    for (int64_t o = 0; o < O; ++o) {
      const double d = dr[o];
      double* out = &D[size_t(o * I)];
      for (int64_t i = 0; i < I; ++i) out[i] += d * xr[i];
    }
  }
  return D;
}

// A weight-gradient shape whose output is a single wave's fraction while K is long: the rule
// should split it, and forced splits must compute it.
struct DwProblem {
  static constexpr int64_t kT = 8192, kO = 128, kI = 192;
  std::vector<float> dout = RandomNormalBf16(size_t(kT * kO), 1.0f, 50);
  std::vector<float> x = RandomNormalBf16(size_t(kT * kI), 1.0f, 51);
  std::vector<float> dw0 = RandomNormal(size_t(kO * kI), 10.0f, 52);
  std::vector<double> prod = RefWeightGrad(dout, x, kT, kO, kI);
  DeviceBuffer<bf16> d_dout{ToBf16(dout)}, d_x{ToBf16(x)};

  GemmArgs Args(float* dw, bool accumulate) {
    GemmArgs g;
    g.M = kO, g.N = kI, g.K = kT;
    g.A = d_dout.data(), g.B = d_x.data(), g.D = dw;
    g.trans_a = true, g.trans_b = false;
    g.d_type = DType::kFp32;
    g.accumulate = accumulate;
    return g;
  }
  // dw0 * start + prod * times
  std::vector<double> Expect(double start, double times) const {
    std::vector<double> r(prod.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = start * dw0[i] + times * prod[i];
    return r;
  }
};

// Every split of a split-K-capable candidate (fp32 workspace reduction), accumulating onto a
// non-zero dW twice and overwriting a poisoned one, against the CPU.
TEST_F(GpuGemmTest, SplitKWeightGradMatchesCpu) {
  DwProblem p;
  DeviceBuffer<float> dw(p.dw0);
  const GemmArgs acc = p.Args(dw.data(), true);
  auto cands = runner_.Candidates(acc, 32, nullptr);
  ASSERT_STATUS_OK(cands.status());
  const GemmCandidate* split_capable = nullptr;
  for (const GemmCandidate& c : cands.value()) {
    if (SupportsSplitK(c.algo)) {
      split_capable = &c;
      break;
    }
  }
  ASSERT_NE(split_capable, nullptr) << "no heuristic candidate supports split-K with an fp32 "
                                       "workspace reduction";
  int ran = 0;
  for (int s : {2, 3, 4, 8}) {
    SCOPED_TRACE(::testing::Message() << "split " << s);
    cublasLtMatmulAlgo_t algo = split_capable->algo;
    ASSERT_STATUS_OK(SetSplitK(&algo, s));
    EXPECT_EQ(ReadAlgoInfo(algo).splitk, s);
    EXPECT_EQ(ReadAlgoInfo(algo).reduction, uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
    if (!runner_.CheckAlgo(acc, algo, nullptr).ok()) continue;
    ++ran;
    dw.Upload(p.dw0);
    ASSERT_STATUS_OK(runner_.RunWithAlgo(acc, algo, nullptr));
    EXPECT_LT(RelFrobenius(dw.Download(), p.Expect(1, 1)), 1e-5);
    ASSERT_STATUS_OK(runner_.RunWithAlgo(acc, algo, nullptr));
    EXPECT_LT(RelFrobenius(dw.Download(), p.Expect(1, 2)), 1e-5);

    // beta = 0: every element written (no NaN from the poison survives).
    DeviceBuffer<float> fresh(p.dw0.size());
    fresh.Poison();
    const GemmArgs over = p.Args(fresh.data(), false);
    if (!runner_.CheckAlgo(over, algo, nullptr).ok()) continue;
    ASSERT_STATUS_OK(runner_.RunWithAlgo(over, algo, nullptr));
    EXPECT_LT(RelFrobenius(fresh.Download(), p.Expect(0, 1)), 1e-5);
  }
  EXPECT_GT(ran, 0) << "cublasLtMatmulAlgoCheck rejected every split of algo "
                    << ReadAlgoInfo(split_capable->algo).id;
}

// The rule: what it chooses follows the wave model over the splits cublasLtMatmulAlgoCheck
// accepts (it splits this shape when the heuristic's first can split), the same choice in two
// runners (two processes), results bitwise identical across runs and runners and right vs
// the CPU; with the rule off the heuristic's first runs unchanged.
TEST_F(GpuGemmTest, SplitKRuleIsDeterministic) {
  DwProblem p;
  GemmRunner r1, r2, off;
  for (GemmRunner* r : {&r1, &r2, &off}) {
    ASSERT_STATUS_OK(r->Init());
    r->set_autotune(false);
  }
  r1.set_splitk(true);
  r2.set_splitk(true);
  off.set_splitk(false);
  DeviceBuffer<float> a(p.dw0), b(p.dw0), c(p.dw0), d(p.dw0);
  ASSERT_STATUS_OK(r1.Run(p.Args(a.data(), true), nullptr));
  ASSERT_STATUS_OK(r2.Run(p.Args(b.data(), true), nullptr));
  ASSERT_STATUS_OK(r1.Run(p.Args(c.data(), true), nullptr));  // the cached plan again
  ASSERT_STATUS_OK(off.Run(p.Args(d.data(), true), nullptr));
  ASSERT_EQ(r1.autotune_log().size(), 1u);
  ASSERT_EQ(r2.autotune_log().size(), 1u);
  ASSERT_EQ(off.autotune_log().size(), 1u);
  const GemmTuneRecord& rec = r1.autotune_log()[0];
  std::printf("[ split-K  ] %s: split %d (%s); runs %s\n", rec.gemm.c_str(), rec.splitk,
              rec.splitk_note.c_str(), Describe(rec.algo).c_str());

  // The expected choice, recomputed from the heuristic's candidates: the first that can
  // split, priced against the first's unsplit prediction.
  auto cands = r1.Candidates(p.Args(a.data(), true), GemmRunner::kMaxCandidates, nullptr);
  ASSERT_STATUS_OK(cands.status());
  const GemmCandidate& first = cands.value()[0];
  const GemmCandidate* splitter = nullptr;
  for (const GemmCandidate& c : cands.value()) {
    if (c.info.splitk == 1 && SupportsSplitK(c.algo)) {
      splitter = &c;
      break;
    }
  }
  int expect = 1;
  if (first.info.splitk == 1 && splitter != nullptr && first.info.waves > 0.0f) {
    std::vector<int> allowed;
    for (int s : kSplitKValues) {
      cublasLtMatmulAlgo_t algo = splitter->algo;
      ASSERT_STATUS_OK(SetSplitK(&algo, s));
      if (r1.CheckAlgo(p.Args(a.data(), true), algo, nullptr).ok()) allowed.push_back(s);
    }
    const double unsplit =
        PredictSplitKUs({DwProblem::kO, DwProblem::kI, DwProblem::kT, first.info.waves}, 1);
    expect = ChooseSplitK({DwProblem::kO, DwProblem::kI, DwProblem::kT, splitter->info.waves},
                          allowed, unsplit);
    if (splitter == &first && !allowed.empty()) {
      EXPECT_GT(expect, 1) << "a " << first.info.waves << "-wave GEMM with K = "
                           << DwProblem::kT << " should split";
    }
  } else {
    std::printf("[ split-K  ] rule inactive: first %s, %s\n", Describe(first.info).c_str(),
                splitter ? "a candidate can split" : "no candidate can split");
  }
  EXPECT_EQ(rec.splitk, expect) << rec.splitk_note;
  EXPECT_EQ(rec.algo.splitk, expect > 1 ? expect : first.info.splitk);
  EXPECT_EQ(rec.algo.id, expect > 1 ? splitter->info.id : first.info.id);
  EXPECT_EQ(r2.autotune_log()[0].splitk, rec.splitk);
  EXPECT_EQ(Describe(r2.autotune_log()[0].algo), Describe(rec.algo));
  EXPECT_EQ(off.autotune_log()[0].splitk, 1);
  EXPECT_EQ(off.autotune_log()[0].algo.splitk, first.info.splitk);
  EXPECT_EQ(off.autotune_log()[0].algo.id, first.info.id);

  const std::vector<float> ga = a.Download();
  EXPECT_LT(RelFrobenius(ga, p.Expect(1, 1)), 1e-5);
  EXPECT_TRUE(BitwiseEqual(ga, b.Download())) << "two runners differ";
  EXPECT_TRUE(BitwiseEqual(ga, c.Download())) << "two runs differ";
  EXPECT_LT(RelFrobenius(d.Download(), p.Expect(1, 1)), 1e-5);
}

// Outputs of many waves are left alone, and so is a short K.
TEST_F(GpuGemmTest, SplitKRuleLeavesFullGemmsAlone) {
  GemmRunner r;
  ASSERT_STATUS_OK(r.Init());
  r.set_autotune(false);
  r.set_splitk(true);
  struct Shape {
    int64_t M, N, K;
  };
  for (const Shape s : {Shape{8192, 8192, 4096}, Shape{128, 192, 1024}}) {
    SCOPED_TRACE(::testing::Message() << s.M << "x" << s.N << "x" << s.K);
    DeviceBuffer<bf16> x(size_t(s.M * s.K)), w(size_t(s.N * s.K)), y(size_t(s.M * s.N));
    ASSERT_CUDA_OK(cudaMemset(x.data(), 0, x.bytes()));
    ASSERT_CUDA_OK(cudaMemset(w.data(), 0, w.bytes()));
    GemmArgs g;
    g.M = s.M, g.N = s.N, g.K = s.K;
    g.A = x.data(), g.B = w.data(), g.D = y.data();
    const size_t before = r.autotune_log().size();
    ASSERT_STATUS_OK(r.Run(g, nullptr));
    ASSERT_EQ(r.autotune_log().size(), before + 1);
    const GemmTuneRecord& rec = r.autotune_log().back();
    EXPECT_EQ(rec.splitk, 1) << rec.splitk_note;
    std::printf("[ split-K  ] %s: %s\n", rec.gemm.c_str(), rec.splitk_note.c_str());
  }
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
}

// The split-K rule is on after Init; set_splitk(false) turns it off (benchmarks compare).
TEST_F(GpuGemmTest, SplitKIsOnByDefault) {
  GemmRunner runner;
  ASSERT_STATUS_OK(runner.Init(1 << 20));
  EXPECT_TRUE(runner.splitk());
  runner.set_splitk(false);
  EXPECT_FALSE(runner.splitk());
}

// The wave model (no GPU needed), on the gpt350m weight gradients at 128x256 tiles on 132
// SMs: wo (32 tiles) splits 4 ways, w_down (88) 3, w_gate_up (176) 3, or 2 when the
// workspace rules 3 out; wqkv (96) gains too little; K / split stays >= kSplitKMinK.
TEST(GemmChooseSplitK, FollowsTheWaveModel) {
  const std::vector<int> all(std::begin(kSplitKValues), std::end(kSplitKValues));
  EXPECT_EQ(ChooseSplitK({1024, 1024, 16384, 32 / 132.0}, all), 4);
  EXPECT_EQ(ChooseSplitK({1024, 2816, 16384, 88 / 132.0}, all), 3);
  EXPECT_EQ(ChooseSplitK({5632, 1024, 16384, 176 / 132.0}, all), 3);
  EXPECT_EQ(ChooseSplitK({5632, 1024, 16384, 176 / 132.0}, {2, 4, 6, 8}), 2);
  EXPECT_EQ(ChooseSplitK({3072, 1024, 16384, 96 / 132.0}, all), 1);
  // Nothing allowed, unknown or many waves, short K.
  EXPECT_EQ(ChooseSplitK({1024, 1024, 16384, 32 / 132.0}, {}), 1);
  EXPECT_EQ(ChooseSplitK({1024, 1024, 16384, 0.0}, all), 1);
  EXPECT_EQ(ChooseSplitK({8192, 8192, 16384, kSplitKMaxWaves}, all), 1);
  EXPECT_EQ(ChooseSplitK({128, 128, 1024, 0.01}, all), 1);
  EXPECT_EQ(ChooseSplitK({128, 128, 2048, 0.01}, all), 2);
  // Exactly one wave gains nothing from splitting; a tiny one gains from the largest split.
  EXPECT_EQ(ChooseSplitK({4096, 4096, 16384, 1.0}, all), 1);
  EXPECT_EQ(ChooseSplitK({128, 192, 8192, 1 / 132.0}, all), 8);
  // The prediction: whole waves of 1/s-long tiles plus the partials' traffic.
  const SplitKProblem p{1024, 1024, 16384, 0.25};
  EXPECT_LT(PredictSplitKUs(p, 4), PredictSplitKUs(p, 1) / 2);
  EXPECT_GT(PredictSplitKUs(p, 8), PredictSplitKUs(p, 4));  // 2 waves: no faster, more traffic
  EXPECT_TRUE(std::isinf(PredictSplitKUs({1024, 1024, 16384, 0.0}, 1)));
}

TEST(GemmAlgoNames, ReadableConfigNames) {
  EXPECT_EQ(TileName(CUBLASLT_MATMUL_TILE_128x256), "128x256");
  EXPECT_EQ(TileName(CUBLASLT_MATMUL_TILE_64x64), "64x64");
  EXPECT_EQ(TileName(CUBLASLT_MATMUL_TILE_UNDEFINED), "undefined");
  EXPECT_EQ(TileName(CUBLASLT_MATMUL_TILE_8x8), "#" + std::to_string(CUBLASLT_MATMUL_TILE_8x8));
  EXPECT_EQ(StagesName(CUBLASLT_MATMUL_STAGES_64x4), "64x4");
  EXPECT_EQ(StagesName(CUBLASLT_MATMUL_STAGES_128xAUTO), "128xAUTO");
  EXPECT_EQ(ClusterName(CUBLASLT_CLUSTER_SHAPE_2x1x1), "2x1x1");
  EXPECT_EQ(ClusterName(CUBLASLT_CLUSTER_SHAPE_AUTO), "auto");
  EXPECT_EQ(ReductionName(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE), "compute_type");
}

// ---- FP8 ----------------------------------------------------------------------------------

float AbsMax(const std::vector<float>& v) {
  float m = 0.0f;
  for (float e : v) m = std::max(m, std::fabs(e));
  return m;
}

// Per-tensor quantisation as the model does it: q = x / scale with scale = amax / fp8 max;
// `deq` gets what the GEMM sees (q * scale).
template <typename Fp8>
std::vector<Fp8> Quantize(const std::vector<float>& x, float fp8_max, float* scale,
                          std::vector<float>* deq) {
  *scale = AbsMax(x) / fp8_max;
  std::vector<Fp8> q(x.size());
  deq->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    q[i] = Fp8(x[i] / *scale);
    (*deq)[i] = float(q[i]) * *scale;
  }
  return q;
}

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;

// One FP8 operand: quantised per tensor to `type` (kE4M3 or kE5M2) and on the device, with
// its scale and what the GEMM sees of it (`deq`).
struct Fp8Operand {
  DType type;
  float scale = 0;
  std::vector<float> deq;
  DeviceBuffer<uint8_t> dev;
};

template <typename Fp8>
DeviceBuffer<uint8_t> UploadBytes(const std::vector<Fp8>& q) {
  static_assert(sizeof(Fp8) == 1);
  std::vector<uint8_t> bytes(q.size());
  std::memcpy(bytes.data(), q.data(), q.size());
  return DeviceBuffer<uint8_t>(bytes);
}

Fp8Operand QuantizeToDevice(const std::vector<float>& x, DType type) {
  Fp8Operand op{type};
  op.dev = type == DType::kE5M2
               ? UploadBytes(Quantize<__nv_fp8_e5m2>(x, kE5M2Max, &op.scale, &op.deq))
               : UploadBytes(Quantize<__nv_fp8_e4m3>(x, kE4M3Max, &op.scale, &op.deq));
  return op;
}

// An FP8 GEMM in the forward form, D[M, N] = A[M, K] B[N, K]^T: both operands quantised onto
// the device, and the double-precision product of what the GEMM sees of them (`ref`).
struct Fp8Gemm {
  Fp8Gemm(int64_t m, int64_t n, int64_t k, const std::vector<float>& a_x, DType a_type,
          const std::vector<float>& b_x, DType b_type)
      : M(m), N(n), K(k), a(QuantizeToDevice(a_x, a_type)), b(QuantizeToDevice(b_x, b_type)),
        ref(RefGemm(a.deq, b.deq, M, N, K, false, true)) {}

  // Args writing D (`d_type`) to `d`, with the operands' scales in one buffer 16 B apart
  // (cuBLASLt's alignment) and, when d_scale is non-zero, a D scale 16 B further; the buffer
  // is `scales`, made anew by each call.
  GemmArgs Args(void* d, DType d_type, float d_scale = 0.0f) {
    std::vector<float> s{a.scale, 0, 0, 0, b.scale};
    if (d_scale != 0.0f) s.insert(s.end(), {0, 0, 0, d_scale});
    scales = DeviceBuffer<float>(s);
    GemmArgs g;
    g.M = M, g.N = N, g.K = K;
    g.A = a.dev.data(), g.B = b.dev.data(), g.D = d;
    g.trans_a = false, g.trans_b = true;
    g.a_type = a.type, g.b_type = b.type, g.d_type = d_type;
    g.a_scale = scales.data(), g.b_scale = scales.data() + 4;
    if (d_scale != 0.0f) g.d_scale = scales.data() + 8;
    return g;
  }

  int64_t M, N, K;
  Fp8Operand a, b;
  std::vector<double> ref;
  DeviceBuffer<float> scales;
};

// E4M3 x E4M3 -> bf16 with per-tensor scales (the forward form), against the dequantised
// product.
TEST_F(GpuGemmTest, Fp8E4M3ToBf16WithScales) {
  const int64_t M = 128, N = 256, K = 512;  // tokens, out, in
  Fp8Gemm f(M, N, K, RandomNormal(size_t(M * K), 3.0f, 13), DType::kE4M3,
            RandomNormal(size_t(N * K), 0.05f, 14), DType::kE4M3);
  DeviceBuffer<bf16> dy(size_t(M * N));
  dy.Poison();
  ASSERT_STATUS_OK(runner_.Run(f.Args(dy.data(), DType::kBf16), nullptr));
  EXPECT_LT(RelFrobenius(ToFloat(dy.Download()), f.ref), 2e-2);
}

// Fast accumulation (no periodic FP32 promotion of the tensor cores' partial sums), at the
// forward shape gpt350m's gate/up GEMM has per 128 rows (K = 1024): still the dequantised
// product within FP8 tolerances, a plan of its own (the flag is part of the key), and refused
// for bf16 inputs.
TEST_F(GpuGemmTest, Fp8FastAccumulationStaysClose) {
  const int64_t M = 128, N = 512, K = 1024;
  Fp8Gemm f(M, N, K, RandomNormal(size_t(M * K), 1.0f, 23), DType::kE4M3,
            RandomNormal(size_t(N * K), 0.03f, 24), DType::kE4M3);
  DeviceBuffer<bf16> exact(size_t(M * N)), fast(size_t(M * N));
  GemmArgs g = f.Args(exact.data(), DType::kBf16);
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));
  const size_t plans = runner_.plan_count();
  g.D = fast.data();
  g.fast_accum = true;
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));
  EXPECT_EQ(runner_.plan_count(), plans + 1);
  EXPECT_LT(RelFrobenius(ToFloat(exact.Download()), f.ref), 2e-2);
  EXPECT_LT(RelFrobenius(ToFloat(fast.Download()), f.ref), 2e-2);

  GemmArgs b16;
  DeviceBuffer<bf16> a(size_t(M * K)), w(size_t(N * K)), d(size_t(M * N));
  b16.M = M, b16.N = N, b16.K = K;
  b16.A = a.data(), b16.B = w.data(), b16.D = d.data();
  b16.fast_accum = true;
  const Status st = runner_.Run(b16, nullptr);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("fast_accum"), std::string::npos) << st.message();
}

// A scale pointer 4 bytes into an allocation: cuBLASLt refuses every FP8 algorithm with
// NOT_SUPPORTED (measured), so the runner rejects it up front with a clear reason.
TEST_F(GpuGemmTest, Fp8ScalePointerMustBe16ByteAligned) {
  DeviceBuffer<uint8_t> a(128 * 512), b(256 * 512);
  DeviceBuffer<bf16> d(size_t(128 * 256));
  DeviceBuffer<float> scales(std::vector<float>{1.0f, 1.0f});
  GemmArgs g;
  g.M = 128, g.N = 256, g.K = 512;
  g.A = a.data(), g.B = b.data(), g.D = d.data();
  g.a_type = DType::kE4M3, g.b_type = DType::kE4M3, g.d_type = DType::kBf16;
  g.a_scale = scales.data(), g.b_scale = scales.data() + 1;
  const Status st = runner_.Run(g, nullptr);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.message();
}

// The backward forms: E5M2 gradients times E4M3 operands, in both operand orders, -> bf16.
TEST_F(GpuGemmTest, Fp8MixedE5M2E4M3ToBf16) {
  const int64_t M = 128, N = 192, K = 256;
  for (const bool grad_is_a : {true, false}) {
    SCOPED_TRACE(grad_is_a ? "e5m2 x e4m3" : "e4m3 x e5m2");
    Fp8Gemm f(M, N, K, RandomNormal(size_t(M * K), grad_is_a ? 1e-3f : 2.0f, 15),
              grad_is_a ? DType::kE5M2 : DType::kE4M3,
              RandomNormal(size_t(N * K), grad_is_a ? 2.0f : 1e-3f, 16),
              grad_is_a ? DType::kE4M3 : DType::kE5M2);
    DeviceBuffer<bf16> dy(size_t(M * N));
    dy.Poison();
    ASSERT_STATUS_OK(runner_.Run(f.Args(dy.data(), DType::kBf16), nullptr));
    EXPECT_LT(RelFrobenius(ToFloat(dy.Download()), f.ref), 2e-2);
  }
}

// E4M3 x E4M3 -> E4M3 with a quantisation scale and amax: D = d_scale * product (fp8), amax
// of the unscaled product (set, not folded into the 1e30 it starts at).
TEST_F(GpuGemmTest, Fp8E4M3ToE4M3WithDScaleAndAmax) {
  const int64_t M = 128, N = 256, K = 512;
  Fp8Gemm f(M, N, K, RandomNormal(size_t(M * K), 3.0f, 17), DType::kE4M3,
            RandomNormal(size_t(N * K), 0.05f, 18), DType::kE4M3);
  const std::vector<double>& ref = f.ref;
  double ref_max = 0.0;
  for (double v : ref) ref_max = std::max(ref_max, std::fabs(v));
  const float d_scale = float(0.5 * kE4M3Max / ref_max);  // headroom: no saturation
  DeviceBuffer<__nv_fp8_e4m3> dy(size_t(M * N));
  DeviceBuffer<float> amax(std::vector<float>{1e30f});
  dy.Poison();
  GemmArgs g = f.Args(dy.data(), DType::kE4M3, d_scale);
  g.d_amax = amax.data();
  ASSERT_STATUS_OK(runner_.Run(g, nullptr));

  const std::vector<__nv_fp8_e4m3> q = dy.Download();
  std::vector<float> got(q.size());
  for (size_t i = 0; i < q.size(); ++i) got[i] = float(q[i]) / d_scale;
  EXPECT_LT(RelFrobenius(got, ref), 6e-2);  // e4m3 output rounding (3 mantissa bits)
  const float got_amax = amax.Download()[0];
  EXPECT_NEAR(got_amax, ref_max, 1e-2 * ref_max)
      << "(d_scale * max|product| would be " << d_scale * ref_max << ")";
}

// What cuBLASLt cannot do is refused up front with a reason, before any plan is made.
TEST_F(GpuGemmTest, RejectsUnsupportedLayoutsAndTypes) {
  DeviceBuffer<uint8_t> a(64 * 64), b(64 * 64);
  DeviceBuffer<float> d(64 * 64), c(64 * 64);
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
  bad.d_type = DType::kE5M2;  // e4m3 x e4m3 has no e5m2 output
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.K = 40;  // fp8 needs multiples of 16
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.d_amax = d.data();  // amax of a bf16 output: cuBLASLt only does it for fp8 outputs
  const Status amax_bf16 = runner_.Run(bad, nullptr);
  EXPECT_EQ(amax_bf16.code(), Code::kInvalidArgument);
  EXPECT_NE(amax_bf16.message().find("amax"), std::string::npos) << amax_bf16.ToString();
  bad = g;
  bad.d_scale = d.data();  // a D scale needs an fp8 output
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.d_type = DType::kE4M3;
  bad.accumulate = true;  // no accumulation into fp8
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.a_type = bad.b_type = DType::kBf16;
  bad.d_amax = d.data();  // amax only for fp8
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.a_type = bad.b_type = DType::kBf16;
  bad.d_type = DType::kE4M3;  // bf16 inputs give no fp8 output
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  bad = g;
  bad.a_type = bad.b_type = DType::kBf16;
  bad.C = c.data();  // C without accumulate
  EXPECT_EQ(runner_.Run(bad, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(runner_.plan_count(), 0u);
}

}  // namespace
}  // namespace forge::cuda
