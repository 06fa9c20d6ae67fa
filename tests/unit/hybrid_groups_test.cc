// hsdp's groups (worker/parallel/hybrid_groups.h): shard and replica groups of each rank, the
// data positions (a permutation, equal to the rank for other modes and for G = 1 or G = W), the
// group-size check, and the split of a world-1 comm. The split over MPI and the training it
// serves are tested under mpirun (tests/integration/parallel_mpi_test.cc).
#include "worker/parallel/hybrid_groups.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace forge {
namespace {

ParallelConfig Hsdp(int g) {
  ParallelConfig p;
  p.mode = ParallelMode::kHsdp;
  p.shard_group_size = g;
  return p;
}

TEST(HybridGroupsTest, GroupsOfConsecutiveRanks) {
  // 8 ranks as 4 shard groups of 2: rank 5 is rank 1 of group 2, rank 2 of replica group 1.
  const HybridGroups h = HybridGroupsOf(5, 8, 2);
  EXPECT_EQ(h.shard_size, 2);
  EXPECT_EQ(h.replicas, 4);
  EXPECT_EQ(h.shard_rank, 1);
  EXPECT_EQ(h.replica_rank, 2);
}

TEST(HybridGroupsTest, DataRanksArePositionsTransposed) {
  // 4 = 2 x 2: ranks 0 1 | 2 3 read positions 0 2 | 1 3.
  std::vector<int> got;
  for (int r = 0; r < 4; ++r) got.push_back(DataRank(Hsdp(2), r, 4));
  EXPECT_EQ(got, (std::vector<int>{0, 2, 1, 3}));
  // 8 = 2 groups x 4: positions j*2 + i.
  got.clear();
  for (int r = 0; r < 8; ++r) got.push_back(DataRank(Hsdp(4), r, 8));
  EXPECT_EQ(got, (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
  // A permutation for every divisor; the identity for G = 1, G = W and the other modes.
  for (int w : {1, 2, 3, 4, 6, 8, 12}) {
    for (int g = 1; g <= w; ++g) {
      if (w % g) continue;
      std::vector<int> pos;
      for (int r = 0; r < w; ++r) pos.push_back(DataRank(Hsdp(g), r, w));
      std::vector<int> sorted = pos;
      std::sort(sorted.begin(), sorted.end());
      for (int r = 0; r < w; ++r) EXPECT_EQ(sorted[r], r) << "w " << w << " g " << g;
      if (g == 1 || g == w)
        for (int r = 0; r < w; ++r) EXPECT_EQ(pos[r], r) << "w " << w << " g " << g;
    }
  }
  ParallelConfig fsdp;
  fsdp.mode = ParallelMode::kFsdp;
  EXPECT_EQ(DataRank(fsdp, 3, 4), 3);
}

TEST(HybridGroupsTest, GroupSizeMustDivideTheWorld) {
  EXPECT_TRUE(CheckShardGroupSize(Hsdp(2), 4).ok());
  EXPECT_TRUE(CheckShardGroupSize(Hsdp(1), 3).ok());
  EXPECT_TRUE(CheckShardGroupSize(Hsdp(4), 4).ok());
  const Status s = CheckShardGroupSize(Hsdp(3), 4);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("parallel.shard_group_size (3) must divide the world size (4)"),
            std::string::npos)
      << s.ToString();
  EXPECT_FALSE(CheckShardGroupSize(Hsdp(8), 4).ok());
  ParallelConfig ddp;  // other modes: nothing to check
  EXPECT_TRUE(CheckShardGroupSize(ddp, 3).ok());
}

TEST(HybridGroupsTest, WorldOneSplitsIntoTwoLocalComms) {
  auto world = MakeLocalComm();
  auto split = SplitHybridComms(world.get(), 1);
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  EXPECT_EQ(split->shard->world(), 1);
  EXPECT_EQ(split->replica->world(), 1);
  float x = 2.5f;
  EXPECT_TRUE(AllReduceSumBlocking(split->shard.get(), &x, 1, DType::kF32).ok());
  EXPECT_EQ(x, 2.5f);
  EXPECT_FALSE(SplitHybridComms(world.get(), 2).ok());
}

}  // namespace
}  // namespace forge
