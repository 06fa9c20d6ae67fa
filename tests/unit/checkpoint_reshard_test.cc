// Resharding: a checkpoint written by W ranks loads on W' ranks as exactly the slices those
// ranks own (ShardOf), bitwise, whatever the mode that wrote it.
#include <gtest/gtest.h>

#include "checkpoint_test_util.h"

namespace forge {
namespace {

using namespace ckpt_test;

void ExpectReshard(int from, int to, bool knobs = false) {
  const std::string root = FreshDir("reshard_" + std::to_string(from) + "_" + std::to_string(to) +
                                    (knobs ? "_knobs" : ""));
  RunConfig cfg = SmallConfig();
  if (knobs) {  // an untied LM head (a tensor of the final unit), head_dim, RoPE scaling
    cfg.model.tie_embeddings = false;
    cfg.model.explicit_head_dim = 2 * cfg.model.head_dim();
    cfg.model.rope_scaling.type = RopeScalingType::kLlama3;
  }
  cfg.parallel.mode = ParallelMode::kDdp;
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const FullState full = MakeState(layout, 100 * from + to);
  const std::string dir = SaveAll(root, cfg, layout, full, from, 30, 480);

  for (int r = 0; r < to; ++r) {
    auto l = LoadCheckpoint(dir, r, to, &layout);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->manifest.world_size, from);
    EXPECT_EQ(l->blobs_from_same_rank, from == to);
    // Another world size: per-rank blobs come from source rank 0.
    const int blob_rank = from == to ? r : 0;
    EXPECT_EQ(l->state.trainer.rng, MakeTrainer(30, 480, blob_rank).rng);
    EXPECT_EQ(l->state.trainer.step, 30);
    EXPECT_EQ(l->state.trainer.data_cursor, 480);
    for (size_t u = 0; u < layout.units.size(); ++u) {
      const ShardRange want = ShardOf(layout.units[u].numel, r, to);
      const UnitSlice& x = l->state.units[u];
      ASSERT_EQ(x.begin, want.begin) << "rank " << r << " unit " << u;
      ASSERT_EQ(x.end, want.end);
      auto slice = [&](const std::vector<float>& b) {
        return std::vector<float>(b.begin() + want.begin, b.begin() + want.end);
      };
      EXPECT_TRUE(SameBits(x.master, slice(full.master[u]))) << "rank " << r << " unit " << u;
      EXPECT_TRUE(SameBits(x.m, slice(full.m[u]))) << "rank " << r << " unit " << u;
      EXPECT_TRUE(SameBits(x.v, slice(full.v[u]))) << "rank " << r << " unit " << u;
    }
  }
}

TEST(CheckpointReshardTest, FourToTwo) { ExpectReshard(4, 2); }
TEST(CheckpointReshardTest, TwoToFour) { ExpectReshard(2, 4); }
TEST(CheckpointReshardTest, ThreeToOne) { ExpectReshard(3, 1); }
TEST(CheckpointReshardTest, OneToThree) { ExpectReshard(1, 3); }
TEST(CheckpointReshardTest, FiveToThree) { ExpectReshard(5, 3); }
TEST(CheckpointReshardTest, ArchitectureKnobsThreeToTwo) { ExpectReshard(3, 2, /*knobs=*/true); }

// A checkpoint that groups the same tensors into units another way (the untied LM head in the
// embedding unit, as written before the head moved to the final unit) loads into today's units
// tensor by tensor, on another world size, bitwise; one that lacks a tensor is still refused.
TEST(CheckpointReshardTest, OlderUnitGroupingLoadsByTensorName) {
  const std::string root = FreshDir("reshard_regrouped");
  RunConfig cfg = SmallConfig();
  cfg.model.tie_embeddings = false;
  cfg.parallel.mode = ParallelMode::kFsdp;
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const size_t fin = size_t(layout.final_norm_unit());
  ASSERT_EQ(layout.units[fin].tensors.back().name, "lm_head");
  ParamLayout old = layout;  // lm_head after wte in the embedding unit
  TensorSlot head = old.units[fin].tensors.back();
  old.units[fin].tensors.pop_back();
  old.units[fin].numel -= head.numel;
  head.offset = old.units[0].numel;
  old.units[0].tensors.push_back(head);
  old.units[0].numel += head.numel;
  const FullState saved = MakeState(old, 31);
  const std::string dir = SaveAll(root, cfg, old, saved, 3, 7, 21);

  // Today's units assembled by name from the saved ones.
  auto regroup = [&](const std::vector<std::vector<float>>& from) {
    std::vector<std::vector<float>> to(layout.units.size());
    for (size_t u = 0; u < layout.units.size(); ++u) {
      to[u].resize(size_t(layout.units[u].numel));
      for (const TensorSlot& t : layout.units[u].tensors)
        for (size_t ou = 0; ou < old.units.size(); ++ou)
          for (const TensorSlot& o : old.units[ou].tensors)
            if (o.name == t.name)
              std::copy(from[ou].begin() + o.offset, from[ou].begin() + o.offset + o.numel,
                        to[u].begin() + t.offset);
    }
    return to;
  };
  const auto master = regroup(saved.master), m = regroup(saved.m), v = regroup(saved.v);
  for (int r = 0; r < 2; ++r) {
    auto l = LoadCheckpoint(dir, r, 2, &layout);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    ASSERT_EQ(l->state.units.size(), layout.units.size());
    for (size_t u = 0; u < layout.units.size(); ++u) {
      const ShardRange want = ShardOf(layout.units[u].numel, r, 2);
      const UnitSlice& x = l->state.units[u];
      ASSERT_EQ(x.begin, want.begin) << "rank " << r << " unit " << u;
      ASSERT_EQ(x.end, want.end);
      auto slice = [&](const std::vector<float>& b) {
        return std::vector<float>(b.begin() + want.begin, b.begin() + want.end);
      };
      EXPECT_TRUE(SameBits(x.master, slice(master[u]))) << "rank " << r << " unit " << u;
      EXPECT_TRUE(SameBits(x.m, slice(m[u]))) << "rank " << r << " unit " << u;
      EXPECT_TRUE(SameBits(x.v, slice(v[u]))) << "rank " << r << " unit " << u;
    }
  }
  auto whole = LoadFullCheckpoint(dir, &layout);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  for (size_t u = 0; u < layout.units.size(); ++u)
    EXPECT_TRUE(SameBits(whole->master[u], master[u])) << "unit " << u;

  // Another model (a tied head: no lm_head tensor) is refused, naming the difference.
  RunConfig tied = cfg;
  tied.model.tie_embeddings = true;
  const ParamLayout tied_layout = MakeParamLayout(tied.model);
  auto refused = LoadFullCheckpoint(dir, &tied_layout);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("checkpoint unit embedding"), std::string::npos)
      << refused.status().message();
}

// The layout a DDP run writes (full replicas, each rank writing its slice) equals the one a
// ZeRO/FSDP run writes from the slices it owns: the same files byte for byte, except the mode
// recorded in the manifest.
TEST(CheckpointReshardTest, DdpAndShardedModesWriteIdenticalShards) {
  const ParamLayout layout = MakeParamLayout(SmallConfig().model);
  const FullState full = MakeState(layout, 77);
  const std::string ddp_root = FreshDir("mode_ddp"), fsdp_root = FreshDir("mode_fsdp");
  RunConfig cfg = SmallConfig();
  cfg.parallel.mode = ParallelMode::kDdp;
  const std::string ddp = SaveAll(ddp_root, cfg, layout, full, 3, 5, 15);

  cfg.parallel.mode = ParallelMode::kFsdp;
  const std::string fsdp = StepDir(fsdp_root, 5);
  std::vector<ShardReport> reps;
  for (int r = 0; r < 3; ++r) {
    ShardState s;
    s.rank = r;
    s.world = 3;
    s.trainer = MakeTrainer(5, 15, r);
    for (size_t u = 0; u < layout.units.size(); ++u) {
      const ShardRange own = ShardOf(layout.units[u].numel, r, 3);
      UnitSlice x;
      x.unit_numel = layout.units[u].numel;
      x.begin = own.begin;
      x.end = own.end;
      x.master.assign(full.master[u].begin() + own.begin, full.master[u].begin() + own.end);
      x.m.assign(full.m[u].begin() + own.begin, full.m[u].begin() + own.end);
      x.v.assign(full.v[u].begin() + own.begin, full.v[u].begin() + own.end);
      s.units.push_back(std::move(x));
    }
    auto rep = WriteShard(fsdp, s);
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    reps.push_back(*rep);
  }
  ASSERT_TRUE(CommitCheckpoint(fsdp, cfg, layout, reps).ok());
  for (int r = 0; r < 3; ++r) {
    std::ifstream a(ShardPath(ddp, r, 3), std::ios::binary), b(ShardPath(fsdp, r, 3), std::ios::binary);
    const std::string da((std::istreambuf_iterator<char>(a)), {});
    const std::string db((std::istreambuf_iterator<char>(b)), {});
    EXPECT_FALSE(da.empty());
    EXPECT_EQ(da, db) << "rank " << r;
  }
}

// Arbitrary target ranges (e.g. a pipeline stage that owns some units only) read the right
// bytes, across source shard boundaries.
TEST(CheckpointReshardTest, ArbitraryRanges) {
  const std::string root = FreshDir("reshard_ranges");
  const RunConfig cfg = SmallConfig();
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const FullState full = MakeState(layout, 9);
  const std::string dir = SaveAll(root, cfg, layout, full, 4, 2, 4);
  std::vector<ShardRange> want;
  for (const UnitLayout& u : layout.units) want.push_back({u.numel / 3, u.numel - u.numel / 5});
  want.back() = {0, 0};
  auto l = LoadCheckpointRanges(dir, want, 2);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->state.trainer.rng, MakeTrainer(2, 4, 2).rng);
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const std::vector<float> expect(full.m[u].begin() + want[u].begin,
                                    full.m[u].begin() + want[u].end);
    EXPECT_TRUE(SameBits(l->state.units[u].m, expect)) << "unit " << u;
  }
  want[0].end = layout.units[0].numel + 1;
  EXPECT_FALSE(LoadCheckpointRanges(dir, want, 0).ok());
}

}  // namespace
}  // namespace forge
