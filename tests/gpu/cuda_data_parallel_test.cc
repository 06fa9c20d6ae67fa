// The CUDA backend data-parallel over NCCL (ddp, zero1, zero2, fsdp, hsdp) on 2 and 4 GPUs of
// one machine, one thread per rank: K steps of the tiny BF16 model with a global batch of W
// micro-batches per accumulation step against one GPU training the same global batch. Where
// fewer GPUs are visible than the case has ranks, the ranks share them over ThreadNcclComm
// (RunRanksOnAnyGpus): the same checks of the modes' logic, with host collectives for NCCL.
//
// What must hold:
//   - every rank ends every step with the same loss, grad norm and weights, bit for bit;
//   - the trajectory equals the single-GPU one within BF16-run tolerances: the gradient sums
//     differ only in fp32 summation order (ranks vs micro-steps), so losses agree to 1e-3
//     relative and the final fp32 master weights / moments per unit to 1e-3 / 2e-2 relative
//     Frobenius error;
//   - with parallel.grad_reduce bf16 (ddp, zero1 on 2 GPUs) all of this too, within the looser
//     tolerances of TolerancesFor() (ranks still bitwise equal to each other);
//   - in FP8 (ddp, zero1, fsdp on 2 GPUs) likewise against one GPU in FP8, and every rank
//     ends with the same FP8 scaling state (amaxes max-reduced over the ranks);
//   - fsdp in FP8, whose blocks' weights are gathered as E4M3 after the delayed recipe's
//     first step, is bitwise zero2 (one micro-step per rank) and its own bf16 gather
//     (accumulation, recompute), and did gather E4M3;
//   - hsdp on 4 GPUs as 2 shard groups x 2 (and the degenerate 4 x 1 = ddp, 1 x 4 = fsdp): the
//     same, against one GPU on the same global batch; "every rank bitwise equal" covers the
//     replicas (ranks 2, 3 hold the shards of ranks 0, 1). Its sums differ from one GPU's
//     only in fp32 order as well (reduce-scatter in the shard group, all-reduce of the shards
//     across groups), so the fp32 tolerances apply. Ranks read the micro-steps of their data
//     position (worker/parallel/hybrid_groups.h), as forge train's do;
//   - the same run twice gives bitwise the same weights (NCCL's reduction order is fixed for
//     a given world and topology);
//   - a run restarted from GetParams/GetMoments (and rank 0's GetExtraState, FP8 scaling) on
//     fresh backends (what a checkpoint resume does; sharded modes gather the slots) continues
//     bitwise like the uninterrupted one.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_util.h"
#include "nccl_test_util.h"
#include "tiny_gpu_config.h"
#include "worker/model/init.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/hybrid_groups.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/lookup_apart_rule.h"

namespace forge {
namespace {

using test::RelFrobenius;

constexpr int kSteps = 6;

RunConfig Config(ParallelMode mode, int world, int accum, GradReduce grad_reduce,
                 Precision precision, bool fp8_lm_head = false, bool llama = false,
                 int shard_group = 0) {
  RunConfig c = test::TinyGpuConfig("gpu-data-parallel-test");
  if (llama) {
    test::SetLlamaKnobs(&c.model, /*n_kv_head=*/2);  // GQA 2:1
    // A vocabulary (padded 1152) over the ranks' tokens (4 x 256 at most): fsdp looks the untied
    // embedding up in the slots (lookup_apart_rule.h), as at llama3-8b.
    c.model.vocab = 1100;
  }
  c.precision.compute = precision;
  c.precision.fp8.lm_head = fp8_lm_head;
  c.batch.global_batch = c.batch.micro_batch * world * accum;
  c.parallel.mode = mode;
  c.parallel.grad_reduce = grad_reduce;
  c.parallel.shard_group_size = mode == ParallelMode::kHsdp ? shard_group : 0;
  return c;
}

// Against the one-GPU run (relative; losses and norms per step, the rest as RelFrobenius of
// each unit after kSteps steps).
struct Tolerances {
  double loss, norm, params, m, v;
};

Tolerances TolerancesFor(GradReduce g, Precision p) {
  // fp32: the sums differ only in summation order (see the file comment).
  if (g == GradReduce::kFp32 && p != Precision::kFp8) return {1e-3, 1e-2, 1e-3, 2e-2, 2e-2};
  // FP8 (fp32 sums): every cast sees the scale the one GPU uses (the first step measures each
  // micro-batch's own tensor, later steps share the max amax over ranks, which is the one
  // GPU's amax over its micro-steps), so the gradients differ by the summation order only;
  // but an FP8 rounding that flips on such a difference moves an element by 2^-3 (E4M3) or
  // 2^-2 (E5M2) of its value, so the bf16 bounds below apply.
  // bf16: each rank's gradient is rounded to bf16 (relative error <= 2^-8 ~ 4e-3 per element)
  // and NCCL rounds the sum once more at W = 2, so the summed gradient is off by a few 1e-3
  // relative, more where the ranks' halves cancel. AdamW normalises each element's step (~lr
  // whatever |g|), so an element whose small summed gradient flips sign under the rounding moves
  // by up to 2 lr: those dominate the difference in weights and moments. Measured on the CPU
  // reference model (same init, batches and AdamW; each rank's gradient and their sum rounded to
  // bf16 as NCCL does), bf16 against fp32 sums after these 6 steps: per-step gradients <= 1.1e-2,
  // weights <= 2.2e-3, m <= 8.3e-3, v <= 7.9e-3, losses <= 5e-5, norms <= 3e-4 (ddp accum 1 and
  // zero1 accum 2 alike). The bounds are the fp32 ones plus that, with ~3x margin; a wrong or
  // raced comm buffer moves weights by O(lr * steps / init_std) ~ 0.5.
  return {2e-3, 2e-2, 1e-2, 5e-2, 5e-2};
}

struct Tokens {
  std::vector<int32_t> inputs, targets;
};

// batches[step][j]: global micro-step j of a step: uniform random inputs, each target a fixed
// function of its input (a bigram table the model learns within a few steps).
std::vector<std::vector<Tokens>> MakeBatches(const RunConfig& c, int per_step) {
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, c.model.vocab - 1);
  const size_t n = size_t(c.batch.micro_batch) * c.model.seq_len;
  std::vector<std::vector<Tokens>> out(kSteps, std::vector<Tokens>(per_step));
  for (auto& step : out) {
    for (Tokens& t : step) {
      t.inputs.resize(n);
      t.targets.resize(n);
      for (size_t i = 0; i < n; ++i) t.inputs[i] = tok(rng);
      for (size_t i = 0; i < n; ++i) t.targets[i] = (t.inputs[i] * 31 + 7) % c.model.vocab;
    }
  }
  return out;
}

struct Trajectory {
  std::vector<float> losses, norms;
  UnitBuffers params, m, v;
  std::map<std::string, std::string> extra;  // the backend's FP8 scaling state
  int64_t fp8_block_gathers = 0;              // CudaTrainBackend::fp8_block_gathers
};

StepHyper Hyper(int step) { return StepHyper{2e-3f * (1.0f - 0.05f * step), step + 1}; }

// One GPU, every global micro-step of a step in order (reversed: last first, the same
// gradients summed in another fp32 order).
Trajectory RunSingle(const RunConfig& c, const std::vector<std::vector<Tokens>>& batches,
                     bool reversed = false) {
  Trajectory t;
  cudaSetDevice(0);
  RunConfig one = c;
  one.parallel.mode = ParallelMode::kDdp;
  one.parallel.shard_group_size = 0;
  auto made = MakeCudaTrainBackend(one, CudaBackendOptions{});
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  if (!made.ok()) return t;
  auto& b = *made;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<MicroBatch> micro;
    for (const Tokens& k : batches[s]) micro.push_back({k.inputs.data(), k.targets.data()});
    if (reversed) std::reverse(micro.begin(), micro.end());
    StepStats st;
    const Status ok = b->TrainStep(micro, Hyper(s), true, &st);
    EXPECT_TRUE(ok.ok()) << ok.ToString();
    t.losses.push_back(st.loss);
    t.norms.push_back(st.grad_norm);
  }
  EXPECT_TRUE(b->GetParams(&t.params).ok());
  EXPECT_TRUE(b->GetMoments(&t.m, &t.v).ok());
  return t;
}

// Rank r runs global micro-steps k*W + p (the sampler's slice; p = r but for hsdp, whose data
// position is DataRank) for steps [first, last); with
// `resume_from` it starts from those weights and moments instead of the init.
void RankSteps(const RunConfig& c, const std::vector<std::vector<Tokens>>& batches, int r,
               NcclComm* comm, int first, int last, const Trajectory* resume_from,
               const CudaBackendOptions& options, Trajectory* out, Errors* e) {
  auto made = MakeCudaTrainBackend(c, options, comm);
  if (!made.ok()) return e->Add(r, "backend: " + made.status().ToString());
  auto& b = *made;
  if (resume_from != nullptr) {  // rank 0's state on every rank, as a checkpoint gives it
    e->Ok(r, b->SetParams(resume_from->params), "SetParams");
    e->Ok(r, b->SetMoments(resume_from->m, resume_from->v), "SetMoments");
    e->Ok(r, b->SetExtraState(resume_from->extra), "SetExtraState");
  }
  const int W = comm->world();
  const int accum = c.batch.global_batch / (c.batch.micro_batch * W);
  const int p = DataRank(c.parallel, r, W);
  for (int s = first; s < last; ++s) {
    std::vector<MicroBatch> micro;
    for (int k = 0; k < accum; ++k) {
      const Tokens& t = batches[s][k * W + p];
      micro.push_back({t.inputs.data(), t.targets.data()});
    }
    StepStats st;
    e->Ok(r, b->TrainStep(micro, Hyper(s), true, &st), "TrainStep " + std::to_string(s));
    out->losses.push_back(st.loss);
    out->norms.push_back(st.grad_norm);
  }
  e->Ok(r, b->GetParams(&out->params), "GetParams");
  e->Ok(r, b->GetMoments(&out->m, &out->v), "GetMoments");
  e->Ok(r, b->GetExtraState(&out->extra), "GetExtraState");
  out->fp8_block_gathers = b->fp8_block_gathers();
}

std::vector<Trajectory> RunParallel(const RunConfig& c, int world,
                                    const std::vector<std::vector<Tokens>>& batches, int first,
                                    int last, const Trajectory* resume_from,
                                    const CudaBackendOptions& options = {}) {
  Errors e;
  std::vector<Trajectory> out(world);
  NcclCommOptions o;
  o.timeout_s = 120;
  RunRanksOnAnyGpus(world, o, &e, [&](int r, NcclComm* comm) {
    RankSteps(c, batches, r, comm, first, last, resume_from, options, &out[r], &e);
  });
  for (const std::string& m : e.list) ADD_FAILURE() << m;
  return out;
}

void ExpectBitwiseEqual(const Trajectory& a, const Trajectory& b, const std::string& what) {
  EXPECT_EQ(a.losses, b.losses) << what;
  EXPECT_EQ(a.norms, b.norms) << what;
  EXPECT_TRUE(a.params == b.params) << what << ": weights differ";
  EXPECT_TRUE(a.m == b.m && a.v == b.v) << what << ": moments differ";
}

struct Case {
  int world;
  ParallelMode mode;
  int accum;  // micro-steps per rank per step
  GradReduce grad_reduce = GradReduce::kFp32;
  Precision precision = Precision::kBf16;
  bool fp8_lm_head = false;  // precision.fp8.lm_head: its scaling slots are shared too
  bool llama = false;        // the Llama architecture knobs (Config)
  int shard_group = 0;       // hsdp: parallel.shard_group_size
};

class CudaDataParallelTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaDataParallelTest, MatchesOneGpuAndIsDeterministic) {
  FORGE_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  RunConfig c = Config(k.mode, k.world, k.accum, k.grad_reduce, k.precision, k.fp8_lm_head,
                       k.llama, k.shard_group);
  const Tolerances tol = TolerancesFor(k.grad_reduce, k.precision);
  const auto batches = MakeBatches(c, k.world * k.accum);
  const ModeRules rules = ModeRulesFor(c.parallel, k.world);
  if (k.llama && rules.shard_params && rules.shard_world > 1) {  // fsdp, hsdp in groups of 2+
    EXPECT_TRUE(FsdpLooksUpInSlots(c.model, rules, rules.shard_world,
                                   int64_t{c.batch.micro_batch} * c.model.seq_len))
        << "the case is meant to look the untied embedding up in the slots";
  }

  const Trajectory single = RunSingle(c, batches);
  const std::vector<Trajectory> ranks = RunParallel(c, k.world, batches, 0, kSteps, nullptr);
  ASSERT_EQ(single.losses.size(), size_t(kSteps));
  for (int r = 0; r < k.world; ++r) {
    ASSERT_EQ(ranks[r].losses.size(), size_t(kSteps)) << "rank " << r;
    if (r > 0) {
      ExpectBitwiseEqual(ranks[r], ranks[0], "rank " + std::to_string(r) + " vs 0");
      EXPECT_TRUE(ranks[r].extra == ranks[0].extra) << "rank " << r << ": FP8 scaling differs";
    }
  }
  const Trajectory& dp = ranks[0];
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(dp.losses[s], single.losses[s], tol.loss * std::fabs(single.losses[s]))
        << "step " << s;
    EXPECT_NEAR(dp.norms[s], single.norms[s], tol.norm * std::fabs(single.norms[s]))
        << "step " << s;
  }
  EXPECT_LT(dp.losses.back(), dp.losses.front()) << "the model did not learn";
  const ParamLayout layout = MakeParamLayout(c.model);
  ASSERT_EQ(dp.params.size(), layout.units.size());
  auto errors = [&](const Trajectory& t, size_t u) {
    return std::array<double, 3>{RelFrobenius(t.params[u], single.params[u]),
                                 RelFrobenius(t.m[u], single.m[u]),
                                 RelFrobenius(t.v[u], single.v[u])};
  };
  // The yardstick of summation order: the one GPU against itself with each step's micro-batches
  // reversed, the same gradients summed in another fp32 order, as the ranks sum them in yet
  // another. In FP8 a cast whose input sits next to a rounding boundary can round the other
  // way under such a 1e-7 change and move that element by 2^-3 (E4M3) or 2^-2 (E5M2) of
  // itself, and the layers below carry it on, so an FP8 trajectory may spread under a mere
  // reordering by more than the fixed bounds. The data-parallel run is one more draw of that
  // spread: it must stay within 3x of the reversed run's or within the fixed bound, whichever
  // is larger. A wrong or raced comm buffer moves weights by O(lr * steps / init_std) ~ 0.5,
  // and the printed spread shows the margin. Measured on two H200s: ddp accum 2 in FP8 (BF16
  // LM head) moves the worst unit's first moment by 0.052 against one GPU, the reversed one
  // GPU by 0.028 (fsdp accum 2 FP8: 0.028 and 0.028); in BF16 both stay under 3e-3.
  const Trajectory reordered = RunSingle(c, batches, /*reversed=*/true);
  ASSERT_EQ(reordered.params.size(), layout.units.size());
  double order[3] = {0, 0, 0};
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const std::array<double, 3> e = errors(reordered, u);
    for (int i = 0; i < 3; ++i) order[i] = std::max(order[i], e[i]);
  }
  const double bound[3] = {std::max(tol.params, 3 * order[0]), std::max(tol.m, 3 * order[1]),
                           std::max(tol.v, 3 * order[2])};
  double worst[3] = {0, 0, 0};  // params, m, v: printed so the margin to the bounds shows
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const std::array<double, 3> e = errors(dp, u);
    for (int i = 0; i < 3; ++i) worst[i] = std::max(worst[i], e[i]);
    EXPECT_LT(e[0], bound[0]) << layout.units[u].name;
    EXPECT_LT(e[1], bound[1]) << layout.units[u].name << " (m)";
    EXPECT_LT(e[2], bound[2]) << layout.units[u].name << " (v)";
  }
  std::printf("[ against one GPU ] worst relative Frobenius: params %.3g (bound %.3g), m %.3g "
              "(%.3g), v %.3g (%.3g); one GPU reversed: %.3g, %.3g, %.3g\n",
              worst[0], bound[0], worst[1], bound[1], worst[2], bound[2], order[0], order[1],
              order[2]);

  // Determinism, and a restart from the state after step 3 on fresh backends.
  const std::vector<Trajectory> again = RunParallel(c, k.world, batches, 0, kSteps, nullptr);
  ExpectBitwiseEqual(again[0], dp, "second run");
  const std::vector<Trajectory> head = RunParallel(c, k.world, batches, 0, 3, nullptr);
  const std::vector<Trajectory> tail = RunParallel(c, k.world, batches, 3, kSteps, &head[0]);
  EXPECT_TRUE(tail[0].params == dp.params) << "resumed run's weights differ";
  EXPECT_TRUE(tail[0].m == dp.m && tail[0].v == dp.v) << "resumed run's moments differ";
  for (int s = 3; s < kSteps; ++s) EXPECT_EQ(tail[0].losses[s - 3], dp.losses[s]) << "step " << s;
}

// fsdp in FP8 keeps one set of FP8 weights for all layers, cast before each block's forward
// and backward pass (Fp8Linears one_weight_set); zero2 keeps every layer's, cast once per step,
// from the same bf16 values. Casts within a step share one scale, so both write the same FP8
// bytes and amaxes. After the delayed recipe's first step fsdp gathers the weights as E4M3
// instead, each rank casting its slot: the cast is elementwise with the same scale and the
// amax a max over the slots, so again the same bytes and amaxes. On 2 ranks with one
// micro-step each every gradient sum is one addition (the same in either order), so the
// trajectories must be bitwise equal, FP8 scaling state included: delayed and current
// recipe, BF16 and FP8 LM head, and the Llama knobs (whose untied embedding fsdp looks up in
// the slots: the same rows, and each rank's rows summed before the two ranks' sums are added,
// the one addition of zero2's reduce-scatter). The delayed runs must have gathered E4M3
// (the first step and the current recipe gather bf16).
TEST(CudaDataParallel, FsdpRecastingFp8WeightsPerPassChangesNoBits) {
  FORGE_SKIP_WITHOUT_GPU();
  struct Variant {
    Fp8Recipe recipe;
    bool fp8_lm_head, llama;
  };
  for (const Variant v : {Variant{Fp8Recipe::kDelayed, false, false},
                          Variant{Fp8Recipe::kDelayed, true, true},
                          Variant{Fp8Recipe::kCurrent, false, true}}) {
    SCOPED_TRACE(std::string(v.recipe == Fp8Recipe::kCurrent ? "current" : "delayed") +
                 (v.fp8_lm_head ? ", fp8 lm head" : "") + (v.llama ? ", llama knobs" : ""));
    RunConfig zero2 = Config(ParallelMode::kZero2, 2, 1, GradReduce::kFp32, Precision::kFp8,
                             v.fp8_lm_head, v.llama);
    zero2.precision.fp8.recipe = v.recipe;
    RunConfig fsdp = zero2;
    fsdp.parallel.mode = ParallelMode::kFsdp;
    const auto batches = MakeBatches(zero2, 2);
    const std::vector<Trajectory> a = RunParallel(zero2, 2, batches, 0, kSteps, nullptr);
    const std::vector<Trajectory> b = RunParallel(fsdp, 2, batches, 0, kSteps, nullptr);
    ASSERT_EQ(a.size(), 2u);
    ASSERT_EQ(b.size(), 2u);
    ASSERT_EQ(a[0].losses.size(), size_t(kSteps));
    ExpectBitwiseEqual(b[0], a[0], "fsdp vs zero2");
    EXPECT_TRUE(b[0].extra == a[0].extra) << "FP8 scaling state differs";
    EXPECT_LT(b[0].losses.back(), b[0].losses.front()) << "the model did not learn";
    // Every block is gathered at least once a step (each update makes the gathered copies
    // stale), in E4M3 from the second step on.
    const int64_t min_gathers = int64_t{zero2.model.n_layer} * (kSteps - 1);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(a[r].fp8_block_gathers, 0) << "rank " << r;
      if (v.recipe == Fp8Recipe::kDelayed) {
        EXPECT_GE(b[r].fp8_block_gathers, min_gathers) << "rank " << r;
      } else {
        EXPECT_EQ(b[r].fp8_block_gathers, 0) << "rank " << r;
      }
    }
  }
}

// `c` on 2 ranks twice from the same 4 micro-batches a step, the second run with `changed`:
// each rank's two runs must be bitwise equal, FP8 scaling state included. Returns both runs
// for the caller's own checks, or nothing (a failure recorded) where one did not run whole.
std::pair<std::vector<Trajectory>, std::vector<Trajectory>> ExpectSameBitsWith(
    const RunConfig& c, const CudaBackendOptions& changed, const std::string& what) {
  const auto batches = MakeBatches(c, 4);
  std::vector<Trajectory> a = RunParallel(c, 2, batches, 0, kSteps, nullptr);
  std::vector<Trajectory> b = RunParallel(c, 2, batches, 0, kSteps, nullptr, changed);
  if (a.size() != 2 || b.size() != 2 || a[0].losses.size() != size_t(kSteps)) {
    ADD_FAILURE() << what << ": a run did not finish";
    return {};
  }
  for (int r = 0; r < 2; ++r) {
    ExpectBitwiseEqual(a[r], b[r], what + ", rank " + std::to_string(r));
    EXPECT_TRUE(a[r].extra == b[r].extra) << what << ", rank " << r << ": FP8 state differs";
  }
  return {std::move(a), std::move(b)};
}

// ExpectSameBitsWith for `mode` with 2 micro-steps a step. fsdp in FP8 takes the Llama knobs
// and delayed scaling, so that its E4M3 gather runs, and must have gathered every block so.
void ExpectModeSameBitsWith(ParallelMode mode, GradReduce reduce, Precision p,
                            const CudaBackendOptions& changed, const std::string& what) {
  const bool fsdp_fp8 = mode == ParallelMode::kFsdp && p == Precision::kFp8;
  RunConfig c = Config(mode, 2, 2, reduce, p, /*fp8_lm_head=*/false, /*llama=*/fsdp_fp8);
  if (fsdp_fp8) c.precision.fp8.recipe = Fp8Recipe::kDelayed;  // the E4M3 gather runs
  const auto [base, with_changed] = ExpectSameBitsWith(c, changed, what);
  if (fsdp_fp8 && !base.empty()) {
    EXPECT_GE(base[0].fp8_block_gathers, int64_t{c.model.n_layer} * (kSteps - 1));
  }
}

// With accumulation (every micro-step gathers the blocks again and adds its reduce-scattered
// gradient) and with full activation recompute (the backward's recompute reads the gathered
// E4M3 weights again), fsdp's E4M3 gather against its bf16 gather and per-pass cast
// (CudaBackendOptions::fp8_gather off): the same bytes and amaxes, so bitwise the same run.
TEST(CudaDataParallel, FsdpFp8GatherChangesNoBits) {
  FORGE_SKIP_WITHOUT_GPU();
  for (const Recompute recompute : {Recompute::kNone, Recompute::kFull}) {
    SCOPED_TRACE(recompute == Recompute::kFull ? "full recompute" : "no recompute");
    RunConfig c = Config(ParallelMode::kFsdp, 2, 2, GradReduce::kFp32, Precision::kFp8,
                         /*fp8_lm_head=*/true, /*llama=*/true);
    c.precision.fp8.recipe = Fp8Recipe::kDelayed;
    c.train.activation_recompute = recompute;
    CudaBackendOptions bf16_gather;
    bf16_gather.fp8_gather = false;
    const auto [fp8, bf16] = ExpectSameBitsWith(c, bf16_gather, "e4m3 vs bf16 gather");
    if (fp8.empty()) continue;
    for (int r = 0; r < 2; ++r) {
      EXPECT_GE(fp8[r].fp8_block_gathers, int64_t{c.model.n_layer} * (kSteps - 1))
          << "rank " << r;
      EXPECT_EQ(bf16[r].fp8_block_gathers, 0) << "rank " << r;
    }
    EXPECT_LT(fp8[0].losses.back(), fp8[0].losses.front()) << "the model did not learn";
  }
}

// Comm windows only move when the collectives start (cuda_data_parallel.h): the same sums
// and gathers, so bitwise the trajectory of collectives started at once, with accumulation
// (ddp and zero open the windows on the last micro-step only, fsdp on every one) and in every
// collective kind (fsdp: its block gathers in the forward and backward windows too).
TEST(CudaDataParallel, CommWindowsChangeNoBits) {
  FORGE_SKIP_WITHOUT_GPU();
  for (const ParallelMode mode : {ParallelMode::kDdp, ParallelMode::kZero1, ParallelMode::kFsdp}) {
    SCOPED_TRACE(ParallelModeName(mode));
    const RunConfig c = Config(mode, 2, 2, GradReduce::kFp32, Precision::kBf16);
    CudaBackendOptions no_windows;
    no_windows.comm_windows = false;
    ExpectSameBitsWith(c, no_windows, "windows vs at once");
  }
}

// engine.nccl_symmetric_memory: the collectives' buffers in symmetric NCCL windows take
// NCCL's symmetric kernels (ddp's all-reduces) or registered buffers (the ring's gathers and
// reduce-scatters). Over two ranks every element's sum is one addition, the same whichever
// kernel does it, so the run is bitwise the run on plain memory: ddp in fp32 and bf16, zero1,
// and fsdp in BF16 and with its E4M3 gathers (FP8, delayed scaling).
TEST(CudaDataParallel, SymmetricMemoryChangesNoBits) {
  FORGE_SKIP_WITHOUT_GPU();
  struct Case {
    ParallelMode mode;
    GradReduce reduce;
    Precision precision;
  };
  for (const Case k : {Case{ParallelMode::kDdp, GradReduce::kFp32, Precision::kBf16},
                       Case{ParallelMode::kDdp, GradReduce::kBf16, Precision::kBf16},
                       Case{ParallelMode::kZero1, GradReduce::kFp32, Precision::kBf16},
                       Case{ParallelMode::kFsdp, GradReduce::kFp32, Precision::kBf16},
                       Case{ParallelMode::kFsdp, GradReduce::kFp32, Precision::kFp8}}) {
    SCOPED_TRACE(std::string(ParallelModeName(k.mode)) +
                 (k.reduce == GradReduce::kBf16 ? ", bf16 gradients" : "") +
                 (k.precision == Precision::kFp8 ? ", fp8" : ""));
    CudaBackendOptions plain;
    plain.nccl_symmetric_memory = false;
    ExpectModeSameBitsWith(k.mode, k.reduce, k.precision, plain, "symmetric vs plain");
  }
}

// AdamW is deferred (CudaModelOptions::defer_update): ddp applies it during the next
// forward, zero and fsdp from the step's end on the update stream, each unit's gather waiting
// for its update. The same kernel on the same values, so bitwise the trajectory of the update
// at the step's end, with accumulation (only the first micro-step's forward applies it), in
// BF16 and in FP8 (whose scale update runs at the step's end either way; fsdp's E4M3 gather
// casts each block's slot after its update).
TEST(CudaDataParallel, DeferredUpdateChangesNoBits) {
  FORGE_SKIP_WITHOUT_GPU();
  for (const ParallelMode mode : {ParallelMode::kDdp, ParallelMode::kZero1, ParallelMode::kFsdp}) {
    for (const Precision p : {Precision::kBf16, Precision::kFp8}) {
      SCOPED_TRACE(std::string(ParallelModeName(mode)) +
                   (p == Precision::kFp8 ? ", fp8" : ", bf16"));
      CudaBackendOptions immediate;
      immediate.defer_update = false;
      ExpectModeSameBitsWith(mode, GradReduce::kFp32, p, immediate, "deferred vs at the end");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, CudaDataParallelTest,
    ::testing::Values(Case{2, ParallelMode::kDdp, 1}, Case{2, ParallelMode::kDdp, 2},
                      Case{2, ParallelMode::kZero1, 2}, Case{2, ParallelMode::kZero2, 1},
                      Case{4, ParallelMode::kDdp, 2}, Case{4, ParallelMode::kZero1, 1},
                      Case{4, ParallelMode::kZero2, 2}, Case{2, ParallelMode::kFsdp, 1},
                      Case{2, ParallelMode::kFsdp, 2}, Case{4, ParallelMode::kFsdp, 2},
                      Case{2, ParallelMode::kDdp, 1, GradReduce::kBf16},
                      Case{4, ParallelMode::kDdp, 1, GradReduce::kBf16},
                      Case{2, ParallelMode::kDdp, 2, GradReduce::kBf16},
                      Case{2, ParallelMode::kZero1, 2, GradReduce::kBf16},
                      Case{2, ParallelMode::kDdp, 2, GradReduce::kFp32, Precision::kFp8},
                      Case{2, ParallelMode::kZero1, 1, GradReduce::kFp32, Precision::kFp8},
                      Case{2, ParallelMode::kFsdp, 2, GradReduce::kFp32, Precision::kFp8},
                      Case{2, ParallelMode::kDdp, 2, GradReduce::kFp32, Precision::kFp8, true},
                      Case{2, ParallelMode::kFsdp, 1, GradReduce::kFp32, Precision::kFp8, true},
                      Case{2, ParallelMode::kDdp, 2, GradReduce::kFp32, Precision::kBf16, false,
                           true},
                      Case{2, ParallelMode::kFsdp, 2, GradReduce::kFp32, Precision::kBf16, false,
                           true},
                      Case{4, ParallelMode::kFsdp, 1, GradReduce::kFp32, Precision::kBf16, false,
                           true},
                      Case{2, ParallelMode::kZero2, 1, GradReduce::kFp32, Precision::kFp8, true,
                           true},
                      // hsdp: 2 shard groups x 2 GPUs, and the degenerate 4 x 1 and 1 x 4
                      Case{4, ParallelMode::kHsdp, 1, GradReduce::kFp32, Precision::kBf16, false,
                           false, 2},
                      Case{4, ParallelMode::kHsdp, 2, GradReduce::kFp32, Precision::kBf16, false,
                           false, 2},
                      Case{4, ParallelMode::kHsdp, 2, GradReduce::kFp32, Precision::kFp8, false,
                           false, 2},
                      Case{4, ParallelMode::kHsdp, 2, GradReduce::kFp32, Precision::kBf16, false,
                           true, 2},
                      Case{4, ParallelMode::kHsdp, 2, GradReduce::kFp32, Precision::kBf16, false,
                           false, 1},
                      Case{4, ParallelMode::kHsdp, 1, GradReduce::kFp32, Precision::kBf16, false,
                           false, 4}),
    [](const ::testing::TestParamInfo<Case>& i) {
      const bool bf16 = i.param.grad_reduce == GradReduce::kBf16;
      const bool fp8 = i.param.precision == Precision::kFp8;
      return std::string(ParallelModeName(i.param.mode)) + "_" + std::to_string(i.param.world) +
             "gpus_accum" + std::to_string(i.param.accum) + (bf16 ? "_bf16grads" : "") +
             (fp8 ? "_fp8" : "") + (i.param.fp8_lm_head ? "_lmhead" : "") +
             (i.param.llama ? "_llama" : "") +
             (i.param.shard_group > 0 ? "_groups_of" + std::to_string(i.param.shard_group) : "");
    });

}  // namespace
}  // namespace forge
