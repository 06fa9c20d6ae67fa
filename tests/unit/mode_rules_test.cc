// ModeRulesFor: the table of worker/parallel/mode_rules.h, and how hsdp and one rank resolve.
#include "worker/parallel/mode_rules.h"

#include <gtest/gtest.h>

namespace forge {
namespace {

ModeRules Rules(ParallelMode mode, int world, int shard_group_size = 0) {
  ParallelConfig p;
  p.mode = mode;
  p.shard_group_size = shard_group_size;
  return ModeRulesFor(p, world);
}

// shard_optimizer, shard_params, free_full_grads, gather_after_update, reduce_over_replicas
std::array<bool, 5> Flags(const ModeRules& r) {
  return {r.shard_optimizer, r.shard_params, r.free_full_grads, r.gather_after_update,
          r.reduce_over_replicas};
}

TEST(ModeRules, EachModeOnFourRanks) {
  const ModeRules ddp = Rules(ParallelMode::kDdp, 4);
  EXPECT_EQ(ddp.mode, ParallelMode::kDdp);
  EXPECT_EQ(ddp.shard_world, 1);
  EXPECT_FALSE(ddp.sharded());
  EXPECT_EQ(Flags(ddp), (std::array<bool, 5>{false, false, false, false, false}));

  const ModeRules z1 = Rules(ParallelMode::kZero1, 4);
  EXPECT_EQ(z1.shard_world, 4);
  EXPECT_TRUE(z1.sharded());
  EXPECT_EQ(Flags(z1), (std::array<bool, 5>{true, false, false, true, false}));
  EXPECT_EQ(Flags(Rules(ParallelMode::kZero2, 4)),
            (std::array<bool, 5>{true, false, true, true, false}));
  const ModeRules fsdp = Rules(ParallelMode::kFsdp, 4);
  EXPECT_EQ(fsdp.shard_world, 4);
  EXPECT_EQ(Flags(fsdp), (std::array<bool, 5>{true, true, true, false, false}));

  const ModeRules hsdp = Rules(ParallelMode::kHsdp, 4, 2);
  EXPECT_EQ(hsdp.mode, ParallelMode::kHsdp);
  EXPECT_EQ(hsdp.shard_world, 2);
  EXPECT_EQ(Flags(hsdp), (std::array<bool, 5>{true, true, true, false, true}));
}

TEST(ModeRules, HsdpOfOneGroupIsFsdpAndOfSingleRanksDdp) {
  const ModeRules whole = Rules(ParallelMode::kHsdp, 4, 4);
  EXPECT_EQ(whole.mode, ParallelMode::kFsdp);
  EXPECT_EQ(Flags(whole), Flags(Rules(ParallelMode::kFsdp, 4)));
  EXPECT_EQ(whole.shard_world, 4);
  const ModeRules singles = Rules(ParallelMode::kHsdp, 4, 1);
  EXPECT_EQ(singles.mode, ParallelMode::kDdp);
  EXPECT_EQ(Flags(singles), Flags(Rules(ParallelMode::kDdp, 4)));
  EXPECT_EQ(singles.shard_world, 1);
}

TEST(ModeRules, OneRankKeepsTheModeOverWholeSlots) {
  for (ParallelMode m : {ParallelMode::kZero1, ParallelMode::kZero2, ParallelMode::kFsdp}) {
    const ModeRules r = Rules(m, 1);
    EXPECT_EQ(r.mode, m) << ParallelModeName(m);
    EXPECT_EQ(r.shard_world, 1);
    EXPECT_EQ(Flags(r), Flags(Rules(m, 4))) << ParallelModeName(m);
  }
  EXPECT_EQ(Rules(ParallelMode::kHsdp, 1, 1).mode, ParallelMode::kFsdp);  // one whole group
}

}  // namespace
}  // namespace forge
