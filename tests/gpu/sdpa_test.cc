// SdpaRunner (cuDNN composite flash attention, causal) against the CPU float reference
// forge::cpu::AttentionForward/Backward on the same bf16-rounded inputs: O, Stats, dQ, dK, dV,
// every output element written (buffers poisoned with NaN first), and bitwise-reproducible
// gradients in deterministic mode.
//
// Engine choice: every test gets a fresh plan cache file through FORGE_PLAN_CACHE, so each
// runner tunes on its first call of a shape (the path a new machine takes) and the checks
// run on the tuned engine. Further: every candidate engine matches the reference and may be
// re-run (the fp32 dQ accumulator is reset by each run); a second runner reading the cache
// takes the recorded engines without timing and gives bitwise equal outputs; a recorded
// choice is honoured, an unusable one replaced; "off" takes heuristics' first; a first call
// under stream capture is not timed and records nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "fp8_fused_test_util.h"
#include "gpu_test_util.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/plan_cache.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sdpa.h"

namespace forge::cuda {
namespace {

using test::RelFrobenius;

using test::DeviceBuffer;
using test::RandomNormal;
using test::RoundBf16InPlace;
using test::ToBf16;
using test::ToFloat;

constexpr double kTol = 2e-2;

// ||got - ref||_F / ||ref||_F; any non-finite element (left unwritten) makes it infinite.

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

// Operands only (bf16-rounded qkv and dout, seeds seed and seed + 1), no CPU reference: for
// shapes too large for it.
Inputs RandomInputs(const SdpaShape& s, uint64_t seed) {
  Inputs in;
  in.qkv = RandomNormal(size_t(s.B) * s.T * (s.H + 2 * s.KV) * s.hd, 1.0f, seed);
  in.dout = RandomNormal(size_t(s.B) * s.T * s.H * s.hd, 1.0f, seed + 1);
  in.out.resize(in.dout.size());
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

void ExpectForwardMatches(const Inputs& in, const DeviceRun& d) {
  EXPECT_LT(RelFrobenius(ToFloat(d.out.Download()), in.out), kTol) << "O";
  const std::vector<float> stats = d.stats.Download();
  EXPECT_LT(RelFrobenius(stats, in.stats), kTol) << "Stats";
  EXPECT_TRUE(test::MaxRelClose(stats, in.stats, 1e-3)) << "Stats (natural log of sum exp)";
}

void PrintPlan(const SdpaPlanInfo& info) {
  std::printf("[sdpa plan] %s -> %s (%s, %d timed, first %.4f ms, chosen %.4f ms) %s\n",
              info.key.c_str(), info.engine.c_str(), info.source.c_str(), info.timed,
              double(info.first_ms), double(info.chosen_ms), info.note.c_str());
}

// The last plan made was tuned (the fixture's cache starts empty); printed so GPU runs show
// which engines won.
void ExpectTuned(const SdpaRunner& runner) {
  ASSERT_FALSE(runner.plan_log().empty());
  const SdpaPlanInfo& info = runner.plan_log().back();
  EXPECT_EQ(info.source, "tuned") << info.key << ": " << info.note;
  EXPECT_GE(info.timed, 1);
  PrintPlan(info);
}

Status RunBackward(SdpaRunner& runner, const SdpaShape& s, DeviceRun& d, bool deterministic) {
  return runner.Backward(s, d.qkv.data(), d.out.data(), d.dout.data(), d.stats.data(),
                         d.dqkv.data(), d.softmax_sum.data(),
                         deterministic ? nullptr : d.dq_accum.data(), nullptr);
}

// Forward (O, Stats; a second call gives the same O) and backward vs the CPU reference; the
// backward twice without re-poisoning (a run must not accumulate into its scratch).
void CheckAgainstCpu(const SdpaShape& s, bool deterministic, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H
                                    << " KV=" << s.KV << " hd=" << s.hd
                                    << (deterministic ? " deterministic" : ""));
  const Inputs in = MakeReference(s, seed);
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(deterministic, SdpaBackwardKernel::kCudnn));
  DeviceRun d(s, in, deterministic);

  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  ExpectTuned(runner);
  const std::vector<bf16> out_first = d.out.Download();
  ExpectForwardMatches(in, d);

  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  EXPECT_TRUE(test::BitwiseEqual(d.out.Download(), out_first)) << "cached forward plan";

  ASSERT_STATUS_OK(RunBackward(runner, s, d, deterministic));
  ExpectTuned(runner);
  const std::vector<bf16> dqkv_first = d.dqkv.Download();
  ExpectGradientsMatch(s, ToFloat(dqkv_first), in.dqkv);

  ASSERT_STATUS_OK(RunBackward(runner, s, d, deterministic));
  const std::vector<bf16> dqkv_again = d.dqkv.Download();
  ExpectGradientsMatch(s, ToFloat(dqkv_again), in.dqkv);
  if (deterministic) EXPECT_TRUE(test::BitwiseEqual(dqkv_again, dqkv_first)) << "re-run";
}

// Each test gets its own empty plan cache file through FORGE_PLAN_CACHE; the variable's old
// value comes back afterwards.
class GpuSdpaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FORGE_SKIP_WITHOUT_GPU();
    // These tests are about cuDNN's graphs: their runners name SdpaBackwardKernel::kCudnn; our
    // own backward's tests name kFlash (GpuFlashBackward below).
    if (const char* old = std::getenv("FORGE_PLAN_CACHE")) old_env_ = old;
    cache_path_ = ::testing::TempDir() + "forge_sdpa_plans_" + std::to_string(getpid()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
    RemoveCache();
    setenv("FORGE_PLAN_CACHE", cache_path_.c_str(), 1);
  }
  void TearDown() override {
    if (cache_path_.empty()) return;  // skipped before SetUp chose a file
    if (old_env_) {
      setenv("FORGE_PLAN_CACHE", old_env_->c_str(), 1);
    } else {
      unsetenv("FORGE_PLAN_CACHE");
    }
    RemoveCache();
  }
  void RemoveCache() const {
    std::remove(cache_path_.c_str());
    std::remove((cache_path_ + ".lock").c_str());
  }
  std::optional<std::string> Recorded(const std::string& key) const {
    auto got = PlanCache(cache_path_).Get(key);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    return got.ok() ? *got : std::nullopt;
  }

  std::string cache_path_;
  std::optional<std::string> old_env_;
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
  const Inputs in = RandomInputs(s, 600);
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(/*deterministic=*/true, SdpaBackwardKernel::kCudnn));
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

// A runner working in a lent workspace of WorkspaceBytes (as the model lends it the LM head's
// logits region) needs no buffer of its own and gives the bits a runner with its own gives
// (the second reads the first's recorded engines); one lent too little gets its own, with
// the same bits. Lending after the first call, or unaligned memory, is refused.
void CheckLentWorkspace(const SdpaShape& s, bool deterministic, SdpaBackwardKernel kernel,
                        uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "T=" << s.T << " H=" << s.H << " KV=" << s.KV
                                    << " hd=" << s.hd << (deterministic ? " deterministic" : ""));
  const Inputs in = MakeReference(s, seed);
  auto run = [&](SdpaRunner& runner, std::vector<bf16>* out, std::vector<bf16>* dqkv) {
    DeviceRun d(s, in, deterministic);
    ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
    ASSERT_STATUS_OK(RunBackward(runner, s, d, deterministic));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    *out = d.out.Download();
    *dqkv = d.dqkv.Download();
    ExpectForwardMatches(in, d);
    ExpectGradientsMatch(s, ToFloat(*dqkv), in.dqkv);
  };
  SdpaRunner own;
  ASSERT_STATUS_OK(own.Init(deterministic, kernel));
  std::vector<bf16> out_own, dqkv_own;
  run(own, &out_own, &dqkv_own);

  SdpaRunner lent;
  ASSERT_STATUS_OK(lent.Init(deterministic, kernel));
  StatusOr<size_t> bytes = lent.WorkspaceBytes(s);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  std::printf("[sdpa lent] workspace %zu bytes\n", *bytes);
  DeviceBuffer<char> region(std::max<size_t>(*bytes, 256));
  region.Poison();
  ASSERT_STATUS_OK(lent.ShareWorkspace(region.data(), region.size()));
  std::vector<bf16> out_lent, dqkv_lent;
  run(lent, &out_lent, &dqkv_lent);
  EXPECT_FALSE(lent.owns_workspace()) << "WorkspaceBytes was not enough";
  EXPECT_TRUE(test::BitwiseEqual(out_lent, out_own)) << "O";
  if (deterministic) EXPECT_TRUE(test::BitwiseEqual(dqkv_lent, dqkv_own)) << "dQKV";
  EXPECT_EQ(lent.ShareWorkspace(region.data(), region.size()).code(), Code::kFailedPrecondition);

  if (*bytes > 256) {
    SdpaRunner small;
    ASSERT_STATUS_OK(small.Init(deterministic, kernel));
    EXPECT_EQ(small.ShareWorkspace(region.data() + 1, 256).code(), Code::kInvalidArgument);
    ASSERT_STATUS_OK(small.ShareWorkspace(region.data(), 256));
    std::vector<bf16> out_small, dqkv_small;
    run(small, &out_small, &dqkv_small);
    EXPECT_TRUE(small.owns_workspace());
    if (deterministic) EXPECT_TRUE(test::BitwiseEqual(dqkv_small, dqkv_own)) << "dQKV";
  }
}

TEST_F(GpuSdpaTest, LentWorkspaceDeterministic) {
  CheckLentWorkspace({2, 256, 4, 2, 128}, true, SdpaBackwardKernel::kCudnn, 800);
}

TEST_F(GpuSdpaTest, LentWorkspaceDefault) {
  CheckLentWorkspace({2, 256, 4, 2, 128}, false, SdpaBackwardKernel::kCudnn, 810);
}

TEST_F(GpuSdpaTest, LentWorkspaceOurBackward) {
  CheckLentWorkspace({2, 256, 4, 2, 64}, true, SdpaBackwardKernel::kFlash, 820);
}

// Every engine config a tuning may choose matches the reference, forward and backward, and a
// backward re-run without re-poisoning still does (each run resets the fp32 dQ accumulator).
void CheckEveryEngine(const SdpaShape& s, bool deterministic, uint64_t seed) {
  const Inputs in = MakeReference(s, seed);
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(deterministic, SdpaBackwardKernel::kCudnn));
  DeviceRun d(s, in, deterministic);

  auto fwd = runner.EngineCandidates(s, false);
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  ASSERT_FALSE(fwd->empty());
  for (const SdpaEngineCandidate& c : *fwd) {
    SCOPED_TRACE("forward " + c.engine);
    ASSERT_STATUS_OK(runner.UseEngine(s, false, c.engine));
    EXPECT_EQ(runner.plan_log().back().engine, c.engine);
    d.out.Poison();
    d.stats.Poison();
    ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
    ExpectForwardMatches(in, d);
  }
  // Backward from the last (checked) forward's O and Stats.
  auto bwd = runner.EngineCandidates(s, true);
  ASSERT_TRUE(bwd.ok()) << bwd.status().ToString();
  ASSERT_FALSE(bwd->empty());
  for (const SdpaEngineCandidate& c : *bwd) {
    SCOPED_TRACE("backward " + c.engine);
    ASSERT_STATUS_OK(runner.UseEngine(s, true, c.engine));
    d.dqkv.Poison();
    d.softmax_sum.Poison();
    d.dq_accum.Poison();
    ASSERT_STATUS_OK(RunBackward(runner, s, d, deterministic));
    const std::vector<bf16> first = d.dqkv.Download();
    ExpectGradientsMatch(s, ToFloat(first), in.dqkv);
    ASSERT_STATUS_OK(RunBackward(runner, s, d, deterministic));
    const std::vector<bf16> again = d.dqkv.Download();
    ExpectGradientsMatch(s, ToFloat(again), in.dqkv);
    if (deterministic) EXPECT_TRUE(test::BitwiseEqual(again, first)) << "re-run";
  }
  std::printf("[sdpa engines] %s: %zu forward, %zu backward candidates\n",
              deterministic ? "deterministic" : "default", fwd->size(), bwd->size());
}

TEST_F(GpuSdpaTest, EveryCandidateEngineMatchesCpu) {
  CheckEveryEngine({2, 256, 4, 4, 64}, false, 700);
}

TEST_F(GpuSdpaTest, EveryCandidateEngineMatchesCpuDeterministic) {
  CheckEveryEngine({2, 256, 4, 4, 64}, true, 710);
}

// A first runner tunes and records; a second one with the same cache file takes the
// recorded engines without timing and produces the same bits (forward always; backward in
// deterministic mode, where it is bitwise reproducible at all).
void CheckCacheRoundTrip(const SdpaShape& s, bool deterministic, uint64_t seed,
                         const std::string& cache_path) {
  const Inputs in = MakeReference(s, seed);
  std::vector<SdpaPlanInfo> logs[2];
  std::vector<bf16> out[2], dqkv[2];
  std::vector<float> stats[2];
  for (int r = 0; r < 2; ++r) {
    SdpaRunner runner;
    ASSERT_STATUS_OK(runner.Init(deterministic, SdpaBackwardKernel::kCudnn));
    EXPECT_EQ(runner.plan_cache().path(), cache_path);
    DeviceRun d(s, in, deterministic);
    ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
    ASSERT_STATUS_OK(RunBackward(runner, s, d, deterministic));
    logs[r] = runner.plan_log();
    out[r] = d.out.Download();
    stats[r] = d.stats.Download();
    dqkv[r] = d.dqkv.Download();
    ExpectGradientsMatch(s, ToFloat(dqkv[r]), in.dqkv);
  }
  ASSERT_EQ(logs[0].size(), 2u);
  ASSERT_EQ(logs[1].size(), 2u);
  for (int g = 0; g < 2; ++g) {
    PrintPlan(logs[0][size_t(g)]);
    EXPECT_EQ(logs[0][size_t(g)].source, "tuned") << logs[0][size_t(g)].note;
    EXPECT_EQ(logs[1][size_t(g)].source, "cache") << logs[1][size_t(g)].note;
    EXPECT_EQ(logs[1][size_t(g)].timed, 0);
    EXPECT_EQ(logs[1][size_t(g)].key, logs[0][size_t(g)].key);
    EXPECT_EQ(logs[1][size_t(g)].engine, logs[0][size_t(g)].engine);
    auto recorded = PlanCache(cache_path).Get(logs[0][size_t(g)].key);
    ASSERT_TRUE(recorded.ok());
    ASSERT_TRUE(recorded->has_value()) << logs[0][size_t(g)].key;
    EXPECT_EQ(**recorded, logs[0][size_t(g)].engine);
  }
  EXPECT_NE(logs[0][0].key.find("sdpa fwd"), std::string::npos) << logs[0][0].key;
  EXPECT_NE(logs[0][1].key.find(deterministic ? "sdpa bwd-det" : "sdpa bwd "),
            std::string::npos)
      << logs[0][1].key;
  EXPECT_TRUE(test::BitwiseEqual(out[1], out[0])) << "O";
  EXPECT_TRUE(test::BitwiseEqual(stats[1], stats[0])) << "Stats";
  if (deterministic) EXPECT_TRUE(test::BitwiseEqual(dqkv[1], dqkv[0])) << "dQKV";
}

TEST_F(GpuSdpaTest, CacheRoundTripDeterministic) {
  CheckCacheRoundTrip({2, 512, 4, 4, 64}, true, 800, cache_path_);
}

TEST_F(GpuSdpaTest, CacheRoundTripDefault) {
  CheckCacheRoundTrip({2, 512, 4, 4, 64}, false, 810, cache_path_);
}

// A choice in the cache is what runs, even when it is not heuristics' first (here: the last
// candidate, put there by hand); and the result still matches the reference.
TEST_F(GpuSdpaTest, RecordedChoiceIsUsed) {
  const SdpaShape s{2, 256, 4, 4, 64};
  const Inputs in = MakeReference(s, 900);
  std::string keys[2], forced[2];
  {
    SdpaRunner probe;
    ASSERT_STATUS_OK(probe.Init(false, SdpaBackwardKernel::kCudnn));
    DeviceRun d(s, in, false);
    ASSERT_STATUS_OK(probe.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
    ASSERT_STATUS_OK(RunBackward(probe, s, d, false));
    ASSERT_EQ(probe.plan_log().size(), 2u);
    for (int g = 0; g < 2; ++g) {
      keys[g] = probe.plan_log()[size_t(g)].key;
      auto cands = probe.EngineCandidates(s, g == 1);
      ASSERT_TRUE(cands.ok()) << cands.status().ToString();
      forced[g] = cands->back().engine;
      std::printf("[sdpa forced] %s -> %s (of %zu candidates)\n", keys[g].c_str(),
                  forced[g].c_str(), cands->size());
      ASSERT_STATUS_OK(PlanCache(cache_path_).Put(keys[g], forced[g]));
    }
  }
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(false, SdpaBackwardKernel::kCudnn));
  DeviceRun d(s, in, false);
  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  ASSERT_STATUS_OK(RunBackward(runner, s, d, false));
  ASSERT_EQ(runner.plan_log().size(), 2u);
  for (int g = 0; g < 2; ++g) {
    EXPECT_EQ(runner.plan_log()[size_t(g)].source, "cache");
    EXPECT_EQ(runner.plan_log()[size_t(g)].engine, forced[g]);
  }
  ExpectForwardMatches(in, d);
  ExpectGradientsMatch(s, ToFloat(d.dqkv.Download()), in.dqkv);
}

// A recorded choice this cuDNN cannot build (an engine index out of range) or cannot read (not
// the text form) is replaced by a fresh tuning, which is recorded in its place.
TEST_F(GpuSdpaTest, UnusableRecordedChoiceIsRetunedAndReplaced) {
  const SdpaShape s{2, 128, 4, 4, 64};
  const Inputs in = MakeReference(s, 1000);
  std::string keys[2];
  {
    SdpaRunner probe;
    ASSERT_STATUS_OK(probe.Init(false, SdpaBackwardKernel::kCudnn));
    DeviceRun d(s, in, false);
    ASSERT_STATUS_OK(probe.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
    ASSERT_STATUS_OK(RunBackward(probe, s, d, false));
    ASSERT_EQ(probe.plan_log().size(), 2u);
    keys[0] = probe.plan_log()[0].key;
    keys[1] = probe.plan_log()[1].key;
  }
  const std::string bogus[2] = {"engine=999999 knobs=", "not an engine"};
  for (int g = 0; g < 2; ++g) ASSERT_STATUS_OK(PlanCache(cache_path_).Put(keys[g], bogus[g]));

  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(false, SdpaBackwardKernel::kCudnn));
  DeviceRun d(s, in, false);
  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  ASSERT_STATUS_OK(RunBackward(runner, s, d, false));
  ASSERT_EQ(runner.plan_log().size(), 2u);
  for (int g = 0; g < 2; ++g) {
    const SdpaPlanInfo& info = runner.plan_log()[size_t(g)];
    EXPECT_EQ(info.source, "tuned");
    EXPECT_NE(info.note.find("not usable"), std::string::npos) << info.note;
    const std::optional<std::string> now = Recorded(keys[g]);
    ASSERT_TRUE(now.has_value());
    EXPECT_EQ(*now, info.engine);
  }
  ExpectForwardMatches(in, d);
  ExpectGradientsMatch(s, ToFloat(d.dqkv.Download()), in.dqkv);
}

// FORGE_PLAN_CACHE=off: no timing, heuristics' first engine config, no file written.
TEST_F(GpuSdpaTest, CacheOffTakesHeuristicsFirst) {
  setenv("FORGE_PLAN_CACHE", "off", 1);  // TearDown restores
  const SdpaShape s{2, 128, 4, 4, 64};
  const Inputs in = MakeReference(s, 1100);
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(false, SdpaBackwardKernel::kCudnn));
  EXPECT_FALSE(runner.plan_cache().enabled());
  DeviceRun d(s, in, false);
  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  ASSERT_EQ(runner.plan_log().size(), 1u);
  EXPECT_EQ(runner.plan_log()[0].source, "first");
  auto cands = runner.EngineCandidates(s, false);
  ASSERT_TRUE(cands.ok()) << cands.status().ToString();
  EXPECT_EQ(runner.plan_log()[0].engine, cands->front().engine);
  ExpectForwardMatches(in, d);
  FILE* f = std::fopen(cache_path_.c_str(), "r");
  EXPECT_EQ(f, nullptr) << "plan cache written although off";
  if (f) std::fclose(f);
}

// A first call under stream capture takes heuristics' first config untimed and records
// nothing; the plan then runs eagerly and is correct.
TEST_F(GpuSdpaTest, FirstCallUnderCaptureIsNotTimed) {
  const SdpaShape s{2, 128, 4, 4, 64};
  const Inputs in = MakeReference(s, 1200);
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(false, SdpaBackwardKernel::kCudnn));
  DeviceRun d(s, in, false);
  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  const Status captured =
      runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), stream);
  cudaGraph_t graph = nullptr;
  ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  if (graph) ASSERT_CUDA_OK(cudaGraphDestroy(graph));
  ASSERT_STATUS_OK(captured);
  ASSERT_EQ(runner.plan_log().size(), 1u);
  EXPECT_EQ(runner.plan_log()[0].source, "capture");
  EXPECT_FALSE(Recorded(runner.plan_log()[0].key).has_value());

  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  ExpectForwardMatches(in, d);
  ASSERT_CUDA_OK(cudaStreamDestroy(stream));
}

// Under a profiler (CUDA_INJECTION64_PATH set, as ncu and compute-sanitizer do) timings are
// meaningless: heuristics' first config, untimed, and nothing recorded for later runs.
TEST_F(GpuSdpaTest, UnderAProfilerNothingIsTimedOrRecorded) {
  ASSERT_CUDA_OK(cudaFree(nullptr));  // CUDA reads the variable at initialisation: before it
  const char* old = std::getenv("CUDA_INJECTION64_PATH");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  setenv("CUDA_INJECTION64_PATH", "/nonexistent/libprofiler.so", 1);
  const SdpaShape s{2, 128, 4, 4, 64};
  const Inputs in = MakeReference(s, 1300);
  SdpaRunner runner;
  const Status init = runner.Init(false, SdpaBackwardKernel::kCudnn);
  DeviceRun d(s, in, false);
  const Status fwd =
      init.ok() ? runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr) : init;
  if (saved) setenv("CUDA_INJECTION64_PATH", saved->c_str(), 1);
  else unsetenv("CUDA_INJECTION64_PATH");
  ASSERT_STATUS_OK(fwd);
  ASSERT_EQ(runner.plan_log().size(), 1u);
  EXPECT_EQ(runner.plan_log()[0].source, "profiler");
  EXPECT_EQ(runner.plan_log()[0].timed, 0);
  EXPECT_FALSE(Recorded(runner.plan_log()[0].key).has_value());
  auto cands = runner.EngineCandidates(s, false);
  ASSERT_TRUE(cands.ok()) << cands.status().ToString();
  EXPECT_EQ(runner.plan_log()[0].engine, cands->front().engine);
  ExpectForwardMatches(in, d);
}

TEST_F(GpuSdpaTest, RejectsBadShapes) {
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(false, SdpaBackwardKernel::kCudnn));
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
  EXPECT_EQ(runner.Init(false, SdpaBackwardKernel::kCudnn).code(), Code::kFailedPrecondition);
}

// Our own backward (flash_backward.h), forward from cuDNN: against the CPU reference, every
// element written, bitwise the same on a re-run, under CUDA-graph replay and from a workspace
// left dirty; and close to cuDNN's deterministic backward on the same O and Stats.
// (The kernel's waits trap after 10 s, flash_backward.cu, so a deadlock fails these tests
// instead of hanging the suite.)
using GpuFlashBackward = GpuSdpaTest;

// cuDNN's deterministic backward of d's operands (its O and Stats) as floats into *dqkv.
void CudnnDeterministicDqkv(const SdpaShape& s, DeviceRun& d, std::vector<float>* dqkv) {
  SdpaRunner cudnn;
  ASSERT_STATUS_OK(cudnn.Init(true, SdpaBackwardKernel::kCudnn));
  ASSERT_FALSE(cudnn.flash_backward(s));
  DeviceBuffer<bf16> ref(d.qkv.size());
  ASSERT_STATUS_OK(cudnn.Backward(s, d.qkv.data(), d.out.data(), d.dout.data(), d.stats.data(),
                                  ref.data(), d.softmax_sum.data(), nullptr, nullptr));
  *dqkv = ToFloat(ref.Download());
}

void CheckFlashAgainstCpu(const SdpaShape& s, bool deterministic, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H << " KV=" << s.KV
                                    << (deterministic ? " deterministic" : ""));
  const Inputs in = MakeReference(s, seed);
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(deterministic, SdpaBackwardKernel::kFlash));
  ASSERT_TRUE(runner.flash_backward(s));
  DeviceRun d(s, in, deterministic);
  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  ASSERT_STATUS_OK(RunBackward(runner, s, d, deterministic));
  const std::vector<bf16> first = d.dqkv.Download();
  for (float v : ToFloat(first)) ASSERT_TRUE(std::isfinite(v)) << "unwritten dqkv element";
  ExpectGradientsMatch(s, ToFloat(first), in.dqkv);

  d.dqkv.Poison();
  ASSERT_STATUS_OK(RunBackward(runner, s, d, deterministic));
  EXPECT_TRUE(test::BitwiseEqual(d.dqkv.Download(), first)) << "re-run";

  // The same bits from a cuDNN-free graph replay (twice: the semaphores and the tile counter
  // are reset by every call, not left to the previous one).
  cudaStream_t stream = nullptr;
  ASSERT_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status captured =
      runner.Backward(s, d.qkv.data(), d.out.data(), d.dout.data(), d.stats.data(), d.dqkv.data(),
                      d.softmax_sum.data(), deterministic ? nullptr : d.dq_accum.data(), stream);
  ASSERT_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_STATUS_OK(captured);
  ASSERT_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 2; ++r) {
    d.dqkv.Poison();
    ASSERT_CUDA_OK(cudaGraphLaunch(exec, stream));
    ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(test::BitwiseEqual(d.dqkv.Download(), first)) << "graph replay " << r;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);

  // cuDNN's deterministic backward on the same O and Stats: the same sums in another order and
  // rounding, so close (well inside the CPU tolerance), not equal.
  std::vector<float> ref_f;
  ASSERT_NO_FATAL_FAILURE(CudnnDeterministicDqkv(s, d, &ref_f));
  const std::vector<float> got_f = ToFloat(first);
  const int total = s.H + 2 * s.KV;
  const char* names[3] = {"dQ", "dK", "dV"};
  const int firsts[3] = {0, s.H, s.H + s.KV}, counts[3] = {s.H, s.KV, s.KV};
  for (int k = 0; k < 3; ++k) {
    const double rel = RelFrobenius(SliceHeads(got_f, s, total, firsts[k], counts[k]),
                                    SliceHeads(ref_f, s, total, firsts[k], counts[k]));
    std::printf("[flash bwd] B=%d T=%d H=%d KV=%d %s vs cuDNN deterministic: %.3e\n", s.B, s.T, s.H,
                s.KV, names[k], rel);
    EXPECT_LT(rel, 5e-3) << names[k] << " vs cuDNN";
  }
}

TEST_F(GpuFlashBackward, MatchesCpuT128) {
  CheckFlashAgainstCpu({2, 128, 4, 4, 64}, true, 800);
}

TEST_F(GpuFlashBackward, MatchesCpuT384) {
  CheckFlashAgainstCpu({1, 384, 2, 2, 64}, true, 810);
}

TEST_F(GpuFlashBackward, MatchesCpuT1024H12) {
  CheckFlashAgainstCpu({2, 1024, 12, 12, 64}, true, 820);
}

// The non-deterministic mode takes the same (deterministic) kernels.
TEST_F(GpuFlashBackward, MatchesCpuDefaultMode) {
  CheckFlashAgainstCpu({2, 256, 4, 4, 64}, false, 830);
}

// GQA: a tile per query head; the group's last tile of each kv block sums their dK and dV.
TEST_F(GpuFlashBackward, GroupedQueryMatchesCpu) {
  CheckFlashAgainstCpu({2, 256, 8, 2, 64}, true, 840);
}

// Many CTAs on one query block's semaphore at once: two runs give the same bits; a mismatch
// would mean an addition out of order or unseen.
void CheckFlashReproducible(const SdpaShape& s, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H << " KV=" << s.KV);
  const Inputs in = RandomInputs(s, seed);
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(true, SdpaBackwardKernel::kFlash));
  DeviceRun d(s, in, true);
  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  std::vector<float> ref_f;
  ASSERT_NO_FATAL_FAILURE(CudnnDeterministicDqkv(s, d, &ref_f));
  std::vector<bf16> first;
  for (int run = 0; run < 3; ++run) {
    d.dqkv.Poison();
    ASSERT_STATUS_OK(runner.Backward(s, d.qkv.data(), d.out.data(), d.dout.data(), d.stats.data(),
                                     d.dqkv.data(), nullptr, nullptr, nullptr));
    std::vector<bf16> got = d.dqkv.Download();
    if (run == 0) {
      EXPECT_LT(RelFrobenius(ToFloat(got), ref_f), 5e-3) << "vs cuDNN deterministic";
      first = std::move(got);
    } else {
      EXPECT_TRUE(test::BitwiseEqual(got, first)) << "run " << run;
    }
  }
}

// B x H = 256 heads of T 1024, as gpt350m.
TEST_F(GpuFlashBackward, LargeBatchIsBitwiseReproducible) {
  CheckFlashReproducible({16, 1024, 16, 16, 64}, 850);
}

// GQA 4:1 at T 2048: the four query heads' tiles of each kv block finish in any order and the
// last sums their dK and dV, in query-head order whichever it is.
TEST_F(GpuFlashBackward, GroupedQueryLongSequenceIsBitwiseReproducible) {
  CheckFlashReproducible({2, 2048, 16, 4, 64}, 855);
}

// FP8 outputs (FlashBackwardFp8Out): every byte of both layouts, the amax and scale_inv bit for
// bit what the bf16 backward, RopeApply's inverse and the FP8 cast(+transpose) give (the path
// it replaces in an FP8 step, RopeBackwardFp8 being that pair's fusion); again on a re-run over
// poisoned outputs. cuDNN's backward refuses them.
void CheckFlashFp8(const SdpaShape& s, float scale, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H << " KV=" << s.KV
                                    << " scale " << scale);
  const Inputs in = RandomInputs(s, seed);
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(true, SdpaBackwardKernel::kFlash));
  DeviceRun d(s, in, true);
  ASSERT_STATUS_OK(runner.Forward(s, d.qkv.data(), d.out.data(), d.stats.data(), nullptr));
  ASSERT_STATUS_OK(RunBackward(runner, s, d, true));
  const test::DeviceBuffer<float> freqs = test::RopeFreqs(s.hd, 10000.0f);
  ASSERT_STATUS_OK(RopeApply(d.dqkv.data(), s.B, s.T, s.H, s.KV, s.hd, freqs.data(),
                             /*inverse=*/true, nullptr));
  DeviceBuffer<float2> sin_cos(size_t(s.T) * (s.hd / 2));
  ASSERT_STATUS_OK(RopeSinCosTable(sin_cos.data(), s.T, s.hd, freqs.data(), nullptr));
  const int64_t rows = int64_t{s.B} * s.T, cols = int64_t{s.H + 2 * s.KV} * s.hd;
  test::Fp8CastOut got(size_t(rows * cols), scale);
  FlashBackwardFp8Out f8;
  f8.out = got.q.data(), f8.out_t = got.qt.data(), f8.rope_sin_cos = sin_cos.data();
  f8.scale = got.scale(), f8.amax = got.amax(), f8.scale_inv = got.scale_inv();
  DeviceBuffer<bf16> dqkv(d.dqkv.size());  // takes dQ in bf16 on the way
  for (int run = 0; run < 2; ++run) {
    got.q.Poison();
    got.qt.Poison();
    ASSERT_STATUS_OK(runner.Backward(s, d.qkv.data(), d.out.data(), d.dout.data(), d.stats.data(),
                                     dqkv.data(), nullptr, nullptr, nullptr, &f8));
    test::ExpectSameAsCast(d.dqkv.data(), rows, cols, DType::kE5M2, scale, got,
                           "flash backward FP8, run " + std::to_string(run));
  }
  SdpaRunner cudnn;
  ASSERT_STATUS_OK(cudnn.Init(true, SdpaBackwardKernel::kCudnn));
  EXPECT_EQ(cudnn
                .Backward(s, d.qkv.data(), d.out.data(), d.dout.data(), d.stats.data(), dqkv.data(),
                          d.softmax_sum.data(), nullptr, nullptr, &f8)
                .code(),
            Code::kFailedPrecondition);
}

TEST_F(GpuFlashBackward, Fp8OutputsAreRopeThenCastBitForBit) {
  CheckFlashFp8({2, 256, 4, 4, 64}, 1.0f, 860);
  CheckFlashFp8({2, 256, 8, 2, 64}, 64.0f, 861);    // GQA; a scale that saturates
  CheckFlashFp8({4, 1024, 16, 16, 64}, 0.5f, 862);  // gpt350m's heads, T 1024
}

TEST_F(GpuFlashBackward, TakesOnlyWhatItCan) {
  SdpaRunner runner;
  ASSERT_STATUS_OK(runner.Init(true, SdpaBackwardKernel::kFlash));
  EXPECT_TRUE(runner.flash_backward({2, 256, 4, 4, 64}));
  EXPECT_FALSE(runner.flash_backward({2, 192, 4, 4, 64}));   // T % 128
  EXPECT_FALSE(runner.flash_backward({2, 256, 4, 4, 128}));  // head width
}

}  // namespace
}  // namespace forge::cuda
