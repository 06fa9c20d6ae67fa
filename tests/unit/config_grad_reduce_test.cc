// `parallel.grad_reduce` in the run config: the default, both values, the YAML round trip, and
// errors with file:line (a bad value; bf16 with fsdp, whose reduce-scatters stay fp32).
#include <gtest/gtest.h>

#include <string>

#include "common/config.h"

namespace forge {
namespace {

const std::string kBase = "model:\n  preset: tiny\n";  // lines 1-2

RunConfig ParseOk(const std::string& yaml) {
  StatusOr<RunConfig> r = ParseRunConfig(yaml, "f.yaml");
  EXPECT_TRUE(r.ok()) << r.status().ToString() << "\n--- yaml:\n" << yaml;
  return r.ok() ? r.value() : RunConfig{};
}

// The error message must be exactly "f.yaml:<line>: <path>: ..." and contain `what`.
::testing::AssertionResult FailsAt(const std::string& yaml, int line, const std::string& path,
                                   const std::string& what) {
  StatusOr<RunConfig> r = ParseRunConfig(yaml, "f.yaml");
  if (r.ok()) return ::testing::AssertionFailure() << "parsed fine:\n" << yaml;
  if (r.status().code() != Code::kInvalidArgument) {
    return ::testing::AssertionFailure() << "code: " << r.status().ToString();
  }
  const std::string& msg = r.status().message();
  const std::string prefix = "f.yaml:" + std::to_string(line) + ": " + path + ": ";
  if (msg.rfind(prefix, 0) != 0 || msg.find(what) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message '" << msg << "' does not start with '" << prefix << "' and contain '"
           << what << "'";
  }
  return ::testing::AssertionSuccess();
}

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
  EXPECT_TRUE(FailsAt(kBase + "parallel:\n  grad_reduce: fp16\n", 4, "parallel.grad_reduce",
                      "must be one of fp32|bf16, got fp16"));
  EXPECT_TRUE(FailsAt(kBase + "parallel:\n  mode: ddp\n  grad_reduce: [bf16]\n", 5,
                      "parallel.grad_reduce", "must be one of fp32|bf16, got a sequence"));
  EXPECT_TRUE(FailsAt(kBase + "parallel:\n  grad_reduce: bf16\n  gradreduce: bf16\n", 5,
                      "parallel.gradreduce", "unknown key"));
}

TEST(ConfigGradReduceTest, Bf16WithFsdpIsRejected) {
  EXPECT_TRUE(FailsAt(kBase + "parallel:\n  mode: fsdp\n  grad_reduce: bf16\n", 5,
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
