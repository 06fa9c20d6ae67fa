// `precision.fp8` in the run config: defaults, every key, the YAML round trip, and strict-key
// errors with file:line like the rest of the config.
#include <gtest/gtest.h>

#include <string>

#include "common/config.h"
#include "config_test_util.h"

namespace forge {
namespace {

const std::string kBase = "model:\n  preset: tiny\n";  // lines 1-2

using test::FailsWith;
using test::ParseOk;

TEST(ConfigFp8Test, Defaults) {
  const RunConfig c = ParseOk(kBase);
  EXPECT_EQ(c.precision.fp8.recipe, Fp8Recipe::kDelayed);
  EXPECT_EQ(c.precision.fp8.amax_history, 16);
  EXPECT_EQ(c.precision.fp8.margin, 0);
  EXPECT_FALSE(c.precision.fp8.lm_head);
  EXPECT_EQ(c.precision.fp8.fast_accum, Fp8FastAccum::kFpropDgrad);
  // An empty fp8 section keeps them too.
  const RunConfig e = ParseOk(kBase + "precision:\n  compute: fp8\n  fp8:\n");
  EXPECT_EQ(e.precision.compute, Precision::kFp8);
  EXPECT_EQ(e.precision.fp8.amax_history, 16);
}

TEST(ConfigFp8Test, EveryKeyIsRead) {
  const RunConfig c = ParseOk(kBase +
                              "precision:\n"
                              "  compute: fp8\n"
                              "  fp8:\n"
                              "    recipe: current\n"
                              "    amax_history: 1\n"
                              "    margin: 3\n"
                              "    lm_head: true\n"
                              "    fast_accum: fprop_dgrad\n");
  EXPECT_EQ(c.precision.fp8.recipe, Fp8Recipe::kCurrent);
  EXPECT_EQ(c.precision.fp8.fast_accum, Fp8FastAccum::kFpropDgrad);
  EXPECT_STREQ(Fp8FastAccumName(Fp8FastAccum::kFprop), "fprop");
  EXPECT_EQ(c.precision.fp8.amax_history, 1);
  EXPECT_EQ(c.precision.fp8.margin, 3);
  EXPECT_TRUE(c.precision.fp8.lm_head);
  EXPECT_STREQ(Fp8RecipeName(Fp8Recipe::kDelayed), "delayed");
  EXPECT_STREQ(Fp8RecipeName(Fp8Recipe::kCurrent), "current");
}

TEST(ConfigFp8Test, YamlRoundTrip) {
  RunConfig c = ParseOk(kBase);
  c.precision.compute = Precision::kFp8;
  c.precision.fp8.recipe = Fp8Recipe::kCurrent;
  c.precision.fp8.amax_history = 1024;
  c.precision.fp8.margin = 32;
  c.precision.fp8.lm_head = true;
  c.precision.fp8.fast_accum = Fp8FastAccum::kFprop;
  const std::string yaml = RunConfigToYaml(c);
  EXPECT_NE(yaml.find("  fp8:\n    recipe: current\n"), std::string::npos) << yaml;
  const RunConfig back = ParseOk(yaml);
  EXPECT_EQ(RunConfigToYaml(back), yaml);
  EXPECT_EQ(back.precision.fp8.recipe, Fp8Recipe::kCurrent);
  EXPECT_EQ(back.precision.fp8.amax_history, 1024);
  EXPECT_EQ(back.precision.fp8.margin, 32);
  EXPECT_TRUE(back.precision.fp8.lm_head);
  EXPECT_EQ(back.precision.fp8.fast_accum, Fp8FastAccum::kFprop);
}

TEST(ConfigFp8Test, StrictKeysWithLines) {
  const std::string p = kBase + "precision:\n  compute: fp8\n  fp8:\n";  // fp8: on line 5
  EXPECT_TRUE(FailsWith(p + "    recipe: delayed\n    amax_histroy: 8\n", 7,
                      "precision.fp8.amax_histroy", "did you mean 'amax_history'?"));
  EXPECT_TRUE(FailsWith(p + "    window: 8\n", 6, "precision.fp8.window",
                      "valid keys of precision.fp8: recipe, amax_history, margin, lm_head, "
                      "fast_accum"));
  EXPECT_TRUE(FailsWith(p + "    margin: 0\n    margin: 1\n", 7, "precision.fp8.margin",
                      "duplicate key (first given on line 6)"));
  // The old flat spellings are unknown keys of precision.
  EXPECT_TRUE(FailsWith(kBase + "precision:\n  fp8_margin: 1\n", 4, "precision.fp8_margin",
                      "unknown key"));
  EXPECT_TRUE(FailsWith(kBase + "precision:\n  fp8: 3\n", 4, "precision.fp8",
                      "must be a mapping of keys, got 3"));
}

TEST(ConfigFp8Test, BadValuesWithLines) {
  const std::string p = kBase + "precision:\n  fp8:\n";  // fp8: on line 4
  EXPECT_TRUE(FailsWith(p + "    recipe: jit\n", 5, "precision.fp8.recipe",
                      "must be one of delayed|current, got jit"));
  EXPECT_TRUE(FailsWith(p + "    amax_history: 0\n", 5, "precision.fp8.amax_history",
                      "must be in [1, 1024], got 0"));
  EXPECT_TRUE(FailsWith(p + "    amax_history: 1025\n", 5, "precision.fp8.amax_history",
                      "must be in [1, 1024], got 1025"));
  EXPECT_TRUE(FailsWith(p + "    amax_history: 2.5\n", 5, "precision.fp8.amax_history",
                      "must be an integer, got 2.5"));
  EXPECT_TRUE(FailsWith(p + "    margin: -1\n", 5, "precision.fp8.margin",
                      "must be in [0, 32], got -1"));
  EXPECT_TRUE(FailsWith(p + "    margin: 0.5\n", 5, "precision.fp8.margin",
                      "must be an integer, got 0.5"));
  EXPECT_TRUE(FailsWith(p + "    lm_head: maybe\n", 5, "precision.fp8.lm_head",
                      "must be true or false, got maybe"));
  EXPECT_TRUE(FailsWith(p + "    fast_accum: all\n", 5, "precision.fp8.fast_accum",
                      "must be one of none|fprop|fprop_dgrad, got all"));
  // ValidateRunConfig applies the same rules to a config built in code.
  RunConfig c = ParseOk(kBase);
  c.precision.fp8.margin = 33;
  const Status st = ValidateRunConfig(c);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("precision.fp8.margin: must be in [0, 32], got 33"),
            std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace forge
