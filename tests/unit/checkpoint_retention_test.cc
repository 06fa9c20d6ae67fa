// Retention: keep the newest K complete checkpoints and every Mth step; never delete the newest
// complete one; remove manifest-less directories older than it, leave newer ones (a save may be
// in progress).
#include <gtest/gtest.h>

#include <set>

#include "checkpoint_test_util.h"

namespace forge {
namespace {

using namespace ckpt_test;

// Cheap stand-ins: a checkpoint is a step directory with a manifest (retention reads no
// shard), an incomplete one a directory with just a shard-like file.
void MakeStep(const std::string& root, int64_t step, bool complete) {
  const std::string dir = StepDir(root, step);
  fs::create_directories(dir);
  { std::ofstream(dir + "/" + ShardFileName(0, 1)) << "x"; }
  if (complete) std::ofstream(dir + "/manifest.json") << "{}";
}

std::set<int64_t> Steps(const std::string& root) {
  std::set<int64_t> s;
  for (const auto& e : ListStepDirs(root)) s.insert(e.step);
  return s;
}

TEST(CheckpointRetentionTest, KeepsLastKAndEveryMth) {
  const std::string root = FreshDir("keep_k_m");
  for (int64_t step = 10; step <= 100; step += 10) MakeStep(root, step, true);
  auto removed = ApplyRetention(root, /*keep_last=*/3, /*keep_every=*/40);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(Steps(root), (std::set<int64_t>{40, 80, 90, 100}));
  EXPECT_EQ(removed->size(), 6u);
  // Idempotent.
  auto again = ApplyRetention(root, 3, 40);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
}

TEST(CheckpointRetentionTest, NoMilestones) {
  const std::string root = FreshDir("keep_k");
  for (int64_t step : {1, 2, 3, 5, 8}) MakeStep(root, step, true);
  ASSERT_TRUE(ApplyRetention(root, 2, 0).ok());
  EXPECT_EQ(Steps(root), (std::set<int64_t>{5, 8}));
}

TEST(CheckpointRetentionTest, NeverDeletesNewestComplete) {
  const std::string root = FreshDir("newest");
  MakeStep(root, 10, true);
  MakeStep(root, 20, true);
  MakeStep(root, 30, false);  // newer, but incomplete (a save in progress)
  // keep_last below 1 still keeps the newest complete checkpoint.
  ASSERT_TRUE(ApplyRetention(root, 0, 0).ok());
  EXPECT_EQ(Steps(root), (std::set<int64_t>{20, 30}));
  const auto list = ListCheckpoints(root);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].step, 20);
}

TEST(CheckpointRetentionTest, IncompleteOlderThanNewestCompleteAreRemoved) {
  const std::string root = FreshDir("incomplete");
  MakeStep(root, 5, false);
  MakeStep(root, 10, true);
  MakeStep(root, 15, false);
  MakeStep(root, 20, true);
  MakeStep(root, 25, false);
  auto removed = ApplyRetention(root, 5, 0);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(Steps(root), (std::set<int64_t>{10, 20, 25}));
  EXPECT_EQ(removed->size(), 2u);
}

TEST(CheckpointRetentionTest, NothingComplete) {
  const std::string root = FreshDir("nothing_complete");
  MakeStep(root, 5, false);
  MakeStep(root, 10, false);
  ASSERT_TRUE(ApplyRetention(root, 1, 0).ok());
  EXPECT_EQ(Steps(root), (std::set<int64_t>{5, 10}));
  auto missing = ApplyRetention(root + "/nope", 1, 0);
  ASSERT_TRUE(missing.ok());
  EXPECT_TRUE(missing->empty());
}

// On real checkpoints: what retention keeps still loads.
TEST(CheckpointRetentionTest, KeptCheckpointsStillLoad) {
  const std::string root = FreshDir("real");
  const RunConfig cfg = SmallConfig();
  const ParamLayout layout = MakeParamLayout(cfg.model);
  for (int64_t step : {2, 4, 6, 8}) {
    SaveAll(root, cfg, layout, MakeState(layout, static_cast<uint32_t>(step)), 2, step, step);
  }
  ASSERT_TRUE(ApplyRetention(root, 2, 4).ok());
  EXPECT_EQ(Steps(root), (std::set<int64_t>{4, 6, 8}));
  for (int64_t step : {4, 6, 8}) EXPECT_TRUE(VerifyCheckpoint(StepDir(root, step)).ok());
}

}  // namespace
}  // namespace forge
