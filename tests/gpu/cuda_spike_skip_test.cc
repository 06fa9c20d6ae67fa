// Loss-spike skipping on the CUDA backend (StepHyper::skip_above, decided on the device before
// the deferred AdamW update is applied; kernels/cuda/spike_gate.h):
//   - the backend's comparison is the host's, to the last bit: a limit equal to the step's
//     loss (or norm) lets it through, the next float below skips it;
//   - a skipped step leaves weights and moments bitwise as they were, is counted, and the run
//     then goes on bitwise as a run that never had the step (one GPU; ddp and zero1 on 2 GPUs,
//     where the limits apply to the global loss and norm);
//   - the gate changes no bits of a step it lets through (gated vs train.spike_sigma 0);
//   - the CPU backend, the reference, skips the same way;
//   - through the trainer (train.spike_sigma on), a data window the trained model gets badly
//     wrong is skipped at exactly the step the CPU backend's run skips, and the weights after
//     it equal those before it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../common/tiny_fixtures.h"
#include "gpu_test_util.h"
#include "nccl_test_util.h"
#include "tiny_gpu_config.h"
#include "worker/train/backend.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

constexpr float kInf = std::numeric_limits<float>::infinity();

bool Same(const UnitBuffers& a, const UnitBuffers& b) {
  if (a.size() != b.size()) return false;
  for (size_t u = 0; u < a.size(); ++u)
    if (a[u].size() != b[u].size() ||
        std::memcmp(a[u].data(), b[u].data(), a[u].size() * sizeof(float)) != 0)
      return false;
  return true;
}

struct State {
  UnitBuffers w, m, v;
  bool operator==(const State& o) const { return Same(w, o.w) && Same(m, o.m) && Same(v, o.v); }
};

// One TrainStep: which data it reads and which optimizer step it is (lr, bias correction).
struct Step {
  int data;
  int64_t number;
  SpikeLimits limits;
};

struct Outcome {
  std::vector<StepStats> stats;
  std::vector<State> after;  // state after each step
};

using Tokens = std::vector<int32_t>;

// batches[d][k]: micro-batch k (rank k's slice under data parallelism) of data index d.
std::vector<std::vector<std::pair<Tokens, Tokens>>> Batches(const RunConfig& c, int count,
                                                            int per) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, c.model.vocab - 1);
  const size_t N = size_t(c.batch.micro_batch) * c.model.seq_len;
  std::vector<std::vector<std::pair<Tokens, Tokens>>> out(count);
  for (auto& d : out) {
    d.resize(per);
    for (auto& [in, tg] : d) {
      in.resize(N);
      tg.resize(N);
      for (auto& x : in) x = tok(rng);
      for (auto& x : tg) x = tok(rng);
    }
  }
  return out;
}

float Lr(int64_t step) { return 2e-3f * float(std::min<int64_t>(step, 3)) / 3.0f; }

void RunOn(TrainBackend* b, const std::vector<std::vector<std::pair<Tokens, Tokens>>>& batches,
           int slice, const std::vector<Step>& plan, Outcome* out) {
  for (const Step& s : plan) {
    const auto& [in, tg] = batches[s.data][slice];
    StepHyper h(Lr(s.number), s.number);
    h.skip_above = s.limits;
    StepStats st;
    const Status ok = b->TrainStep({{in.data(), tg.data()}}, h, true, &st);
    ASSERT_TRUE(ok.ok()) << ok.ToString();
    out->stats.push_back(st);
    State after;
    ASSERT_TRUE(b->GetParams(&after.w).ok());
    ASSERT_TRUE(b->GetMoments(&after.m, &after.v).ok());
    out->after.push_back(std::move(after));
  }
}

// The plan on `world` GPUs (rank 0's outcome; every rank must end bitwise alike), or on the
// CPU backend with world 0.
Outcome RunPlan(const RunConfig& c, int world, const std::vector<Step>& plan) {
  const auto batches = Batches(c, 8, std::max(world, 1));
  Outcome out;
  if (world == 0) {
    auto b = MakeCpuBackend(c);
    EXPECT_TRUE(b->SkipsAboveLimits());
    RunOn(b.get(), batches, 0, plan, &out);
    return out;
  }
  if (world == 1) {
    auto b = MakeCudaTrainBackend(c, CudaBackendOptions{});
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return out;
    EXPECT_EQ((*b)->SkipsAboveLimits(), c.train.spike_sigma > 0);
    RunOn(b->get(), batches, 0, plan, &out);
    return out;
  }
  std::vector<Outcome> ranks(world);
  Errors e;
  NcclCommOptions o;
  o.timeout_s = 120;
  RunRanksOnAnyGpus(world, o, &e, [&](int r, NcclComm* comm) {
    auto b = MakeCudaTrainBackend(c, CudaBackendOptions{}, comm);
    if (!b.ok()) return e.Add(r, b.status().ToString());
    RunOn(b->get(), batches, r, plan, &ranks[r]);
  });
  for (const std::string& m : e.list) ADD_FAILURE() << m;
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(ranks[r].after.size(), ranks[0].after.size());
    for (size_t i = 0; i < std::min(ranks[r].after.size(), ranks[0].after.size()); ++i)
      EXPECT_TRUE(ranks[r].after[i] == ranks[0].after[i]) << "rank " << r << " step " << i;
  }
  return std::move(ranks[0]);
}

std::vector<Step> Plain(std::vector<int> data, std::vector<SpikeLimits> limits = {}) {
  std::vector<Step> plan;
  for (size_t i = 0; i < data.size(); ++i)
    plan.push_back({data[i], data[i], i < limits.size() ? limits[i] : SpikeLimits{}});
  return plan;
}

// Steps 1-5 plain; then step 4 with limits exactly at its loss / norm (through) and one float
// below (skipped); the skipping run's step 5 against a run of steps 1, 2, 3, 5.
void CheckSkips(const RunConfig& c, int world) {
  const Outcome ref = RunPlan(c, world, Plain({1, 2, 3, 4, 5}));
  ASSERT_EQ(ref.stats.size(), 5u);
  const float loss4 = ref.stats[3].loss, norm4 = ref.stats[3].grad_norm;
  ASSERT_TRUE(std::isfinite(loss4) && std::isfinite(norm4));
  EXPECT_EQ(ref.stats[4].skipped_steps, 0);
  const SpikeLimits none;
  const SpikeLimits at_loss{loss4, kInf}, at_norm{kInf, norm4};
  const SpikeLimits below_loss{std::nextafter(loss4, -kInf), kInf};
  const SpikeLimits below_norm{kInf, std::nextafter(norm4, -kInf)};

  for (const SpikeLimits& through : {at_loss, at_norm}) {
    const Outcome r = RunPlan(c, world, Plain({1, 2, 3, 4}, {none, none, none, through}));
    ASSERT_EQ(r.after.size(), 4u);
    EXPECT_EQ(r.stats[3].skipped_steps, 0);
    EXPECT_TRUE(r.after[3] == ref.after[3]) << "a step at the limit was changed";
  }
  const Outcome without =
      RunPlan(c, world, {{1, 1, none}, {2, 2, none}, {3, 3, none}, {5, 5, none}});
  ASSERT_EQ(without.after.size(), 4u);
  for (const SpikeLimits& above : {below_loss, below_norm}) {
    const Outcome r = RunPlan(c, world, Plain({1, 2, 3, 4, 5}, {none, none, none, above, none}));
    ASSERT_EQ(r.after.size(), 5u);
    EXPECT_EQ(r.stats[2].skipped_steps, 0);
    EXPECT_EQ(r.stats[3].skipped_steps, 1);
    EXPECT_EQ(r.stats[4].skipped_steps, 1);
    EXPECT_EQ(r.stats[3].loss, loss4) << "the skipped step still reports its loss";
    EXPECT_EQ(r.stats[3].grad_norm, norm4);
    EXPECT_TRUE(r.after[3] == ref.after[2]) << "the skipped step changed weights or moments";
    EXPECT_TRUE(r.after[4] == without.after[3]) << "the run after the skip is not the run "
                                                   "without the step";
  }
}

RunConfig GpuConfig() {
  RunConfig c = test::TinyGpuConfig("gpu-spike-test");
  c.train.spike_sigma = 6.0;
  return c;
}

TEST(CudaSpikeSkip, OneGpuSkipsExactlyAboveTheLimits) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckSkips(GpuConfig(), 1);
}

TEST(CudaSpikeSkip, TheGateChangesNoBitsOfAStepItLetsThrough) {
  FORGE_SKIP_WITHOUT_GPU();
  RunConfig off = GpuConfig();
  off.train.spike_sigma = 0;  // no gate at all
  const Outcome gated = RunPlan(GpuConfig(), 1, Plain({1, 2, 3, 4}));
  const Outcome plain = RunPlan(off, 1, Plain({1, 2, 3, 4}));
  ASSERT_EQ(gated.after.size(), 4u);
  ASSERT_EQ(plain.after.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(gated.stats[i].loss, plain.stats[i].loss) << i;
    EXPECT_TRUE(gated.after[i] == plain.after[i]) << "step " << i + 1;
  }
}

TEST(CudaSpikeSkip, DataParallelSkipsOnTheGlobalLossAndNorm) {
  FORGE_SKIP_WITHOUT_GPU();
  for (const ParallelMode mode : {ParallelMode::kDdp, ParallelMode::kZero1}) {
    SCOPED_TRACE(ParallelModeName(mode));
    RunConfig c = GpuConfig();
    c.parallel.mode = mode;
    c.batch.global_batch = 2 * c.batch.micro_batch;
    CheckSkips(c, 2);
    RunConfig off = c;
    off.train.spike_sigma = 0;
    const Outcome gated = RunPlan(c, 2, Plain({1, 2, 3}));
    const Outcome plain = RunPlan(off, 2, Plain({1, 2, 3}));
    ASSERT_EQ(gated.after.size(), 3u);
    ASSERT_EQ(plain.after.size(), 3u);
    EXPECT_TRUE(gated.after[2] == plain.after[2]) << "the gate changed a step it let through";
  }
}

TEST(CudaSpikeSkip, CpuReferenceSkipsAlike) {
  RunConfig c = GpuConfig();
  c.precision.compute = Precision::kFp32;
  CheckSkips(c, 0);
}

// Through the trainer: a stream of sequences counting up (mod 64) with a window counting down
// at step 20, which the trained model gets badly wrong (as in the CPU trainer's spike test).
// On the CPU backend step 19's loss is 0.45 and step 20's 7.6, against a limit of 1.6.
BatchProvider CountingData(const RunConfig& c, int64_t bad_from, int64_t bad_to) {
  return test::CountingData(c, 64, [=](int64_t q) { return q >= bad_from && q < bad_to; });
}

RunConfig TrainerConfig() {
  RunConfig c = test::TinyGpuConfig("gpu-spike-trainer-test");
  c.optimizer.lr = 1e-2f;
  c.schedule.total_steps = 24;
  c.schedule.warmup_steps = 2;
  c.eval.every_steps = 0;
  c.eval.batches = 1;
  c.train.log_every = 1;
  c.train.spike_sigma = 6.0;
  c.train.spike_window = 8;
  c.train.spike_max_in_row = 3;
  return c;
}

// A fresh, empty directory for a run's checkpoints.
std::string TempDir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() /
                     ("forge_gpu_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::set<int64_t> SpikeSteps(const test::RunOutcome& run) {
  std::set<int64_t> s;
  for (const StepRecord& r : run.records)
    if (r.loss_spike) s.insert(r.step);
  return s;
}

TEST(CudaSpikeSkip, TrainerSkipsTheStepTheCpuRunSkips) {
  FORGE_SKIP_WITHOUT_GPU();
  RunConfig c = TrainerConfig();
  const int64_t per_step = c.batch.global_batch;
  const BatchProvider data = CountingData(c, per_step * 19, per_step * 20);  // step 20 only

  RunConfig cpu_cfg = c;
  cpu_cfg.train.backend = Backend::kCpu;
  cpu_cfg.precision.compute = Precision::kFp32;
  cpu_cfg.checkpoint.dir = TempDir("cuda_spike_cpu");
  auto cpu = MakeCpuBackend(cpu_cfg);
  const test::RunOutcome cpu_run = test::TrainKeepingState(cpu_cfg, cpu.get(), data);
  ASSERT_EQ(SpikeSteps(cpu_run), std::set<int64_t>{20}) << "the CPU reference run";

  auto run_cuda = [&](int64_t max_steps) {
    RunConfig g = c;
    g.train.backend = Backend::kCuda;
    g.checkpoint.dir = TempDir("cuda_spike_" + std::to_string(max_steps));
    auto b = MakeCudaTrainBackend(g, CudaBackendOptions{});
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    TrainOptions o;
    o.max_steps = max_steps;
    return b.ok() ? test::TrainKeepingState(g, b->get(), data, o) : test::RunOutcome{};
  };
  const test::RunOutcome full = run_cuda(-1);
  EXPECT_EQ(full.result.steps, 24);
  EXPECT_EQ(SpikeSteps(full), SpikeSteps(cpu_run));
  EXPECT_EQ(full.result.loss_spikes, 1);
  EXPECT_EQ(full.result.skipped_steps, 1);
  EXPECT_EQ(full.result.spike_rollbacks, 0);

  // Stopping right after the skipped step equals stopping right before it.
  const test::RunOutcome to19 = run_cuda(19), to20 = run_cuda(20);
  EXPECT_EQ(to20.result.loss_spikes, 1);
  EXPECT_TRUE(Same(to19.w, to20.w)) << "the skipped step changed the weights";
  EXPECT_TRUE(Same(to19.m, to20.m) && Same(to19.v, to20.v)) << "or the moments";
}

}  // namespace
}  // namespace forge
