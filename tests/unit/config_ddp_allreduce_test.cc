// `parallel.ddp_allreduce` in the run config: the default, both values, the YAML round trip, and
// errors with file:line (a bad value; copy_engine outside ddp or with bf16 gradients).
#include <gtest/gtest.h>

#include <string>

#include <cstdlib>

#include "common/config.h"
#include "config_test_util.h"
#include "worker/parallel/nccl_comm.h"

namespace forge {
namespace {

const std::string kBase = "model:\n  preset: tiny\n";  // lines 1-2

using test::FailsWith;
using test::ParseOk;

TEST(ConfigDdpAllReduceTest, DefaultIsNccl) {
  EXPECT_EQ(ParseOk(kBase).parallel.ddp_allreduce, DdpAllReduce::kNccl);
  EXPECT_EQ(ParseOk(kBase + "parallel:\n  mode: fsdp\n").parallel.ddp_allreduce,
            DdpAllReduce::kNccl);
}

TEST(ConfigDdpAllReduceTest, ReadsBothValues) {
  const RunConfig c = ParseOk(kBase + "parallel:\n  mode: ddp\n  ddp_allreduce: copy_engine\n");
  EXPECT_EQ(c.parallel.ddp_allreduce, DdpAllReduce::kCopyEngine);
  EXPECT_EQ(ParseOk(kBase + "parallel:\n  ddp_allreduce: nccl\n").parallel.ddp_allreduce,
            DdpAllReduce::kNccl);
  EXPECT_STREQ(DdpAllReduceName(DdpAllReduce::kNccl), "nccl");
  EXPECT_STREQ(DdpAllReduceName(DdpAllReduce::kCopyEngine), "copy_engine");
}

TEST(ConfigDdpAllReduceTest, YamlRoundTrip) {
  RunConfig c = ParseOk(kBase);
  c.parallel.ddp_allreduce = DdpAllReduce::kCopyEngine;
  const std::string yaml = RunConfigToYaml(c);
  EXPECT_NE(yaml.find("  grad_reduce: fp32\n  ddp_allreduce: copy_engine\n"), std::string::npos)
      << yaml;
  const RunConfig back = ParseOk(yaml);
  EXPECT_EQ(back.parallel.ddp_allreduce, DdpAllReduce::kCopyEngine);
  EXPECT_EQ(RunConfigToYaml(back), yaml);
}

TEST(ConfigDdpAllReduceTest, BadValueNamesKeyAndLine) {
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  ddp_allreduce: nvlink\n", 4,
                        "parallel.ddp_allreduce", "must be one of nccl|copy_engine, got nvlink"));
}

TEST(ConfigDdpAllReduceTest, CopyEngineOnlyForDdpWithFp32Gradients) {
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  mode: zero1\n  ddp_allreduce: copy_engine\n", 5,
                        "parallel.ddp_allreduce", "copy_engine is for parallel.mode ddp"));
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  grad_reduce: bf16\n  ddp_allreduce: copy_engine\n",
                        5, "parallel.ddp_allreduce", "copy_engine sums fp32 gradients"));
}

// What a process that uses copy_engine does before its first CUDA call: 32 hardware queues,
// unless the user chose a number.
TEST(ConfigDdpAllReduceTest, CopyEngineReservesQueuesUnlessSet) {
  const char* before = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const std::string saved = before ? before : "";
  unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  ReserveCudaQueuesForCopyEngine();
  ASSERT_NE(std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"), nullptr);
  EXPECT_STREQ(std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"), "32");
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "4", 1);
  ReserveCudaQueuesForCopyEngine();
  EXPECT_STREQ(std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"), "4");
  if (before) {
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", saved.c_str(), 1);
  } else {
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  }
}

}  // namespace
}  // namespace forge
