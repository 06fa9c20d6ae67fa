// The rule that decides whether fsdp gathers the blocks' FP8 linear weights as E4M3 bytes
// (worker/train/fp8_gather_rule.h): each condition alone turns it off and is the reason given,
// the run-config form asks only of fsdp and hsdp in FP8 over their shard group, and the memory
// estimate counts the E4M3 buffers exactly where the rule says yes.
#include "worker/train/fp8_gather_rule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "worker/model/shard_layout.h"
#include "worker/train/memory_estimate.h"

namespace forge {
namespace {

// d 128, 4 heads of 32 (2 KV heads), ffn 256: every weight's rows and columns multiples of 64.
ModelConfig Eligible() {
  ModelConfig m;
  m.n_layer = 3;
  m.d_model = 128;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.ffn = 256;
  m.vocab = 300;
  m.seq_len = 64;
  return m;
}

RunConfig Fp8Fsdp(const ModelConfig& m) {
  RunConfig c;
  c.model = m;
  c.batch.micro_batch = 2;
  c.batch.global_batch = 8;
  c.precision.compute = Precision::kFp8;
  c.precision.fp8.recipe = Fp8Recipe::kDelayed;
  c.parallel.mode = ParallelMode::kFsdp;
  return c;
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Fp8GatherRule, DelayedScalingWithShapesInTilesGathersE4m3) {
  for (int world : {2, 4, 8, 24}) {
    const Fp8GatherChoice c = ChooseFp8Gather(Eligible(), Fp8Recipe::kDelayed, world);
    EXPECT_TRUE(c.e4m3) << world << ": " << c.why;
    EXPECT_EQ(c.why, "");
    EXPECT_TRUE(Has(c.note, "gathered as E4M3")) << c.note;
  }
}

TEST(Fp8GatherRule, EachMissingConditionIsTheReasonGiven) {
  auto no = [](const ModelConfig& m, Fp8Recipe r, bool enabled, const std::string& why) {
    const Fp8GatherChoice c = ChooseFp8Gather(m, r, 4, enabled);
    EXPECT_FALSE(c.e4m3) << why;
    EXPECT_TRUE(Has(c.why, why)) << c.why;
    EXPECT_EQ(c.note, "fsdp fp8 weights: gathered in bf16 and cast before each pass (" + c.why +
                          ")");
  };
  no(Eligible(), Fp8Recipe::kDelayed, false, "the FP8 gather is off");
  no(Eligible(), Fp8Recipe::kCurrent, true, "current scaling");
  ModelConfig ffn = Eligible();
  ffn.ffn = 160;  // w_down's 160 columns, w_gate_up's 320 rows
  no(ffn, Fp8Recipe::kDelayed, true, "not a multiple of 64");
  ModelConfig heads = Eligible();
  heads.explicit_head_dim = 40;  // wo's 4 x 40 = 160 columns
  no(heads, Fp8Recipe::kDelayed, true, "not a multiple of 64");
  ModelConfig d = Eligible();
  d.d_model = 96;  // every weight's d_model side
  d.explicit_head_dim = 32;
  no(d, Fp8Recipe::kDelayed, true, "not a multiple of 64");
  // QK-norm's two norms of head_dim 4 before wqkv put it 8 elements off 16-byte alignment
  // (32 heads of 4: wqkv 384 x 128, wo 128 x 128).
  ModelConfig qk = Eligible();
  qk.n_head = 32;
  qk.n_kv_head = 32;
  qk.qk_norm = true;
  no(qk, Fp8Recipe::kDelayed, true, "16-byte aligned");
  qk.qk_norm = false;
  EXPECT_TRUE(ChooseFp8Gather(qk, Fp8Recipe::kDelayed, 4).e4m3);
  // Widths no device holds are refused before their layout is summed.
  ModelConfig wide = Eligible();
  wide.d_model = 1 << 30;
  wide.n_head = 1 << 24;
  wide.n_kv_head = 1 << 24;
  no(wide, Fp8Recipe::kDelayed, true, "wider than 2^24");
}

TEST(Fp8GatherRule, RunConfigAsksOnlyOfShardedParamsInFp8) {
  const RunConfig fsdp = Fp8Fsdp(Eligible());
  EXPECT_TRUE(ChooseFp8Gather(fsdp, 4).e4m3);
  RunConfig bf16 = fsdp;
  bf16.precision.compute = Precision::kBf16;
  EXPECT_FALSE(ChooseFp8Gather(bf16, 4).e4m3);
  EXPECT_TRUE(Has(ChooseFp8Gather(bf16, 4).why, "precision.compute"));
  EXPECT_EQ(ChooseFp8Gather(bf16, 4).note, "");
  for (ParallelMode mode : {ParallelMode::kDdp, ParallelMode::kZero1, ParallelMode::kZero2}) {
    RunConfig c = fsdp;
    c.parallel.mode = mode;
    EXPECT_FALSE(ChooseFp8Gather(c, 4).e4m3) << ParallelModeName(mode);
    EXPECT_TRUE(Has(ChooseFp8Gather(c, 4).why, "parallel.mode")) << ParallelModeName(mode);
  }
  EXPECT_FALSE(ChooseFp8Gather(fsdp, 1).e4m3);  // one rank shards nothing
  RunConfig current = fsdp;
  current.precision.fp8.recipe = Fp8Recipe::kCurrent;
  EXPECT_TRUE(Has(ChooseFp8Gather(current, 4).why, "current scaling"));
  // hsdp gathers inside its shard group: groups of 2 on 8 ranks decide as fsdp on 2.
  RunConfig hsdp = fsdp;
  hsdp.parallel.mode = ParallelMode::kHsdp;
  hsdp.parallel.shard_group_size = 2;
  EXPECT_TRUE(ChooseFp8Gather(hsdp, 8).e4m3);
  hsdp.parallel.shard_group_size = 1;  // groups of one rank: ddp
  EXPECT_FALSE(ChooseFp8Gather(hsdp, 8).e4m3);
}

// The memory estimate counts fsdp's E4M3 buffers where, and only where, the rule says yes.
TEST(Fp8GatherRule, MemoryEstimateCountsTheE4m3BuffersExactlyWhereItSaysYes) {
  ModelConfig ffn = Eligible();
  ffn.ffn = 160;
  ModelConfig qk = Eligible();
  qk.n_head = qk.n_kv_head = 32;
  qk.qk_norm = true;
  for (const ModelConfig& m : {Eligible(), ffn, qk}) {
    for (Fp8Recipe r : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent}) {
      RunConfig c = Fp8Fsdp(m);
      c.precision.fp8.recipe = r;
      RunConfig off = c;  // the same buffers but the gather's: the gather rule says no
      off.precision.fp8.recipe = Fp8Recipe::kCurrent;
      const double extra = EstimateTrainingMemory(c, Backend::kCuda, 4).weights -
                           EstimateTrainingMemory(off, Backend::kCuda, 4).weights;
      EXPECT_EQ(extra > 0, ChooseFp8Gather(c, 4).e4m3) << m.ffn << " " << m.qk_norm;
    }
  }
}

// The norm weights' share of the E4M3 gather's second all-gather: the most elements outside
// the linear weights that one rank's slot holds, counted element by element here.
TEST(Fp8GatherRule, MostNormElementsPerSlotIsTheLargestRanksShare) {
  ModelConfig llama = Eligible();
  llama.qk_norm = true;
  for (const ModelConfig& m : {Eligible(), llama}) {
    ModelConfig one = m;
    one.n_layer = 1;
    const ParamLayout layout = MakeParamLayout(one);
    const int64_t numel = layout.units[size_t(layout.block_unit(0))].numel;
    for (int world : {1, 2, 3, 4, 8}) {
      const int64_t slot = ShardSize(numel, world);
      std::vector<int64_t> count(size_t(world), 0);
      for (int64_t i = 0; i < numel; ++i) {
        bool in_linear = false;
        for (const BlockLinear& w : layout.linears)
          in_linear = in_linear || (i >= w.offset && i < w.offset + w.numel());
        if (!in_linear) ++count[size_t(i / slot)];
      }
      EXPECT_EQ(MostNormElementsPerSlot(numel, layout.linears, world),
                *std::max_element(count.begin(), count.end()))
          << "world " << world << (m.qk_norm ? " with QK-norm" : "");
    }
  }
}

}  // namespace
}  // namespace forge
