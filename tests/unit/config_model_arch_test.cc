// The model-architecture keys: model.head_dim, model.tie_embeddings, model.rope_scaling and the
// llama3 presets (their published shapes), with their checks and the YAML round trip.
#include <gtest/gtest.h>

#include <string>

#include "common/config.h"
#include "config_test_util.h"
#include "worker/model/param_layout.h"

namespace forge {
namespace {

using test::FailsWith;
using test::ParseOk;

const std::string kTiny = "model:\n  preset: tiny\n";

TEST(ConfigModelArch, DefaultsAreTheGpt2ShapedModel) {
  const RunConfig c = ParseOk(kTiny);
  EXPECT_EQ(c.model.explicit_head_dim, 0);
  EXPECT_EQ(c.model.head_dim(), 32);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.model.rope_scaling.type, RopeScalingType::kNone);
}

TEST(ConfigModelArch, HeadDimIsIndependentOfDModel) {
  const RunConfig c = ParseOk(kTiny + "  head_dim: 64\n");
  EXPECT_EQ(c.model.head_dim(), 64);  // attention width 4 x 64 = 256 over d_model 128
  const ParamLayout p = MakeParamLayout(c.model);
  EXPECT_EQ(p.units[1].tensors[1].shape, (std::vector<int64_t>{(4 + 8) * 64, 128}));  // wqkv
  EXPECT_EQ(p.units[1].tensors[2].shape, (std::vector<int64_t>{128, 4 * 64}));        // wo
  // With head_dim given, n_head need not divide d_model.
  EXPECT_EQ(ParseOk(kTiny + "  n_head: 3\n  head_dim: 16\n").model.head_dim(), 16);
  // A preset sets head_dim back to d_model / n_head; a head_dim written anywhere wins.
  EXPECT_EQ(ParseOk("model:\n  head_dim: 16\n  preset: gpt124m\n").model.head_dim(), 16);
  ModelConfig m;
  m.explicit_head_dim = 16;
  ASSERT_TRUE(ApplyModelPreset("gpt124m", &m).ok());
  EXPECT_EQ(m.head_dim(), 64);
}

TEST(ConfigModelArch, HeadDimErrorsNameTheKey) {
  EXPECT_TRUE(FailsWith(kTiny + "  head_dim: 7\n", 3, "model.head_dim", "must be even for RoPE, got 7"));
  EXPECT_TRUE(FailsWith(kTiny + "  head_dim: -4\n", 3, "model.head_dim", "must be >= 2, got -4"));
  EXPECT_TRUE(FailsWith(kTiny + "  head_dim: 1.5\n", 3, "model.head_dim", "integer"));
  EXPECT_TRUE(FailsWith(kTiny + "  n_head: 3\n", 3, "model.n_head",
                        "must divide model.d_model (128), got 3 (or give model.head_dim)"));
}

TEST(ConfigModelArch, UntiedHeadIsATensorOfTheFinalUnit) {
  const RunConfig c = ParseOk(kTiny + "  tie_embeddings: false\n");
  EXPECT_FALSE(c.model.tie_embeddings);
  const ParamLayout tied = MakeParamLayout(ParseOk(kTiny).model);
  const ParamLayout untied = MakeParamLayout(c.model);
  EXPECT_EQ(tied.head_unit, tied.embedding_unit());
  EXPECT_EQ(tied.lm_head, 0);
  ASSERT_EQ(untied.units[0].tensors.size(), 1u);
  const UnitLayout& fin = untied.units[size_t(untied.final_norm_unit())];
  ASSERT_EQ(fin.tensors.size(), 2u);
  EXPECT_EQ(untied.head_unit, untied.final_norm_unit());
  EXPECT_EQ(fin.tensors[1].name, "lm_head");
  EXPECT_EQ(fin.tensors[1].shape, (std::vector<int64_t>{50304, 128}));
  EXPECT_EQ(fin.tensors[1].offset, 128);
  EXPECT_EQ(untied.lm_head, 128);
  EXPECT_EQ(untied.total, tied.total + 50304 * 128);
  // The FLOPs count the LM head's matmul once either way (an untied wte is a lookup).
  EXPECT_EQ(MatmulParamCount(c.model), MatmulParamCount(ParseOk(kTiny).model));
  EXPECT_TRUE(FailsWith(kTiny + "  tie_embeddings: no\n", 3, "model.tie_embeddings",
                        "must be true or false"));
}

TEST(ConfigModelArch, RopeScalingKeys) {
  const RunConfig c =
      ParseOk(kTiny + "  rope_scaling:\n    type: llama3\n    factor: 32\n    low_freq_factor: 2\n"
                      "    high_freq_factor: 8\n    original_max_position_embeddings: 4096\n");
  EXPECT_EQ(c.model.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(c.model.rope_scaling.factor, 32.0f);
  EXPECT_EQ(c.model.rope_scaling.low_freq_factor, 2.0f);
  EXPECT_EQ(c.model.rope_scaling.high_freq_factor, 8.0f);
  EXPECT_EQ(c.model.rope_scaling.original_max_position_embeddings, 4096);
  // Llama 3.1 8B's numbers by default.
  const RunConfig d = ParseOk(kTiny + "  rope_scaling: {type: llama3}\n");
  EXPECT_EQ(d.model.rope_scaling.factor, 8.0f);
  EXPECT_EQ(d.model.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(d.model.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(d.model.rope_scaling.original_max_position_embeddings, 8192);
}

TEST(ConfigModelArch, RopeScalingErrorsNameTheKey) {
  const std::string rs = kTiny + "  rope_scaling:\n";
  EXPECT_TRUE(FailsWith(rs + "    type: yarn\n", 4, "model.rope_scaling.type",
                        "must be one of none|llama3, got yarn"));
  EXPECT_TRUE(FailsWith(rs + "    type: llama3\n    factr: 8\n", 5, "model.rope_scaling.factr",
                        "did you mean 'factor'?"));
  EXPECT_TRUE(FailsWith(rs + "    type: llama3\n    factor: 0.5\n", 5, "model.rope_scaling.factor",
                        "must be >= 1, got 0.5"));
  EXPECT_TRUE(FailsWith(rs + "    type: llama3\n    high_freq_factor: 1\n", 5,
                        "model.rope_scaling.high_freq_factor",
                        "must be > model.rope_scaling.low_freq_factor (1), got 1"));
  EXPECT_TRUE(FailsWith(rs + "    type: llama3\n    original_max_position_embeddings: 0\n", 5,
                        "model.rope_scaling.original_max_position_embeddings",
                        "must be >= 1, got 0"));
  EXPECT_TRUE(FailsWith(kTiny + "  rope_scaling: llama3\n", 3, "model.rope_scaling", "mapping"));
  // Numbers without a scaling type would be silently unused.
  EXPECT_TRUE(FailsWith(rs + "    factor: 32\n", 4, "model.rope_scaling.factor",
                        "given with rope_scaling type none (set type: llama3 to scale RoPE)"));
  EXPECT_TRUE(FailsWith(rs + "    type: none\n    low_freq_factor: 2\n", 5,
                        "model.rope_scaling.low_freq_factor", "given with rope_scaling type none"));
}

TEST(ConfigModelArch, Llama3PresetsHaveThePublishedShapes) {
  struct Want {
    const char* name;
    int n_layer, d_model, n_head, n_kv_head, head_dim, ffn;
    float factor;
    bool tied;
    double params;  // parameters without vocabulary padding
  };
  for (const Want& w : {Want{"llama3-1b", 16, 2048, 32, 8, 64, 8192, 32.0f, true, 1.236e9},
                        Want{"llama3-3b", 28, 3072, 24, 8, 128, 8192, 32.0f, true, 3.213e9},
                        Want{"llama3-8b", 32, 4096, 32, 8, 128, 14336, 8.0f, false, 8.030e9}}) {
    const RunConfig c = ParseOk(std::string("model:\n  preset: ") + w.name + "\n");
    const ModelConfig& m = c.model;
    EXPECT_EQ(m.n_layer, w.n_layer) << w.name;
    EXPECT_EQ(m.d_model, w.d_model) << w.name;
    EXPECT_EQ(m.n_head, w.n_head) << w.name;
    EXPECT_EQ(m.n_kv_head, w.n_kv_head) << w.name;
    EXPECT_EQ(m.head_dim(), w.head_dim) << w.name;
    EXPECT_EQ(m.ffn, w.ffn) << w.name;
    EXPECT_EQ(m.vocab, 128256) << w.name;
    EXPECT_EQ(m.padded_vocab(), 128256) << w.name;  // already a multiple of 128
    EXPECT_EQ(m.seq_len, 8192) << w.name;
    EXPECT_EQ(m.rope_theta, 500000.0f) << w.name;
    EXPECT_EQ(m.rope_scaling.type, RopeScalingType::kLlama3) << w.name;
    EXPECT_EQ(m.rope_scaling.factor, w.factor) << w.name;
    EXPECT_EQ(m.rope_scaling.original_max_position_embeddings, 8192) << w.name;
    EXPECT_EQ(m.tie_embeddings, w.tied) << w.name;
    EXPECT_NEAR(double(MakeParamLayout(m).total), w.params, 0.001e9) << w.name;
  }
  // Overrides still apply after the preset.
  const RunConfig c = ParseOk("model:\n  preset: llama3-8b\n  n_layer: 2\n  tie_embeddings: true\n");
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_TRUE(c.model.tie_embeddings);
}

TEST(ConfigModelArch, YamlRoundTripKeepsEveryKnob) {
  RunConfig c = ParseOk("model:\n  preset: llama3-8b\n  head_dim: 96\n  qk_norm: true\n"
                        "  rope_scaling: {type: llama3, factor: 4.5, low_freq_factor: 1.5, "
                        "high_freq_factor: 6, original_max_position_embeddings: 2048}\n");
  const std::string yaml = RunConfigToYaml(c);
  EXPECT_NE(yaml.find("  head_dim: 96\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  tie_embeddings: false\n"), std::string::npos) << yaml;
  const RunConfig back = ParseOk(yaml);
  EXPECT_EQ(RunConfigToYaml(back), yaml);
  EXPECT_EQ(back.model.head_dim(), 96);
  EXPECT_FALSE(back.model.tie_embeddings);
  EXPECT_EQ(back.model.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(back.model.rope_scaling.factor, 4.5f);
  EXPECT_EQ(back.model.rope_scaling.low_freq_factor, 1.5f);
  EXPECT_EQ(back.model.rope_scaling.high_freq_factor, 6.0f);
  EXPECT_EQ(back.model.rope_scaling.original_max_position_embeddings, 2048);
  // The defaults print too (what --print-config shows), and read back to the same model.
  const std::string tiny = RunConfigToYaml(ParseOk(kTiny));
  EXPECT_NE(tiny.find("  head_dim: 32\n"), std::string::npos) << tiny;
  EXPECT_NE(tiny.find("  rope_scaling:\n    type: none\n  norm_eps:"), std::string::npos) << tiny;
  EXPECT_NE(tiny.find("  tie_embeddings: true\n"), std::string::npos) << tiny;
  EXPECT_EQ(RunConfigToYaml(ParseOk(tiny)), tiny);
}

}  // namespace
}  // namespace forge
