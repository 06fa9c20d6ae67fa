// GPU global grad-norm and multi-tensor AdamW vs the float32 CPU reference (cpu::SumSquares,
// cpu::AdamWUpdate), over several steps with a clip factor != 1, plus the fp32 <-> bf16 casts.
// Tolerances (max |got - ref| / max |ref|): sum of squares and clip factor 1e-5 (fp32 partial
// sums vs a double reference); params and moments 1e-5, and the parameter update (new - old)
// 1e-4 (the kernel rounds every operation as the reference does, so these are expected to agree
// to the last bit or nearly); the bf16 copy must equal the rounded fp32 master exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cuda/adamw.h"

namespace forge {
namespace {

using test::bf16;
using test::DeviceBuffer;

// Host copies and device buffers of one tensor. `offset` shifts every device pointer by that
// many elements, so offset 1 exercises the unaligned (scalar) path.
struct Tensor {
  int64_t n = 0;
  float wd = 0.0f;
  int offset = 0;
  std::vector<float> p, m, v;
  DeviceBuffer<float> d_p, d_g, d_m, d_v;
  DeviceBuffer<bf16> d_pb;
};

Tensor MakeTensor(int64_t n, float wd, int offset, uint64_t seed) {
  Tensor t;
  t.n = n;
  t.wd = wd;
  t.offset = offset;
  t.p = test::RandomNormal(n, 0.5f, seed);
  t.m = test::RandomNormal(n, 0.01f, seed + 1);               // non-zero moments from a
  t.v = test::RandomUniform(n, 0.0f, 1e-4f, seed + 2);        // "previous" step
  auto padded = [&](const std::vector<float>& x) {
    std::vector<float> y(n + offset, 0.0f);
    std::copy(x.begin(), x.end(), y.begin() + offset);
    return y;
  };
  t.d_p = DeviceBuffer<float>(padded(t.p));
  t.d_m = DeviceBuffer<float>(padded(t.m));
  t.d_v = DeviceBuffer<float>(padded(t.v));
  t.d_g = DeviceBuffer<float>(n + offset);
  t.d_pb = DeviceBuffer<bf16>(n + offset);
  return t;
}

std::vector<float> DownloadAt(const DeviceBuffer<float>& d, int offset) {
  std::vector<float> all = d.Download();
  return std::vector<float>(all.begin() + offset, all.end());
}

std::vector<cuda::AdamWTensor> Descriptors(std::vector<Tensor>& ts) {
  std::vector<cuda::AdamWTensor> out;
  for (Tensor& t : ts) {
    out.push_back({t.d_p.data() + t.offset, t.d_pb.data() + t.offset, t.d_g.data() + t.offset,
                   t.d_m.data() + t.offset, t.d_v.data() + t.offset, t.n, t.wd});
  }
  return out;
}

std::vector<Tensor> MakeTensors() {
  std::vector<Tensor> ts;
  ts.push_back(MakeTensor(1000003, 0.1f, 0, 601));  // large, n % 4 != 0 (scalar tail)
  ts.push_back(MakeTensor(768, 0.0f, 0, 602));      // a norm weight: no decay
  ts.push_back(MakeTensor(4096 * 3, 0.1f, 1, 603)); // unaligned: scalar path
  ts.push_back(MakeTensor(17, 0.05f, 0, 604));      // smaller than a warp
  ts.push_back(MakeTensor(0, 0.1f, 0, 605));        // empty
  return ts;
}

// Random gradients for one step; returns them per tensor.
std::vector<std::vector<float>> UploadGrads(std::vector<Tensor>& ts, uint64_t seed) {
  std::vector<std::vector<float>> gs;
  for (size_t i = 0; i < ts.size(); ++i) {
    Tensor& t = ts[i];
    std::vector<float> g = test::RandomNormal(t.n, 0.02f, seed + 10 * i);
    std::vector<float> padded(t.n + t.offset, 0.0f);
    std::copy(g.begin(), g.end(), padded.begin() + t.offset);
    t.d_g.Upload(padded);
    gs.push_back(std::move(g));
  }
  return gs;
}

TEST(GpuGradNorm, MatchesCpuSumSquaresAndIsDeterministic) {
  FORGE_SKIP_WITHOUT_GPU();
  std::vector<Tensor> ts = MakeTensors();
  const std::vector<std::vector<float>> gs = UploadGrads(ts, 700);
  DeviceBuffer<cuda::AdamWTensor> d_desc(Descriptors(ts));
  double ref_sumsq = 0.0;
  for (const auto& g : gs) ref_sumsq += cpu::SumSquares(g.data(), int64_t(g.size()));
  const float ref_norm = float(std::sqrt(ref_sumsq));

  DeviceBuffer<char> ws(cuda::GradNormWorkspace());
  DeviceBuffer<float> d_sumsq(1), d_clip(1);
  auto run = [&](float max_norm) {
    ws.Poison();
    d_sumsq.Poison();
    d_clip.Poison();
    Status s = cuda::GlobalGradNorm(d_desc.data(), int(ts.size()), max_norm, d_sumsq.data(),
                                    d_clip.data(), ws.data(), ws.bytes(), nullptr);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return std::make_pair(d_sumsq.Download(), d_clip.Download());
  };

  // Clipping active: max_norm is half the norm, so the factor is ~0.5.
  const float max_norm = 0.5f * ref_norm;
  const auto [sumsq, clip] = run(max_norm);
  EXPECT_TRUE(test::MaxRelClose(sumsq, {float(ref_sumsq)}, 1e-5)) << "sum of squares";
  const float ref_clip = std::min(1.0f, max_norm / (ref_norm + 1e-6f));
  EXPECT_TRUE(test::MaxRelClose(clip, {ref_clip}, 1e-5)) << "clip factor";
  EXPECT_LT(clip[0], 0.51f);

  // Bitwise reproducible.
  const auto [sumsq2, clip2] = run(max_norm);
  EXPECT_TRUE(test::BitwiseEqual(sumsq, sumsq2));
  EXPECT_TRUE(test::BitwiseEqual(clip, clip2));

  // No clipping: a large max_norm, or max_norm <= 0 (disabled), gives exactly 1.
  EXPECT_EQ(run(10.0f * ref_norm).second[0], 1.0f);
  EXPECT_EQ(run(0.0f).second[0], 1.0f);
  EXPECT_TRUE(test::BitwiseEqual(run(0.0f).first, sumsq));
}

// The norm in per-range pieces (what the model does per unit during the backward): each
// tensor's squares into its own partials, then one finish over all of them. Same value as the
// CPU sum (and GlobalGradNorm) to fp32 rounding, bitwise reproducible, and a non-finite
// gradient still gives a NaN clip factor (the step is skipped).
TEST(GpuGradNorm, FromPartialsMatchesCpuAndGlobalNorm) {
  FORGE_SKIP_WITHOUT_GPU();
  std::vector<Tensor> ts = MakeTensors();
  const std::vector<std::vector<float>> gs = UploadGrads(ts, 750);
  double ref_sumsq = 0.0;
  for (const auto& g : gs) ref_sumsq += cpu::SumSquares(g.data(), int64_t(g.size()));
  const int64_t P = cuda::SumSquaresPartials();
  DeviceBuffer<float> partials(size_t(P) * ts.size()), d_sumsq(1), d_clip(1);
  const float max_norm = 0.5f * float(std::sqrt(ref_sumsq));
  auto run = [&]() {
    partials.Poison();
    for (size_t i = 0; i < ts.size(); ++i) {
      // Tensors may start at an unaligned offset (the scalar path).
      EXPECT_STATUS_OK(cuda::SumSquaresPartial(ts[i].d_g.data() + ts[i].offset, ts[i].n,
                                               partials.data() + int64_t(i) * P, nullptr));
    }
    EXPECT_STATUS_OK(cuda::GradNormFromPartials(partials.data(), P * int64_t(ts.size()),
                                                max_norm, d_sumsq.data(), d_clip.data(),
                                                nullptr));
    return std::make_pair(d_sumsq.Download(), d_clip.Download());
  };
  const auto [sumsq, clip] = run();
  EXPECT_TRUE(test::MaxRelClose(sumsq, {float(ref_sumsq)}, 1e-5)) << "sum of squares";
  EXPECT_TRUE(test::MaxRelClose(clip, {max_norm / (float(std::sqrt(ref_sumsq)) + 1e-6f)}, 1e-5));
  const auto [sumsq2, clip2] = run();
  EXPECT_TRUE(test::BitwiseEqual(sumsq, sumsq2));
  EXPECT_TRUE(test::BitwiseEqual(clip, clip2));

  DeviceBuffer<cuda::AdamWTensor> d_desc(Descriptors(ts));
  DeviceBuffer<char> ws(cuda::GradNormWorkspace());
  DeviceBuffer<float> g_sumsq(1), g_clip(1);
  ASSERT_STATUS_OK(cuda::GlobalGradNorm(d_desc.data(), int(ts.size()), max_norm, g_sumsq.data(),
                                        g_clip.data(), ws.data(), ws.bytes(), nullptr));
  EXPECT_TRUE(test::MaxRelClose(g_sumsq.Download(), sumsq, 1e-6)) << "vs GlobalGradNorm";

  std::vector<float> bad(size_t(ts[0].n + ts[0].offset), 0.0f);
  bad[size_t(ts[0].offset)] = std::numeric_limits<float>::infinity();
  ts[0].d_g.Upload(bad);
  EXPECT_TRUE(std::isnan(run().second[0])) << "an Inf gradient must give a NaN clip factor";
  EXPECT_FALSE(cuda::GradNormFromPartials(partials.data(), 0, 1.0f, d_sumsq.data(),
                                          d_clip.data(), nullptr).ok());
}

TEST(GpuGradNorm, EmptyListGivesZeroAndNoClip) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<char> ws(cuda::GradNormWorkspace());
  DeviceBuffer<float> d_sumsq(1), d_clip(1);
  d_sumsq.Poison();
  d_clip.Poison();
  ASSERT_STATUS_OK(cuda::GlobalGradNorm(nullptr, 0, 1.0f, d_sumsq.data(), d_clip.data(),
                                        ws.data(), ws.bytes(), nullptr));
  EXPECT_EQ(d_sumsq.Download()[0], 0.0f);
  EXPECT_EQ(d_clip.Download()[0], 1.0f);
}

TEST(GpuAdamW, SeveralClippedStepsMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  std::vector<Tensor> ts = MakeTensors();
  DeviceBuffer<cuda::AdamWTensor> d_desc(Descriptors(ts));
  DeviceBuffer<char> ws(cuda::GradNormWorkspace());
  DeviceBuffer<float> d_sumsq(1), d_clip(1);
  DeviceBuffer<cuda::AdamWHyper> d_hyper(1);
  const float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;

  for (int64_t step = 1; step <= 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<std::vector<float>> gs = UploadGrads(ts, 800 + 100 * step);
    const float lr = 1e-3f * float(step);  // a schedule: the hyper block changes every step
    d_hyper.Upload({cuda::AdamWHyper{lr, beta1, beta2, eps, step}});
    double sumsq = 0.0;
    for (const auto& g : gs) sumsq += cpu::SumSquares(g.data(), int64_t(g.size()));
    const float max_norm = 0.7f * float(std::sqrt(sumsq));  // clip factor ~0.7
    ASSERT_STATUS_OK(cuda::GlobalGradNorm(d_desc.data(), int(ts.size()), max_norm,
                                          d_sumsq.data(), d_clip.data(), ws.data(), ws.bytes(),
                                          nullptr));
    ASSERT_STATUS_OK(cuda::AdamWMultiTensor(d_desc.data(), int(ts.size()), d_hyper.data(),
                                            d_clip.data(), nullptr));
    // The reference uses the GPU's clip factor (checked against SumSquares in GpuGradNorm).
    const float clip = d_clip.Download()[0];
    ASSERT_TRUE(clip > 0.6f && clip < 0.8f) << clip;
    for (size_t i = 0; i < ts.size(); ++i) {
      Tensor& t = ts[i];
      SCOPED_TRACE("tensor " + std::to_string(i) + " n=" + std::to_string(t.n));
      const std::vector<float> p_prev = t.p;
      const cpu::AdamWParams a{lr, beta1, beta2, eps, t.wd, step, clip};
      cpu::AdamWUpdate(t.p.data(), gs[i].data(), t.m.data(), t.v.data(), t.n, a);
      const std::vector<float> p = DownloadAt(t.d_p, t.offset);
      EXPECT_TRUE(test::MaxRelClose(p, t.p, 1e-5)) << "param";
      // The update itself (much smaller than the parameters) to 1e-4 of its largest value.
      std::vector<float> got_delta(t.n), ref_delta(t.n);
      for (int64_t j = 0; j < t.n; ++j) {
        got_delta[j] = p[j] - p_prev[j];
        ref_delta[j] = t.p[j] - p_prev[j];
      }
      EXPECT_TRUE(test::MaxRelClose(got_delta, ref_delta, 1e-4)) << "param update";
      EXPECT_TRUE(test::MaxRelClose(DownloadAt(t.d_m, t.offset), t.m, 1e-5)) << "m";
      EXPECT_TRUE(test::MaxRelClose(DownloadAt(t.d_v, t.offset), t.v, 1e-5)) << "v";
      std::vector<float> pb = test::ToFloat(t.d_pb.Download());
      pb.erase(pb.begin(), pb.begin() + t.offset);
      std::vector<float> p_rounded = p;
      test::RoundBf16InPlace(p_rounded);
      EXPECT_TRUE(test::BitwiseEqual(pb, p_rounded)) << "bf16 copy";
    }
  }
}

TEST(GpuAdamW, NullBf16CopyAndNullScale) {
  FORGE_SKIP_WITHOUT_GPU();
  std::vector<Tensor> ts;
  ts.push_back(MakeTensor(1001, 0.1f, 0, 901));
  std::vector<cuda::AdamWTensor> desc = Descriptors(ts);
  desc[0].param_bf16 = nullptr;
  DeviceBuffer<cuda::AdamWTensor> d_desc(desc);
  const std::vector<std::vector<float>> gs = UploadGrads(ts, 902);
  DeviceBuffer<cuda::AdamWHyper> d_hyper(
      std::vector<cuda::AdamWHyper>{{3e-4f, 0.9f, 0.999f, 1e-8f, 1}});
  ts[0].d_pb.Poison();
  ASSERT_STATUS_OK(cuda::AdamWMultiTensor(d_desc.data(), 1, d_hyper.data(), nullptr, nullptr));
  cpu::AdamWUpdate(ts[0].p.data(), gs[0].data(), ts[0].m.data(), ts[0].v.data(), ts[0].n,
                   {3e-4f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 1.0f});
  EXPECT_TRUE(test::MaxRelClose(ts[0].d_p.Download(), ts[0].p, 1e-5));
  // The bf16 buffer was not given to the kernel: still all poison.
  for (float x : test::ToFloat(ts[0].d_pb.Download())) ASSERT_TRUE(std::isnan(x));
}

// ddp with bf16 gradient collectives hands the optimizer bf16 gradients (AdamWTensor::grad16):
// the norm (whole-list and per-unit partials) and the update must be bitwise those of fp32
// gradients holding the same values, on the vector and the scalar (unaligned) paths.
TEST(GpuAdamW, Bf16GradientsAreTheWidenedFp32Ones) {
  FORGE_SKIP_WITHOUT_GPU();
  std::vector<Tensor> a = MakeTensors(), b = MakeTensors();
  std::vector<DeviceBuffer<bf16>> g16;
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<float> g = test::RandomNormal(a[i].n, 0.02f, 990 + i);
    test::RoundBf16InPlace(g);
    std::vector<float> padded(size_t(a[i].n + a[i].offset), 0.0f);
    std::copy(g.begin(), g.end(), padded.begin() + a[i].offset);
    a[i].d_g.Upload(padded);
    g16.emplace_back(test::ToBf16(padded));
  }
  std::vector<cuda::AdamWTensor> da = Descriptors(a), db = Descriptors(b);
  for (size_t i = 0; i < db.size(); ++i) {
    db[i].grad = nullptr;
    db[i].grad16 = g16[i].data() + b[i].offset;
  }
  DeviceBuffer<cuda::AdamWTensor> d_da(da), d_db(db);
  DeviceBuffer<char> ws(cuda::GradNormWorkspace());
  DeviceBuffer<float> sa(1), ca(1), sb(1), cb(1);
  ASSERT_STATUS_OK(cuda::GlobalGradNorm(d_da.data(), int(a.size()), 0.05f, sa.data(), ca.data(),
                                        ws.data(), ws.bytes(), nullptr));
  ASSERT_STATUS_OK(cuda::GlobalGradNorm(d_db.data(), int(b.size()), 0.05f, sb.data(), cb.data(),
                                        ws.data(), ws.bytes(), nullptr));
  EXPECT_TRUE(test::BitwiseEqual(sa.Download(), sb.Download())) << "global norm";
  const int64_t P = cuda::SumSquaresPartials();
  DeviceBuffer<float> pa{size_t(P)}, pb{size_t(P)};
  for (size_t i = 0; i < a.size(); ++i) {
    pa.Poison();
    pb.Poison();
    ASSERT_STATUS_OK(
        cuda::SumSquaresPartial(a[i].d_g.data() + a[i].offset, a[i].n, pa.data(), nullptr));
    ASSERT_STATUS_OK(
        cuda::SumSquaresPartialBf16(g16[i].data() + b[i].offset, b[i].n, pb.data(), nullptr));
    EXPECT_TRUE(test::BitwiseEqual(pa.Download(), pb.Download())) << "partials, tensor " << i;
  }
  DeviceBuffer<cuda::AdamWHyper> d_hyper(
      std::vector<cuda::AdamWHyper>{{1e-3f, 0.9f, 0.95f, 1e-8f, 3}});
  ASSERT_STATUS_OK(
      cuda::AdamWMultiTensor(d_da.data(), int(a.size()), d_hyper.data(), ca.data(), nullptr));
  ASSERT_STATUS_OK(
      cuda::AdamWMultiTensor(d_db.data(), int(b.size()), d_hyper.data(), cb.data(), nullptr));
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    EXPECT_TRUE(test::BitwiseEqual(a[i].d_p.Download(), b[i].d_p.Download())) << "param";
    EXPECT_TRUE(test::BitwiseEqual(a[i].d_m.Download(), b[i].d_m.Download())) << "m";
    EXPECT_TRUE(test::BitwiseEqual(a[i].d_v.Download(), b[i].d_v.Download())) << "v";
    EXPECT_TRUE(test::BitwiseEqual(test::ToFloat(a[i].d_pb.Download()),
                                   test::ToFloat(b[i].d_pb.Download())))
        << "bf16 copy";
  }
}

TEST(GpuCast, FloatBf16RoundTripMatchesHostRounding) {
  FORGE_SKIP_WITHOUT_GPU();
  for (int offset : {0, 1}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    const int64_t n = 10007;
    std::vector<float> x = test::RandomNormal(n + offset, 3.0f, 950 + offset);
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<bf16> d_b(n + offset);
    d_b.Poison();
    ASSERT_STATUS_OK(cuda::CastFloatToBf16(d_b.data() + offset, d_x.data() + offset, n, nullptr));
    std::vector<float> b = test::ToFloat(d_b.Download());
    std::vector<float> want(x.begin() + offset, x.end());
    test::RoundBf16InPlace(want);
    EXPECT_TRUE(test::BitwiseEqual(std::vector<float>(b.begin() + offset, b.end()), want));

    DeviceBuffer<float> d_back(n + offset);
    d_back.Poison();
    ASSERT_STATUS_OK(
        cuda::CastBf16ToFloat(d_back.data() + offset, d_b.data() + offset, n, nullptr));
    std::vector<float> back = d_back.Download();
    EXPECT_TRUE(test::BitwiseEqual(std::vector<float>(back.begin() + offset, back.end()), want));
  }
}

}  // namespace
}  // namespace forge
