// `parallel.grad_reduce` in the run config: the default, both values, the YAML round trip, and
// errors with file:line (a bad value; bf16 with fsdp, whose reduce-scatters stay fp32).
#include <gtest/gtest.h>

#include <string>

#include "common/config.h"
#include "config_test_util.h"

namespace forge {
namespace {

const std::string kBase = "model:\n  preset: tiny\n";  // lines 1-2

using test::FailsWith;
using test::ParseOk;

TEST(ConfigGradReduceTest, DefaultIsFp32) {
  EXPECT_EQ(ParseOk(kBase).parallel.grad_reduce, GradReduce::kFp32);
  EXPECT_EQ(ParseOk(kBase + "parallel:\n  mode: zero1\n").parallel.grad_reduce,
            GradReduce::kFp32);
}

TEST(ConfigGradReduceTest, ReadsBothValues) {
  for (const char* mode : {"ddp", "zero1", "zero2"}) {
    const RunConfig c = ParseOk(kBase + "parallel:\n  mode: " + mode + "\n  grad_reduce: bf16\n");
    EXPECT_EQ(c.parallel.grad_reduce, GradReduce::kBf16) << mode;
  }
  EXPECT_EQ(ParseOk(kBase + "parallel:\n  grad_reduce: fp32\n").parallel.grad_reduce,
            GradReduce::kFp32);
  // fsdp with the default (fp32) is fine.
  EXPECT_EQ(ParseOk(kBase + "parallel:\n  mode: fsdp\n  grad_reduce: fp32\n").parallel.mode,
            ParallelMode::kFsdp);
  EXPECT_STREQ(GradReduceName(GradReduce::kFp32), "fp32");
  EXPECT_STREQ(GradReduceName(GradReduce::kBf16), "bf16");
}

TEST(ConfigGradReduceTest, YamlRoundTrip) {
  RunConfig c = ParseOk(kBase);
  c.parallel.mode = ParallelMode::kZero2;
  c.parallel.grad_reduce = GradReduce::kBf16;
  const std::string yaml = RunConfigToYaml(c);
  EXPECT_NE(yaml.find("parallel:\n  mode: zero2\n  grad_reduce: bf16\n"), std::string::npos)
      << yaml;
  const RunConfig back = ParseOk(yaml);
  EXPECT_EQ(back.parallel.grad_reduce, GradReduce::kBf16);
  EXPECT_EQ(RunConfigToYaml(back), yaml);
}

TEST(ConfigGradReduceTest, BadValueNamesKeyAndLine) {
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  grad_reduce: fp16\n", 4, "parallel.grad_reduce",
                      "must be one of fp32|bf16, got fp16"));
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  mode: ddp\n  grad_reduce: [bf16]\n", 5,
                      "parallel.grad_reduce", "must be one of fp32|bf16, got a sequence"));
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  grad_reduce: bf16\n  gradreduce: bf16\n", 5,
                      "parallel.gradreduce", "unknown key"));
}

TEST(ConfigGradReduceTest, Bf16WithFsdpIsRejected) {
  EXPECT_TRUE(FailsWith(kBase + "parallel:\n  mode: fsdp\n  grad_reduce: bf16\n", 5,
                      "parallel.grad_reduce", "bf16 is not supported with parallel.mode fsdp"));
  RunConfig c = ParseOk(kBase);
  c.parallel.mode = ParallelMode::kFsdp;
  c.parallel.grad_reduce = GradReduce::kBf16;
  const Status s = ValidateRunConfig(c);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("parallel.grad_reduce"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace forge
