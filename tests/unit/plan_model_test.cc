// forge plan's cost model (plan/plan_model.h) against the step times and memory measured on
// H200s (docs/performance.md; forge-bench and forge-dist-bench on the project's CUDA step), and
// its calibration files (plan/plan_calibration.h).
//
// Which measurements the built-in H200 calibration was fitted to, and which it never saw, is
// in the `fitted` column of each row (for tokens/s; the memory overhead was fitted to gpt350m
// B16 and llama3-1b B2 alone): fitted rows show the model's form reproduces them; the others
// are predictions. The bounds:
//   - tokens/s within 10%: the largest error of a row the rates were not fitted to when the
//     calibration was made (llama3-8b fsdp with selective recompute on 2 GPUs, the model 4.5%
//     fast; llama3-1b FP8 and full recompute 3.8% slow) plus the 3.5% by which machines of one
//     kind differ (docs/performance.md, run-to-run noise), rounded up. Fitted one-GPU rows come
//     within 0.5%. The 4-GPU rows come within 2.9% (ddp) and 5.4% (fsdp): their runs' own
//     one-GPU baseline was 213,178 tokens/s, 2.3% below the 218,172 the model is fitted to;
//     against it the model's efficiency is 96.0% for ddp (measured 96.06%) and 95.0% for fsdp
//     (92.70%).
//   - peak memory within 2%: memory_estimate.h counts every buffer class of the CUDA model and
//     fsdp's gathered blocks and root units (its own test holds it 0.04-0.33 GiB under the
//     one-GPU H200 peaks), the plan adds a 0.05 GiB overhead; the largest one-GPU error is
//     gpt350m FP8+head's -0.9% (FP8's fused SwiGLU output and LM-head casts the estimate leaves
//     out), rounded up with margin. The llama3-8b fsdp rows come within 1.4% (their comment
//     says why they sit under). The gpt350m fsdp 4-GPU peak was measured when fsdp kept a bf16
//     copy of its slots and a scratch slot for later micro-steps (0.23 GiB at that shape, both
//     gone since): -1.6% against the plan now.
//   - exposed communication within 1 ms of the measured at 4 GPUs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/config.h"
#include "plan/plan_calibration.h"
#include "plan/plan_model.h"
#include "worker/model/param_layout.h"
#include "worker/model/shard_layout.h"
#include "worker/parallel/mode_rules.h"
#include "worker/train/lookup_apart_rule.h"
#include "worker/train/memory_estimate.h"

namespace forge::plan {
namespace {

RunConfig Config(const std::string& name, int micro, int world, Precision p = Precision::kBf16,
                 Recompute r = Recompute::kNone, bool fp8_head = false) {
  auto cfg = LoadRunConfig(std::string(FORGE_SOURCE_DIR) + "/configs/" + name + ".yaml");
  EXPECT_TRUE(cfg.ok()) << cfg.status().ToString();
  RunConfig c = *cfg;
  c.batch.micro_batch = micro;
  c.batch.global_batch = micro * world;  // one micro-step, as forge-bench / forge-dist-bench
  c.precision.compute = p;
  c.precision.fp8.lm_head = fp8_head;
  c.train.activation_recompute = r;
  return c;
}

Topology OneHost(int gpus) {
  Topology t;
  t.gpus = gpus;
  t.gpus_per_node = gpus;
  t.link = Link::kNvlink;
  return t;
}

struct Row {
  std::string what;
  RunConfig cfg;
  Mode mode;
  int gpus;
  double tokens_per_gpu;  // measured (0: not measured)
  double gib;             // measured (0: not measured)
  bool fitted;            // the calibration was fitted to this row
};

std::vector<Row> Measured() {
  const auto bf16 = Precision::kBf16;
  const auto fp8 = Precision::kFp8;
  const auto none = Recompute::kNone;
  RunConfig ddp_bf16 = Config("gpt350m", 16, 4);
  ddp_bf16.parallel.grad_reduce = GradReduce::kBf16;
  RunConfig ddp_bf16_2 = Config("gpt350m", 16, 2);
  ddp_bf16_2.parallel.grad_reduce = GradReduce::kBf16;
  // Tokens/s: BF16 and llama3-1b from docs/performance.md's table of record (forge-bench, one
  // H200), gpt350m FP8 B16 from ../shared/notes/verified-figures.md (what FP8's speedup was
  // fitted to); the one-GPU peaks are forge-bench's on one H200 (the same runs as
  // memory_estimate_test's).
  return {
      {"gpt350m B16 bf16", Config("gpt350m", 16, 1), Mode::kDdp, 1, 218172, 19.62, true},
      {"gpt350m B24 bf16", Config("gpt350m", 24, 1), Mode::kDdp, 1, 221853, 25.94, true},
      {"gpt124m B16 bf16", Config("gpt124m", 16, 1), Mode::kDdp, 1, 593990, 7.83, true},
      {"llama3-1b B2 bf16", Config("llama3-1b", 2, 1), Mode::kDdp, 1, 59232, 42.29, true},
      {"llama3-1b B2 selective", Config("llama3-1b", 2, 1, bf16, Recompute::kSelective),
       Mode::kDdp, 1, 58393, 37.04, false},
      {"llama3-1b B2 full", Config("llama3-1b", 2, 1, bf16, Recompute::kFull), Mode::kDdp, 1,
       49254, 25.85, false},
      {"gpt350m B16 fp8", Config("gpt350m", 16, 1, fp8), Mode::kDdp, 1, 281405, 0, true},
      {"gpt350m B16 fp8+head", Config("gpt350m", 16, 1, fp8, none, true), Mode::kDdp, 1, 295750,
       19.87, true},
      {"gpt350m B24 fp8+head", Config("gpt350m", 24, 1, fp8, none, true), Mode::kDdp, 1, 302986,
       25.81, false},
      {"llama3-1b B2 fp8", Config("llama3-1b", 2, 1, fp8), Mode::kDdp, 1, 74570, 43.19, false},
      // 4x H200 of one host (forge-dist-bench, verified-figures.md): the collectives' bandwidth
      // and the exposed fractions were fitted to these runs' timings.
      {"gpt350m B16 ddp bf16-grad x4", ddp_bf16, Mode::kDdp, 4, 204772, 0, true},
      {"gpt350m B16 fsdp x4", Config("gpt350m", 16, 4), Mode::kFsdp, 4, 197721, 15.6, true},
      // 2x H200 of one host (forge-dist-bench, one call, symmetric NCCL memory; zero2 and ddp
      // FP8 from an earlier call on plain memory; docs/performance.md), never fitted.
      {"gpt350m B16 ddp x2", Config("gpt350m", 16, 2), Mode::kDdp, 2, 208754, 19.71, false},
      {"gpt350m B16 ddp bf16-grad x2", ddp_bf16_2, Mode::kDdp, 2, 210533, 20.38, false},
      {"gpt350m B16 zero1 x2", Config("gpt350m", 16, 2), Mode::kZero1, 2, 210691, 18.29, false},
      {"gpt350m B16 zero2 x2", Config("gpt350m", 16, 2), Mode::kZero2, 2, 209742, 18.23, false},
      {"gpt350m B16 fsdp x2", Config("gpt350m", 16, 2), Mode::kFsdp, 2, 210772, 16.72, false},
      {"gpt350m B16 ddp fp8 x2", Config("gpt350m", 16, 2, fp8), Mode::kDdp, 2, 261798, 19.52,
       false},
      {"gpt350m B16 fsdp fp8 x2", Config("gpt350m", 16, 2, fp8), Mode::kFsdp, 2, 266204, 16.16,
       false},
      // 2x H200 (forge-dist-bench llama3-1b fsdp, B 2 per GPU, --steps 6, beside one GPU in
      // one run: 97.44% of it; docs/performance.md, "Llama 3 1B on two GPUs"), never fitted.
      {"llama3-1b B2 fsdp x2", Config("llama3-1b", 2, 2), Mode::kFsdp, 2, 56571, 33.19, false},
      // 2x H200 (forge-dist-bench llama3-8b fsdp, B 1 per GPU; docs/performance.md), never
      // fitted: no recompute from one call with symmetric NCCL memory (--steps 4), the
      // recompute rows from earlier calls on plain memory (--steps 2-3). Measured while fsdp
      // gathered the untied table, which the estimate no longer holds (looked up in the slots):
      // it now predicts 1.0-1.4% under these peaks.
      {"llama3-8b B1 fsdp x2", Config("llama3-8b", 1, 2), Mode::kFsdp, 2, 10406, 105.61, false},
      {"llama3-8b B1 fsdp fp8 x2", Config("llama3-8b", 1, 2, fp8), Mode::kFsdp, 2, 13642,
       106.40, false},
      {"llama3-8b B1 fsdp selective x2", Config("llama3-8b", 1, 2, bf16, Recompute::kSelective),
       Mode::kFsdp, 2, 9814, 95.26, false},
      {"llama3-8b B1 fsdp full x2", Config("llama3-8b", 1, 2, bf16, Recompute::kFull),
       Mode::kFsdp, 2, 8434, 74.54, false},
      {"llama3-8b B1 fsdp fp8 full x2", Config("llama3-8b", 1, 2, fp8, Recompute::kFull),
       Mode::kFsdp, 2, 11105, 79.70, false},
  };
}

double Err(double predicted, double measured) { return (predicted - measured) / measured; }

TEST(PlanModel, PredictionsMatchTheMeasuredRunsWithinTheStatedBounds) {
  auto cal = BuiltinCalibration("h200");
  ASSERT_TRUE(cal.ok());
  std::printf("| run | GPUs | fitted | tokens/s per GPU measured | predicted | error | peak GiB "
              "measured | predicted | error |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : Measured()) {
    const ModePrediction p = PredictMode(r.cfg, r.mode, OneHost(r.gpus), *cal);
    const double e_t = Err(p.tokens_per_s_per_gpu, r.tokens_per_gpu);
    std::printf("| %s | %d | %s | %.0f | %.0f | %+.1f%% |", r.what.c_str(), r.gpus,
                r.fitted ? "yes" : "no", r.tokens_per_gpu, p.tokens_per_s_per_gpu, 100 * e_t);
    if (r.gib > 0)
      std::printf(" %.2f | %.2f | %+.1f%% |\n", r.gib, p.peak_gib, 100 * Err(p.peak_gib, r.gib));
    else
      std::printf(" | %.2f | |\n", p.peak_gib);
    EXPECT_LT(std::fabs(e_t), 0.10) << r.what << ": predicted " << p.tokens_per_s_per_gpu;
    if (r.gib > 0) EXPECT_LT(std::fabs(Err(p.peak_gib, r.gib)), 0.02) << r.what;
  }
}

TEST(PlanModel, ExposedCommunicationAtFourGpusMatchesTheMeasured) {
  auto cal = BuiltinCalibration("h200");
  ASSERT_TRUE(cal.ok());
  RunConfig ddp = Config("gpt350m", 16, 4);
  ddp.parallel.grad_reduce = GradReduce::kBf16;
  const ModePrediction d = PredictMode(ddp, Mode::kDdp, OneHost(4), *cal);
  // Measured: 3.82 ms of collectives alone, 3.16 exposed.
  EXPECT_NEAR(d.comm_ms, 3.82, 0.5);
  EXPECT_NEAR(d.exposed_ms, 3.16, 1.0);
  const ModePrediction f = PredictMode(Config("gpt350m", 16, 4), Mode::kFsdp, OneHost(4), *cal);
  // Measured: 12.0 ms alone (forge-dist-bench gathers the root units twice, the step once:
  // 0.4 ms more than the step has), 6.0 exposed.
  EXPECT_NEAR(f.comm_ms, 12.0, 1.0);
  EXPECT_NEAR(f.exposed_ms, 6.0, 1.0);
}

// Two nodes of one H200 each, emulated on one host (forge-dist-bench --emulate-nodes 2: NCCL's
// network transport, sockets over loopback, between the ranks; docs/performance.md, one call).
// The link is calibrated from one of the runs, ddp's: its collectives alone took 194.6 ms to
// all-reduce every unit's bf16 gradient once, which on a ring of two is S / busbw (S the
// gradient's bytes; the latencies, ~30 collectives of tens of us, are left out). The other two
// runs are predictions: fsdp moves the same bytes twice over (two bf16 gathers and an fp32
// reduce-scatter of the blocks, each (N-1)/N of its buffer), hsdp with groups of one GPU
// all-reduces the fp32 gradient (twice ddp's bytes). Measured: comm alone, step, of one GPU
// (against that run's own one-GPU baseline; the prediction against the plan's one GPU).
TEST(PlanModel, TwoEmulatedNodesOverSocketsMatchTheMeasured) {
  auto builtin = BuiltinCalibration("h200");
  ASSERT_TRUE(builtin.ok());
  PlanCalibration cal = *builtin;
  RunConfig ddp = Config("gpt350m", 16, 2);
  ddp.parallel.grad_reduce = GradReduce::kBf16;
  const double gradient_bytes = 2.0 * double(MakeParamLayout(ddp.model).total);
  const double busbw = gradient_bytes / 194.6e-3 / 1e9;  // GB/s
  cal.eth100 = {busbw, busbw, 0, 0, false};
  Topology two;
  two.gpus = 2;
  two.gpus_per_node = 1;
  two.link = Link::kEth100;
  Topology hsdp1 = two;
  hsdp1.shard_group = 1;
  struct {
    const char* what;
    RunConfig cfg;
    Mode mode;
    Topology topo;
    double comm_ms, step_ms, efficiency;
  } const runs[] = {
      {"ddp bf16-grad", ddp, Mode::kDdp, two, 194.6, 255.1, 0.3008},
      {"fsdp", Config("gpt350m", 16, 2), Mode::kFsdp, two, 400.6, 397.2, 0.1939},
      {"hsdp groups of 1", Config("gpt350m", 16, 2), Mode::kHsdp, hsdp1, 414.0, 416.5, 0.1851},
  };
  const ModePrediction one = PredictMode(Config("gpt350m", 16, 1), Mode::kDdp, OneHost(1), cal);
  std::printf("link %.2f GB/s\n| run | comm ms measured | predicted | step ms measured | "
              "predicted | of one GPU measured | predicted |\n|---|---|---|---|---|---|---|\n",
              busbw);
  for (const auto& r : runs) {
    const ModePrediction p = PredictMode(r.cfg, r.mode, r.topo, cal);
    const double eff = one.step_ms / p.step_ms;
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f | %.2f%% | %.2f%% |\n", r.what, r.comm_ms,
                p.comm_ms, r.step_ms, p.step_ms, 100 * r.efficiency, 100 * eff);
    // The bound the rows above are held to (10%); the efficiency within 2 points, which at
    // ~20-30% of one GPU is that bound again.
    EXPECT_LT(std::fabs(Err(p.comm_ms, r.comm_ms)), 0.10) << r.what;
    EXPECT_LT(std::fabs(Err(p.step_ms, r.step_ms)), 0.10) << r.what;
    EXPECT_NEAR(eff, r.efficiency, 0.02) << r.what;
  }
}

TEST(PlanModel, OneGpuIsTheSameStepInEveryMode) {
  auto cal = BuiltinCalibration("h200");
  ASSERT_TRUE(cal.ok());
  const RunConfig cfg = Config("gpt350m", 16, 1);
  const ModePrediction ddp = PredictMode(cfg, Mode::kDdp, OneHost(1), *cal);
  for (Mode m : AllModes()) {
    const ModePrediction p = PredictMode(cfg, m, OneHost(1), *cal);
    EXPECT_DOUBLE_EQ(p.step_ms, ddp.step_ms) << ModeName(m);
    EXPECT_EQ(p.comm_ms, 0) << ModeName(m);
  }
}

// The peak is the start-up estimate's parts plus the calibration's overhead (what `forge plan`
// prints by part): for the config's own mode each part is the estimate's, and in every mode the
// parts are whole and add up to the peak.
TEST(PlanModel, PeakMemoryIsTheEstimatesPartsPlusTheOverhead) {
  auto cal = BuiltinCalibration("h200");
  ASSERT_TRUE(cal.ok());
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const RunConfig fsdp_cfg = Config("llama3-8b", 1, 4);  // the preset's config runs fsdp
  ASSERT_EQ(fsdp_cfg.parallel.mode, ParallelMode::kFsdp);
  const MemoryEstimate e = EstimateTrainingMemory(fsdp_cfg, Backend::kCuda, 4);
  const ModePrediction f = PredictMode(fsdp_cfg, Mode::kFsdp, OneHost(4), *cal);
  EXPECT_DOUBLE_EQ(f.weights_gib, e.weights / gib);
  EXPECT_DOUBLE_EQ(f.gradients_gib, e.gradients / gib);
  EXPECT_DOUBLE_EQ(f.moments_gib, e.moments / gib);
  EXPECT_DOUBLE_EQ(f.activations_gib, e.activations / gib);
  EXPECT_DOUBLE_EQ(f.workspace_gib, e.workspace / gib);
  for (Mode m : AllModes()) {
    SCOPED_TRACE(ModeName(m));
    const ModePrediction p = PredictMode(fsdp_cfg, m, OneHost(4), *cal);
    for (double part :
         {p.weights_gib, p.gradients_gib, p.moments_gib, p.activations_gib, p.workspace_gib})
      EXPECT_GT(part, 0);
    EXPECT_EQ(p.overhead_gib, cal->overhead_gib);
    EXPECT_NEAR(p.peak_gib,
                p.weights_gib + p.gradients_gib + p.moments_gib + p.activations_gib +
                    p.workspace_gib + p.overhead_gib,
                1e-9);
  }
}

TEST(PlanModel, ShardingLowersMemoryAndSlowLinksFavourHsdp) {
  auto cal = BuiltinCalibration("h200");
  ASSERT_TRUE(cal.ok());
  // 256 GPUs, 4 micro-steps a step, one 100 Gb/s NIC per node.
  RunConfig cfg = Config("llama3-1b", 2, 256);
  cfg.batch.global_batch = 2 * 256 * 4;
  Topology t;
  t.gpus = 256;
  t.gpus_per_node = 8;
  t.link = Link::kEth100;
  const ModePrediction ddp = PredictMode(cfg, Mode::kDdp, t, *cal);
  const ModePrediction fsdp = PredictMode(cfg, Mode::kFsdp, t, *cal);
  const ModePrediction hsdp = PredictMode(cfg, Mode::kHsdp, t, *cal);
  EXPECT_EQ(fsdp.accum_steps, 4);
  EXPECT_EQ(hsdp.shard_group, 8);
  EXPECT_LT(fsdp.peak_gib, hsdp.peak_gib);
  EXPECT_LT(hsdp.peak_gib, ddp.peak_gib);
  // fsdp's gathers and reduce-scatters cross the network on every micro-step, each a ring of
  // 256 steps; hsdp's shard all-reduce crosses it once a step, over 32 replicas.
  EXPECT_GT(hsdp.tokens_per_s_per_gpu, 1.5 * fsdp.tokens_per_s_per_gpu);
  EXPECT_LT(hsdp.comm_ms, fsdp.comm_ms);
  // With every GPU on NVLink, hsdp's group of one node is fsdp's at 8 GPUs.
  Topology eight = OneHost(8);
  EXPECT_DOUBLE_EQ(PredictMode(cfg, Mode::kHsdp, eight, *cal).step_ms,
                   PredictMode(cfg, Mode::kFsdp, eight, *cal).step_ms);
  // Groups of one GPU: no gathers, but every unit's fp32 gradient is all-reduced over all the
  // replicas, which costs what ddp's fp32 all-reduces do (the same bytes, the same ring).
  Topology ones = t;
  ones.shard_group = 1;
  const ModePrediction hsdp1 = PredictMode(cfg, Mode::kHsdp, ones, *cal);
  EXPECT_EQ(hsdp1.shard_group, 1);
  EXPECT_EQ(hsdp1.gather_ms, 0);
  EXPECT_NEAR(hsdp1.comm_ms, ddp.comm_ms, 0.02 * ddp.comm_ms);
  EXPECT_GT(hsdp1.exposed_ms, 0);
  // A world that is not whole groups: not applicable, and said why.
  Topology odd = OneHost(12);
  odd.shard_group = 8;
  const ModePrediction bad = PredictMode(cfg, Mode::kHsdp, odd, *cal);
  EXPECT_EQ(bad.step_ms, 0);
  EXPECT_NE(bad.note.find("multiple of the shard group"), std::string::npos) << bad.note;
}

TEST(PlanModel, RecommendsTheFastestModeThatFits) {
  auto cal = BuiltinCalibration("h100");
  ASSERT_TRUE(cal.ok());
  // llama3-8b at micro-batch 1: ddp's full state (18 bytes a parameter, 8B parameters) cannot
  // fit in 80 GB; only the sharded modes can.
  RunConfig cfg = Config("llama3-8b", 1, 8);
  const Plan plan = MakePlan(cfg, OneHost(8), *cal);
  ASSERT_GE(plan.recommended, 0) << plan.reason;
  const ModePrediction& rec = plan.modes[plan.recommended];
  EXPECT_TRUE(rec.fits);
  EXPECT_NE(rec.mode, Mode::kDdp);
  EXPECT_FALSE(plan.modes[0].fits);  // ddp
  for (const ModePrediction& p : plan.modes)
    if (p.fits) EXPECT_LE(p.tokens_per_s, rec.tokens_per_s * 1.005) << ModeName(p.mode);
  EXPECT_NE(plan.reason.find("fastest that fits"), std::string::npos) << plan.reason;
  EXPECT_NE(plan.reason.find("ddp does not fit"), std::string::npos) << plan.reason;
  // One GPU: nothing fits; the reason says what to change.
  const Plan one = MakePlan(Config("llama3-8b", 1, 1), OneHost(1), *cal);
  EXPECT_EQ(one.recommended, -1);
  EXPECT_NE(one.reason.find("no mode fits"), std::string::npos) << one.reason;
}

TEST(PlanModel, GlobalBatchSetsTheMicroStepsAndGrowsWhenTooSmall) {
  auto cal = BuiltinCalibration("h200");
  ASSERT_TRUE(cal.ok());
  RunConfig cfg = Config("gpt350m", 16, 1);
  cfg.batch.global_batch = 64;
  EXPECT_EQ(PredictMode(cfg, Mode::kDdp, OneHost(2), *cal).accum_steps, 2);
  const ModePrediction p = PredictMode(cfg, Mode::kDdp, OneHost(8), *cal);
  EXPECT_EQ(p.accum_steps, 1);
  EXPECT_EQ(p.global_batch, 128);
  EXPECT_NE(p.note.find("global batch 128"), std::string::npos) << p.note;
  EXPECT_EQ(ScalingPoints(1024).size(), 11u);
  EXPECT_EQ(ScalingPoints(48), (std::vector<int>{1, 2, 4, 8, 16, 32, 48}));
}

// In FP8 where the run gathers E4M3 (fp8_gather_rule.h) fsdp's blocks move their linear
// weights a byte an element, their norm weights in bf16 in a second all-gather. Without the
// links' latencies the step's parameter all-gathers then move the bytes counted here from the
// layout (blocks at a byte, the root units, gathered once a step, at two); with them, at
// llama3-8b on 8 GPUs they take a little over half the time of bf16's; at gpt350m on 4 GPUs
// the two collectives' latencies (14 us each) keep them at about 0.7. Where the rule says no
// (current scaling, a width not a multiple of 64) they keep bf16's bytes. The memory agrees
// with the estimate's E4M3 gather buffers.
TEST(PlanModel, FsdpInFp8GathersE4m3WhereTheRunDoes) {
  auto cal = BuiltinCalibration("h200");
  ASSERT_TRUE(cal.ok());
  PlanCalibration no_latency = *cal;
  no_latency.nvlink.base_latency_us = no_latency.nvlink.hop_latency_us = 0;
  struct Case {
    RunConfig bf16;
    Mode mode;
    Topology topo;
    double lo, hi;  // the FP8 gathers' time over bf16's
  };
  Topology nodes;
  nodes.gpus = 64;
  nodes.gpus_per_node = 8;
  nodes.link = Link::kIb400;
  const std::vector<Case> cases = {
      {Config("llama3-8b", 1, 8), Mode::kFsdp, OneHost(8), 0.5, 0.6},
      {Config("gpt350m", 16, 4), Mode::kFsdp, OneHost(4), 0.5, 0.75},
      {Config("llama3-1b", 2, 64), Mode::kHsdp, nodes, 0.5, 0.65}};
  for (const Case& k : cases) {
    const std::string what = k.bf16.model.preset + " " + ModeName(k.mode);
    RunConfig fp8 = k.bf16;
    fp8.precision.compute = Precision::kFp8;
    fp8.precision.fp8.recipe = Fp8Recipe::kDelayed;
    RunConfig current = fp8;
    current.precision.fp8.recipe = Fp8Recipe::kCurrent;
    const ModePrediction b = PredictMode(k.bf16, k.mode, k.topo, *cal);
    const ModePrediction e = PredictMode(fp8, k.mode, k.topo, *cal);
    const ModePrediction c = PredictMode(current, k.mode, k.topo, *cal);
    ASSERT_GT(b.gather_ms, 0) << what;
    EXPECT_GT(e.gather_ms / b.gather_ms, k.lo) << what;
    EXPECT_LT(e.gather_ms / b.gather_ms, k.hi) << what;
    EXPECT_DOUBLE_EQ(c.gather_ms, b.gather_ms) << what;
    // What the gather saves is all the difference between the two FP8 recipes' collectives.
    EXPECT_NEAR(c.comm_ms - e.comm_ms, b.gather_ms - e.gather_ms, 1e-9) << what;
    EXPECT_LT(e.exposed_ms, c.exposed_ms) << what;
    // The bytes, inside one node (latencies zeroed): one micro-step a step, every block
    // gathered before its forward and its backward, the norm weights' side gather left out.
    if (k.topo.link == Link::kNvlink) {
      const ParamLayout layout = MakeParamLayout(k.bf16.model);
      const int n = k.topo.gpus;
      const double L = k.bf16.model.n_layer;
      // The table is not gathered where it is looked up in the slots (lookup_apart_rule.h).
      ParallelConfig fsdp = k.bf16.parallel;
      fsdp.mode = ParallelMode::kFsdp;
      const bool table =
          !FsdpLooksUpInSlots(k.bf16.model, ModeRulesFor(fsdp, n), n,
                              int64_t{k.bf16.batch.micro_batch} * k.bf16.model.seq_len);
      const double root = (table ? double(PaddedSize(layout.units.front().numel, n)) : 0.0) +
                          double(PaddedSize(layout.units.back().numel, n));
      const double block = double(PaddedSize(layout.units[1].numel, n));
      const double ratio = (2 * root + 2 * L * block) / (2 * root + 2 * L * 2 * block);
      EXPECT_NEAR(PredictMode(fp8, k.mode, k.topo, no_latency).gather_ms /
                      PredictMode(k.bf16, k.mode, k.topo, no_latency).gather_ms,
                  ratio, 1e-3)
          << what;
    }
    // The memory: the estimate's E4M3 buffers, the rest the same.
    RunConfig sharded = fp8, sharded_current = current;
    for (RunConfig* r : {&sharded, &sharded_current}) {
      r->parallel.mode = k.mode == Mode::kFsdp ? ParallelMode::kFsdp : ParallelMode::kHsdp;
      r->parallel.shard_group_size = k.mode == Mode::kHsdp ? e.shard_group : 0;
    }
    const double extra =
        EstimateTrainingMemory(sharded, Backend::kCuda, k.topo.gpus).total() -
        EstimateTrainingMemory(sharded_current, Backend::kCuda, k.topo.gpus).total();
    EXPECT_GT(extra, 0) << what;
    EXPECT_NEAR((e.peak_gib - c.peak_gib) * 1024.0 * 1024.0 * 1024.0, extra, 1.0) << what;
  }
  // A width the byte transpose cannot take: bf16's bytes in FP8 too.
  RunConfig odd = Config("gpt350m", 16, 4);
  odd.model.ffn = 2800;
  const ModePrediction odd_bf16 = PredictMode(odd, Mode::kFsdp, OneHost(4), *cal);
  odd.precision.compute = Precision::kFp8;
  EXPECT_DOUBLE_EQ(PredictMode(odd, Mode::kFsdp, OneHost(4), *cal).gather_ms, odd_bf16.gather_ms);
}

// forge-calibrate's fit of the compute rates to a timed step: llama3-1b B 2 on one H200
// (docs/performance.md, "llama3-1b at T 8192": the graph-replayed step 275.82 ms; its eager
// profile's GEMM phases 170.03 ms and attention phases 83.59 in the same call). The fitted
// calibration reproduces that step and that split, keeps the half-widths, and carries to the
// other configs of the table of record through them.
TEST(PlanModel, FitToAStepReproducesItAndCarriesToOtherWidths) {
  auto builtin = BuiltinCalibration("h200");
  ASSERT_TRUE(builtin.ok());
  PlanCalibration cal = *builtin;
  const RunConfig llama = Config("llama3-1b", 2, 1);
  const double share = 170.03 / (170.03 + 83.59);
  ASSERT_TRUE(FitComputeToStep(llama, 275.82, share, &cal).ok());
  const ModePrediction p = PredictMode(llama, Mode::kDdp, OneHost(1), cal);
  EXPECT_NEAR(p.step_ms, 275.82, 1e-6);
  EXPECT_NEAR(p.gemm_ms / (p.gemm_ms + p.attention_ms), share, 1e-9);
  EXPECT_EQ(cal.gemm_half_width, builtin->gemm_half_width);
  EXPECT_EQ(cal.attention_half_seq, builtin->attention_half_seq);
  // gpt350m and gpt124m B 16 (218,172 and 593,990 tokens/s, the table of record) through the
  // built-in half-widths: within 2%, the built-in rates' 0.5% (fitted to all of them) plus the
  // ~1.5% by which machines differ (the fitted step is another call's; docs/performance.md,
  // run-to-run noise). They come +1.7% and +0.9%.
  for (const auto& [name, measured] :
       std::vector<std::pair<std::string, double>>{{"gpt350m", 218172}, {"gpt124m", 593990}}) {
    const ModePrediction g = PredictMode(Config(name, 16, 1), Mode::kDdp, OneHost(1), cal);
    std::printf("fitted to llama3-1b: %s B16 %.0f tokens/s predicted, %.0f measured (%+.1f%%)\n",
                name.c_str(), g.tokens_per_s_per_gpu, measured,
                100 * (g.tokens_per_s_per_gpu / measured - 1));
    EXPECT_LT(std::fabs(g.tokens_per_s_per_gpu / measured - 1), 0.02) << name;
  }

  // What cannot be fitted is refused, the calibration untouched.
  PlanCalibration same = *builtin;
  EXPECT_FALSE(FitComputeToStep(Config("llama3-1b", 2, 1, Precision::kFp8), 219.7, share, &same)
                   .ok());
  EXPECT_FALSE(FitComputeToStep(Config("llama3-1b", 2, 1, Precision::kBf16, Recompute::kFull),
                                332.6, share, &same)
                   .ok());
  EXPECT_FALSE(FitComputeToStep(llama, 275.82, 1.0, &same).ok());
  EXPECT_FALSE(FitComputeToStep(llama, -1, share, &same).ok());
  const Status tiny = FitComputeToStep(llama, 5.0, share, &same);
  EXPECT_FALSE(tiny.ok());
  EXPECT_NE(tiny.message().find("elementwise"), std::string::npos) << tiny.message();
  EXPECT_EQ(same.gemm_tflops_max, builtin->gemm_tflops_max);
  EXPECT_EQ(same.attention_tflops_max, builtin->attention_tflops_max);
}

// forge-calibrate's fit of FP8's GEMM speedup to a timed FP8 step, on the BF16 rates: gpt350m B
// 16 in FP8 at 281,405 tokens/s (verified-figures.md, the row the built-in 1.56 was fitted to,
// with the BF16 rates of then) gives back about that speedup, and the step to the microsecond.
TEST(PlanModel, Fp8SpeedupFitReproducesTheFp8Step) {
  auto builtin = BuiltinCalibration("h200");
  ASSERT_TRUE(builtin.ok());
  PlanCalibration cal = *builtin;
  const RunConfig fp8 = Config("gpt350m", 16, 1, Precision::kFp8);
  const double step_ms = 16384.0 / 281405 * 1e3;
  ASSERT_TRUE(FitFp8SpeedupToStep(fp8, step_ms, &cal).ok());
  EXPECT_NEAR(PredictMode(fp8, Mode::kDdp, OneHost(1), cal).step_ms, step_ms, 1e-3);
  EXPECT_NEAR(cal.fp8_gemm_speedup, 1.56, 0.03);

  PlanCalibration same = *builtin;
  EXPECT_FALSE(FitFp8SpeedupToStep(Config("gpt350m", 16, 1), step_ms, &same).ok());
  EXPECT_FALSE(FitFp8SpeedupToStep(
                   Config("gpt350m", 16, 1, Precision::kFp8, Recompute::kFull), step_ms, &same)
                   .ok());
  const Status fast = FitFp8SpeedupToStep(fp8, 1.0, &same);
  EXPECT_FALSE(fast.ok());
  EXPECT_NE(fast.message().find("outside"), std::string::npos) << fast.message();
  EXPECT_EQ(same.fp8_gemm_speedup, builtin->fp8_gemm_speedup);
}

TEST(PlanCalibration, FileOverridesWhatItGivesAndRoundTrips) {
  auto base = BuiltinCalibration("h200");
  ASSERT_TRUE(base.ok());
  auto c = ParseCalibration(
      R"({"format": "forge-calibration/1", "device": "NVIDIA H200",
          "compute": {"gemm_tflops_max": 700},
          "links": {"ib400": {"allreduce_gb_s": 30, "per_node": true}},
          "measured": {"anything": [1, 2]}})",
      "cal.json", *base);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->gemm_tflops_max, 700);
  EXPECT_EQ(c->attention_tflops_max, base->attention_tflops_max);
  EXPECT_EQ(c->ib400.allreduce_gb_s, 30);
  EXPECT_TRUE(c->ib400.per_node);
  EXPECT_EQ(c->ib400.reduce_scatter_gb_s, base->ib400.reduce_scatter_gb_s);
  EXPECT_EQ(c->source, "cal.json");
  auto again = ParseCalibration(CalibrationToJson(*c), "again.json", *BuiltinCalibration("h100"));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(CalibrationToJson(*again), CalibrationToJson(*c));
}

TEST(PlanCalibration, BadFilesNameTheFileAndKey) {
  auto base = BuiltinCalibration("h200");
  ASSERT_TRUE(base.ok());
  const std::pair<const char*, const char*> cases[] = {
      {R"({"compute": {"gemm_tflops": 700}})", "cal.json: compute.gemm_tflops: unknown key"},
      {R"({"links": {"ib400": {"allreduce_gb_s": -1}}})",
       "cal.json: links.ib400.allreduce_gb_s: expected a number > 0"},
      {R"({"overlap": {"sharded_exposed_fraction": 1.5}})",
       "cal.json: overlap.sharded_exposed_fraction: expected a fraction"},
      {R"({"links": {"ib800": {}}})", "cal.json: links.ib800: unknown key"},
      {R"({"format": "other"})", "cal.json: format: expected"},
      {R"([1, 2])", "cal.json: expected a JSON object"},
      {R"({"compute": )", "cal.json: not valid JSON"},
  };
  for (const auto& [text, want] : cases) {
    auto c = ParseCalibration(text, "cal.json", *base);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(want), std::string::npos) << c.status().message();
  }
  EXPECT_FALSE(BuiltinCalibration("a100").ok());
  EXPECT_FALSE(LoadCalibration("/nonexistent/cal.json", *base).ok());
}

}  // namespace
}  // namespace forge::plan
