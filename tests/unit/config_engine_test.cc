// The `engine:` section of the run config: defaults (the fastest measured settings), every key
// read, the YAML round trip, and errors with file:line and the key path.
#include <gtest/gtest.h>

#include <string>

#include "common/config.h"
#include "config_test_util.h"

namespace forge {
namespace {

const std::string kBase = "model:\n  preset: tiny\n";  // lines 1-2

using test::FailsWith;
using test::ParseOk;

TEST(ConfigEngineTest, Defaults) {
  const EngineConfig e = ParseOk(kBase).engine;
  EXPECT_TRUE(e.cuda_graph);
  EXPECT_TRUE(e.deterministic_attention);
  EXPECT_EQ(e.attention_backward, AttentionBackward::kFlash);
  EXPECT_EQ(e.lm_head_chunk, 4096);
  EXPECT_TRUE(e.wgrad_stream);
  EXPECT_EQ(e.wgrad_sm_margin, -1);
  EXPECT_TRUE(e.fused_epilogues);
  EXPECT_FALSE(e.gemm_autotune);
  EXPECT_TRUE(e.nccl_symmetric_memory);
}

TEST(ConfigEngineTest, ReadsEveryKeyAndRoundTrips) {
  const RunConfig c = ParseOk(kBase +
                              "engine:\n"
                              "  cuda_graph: false\n"
                              "  deterministic_attention: false\n"
                              "  attention_backward: cudnn\n"
                              "  lm_head_chunk: 1024\n"
                              "  wgrad_stream: false\n"
                              "  wgrad_sm_margin: 0\n"
                              "  fused_epilogues: false\n"
                              "  gemm_autotune: true\n"
                              "  nccl_symmetric_memory: false\n");
  const EngineConfig& e = c.engine;
  EXPECT_FALSE(e.cuda_graph);
  EXPECT_FALSE(e.deterministic_attention);
  EXPECT_EQ(e.attention_backward, AttentionBackward::kCudnn);
  EXPECT_EQ(e.lm_head_chunk, 1024);
  EXPECT_FALSE(e.wgrad_stream);
  EXPECT_EQ(e.wgrad_sm_margin, 0);
  EXPECT_FALSE(e.fused_epilogues);
  EXPECT_TRUE(e.gemm_autotune);
  EXPECT_FALSE(e.nccl_symmetric_memory);
  const RunConfig back = ParseOk(RunConfigToYaml(c));
  EXPECT_EQ(RunConfigToYaml(back), RunConfigToYaml(c));
  EXPECT_EQ(back.engine.attention_backward, AttentionBackward::kCudnn);
  EXPECT_EQ(back.engine.lm_head_chunk, 1024);
}

TEST(ConfigEngineTest, ErrorsNameTheKeyAndLine) {
  EXPECT_TRUE(FailsWith(kBase + "engine:\n  attention_backward: fast\n", 4,
                        "engine.attention_backward", "flash|cudnn"));
  EXPECT_TRUE(FailsWith(kBase + "engine:\n  lm_head_chunk: 0\n", 4, "engine.lm_head_chunk", ""));
  EXPECT_TRUE(FailsWith(kBase + "engine:\n  wgrad_sm_margin: -2\n", 4, "engine.wgrad_sm_margin",
                        ""));
  EXPECT_TRUE(FailsWith(kBase + "engine:\n  cuda_grap: false\n", 4, "engine.cuda_grap",
                        "cuda_graph"));
  EXPECT_TRUE(FailsWith(kBase + "engine:\n  nccl_symmetric_memory: maybe\n", 4,
                        "engine.nccl_symmetric_memory", ""));
}

}  // namespace
}  // namespace forge
