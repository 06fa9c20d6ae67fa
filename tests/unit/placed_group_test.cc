// JoinPlacedGroup: a coordinator-formed group of standalone workers (worker/run/process_run.h).
// Only the CPU-side rules run here; the NCCL path needs GPUs.
#include <gtest/gtest.h>

#include "worker/run/process_run.h"

namespace forge {
namespace {

TEST(PlacedGroup, AloneNeedsNoCommAndCpuRanksAreRefused) {
  RunConfig cfg;
  cfg.train.backend = Backend::kCpu;
  LaunchInfo one;
  auto alone = JoinPlacedGroup(cfg, one, nullptr);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  EXPECT_EQ(alone->world(), 1);
  EXPECT_EQ(alone->comm, nullptr);

  LaunchInfo two;
  two.rank = 1;
  two.world = 2;
  auto refused = JoinPlacedGroup(cfg, two, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kUnavailable);
  EXPECT_NE(refused.status().message().find("MPI"), std::string::npos)
      << refused.status().ToString();
}

}  // namespace
}  // namespace forge
