// `parallel.mode: hsdp` and `parallel.shard_group_size` in the run config: reading, the YAML
// round trip, and errors naming the key and line (missing size, a size without hsdp, bf16
// gradients). Whether the size divides the world is checked where the world is known
// (worker/parallel/hybrid_groups.h).
#include <gtest/gtest.h>

#include <string>

#include "common/config.h"
#include "config_test_util.h"

namespace forge {
namespace {

const std::string kBase = "model:\n  preset: tiny\n";  // lines 1-2

using test::FailsWith;
using test::ParseOk;

TEST(ConfigHsdpTest, ReadsModeAndGroupSize) {
  const RunConfig c = ParseOk(kBase + "parallel:\n  mode: hsdp\n  shard_group_size: 8\n");
  EXPECT_EQ(c.parallel.mode, ParallelMode::kHsdp);
  EXPECT_EQ(c.parallel.shard_group_size, 8);
  EXPECT_STREQ(ParallelModeName(ParallelMode::kHsdp), "hsdp");
  ParallelMode m = ParallelMode::kDdp;
  ASSERT_TRUE(ParallelModeFromName("hsdp", "--mode", &m).ok());
  EXPECT_EQ(m, ParallelMode::kHsdp);
  // Other modes leave it 0.
  EXPECT_EQ(ParseOk(kBase + "parallel:\n  mode: fsdp\n").parallel.shard_group_size, 0);
}

TEST(ConfigHsdpTest, YamlRoundTrip) {
  RunConfig c = ParseOk(kBase);
  c.parallel.mode = ParallelMode::kHsdp;
  c.parallel.shard_group_size = 4;
  const std::string yaml = RunConfigToYaml(c);
  EXPECT_NE(yaml.find("  mode: hsdp\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  shard_group_size: 4\n"), std::string::npos) << yaml;
  const RunConfig back = ParseOk(yaml);
  EXPECT_EQ(back.parallel.shard_group_size, 4);
  EXPECT_EQ(RunConfigToYaml(back), yaml);
  // Other modes do not print the key (their YAML stays as it was).
  EXPECT_EQ(RunConfigToYaml(ParseOk(kBase)).find("shard_group_size"), std::string::npos);
}

TEST(ConfigHsdpTest, HsdpNeedsAGroupSize) {
  // Missing: the error points at the mode line.
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  mode: hsdp\n", 4, "parallel.shard_group_size",
                        "parallel.mode hsdp needs it"));
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  mode: hsdp\n  shard_group_size: 0\n", 5,
                        "parallel.shard_group_size", "parallel.mode hsdp needs it"));
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  mode: hsdp\n  shard_group_size: -2\n", 5,
                        "parallel.shard_group_size", ">= 1, got -2"));
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  mode: hsdp\n  shard_group_size: two\n", 5,
                        "parallel.shard_group_size", "must be an integer, got two"));
}

TEST(ConfigHsdpTest, GroupSizeWithoutHsdpIsRejected) {
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  mode: fsdp\n  shard_group_size: 2\n", 5,
                        "parallel.shard_group_size",
                        "is for parallel.mode hsdp only (mode is fsdp)"));
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  shard_group_size: 2\n", 4,
                        "parallel.shard_group_size", "(mode is ddp)"));
}

TEST(ConfigHsdpTest, Bf16GradientsAreRejected) {
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  mode: hsdp\n  shard_group_size: 2\n"
                                "  grad_reduce: bf16\n",
                        6, "parallel.grad_reduce",
                        "bf16 is not supported with parallel.mode hsdp"));
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  mode: hsdp\n  shard_group_size: 2\n"
                                "  ddp_allreduce: copy_engine\n",
                        6, "parallel.ddp_allreduce", "copy_engine is for parallel.mode ddp"));
}

}  // namespace
}  // namespace forge
