// The asynchronous writer: the snapshot is taken at call time, the background write commits
// like the synchronous one, errors surface on the next call, and it reports blocked time and
// throughput.
#include <gtest/gtest.h>

#include "checkpoint_test_util.h"
#include "worker/checkpoint/shard_file.h"

namespace forge {
namespace {

using namespace ckpt_test;

TEST(CheckpointAsyncTest, SnapshotIsTakenAtCallTime) {
  const std::string root = FreshDir("async_snapshot");
  const RunConfig cfg = SmallConfig();
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const FullState original = MakeState(layout, 31);
  ShardState live = ShardStateFromFull(layout, 0, 1, original.master, original.m, original.v,
                                       MakeTrainer(50, 400, 0));

  AsyncCheckpointer ckpt;
  ASSERT_TRUE(ckpt.Save(StepDir(root, 50), live).ok());
  // The "training step" goes on mutating its state while the write is in flight.
  for (UnitSlice& x : live.units) {
    for (float& f : x.master) f = 1.0f;
    for (float& f : x.m) f = 2.0f;
    x.v.assign(x.v.size(), 3.0f);
  }
  live.trainer.rng = "changed";
  live.trainer.step = 51;

  auto rep = ckpt.Wait();
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_TRUE(ckpt.Done());
  EXPECT_EQ(rep->step, 50);
  ASSERT_TRUE(CommitCheckpoint(StepDir(root, 50), cfg, layout, {*rep}).ok());

  auto f = LoadFullCheckpoint(StepDir(root, 50), &layout);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  for (size_t u = 0; u < layout.units.size(); ++u) {
    EXPECT_TRUE(SameBits(f->master[u], original.master[u])) << "unit " << u;
    EXPECT_TRUE(SameBits(f->m[u], original.m[u]));
    EXPECT_TRUE(SameBits(f->v[u], original.v[u]));
  }
  EXPECT_EQ(f->trainer.rng, MakeTrainer(50, 400, 0).rng);

  const SaveStats st = ckpt.last_stats();
  EXPECT_EQ(st.step, 50);
  EXPECT_EQ(st.bytes, rep->size);
  EXPECT_GT(st.write_s, 0.0);
  EXPECT_GT(st.bytes_per_s(), 0.0);
  EXPECT_GE(st.blocked_s, 0.0);
}

TEST(CheckpointAsyncTest, MovedStateAndSeveralRanks) {
  const std::string root = FreshDir("async_ranks");
  const RunConfig cfg = SmallConfig();
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const FullState full = MakeState(layout, 32);
  std::vector<AsyncCheckpointer> ranks(3);
  for (int r = 0; r < 3; ++r) {
    ShardState s =
        ShardStateFromFull(layout, r, 3, full.master, full.m, full.v, MakeTrainer(9, 27, r));
    ASSERT_TRUE(ranks[r].Save(StepDir(root, 9), std::move(s)).ok());
  }
  std::vector<ShardReport> reps;
  for (auto& c : ranks) {
    auto rep = c.Wait();
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    reps.push_back(*rep);
  }
  ASSERT_TRUE(CommitCheckpoint(StepDir(root, 9), cfg, layout, reps).ok());
  auto l = LoadCheckpoint(StepDir(root, 9), 1, 2, &layout);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const ShardRange want = ShardOf(layout.units[1].numel, 1, 2);
  EXPECT_TRUE(SameBits(l->state.units[1].master,
                       std::vector<float>(full.master[1].begin() + want.begin,
                                          full.master[1].begin() + want.end)));
}

TEST(CheckpointAsyncTest, ErrorsSurfaceOnTheNextCall) {
  const std::string root = FreshDir("async_errors");
  const ParamLayout layout = MakeParamLayout(SmallConfig().model);
  const FullState full = MakeState(layout, 33);
  const ShardState s =
      ShardStateFromFull(layout, 0, 1, full.master, full.m, full.v, MakeTrainer(1, 1, 0));
  // A step directory that cannot be created: a regular file is in the way.
  { std::ofstream(root + "/blocked") << "file"; }

  AsyncCheckpointer ckpt;
  ASSERT_TRUE(ckpt.Save(root + "/blocked/step_1", s).ok());  // the failure is in the background
  auto rep = ckpt.Wait();
  ASSERT_FALSE(rep.ok());
  EXPECT_TRUE(Contains(rep.status().message(), "blocked")) << rep.status().ToString();

  // Nobody waits: the next Save returns the failure and starts nothing.
  ASSERT_TRUE(ckpt.Save(root + "/blocked/step_2", s).ok());
  const Status next = ckpt.Save(StepDir(root, 3), s);
  ASSERT_FALSE(next.ok());
  EXPECT_TRUE(Contains(next.message(), "previous checkpoint save")) << next.ToString();
  EXPECT_FALSE(ckpt.Wait().ok());  // nothing in flight
  EXPECT_FALSE(fs::exists(StepDir(root, 3)));

  // A report must be collected before the next save; then saving works again.
  ASSERT_TRUE(ckpt.Save(StepDir(root, 4), s).ok());
  const Status uncollected = ckpt.Save(StepDir(root, 5), s);
  ASSERT_FALSE(uncollected.ok());
  EXPECT_EQ(uncollected.code(), Code::kFailedPrecondition);
  auto ok = ckpt.Wait();
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->step, 1);
  ASSERT_TRUE(ckpt.Save(StepDir(root, 5), s).ok());
  EXPECT_TRUE(ckpt.Wait().ok());
}

// Buffers come back after a save; a later copying Save writes into them and still writes
// exactly its own state (here a smaller slice state after a whole-unit one).
TEST(CheckpointAsyncTest, SpareBuffersAreReused) {
  const std::string root = FreshDir("async_spare");
  const RunConfig cfg = SmallConfig();
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const FullState a = MakeState(layout, 61), b = MakeState(layout, 62);

  AsyncCheckpointer ckpt;
  EXPECT_FALSE(ckpt.TakeSpare().has_value());
  ASSERT_TRUE(ckpt.Save(StepDir(root, 1), ShardStateFromFull(layout, 0, 1, a.master, a.m, a.v,
                                                             MakeTrainer(1, 1, 0)))
                  .ok());
  ASSERT_TRUE(ckpt.Wait().ok());
  auto spare = ckpt.TakeSpare();
  ASSERT_TRUE(spare.has_value());
  EXPECT_FALSE(ckpt.TakeSpare().has_value());
  UnitBuffers master, m, v;
  TakeFullBuffers(std::move(*spare), &master, &m, &v);
  ASSERT_EQ(master.size(), layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    EXPECT_TRUE(SameBits(master[u], a.master[u]));
    EXPECT_TRUE(SameBits(v[u], a.v[u]));
  }

  // Whole-unit state at step 2 (its buffers become the spare), then rank 1 of 2's slices at
  // step 3 copied into them.
  ASSERT_TRUE(ckpt.Save(StepDir(root, 2), ShardStateFromFull(layout, 0, 1, std::move(master),
                                                             std::move(m), std::move(v),
                                                             MakeTrainer(2, 2, 0)))
                  .ok());
  ASSERT_TRUE(ckpt.Wait().ok());
  ShardState slices = ShardStateFromFull(layout, 1, 2, b.master, b.m, b.v, MakeTrainer(3, 3, 1));
  for (UnitSlice& x : slices.units) {
    for (std::vector<float>* buf : {&x.master, &x.m, &x.v}) {
      *buf = std::vector<float>(buf->begin() + x.begin, buf->begin() + x.end);
    }
  }
  ASSERT_TRUE(ckpt.Save(StepDir(root, 3), slices).ok());
  auto rep = ckpt.Wait();
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  auto c = ReadShardFile(ShardPath(StepDir(root, 3), 1, 2));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const ShardRange r = ShardOf(layout.units[u].numel, 1, 2);
    EXPECT_EQ(std::memcmp(c->m[u], b.m[u].data() + r.begin, 4 * r.size()), 0) << "unit " << u;
  }
}

}  // namespace
}  // namespace forge
