// An exported Hugging Face directory computes Forge's model: scripts/hf_llama_numpy.py (a NumPy
// Llama written from transformers' conventions: rotate-half RoPE from config.json, repeat_kv,
// float32 RMSNorm, safetensors parsed by hand) reads the directory and must reproduce the
// logits of the training model (CpuModel::ForwardLogits) and the greedy tokens of the KV-cache
// generator, for the tiny config (head_dim 32), a GQA config, a head_dim-64 config, an untied
// LM head, Llama 3.1 RoPE scaling, a head_dim apart from d_model / n_head, and all of those at
// once, in F32 and in BF16. Needs python3 with numpy (python3-numpy); skips without it.
//
// FORGE_HF_BIG=1 adds gpt350m- and llama3-1b-shaped models (random weights; minutes and ~15 GB
// of memory, not for CI).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../unit/hf_test_util.h"
#include "worker/hf/hf_export.h"
#include "worker/infer/decode_backend.h"
#include "worker/infer/generate.h"
#include "worker/model/cpu_model.h"
#include "../common/run_command.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using hf_test::Model;

// The Python with NumPy: Debian's (python3-numpy installs there), else the first python3.
std::string Python() {
  for (const char* p : {"/usr/bin/python3", "python3"}) {
    const std::string cmd = std::string(p) + " -c 'import numpy' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return p;
  }
  return "";
}

// Standard output; standard error goes where the test's does.
std::string Run(const std::string& cmd, int* rc) {
  test::CommandResult r = test::RunCommand(cmd, "", test::Stderr::kInherited);
  *rc = r.exit_code;
  return r.out;
}

std::vector<int32_t> Tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    t[i] = int32_t((seed >> 8) % uint32_t(vocab));
  }
  return t;
}

struct Case {
  const char* name;
  ModelConfig m;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  double tol_rel = 1e-4;
  std::vector<int> prompt_lengths = {5, 11, 17};
  int new_tokens = 6;
};

// Exports `c` and compares with the NumPy model. `rounded`: Forge computes on the weights as
// the file holds them (bf16-rounded for a BF16 export), so the only difference left is the two
// implementations' float32 arithmetic; else on its own float32 weights (the BF16 export's own
// error, no greedy check).
nlohmann::json Compare(const Case& c, bool rounded, const std::string& python) {
  const std::string dir = hf_test::TempDir(std::string("numpy_") + c.name + (rounded ? "_r" : ""));
  UnitBuffers p = hf_test::Params(c.m, 31);
  hf::HfExportOptions opt;
  opt.dtype = c.dtype;
  auto sum = hf::ExportHfDirectory(c.m, p, dir + "/model", opt);
  EXPECT_TRUE(sum.ok()) << sum.status().ToString();
  if (rounded && c.dtype == SafetensorsDtype::kBF16)
    for (auto& u : p)
      for (float& x : u) x = Bf16ToFloat(FloatToBf16(x));

  std::vector<std::vector<int32_t>> prompts;
  std::vector<float> logits;  // the training model's, real vocabulary columns
  const int V = c.m.padded_vocab();
  for (size_t i = 0; i < c.prompt_lengths.size(); ++i) {
    prompts.push_back(Tokens(c.prompt_lengths[i], c.m.vocab, 7 + uint32_t(i)));
    ModelConfig mt = c.m;
    mt.seq_len = c.prompt_lengths[i];
    CpuModel model(mt, 1);
    std::vector<float> full(size_t(mt.seq_len) * V);
    model.ForwardLogits(p, prompts.back().data(), 1, full.data());
    for (int t = 0; t < mt.seq_len; ++t)
      logits.insert(logits.end(), full.begin() + size_t(t) * V, full.begin() + size_t(t) * V + c.m.vocab);
  }
  GenerateOptions g;
  g.max_new_tokens = c.new_tokens;
  const std::string dump = dir + "/dump.safetensors";
  {  // the weights are not needed past here: the backend takes them (large models)
    auto backend = MakeCpuDecodeBackend(c.m, std::move(p));
    auto gens = Generate(backend.get(), prompts, g);
    EXPECT_TRUE(gens.ok()) << gens.status().ToString();
    EXPECT_TRUE(WriteGenerationDump(dump, *gens, logits, c.m.vocab, g).ok());
  }

  const double tol = rounded ? 1e-4 : c.tol_rel;
  int rc = 0;
  const std::string out =
      Run(python + " " + FORGE_SOURCE_DIR + "/scripts/hf_llama_numpy.py compare " + dir +
              "/model " + dump + " --tol-rel " + std::to_string(tol) +
              (rounded ? "" : " --no-greedy"),
          &rc);
  EXPECT_EQ(rc, 0) << out;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(out);
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << "not JSON: " << out;
  }
  std::printf("%-10s %-4s %-9s max_abs %.3g max_rel %.3g (max |logit| %.3g) greedy %s\n", c.name,
              c.dtype == SafetensorsDtype::kBF16 ? "bf16" : "f32",
              rounded ? "same-w" : "fp32-w", j.value("max_abs", -1.0), j.value("max_rel", -1.0),
              j.value("max_logit", -1.0),
              j.value("greedy_checked", false) ? (j.value("greedy_equal", false) ? "equal" : "DIFFER")
                                               : "-");
  fs::remove_all(dir);
  return j;
}

class HfNumpyAgreement : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    python_ = Python();
    if (python_.empty()) GTEST_SKIP() << "no python3 with numpy (apt-get install python3-numpy)";
  }
  std::string python_;
};

TEST_P(HfNumpyAgreement, LogitsAndGreedyTokensMatch) {
  const Case& c = GetParam();
  const nlohmann::json same = Compare(c, /*rounded=*/true, python_);
  EXPECT_TRUE(same.value("ok", false));
  EXPECT_TRUE(same.value("greedy_equal", false));
  EXPECT_EQ(same.value("prompts", 0), int(c.prompt_lengths.size()));
  if (c.dtype == SafetensorsDtype::kBF16) {
    const nlohmann::json fp32 = Compare(c, /*rounded=*/false, python_);
    EXPECT_TRUE(fp32.value("ok", false));
  }
}

ModelConfig Tiny() {
  ModelConfig m;
  EXPECT_TRUE(ApplyModelPreset("tiny", &m).ok());
  return m;
}

ModelConfig Untied(ModelConfig m) {
  m.tie_embeddings = false;
  return m;
}

ModelConfig HeadDim(ModelConfig m, int hd) {
  m.explicit_head_dim = hd;
  return m;
}

// Llama 3.1 scaling over 16 original positions, so the prompts (up to 23 positions) reach past
// it: pair 0 (wavelength 2 pi) is blended, every other pair divided by the factor.
ModelConfig Llama3Scaling(ModelConfig m) {
  m.rope_theta = 500000.0f;
  m.rope_scaling.type = RopeScalingType::kLlama3;
  m.rope_scaling.factor = 8.0f;
  m.rope_scaling.low_freq_factor = 1.0f;
  m.rope_scaling.high_freq_factor = 4.0f;
  m.rope_scaling.original_max_position_embeddings = 16;
  return m;
}

INSTANTIATE_TEST_SUITE_P(
    Models, HfNumpyAgreement,
    ::testing::Values(Case{"tiny", Tiny()},
                      Case{"tiny_bf16", Tiny(), SafetensorsDtype::kBF16, 5e-2},
                      Case{"gqa4to1", Model(2, 256, 8, 2, 512, 4096, 64)},
                      Case{"hd64", Model(2, 256, 4, 4, 640, 4096, 64)},
                      Case{"hd64_gqa", Model(2, 512, 8, 2, 1024, 4096, 64), SafetensorsDtype::kBF16, 5e-2},
                      Case{"untied", Untied(Model(2, 128, 4, 2, 256, 1000, 64))},
                      Case{"llama3_rope", Llama3Scaling(Model(2, 256, 4, 2, 512, 1000, 64))},
                      Case{"hd48_over_d128", HeadDim(Model(2, 128, 4, 2, 256, 1000, 64), 48)},
                      Case{"all_knobs",
                           Llama3Scaling(Untied(HeadDim(Model(2, 96, 6, 2, 256, 1000, 64), 64))),
                           SafetensorsDtype::kBF16, 5e-2}),
    [](const auto& info) { return std::string(info.param.name); });

// gpt350m- and llama3-1b-shaped models, by hand: FORGE_HF_BIG=1.
TEST(HfNumpyAgreementBig, PublishedShapes) {
  const char* big = std::getenv("FORGE_HF_BIG");
  if (big == nullptr || std::string(big) != "1") GTEST_SKIP() << "set FORGE_HF_BIG=1";
  const std::string python = Python();
  if (python.empty()) GTEST_SKIP() << "no python3 with numpy";
  ModelConfig gpt350m;
  ASSERT_TRUE(ApplyModelPreset("gpt350m", &gpt350m).ok());
  // Llama 3.2 1B (the llama3-1b preset): 16 x 2048, 32 heads over 8 KV heads (head_dim 64),
  // ffn 8192, vocab 128256, tied, rope_theta 500000 with llama3 scaling (factor 32).
  ModelConfig llama;
  ASSERT_TRUE(ApplyModelPreset("llama3-1b", &llama).ok());
  llama.seq_len = 2048;
  for (const Case& c : {Case{"gpt350m", gpt350m, SafetensorsDtype::kF32, 1e-4, {9, 23}, 4},
                        Case{"llama3-1b", llama, SafetensorsDtype::kBF16, 5e-2, {9, 23}, 4}}) {
    const nlohmann::json j = Compare(c, true, python);
    EXPECT_TRUE(j.value("ok", false)) << c.name;
  }
}

}  // namespace
}  // namespace forge
