// Rank / world / local rank from the launcher's environment: MPI first, then Slurm, then
// torchrun-style variables; bad values are errors naming the variable.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "worker/parallel/bootstrap.h"

namespace forge {
namespace {

std::map<std::string, std::string> g_env;

const char* FakeEnv(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

LaunchInfo Detect(std::map<std::string, std::string> env) {
  g_env = std::move(env);
  auto r = DetectLaunch(&FakeEnv);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : LaunchInfo{};
}

TEST(Bootstrap, NothingSetMeansOneProcess) {
  const LaunchInfo i = Detect({});
  EXPECT_EQ(i.kind, LaunchKind::kSingle);
  EXPECT_EQ(i.rank, 0);
  EXPECT_EQ(i.world, 1);
  EXPECT_EQ(i.local_rank, 0);
}

TEST(Bootstrap, OpenMpiWinsOverEverythingElse) {
  const LaunchInfo i = Detect({{"OMPI_COMM_WORLD_RANK", "3"},
                               {"OMPI_COMM_WORLD_SIZE", "8"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                               {"SLURM_PROCID", "5"},
                               {"SLURM_NTASKS", "16"},
                               {"RANK", "7"},
                               {"WORLD_SIZE", "9"}});
  EXPECT_EQ(i.kind, LaunchKind::kMpi);
  EXPECT_EQ(i.rank, 3);
  EXPECT_EQ(i.world, 8);
  EXPECT_EQ(i.local_rank, 1);
}

TEST(Bootstrap, SrunWithPmixIsMpi) {
  const LaunchInfo i = Detect(
      {{"PMIX_RANK", "2"}, {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(i.kind, LaunchKind::kMpi);
  EXPECT_EQ(i.rank, 2);
  EXPECT_EQ(i.world, 4);
  EXPECT_EQ(i.local_rank, 0);
}

TEST(Bootstrap, SlurmWithoutMpi) {
  const LaunchInfo i =
      Detect({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(i.kind, LaunchKind::kSlurm);
  EXPECT_EQ(i.rank, 5);
  EXPECT_EQ(i.world, 8);
  EXPECT_EQ(i.local_rank, 1);
}

TEST(Bootstrap, TorchrunStyleAndLocalRankDefault) {
  LaunchInfo i = Detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
  EXPECT_EQ(i.kind, LaunchKind::kTorchrun);
  EXPECT_EQ(i.rank, 1);
  EXPECT_EQ(i.world, 2);
  EXPECT_EQ(i.local_rank, 1);
  i = Detect({{"RANK", "3"}, {"WORLD_SIZE", "4"}});  // no LOCAL_RANK: one process per node
  EXPECT_EQ(i.local_rank, 3);
  i = Detect({{"RANK", "3"}});  // half a pair is no launch
  EXPECT_EQ(i.kind, LaunchKind::kSingle);
}

TEST(Bootstrap, BadValuesNameTheVariable) {
  g_env = {{"RANK", "two"}, {"WORLD_SIZE", "4"}};
  auto r = DetectLaunch(&FakeEnv);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("RANK"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("two"), std::string::npos);

  g_env = {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}};
  r = DetectLaunch(&FakeEnv);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("SLURM_PROCID=4"), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace forge
