// SdpaRunner (cuDNN composite flash attention, causal) against the CPU float reference
// forge::cpu::AttentionForward/Backward on the same bf16-rounded inputs: O, Stats, dQ, dK, dV,
// every output element written (buffers poisoned with NaN first), and bitwise-reproducible
// gradients in deterministic mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/sdpa.cuh"

namespace forge::cuda {
namespace {

using test::DeviceBuffer;
using test::RandomNormal;
using test::RoundBf16InPlace;
using test::ToBf16;
using test::ToFloat;

constexpr double kTol = 2e-2;

// ||got - ref||_F / ||ref||_F; any non-finite element (left unwritten) makes it infinite.
double RelFrobenius(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = double(got[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Heads [first, first + count) of every token of a [B, T, heads_total, hd] buffer.
std::vector<float> SliceHeads(const std::vector<float>& x, const SdpaShape& s, int heads_total,
                              int first, int count) {
  std::vector<float> out;
  out.reserve(size_t(s.B) * s.T * count * s.hd);
  for (int64_t bt = 0; bt < int64_t{s.B} * s.T; ++bt) {
    const float* row = x.data() + (bt * heads_total + first) * s.hd;
    out.insert(out.end(), row, row + int64_t{count} * s.hd);
  }
  return out;
}

// Stats[b, h, t] = max_j(s_tj) + log(sum_j exp(s_tj - max)), s = scale q.k over j <= t.
std::vector<float> RefStats(const std::vector<float>& qkv, const SdpaShape& s) {
  const int64_t row = int64_t{s.H + 2 * s.KV} * s.hd;
  const int group = s.H / s.KV;
  const double scale = 1.0 / std::sqrt(double(s.hd));
  std::vector<float> stats(size_t(s.B) * s.H * s.T);
  std::vector<double> sc(s.T);
  for (int b = 0; b < s.B; ++b) {
    const float* base = qkv.data() + int64_t{b} * s.T * row;
    for (int h = 0; h < s.H; ++h) {
      const int64_t k_off = int64_t{s.H + h / group} * s.hd;
      for (int t = 0; t < s.T; ++t) {
        const float* q = base + t * row + int64_t{h} * s.hd;
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const float* k = base + j * row + k_off;
          double d = 0.0;
          for (int i = 0; i < s.hd; ++i) d += double(q[i]) * k[i];
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= t; ++j) sum += std::exp(sc[j] - mx);
        stats[(size_t(b) * s.H + h) * s.T + t] = float(mx + std::log(sum));
      }
    }
  }
  return stats;
}

struct Inputs {
  std::vector<float> qkv, dout;                       // bf16-rounded
  std::vector<float> out, probs, dqkv, stats;         // CPU reference results
};

Inputs MakeReference(const SdpaShape& s, uint64_t seed) {
  Inputs in;
  const size_t n_qkv = size_t(s.B) * s.T * (s.H + 2 * s.KV) * s.hd;
  const size_t n_out = size_t(s.B) * s.T * s.H * s.hd;
  in.qkv = RandomNormal(n_qkv, 1.0f, seed);
  in.dout = RandomNormal(n_out, 1.0f, seed + 1);
  RoundBf16InPlace(in.qkv);
  RoundBf16InPlace(in.dout);
  in.out.resize(n_out);
  in.probs.resize(size_t(s.B) * s.H * s.T * s.T);
  in.dqkv.resize(n_qkv);
  cpu::AttentionForward(in.out.data(), in.probs.data(), in.qkv.data(), s.B, s.T, s.H, s.KV,
                        s.hd);
  cpu::AttentionBackward(in.dqkv.data(), in.dout.data(), in.qkv.data(), in.probs.data(), s.B,
                         s.T, s.H, s.KV, s.hd);
  in.stats = RefStats(in.qkv, s);
  return in;
}

// Device-side state of one forward + backward.
struct DeviceRun {
  DeviceBuffer<bf16> qkv, out, dout, dqkv;
  DeviceBuffer<float> stats, softmax_sum, dq_accum;

  DeviceRun(const SdpaShape& s, const Inputs& in, bool deterministic)
      : qkv(ToBf16(in.qkv)),
        out(in.out.size()),
        dout(ToBf16(in.dout)),
        dqkv(in.qkv.size()),
        stats(size_t(s.B) * s.H * s.T),
        softmax_sum(size_t(s.B) * s.H * s.T),
        dq_accum(deterministic ? 0 : size_t(s.B) * s.H * s.T * s.hd) {
    // NaN everywhere: unwritten outputs show up, and the fp32 dQ accumulator must be
    // initialised by the graph itself.
    out.Poison();
    dqkv.Poison();
    stats.Poison();
    softmax_sum.Poison();
    dq_accum.Poison();
  }
};

void ExpectGradientsMatch(const SdpaShape& s, const std::vector<float>& got,
                          const std::vector<float>& ref) {
  const int total = s.H + 2 * s.KV;
  EXPECT_LT(RelFrobenius(SliceHeads(got, s, total, 0, s.H), SliceHeads(ref, s, total, 0, s.H)),
            kTol)
      << "dQ";
  EXPECT_LT(RelFrobenius(SliceHeads(got, s, total, s.H, s.KV),
                         SliceHeads(ref, s, total, s.H, s.KV)),
            kTol)
      << "dK";
  EXPECT_LT(RelFrobenius(SliceHeads(got, s, total, s.H + s.KV, s.KV),
                         SliceHeads(ref, s, total, s.H + s.KV, s.KV)),
            kTol)
      << "dV";
}

// Forward (O, Stats; a second call gives the same O) and backward vs the CPU reference.
void CheckAgainstCpu(const SdpaShape& s, bool deterministic, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H
                                    << " KV=" << s.KV << " hd=" << s.hd
                                    << (deterministic ? " deterministic" : ""));
  const Inputs in = MakeReference(s, seed);
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(deterministic));
  DeviceRun d(s, in, deterministic);

  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  const std::vector<bf16> out_first = d.out.Download();
  EXPECT_LT(RelFrobenius(ToFloat(out_first), in.out), kTol) << "O";
  const std::vector<float> stats = d.stats.Download();
  EXPECT_LT(RelFrobenius(stats, in.stats), kTol) << "Stats";
  EXPECT_TRUE(test::MaxRelClose(stats, in.stats, 1e-3)) << "Stats (natural log of sum exp)";

  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  EXPECT_TRUE(test::BitwiseEqual(d.out.Download(), out_first)) << "cached forward plan";

  ASSERT_STATUS_OK(runner.Backward(s, d.qkv.data(), d.out.data(), d.dout.data(), d.stats.data(),
                                   d.dqkv.data(), d.softmax_sum.data(),
                                   deterministic ? nullptr : d.dq_accum.data(), nullptr));
  ExpectGradientsMatch(s, ToFloat(d.dqkv.Download()), in.dqkv);
}

class GpuSdpaTest : public ::testing::Test {
 protected:
  void SetUp() override { FORGE_SKIP_WITHOUT_GPU(); }
};

TEST_F(GpuSdpaTest, MatchesCpuT128) { CheckAgainstCpu({2, 128, 4, 4, 64}, false, 100); }

TEST_F(GpuSdpaTest, MatchesCpuT256) { CheckAgainstCpu({2, 256, 4, 4, 64}, false, 200); }

TEST_F(GpuSdpaTest, MatchesCpuT1024H12) { CheckAgainstCpu({2, 1024, 12, 12, 64}, false, 300); }

TEST_F(GpuSdpaTest, DeterministicMatchesCpuT256) {
  CheckAgainstCpu({2, 256, 4, 4, 64}, true, 400);
}

// GQA: 2 query heads per kv head; dK/dV summed over the group by the graph.
TEST_F(GpuSdpaTest, GroupedQueryMatchesCpu) { CheckAgainstCpu({2, 128, 4, 2, 64}, false, 500); }

// Two backward runs in deterministic mode write bitwise-identical dQKV.
TEST_F(GpuSdpaTest, DeterministicBackwardIsBitwiseReproducible) {
  const SdpaShape s{2, 1024, 12, 12, 64};
  Inputs in;
  in.qkv = RandomNormal(size_t(s.B) * s.T * (s.H + 2 * s.KV) * s.hd, 1.0f, 600);
  in.dout = RandomNormal(size_t(s.B) * s.T * s.H * s.hd, 1.0f, 601);
  in.out.resize(in.dout.size());
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(/*deterministic=*/true));
  DeviceRun d(s, in, true);
  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  std::vector<bf16> first;
  for (int run = 0; run < 2; ++run) {
    d.dqkv.Poison();
    d.softmax_sum.Poison();
    ASSERT_STATUS_OK(runner.Backward(s, d.qkv.data(), d.out.data(), d.dout.data(),
                                     d.stats.data(), d.dqkv.data(), d.softmax_sum.data(),
                                     nullptr, nullptr));
    std::vector<bf16> got = d.dqkv.Download();
    if (run == 0) {
      for (float v : ToFloat(got)) ASSERT_TRUE(std::isfinite(v)) << "unwritten dqkv element";
      first = std::move(got);
    } else {
      EXPECT_TRUE(test::BitwiseEqual(got, first));
    }
  }
}

TEST_F(GpuSdpaTest, RejectsBadShapes) {
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(false));
  DeviceBuffer<bf16> buf(1 << 16);
  DeviceBuffer<float> stats(1 << 10);
  auto forward = [&](SdpaShape s) {
    return runner.Forward(s, buf.data(), buf.data(), stats.data(), nullptr).code();
  };
  EXPECT_EQ(forward({1, 16, 4, 3, 64}), Code::kInvalidArgument);  // H % KV != 0
  EXPECT_EQ(forward({1, 16, 4, 4, 60}), Code::kInvalidArgument);  // hd % 8 != 0
  EXPECT_EQ(forward({0, 16, 4, 4, 64}), Code::kInvalidArgument);  // empty
  EXPECT_EQ(runner.Forward({1, 16, 4, 4, 64}, buf.data() + 1, buf.data(), stats.data(), nullptr)
                .code(),
            Code::kInvalidArgument);  // misaligned qkv
  EXPECT_EQ(runner.Init(false).code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace forge::cuda
