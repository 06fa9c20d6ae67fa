#include "worker/hf/llama_config.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "common/json_parse.h"

namespace forge::hf {
namespace {

using json = nlohmann::json;

// Keys that describe the checkpoint or the library that wrote it, not the computation.
const std::set<std::string> kIgnoredKeys = {
    "_name_or_path",     "transformers_version", "initializer_range", "use_cache",
    "pretraining_tp",    "pad_token_id",         "torch_dtype",       "dtype",
    "output_attentions", "output_hidden_states", "return_dict",       "tokenizer_class",
    "bos_token_id",      "eos_token_id"};

// Keys Forge reads (the rest of the known ones are checked one by one below).
const std::set<std::string> kReadKeys = {
    "architectures",       "model_type",          "hidden_size",
    "intermediate_size",   "num_hidden_layers",   "num_attention_heads",
    "num_key_value_heads", "head_dim",            "vocab_size",
    "max_position_embeddings", "rope_theta",      "rope_scaling",
    "rope_parameters",     "rms_norm_eps",        "tie_word_embeddings",
    "hidden_act",          "attention_bias",      "mlp_bias",
    "attention_dropout",   "sliding_window",      "use_sliding_window"};

// bos_token_id (null for none) and eos_token_id (a number, a list of several, or null), as
// config.json and generation_config.json both hold them.
void PutTokenIds(const LlamaConfig& c, json* j) {
  (*j)["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.size() == 1) (*j)["eos_token_id"] = c.eos_token_ids[0];
  else if (c.eos_token_ids.empty()) (*j)["eos_token_id"] = nullptr;
  else (*j)["eos_token_id"] = c.eos_token_ids;
}

}  // namespace

double ShortestDecimal(float x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

LlamaConfig LlamaConfigFromModel(const ModelConfig& m) {
  LlamaConfig c;
  for (const LlamaDimension& d : kLlamaDimensions) c.*d.hf = m.*d.forge;
  c.head_dim = m.head_dim();
  c.max_position_embeddings = m.seq_len;
  c.rope_theta = ShortestDecimal(m.rope_theta);
  if (m.rope_scaling.type == RopeScalingType::kLlama3) {
    Llama3RopeScaling s;
    s.factor = ShortestDecimal(m.rope_scaling.factor);
    s.low_freq_factor = ShortestDecimal(m.rope_scaling.low_freq_factor);
    s.high_freq_factor = ShortestDecimal(m.rope_scaling.high_freq_factor);
    s.original_max_position_embeddings = m.rope_scaling.original_max_position_embeddings;
    c.rope_scaling = s;
  }
  c.rms_norm_eps = ShortestDecimal(m.norm_eps);
  c.tie_word_embeddings = m.tie_embeddings;
  return c;
}

StatusOr<ModelConfig> ModelFromLlamaConfig(const LlamaConfig& c, const std::string& source) {
  auto unsupported = [&](const std::string& field, const std::string& why) {
    return Status::Invalid(source + ": " + field + ": " + why);
  };
  if (c.num_attention_heads <= 0)
    return unsupported("num_attention_heads", std::to_string(c.num_attention_heads));
  if (c.head_dim < 2 || c.head_dim % 2 != 0)
    return unsupported("head_dim", std::to_string(c.head_dim) + ": RoPE needs pairs");
  ModelConfig m;
  // head_dim is written only where it is not hidden_size / num_attention_heads.
  const bool default_head_dim = c.hidden_size % c.num_attention_heads == 0 &&
                                c.head_dim == c.hidden_size / c.num_attention_heads;
  m.explicit_head_dim = default_head_dim ? 0 : c.head_dim;
  m.tie_embeddings = c.tie_word_embeddings;
  if (c.rope_scaling.has_value()) {
    const Llama3RopeScaling& s = *c.rope_scaling;
    if (!(s.factor >= 1))
      return unsupported("rope_scaling.factor", "must be >= 1, got " + std::to_string(s.factor));
    if (!(s.high_freq_factor > s.low_freq_factor))
      return unsupported("rope_scaling.high_freq_factor",
                         "must be > low_freq_factor (" + std::to_string(s.low_freq_factor) +
                             "), got " + std::to_string(s.high_freq_factor));
    if (s.original_max_position_embeddings < 1 ||
        s.original_max_position_embeddings > std::numeric_limits<int>::max())
      return unsupported("rope_scaling.original_max_position_embeddings",
                         "out of range: " + std::to_string(s.original_max_position_embeddings));
    m.rope_scaling.type = RopeScalingType::kLlama3;
    m.rope_scaling.factor = static_cast<float>(s.factor);
    m.rope_scaling.low_freq_factor = static_cast<float>(s.low_freq_factor);
    m.rope_scaling.high_freq_factor = static_cast<float>(s.high_freq_factor);
    m.rope_scaling.original_max_position_embeddings =
        static_cast<int>(s.original_max_position_embeddings);
  }
  m.preset = "";
  for (const LlamaDimension& d : kLlamaDimensions) m.*d.forge = c.*d.hf;
  m.seq_len = c.max_position_embeddings;
  m.rope_theta = static_cast<float>(c.rope_theta);
  m.norm_eps = static_cast<float>(c.rms_norm_eps);
  m.qk_norm = false;
  if (m.n_kv_head <= 0 || m.n_head % m.n_kv_head != 0)
    return unsupported("num_key_value_heads",
                       std::to_string(m.n_kv_head) + " does not divide num_attention_heads " +
                           std::to_string(m.n_head));
  if (m.n_layer < 1 || m.d_model < 1 || m.ffn < 1 || m.vocab < 2 || m.seq_len < 2)
    return Status::Invalid(source + ": a dimension is out of range (num_hidden_layers " +
                           std::to_string(m.n_layer) + ", hidden_size " +
                           std::to_string(m.d_model) + ", intermediate_size " +
                           std::to_string(m.ffn) + ", vocab_size " + std::to_string(m.vocab) +
                           ", max_position_embeddings " + std::to_string(m.seq_len) + ")");
  return m;
}

std::string LlamaConfigJson(const LlamaConfig& c) {
  json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  for (const LlamaDimension& d : kLlamaDimensions) j[d.hf_name] = c.*d.hf;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling->factor},
                         {"low_freq_factor", c.rope_scaling->low_freq_factor},
                         {"high_freq_factor", c.rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings",
                          c.rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  PutTokenIds(c, &j);
  // transformers 5 reads `dtype`; older readers (and converters) read `torch_dtype`.
  j["dtype"] = c.dtype;
  j["torch_dtype"] = c.dtype;
  return j.dump(2) + "\n";
}

std::string GenerationConfigJson(const LlamaConfig& c) {
  json j;
  PutTokenIds(c, &j);
  j["do_sample"] = false;
  return j.dump(2) + "\n";
}

StatusOr<LlamaConfig> ParseLlamaConfigJson(const std::string& text, const std::string& source) {
  FORGE_ASSIGN_OR_RETURN(json j, ParseJsonObject(text, source));
  auto bad = [&](const std::string& key, const std::string& why) {
    return Status::Invalid(source + ": " + key + ": " + why);
  };
  for (const auto& [key, v] : j.items()) {
    if (!kIgnoredKeys.count(key) && !kReadKeys.count(key))
      return bad(key, "a field Forge does not know (Forge imports Llama models: "
                      "LlamaForCausalLM without biases, sliding windows or quantization)");
  }

  // Types first, so that every later read is safe.
  auto get_int = [&](const std::string& key, bool required, int def, int* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) return bad(key, "missing");
      *out = def;
      return Status::Ok();
    }
    if (!j[key].is_number_integer()) return bad(key, "expected an integer, got " + j[key].dump());
    const int64_t v = j[key].get<int64_t>();
    if (v < 0 || v > (int64_t{1} << 31) - 1) return bad(key, "out of range: " + j[key].dump());
    *out = static_cast<int>(v);
    return Status::Ok();
  };
  auto get_double = [&](const json& obj, const std::string& key, double def,
                        double* out) -> Status {
    if (!obj.contains(key) || obj[key].is_null()) {
      *out = def;
      return Status::Ok();
    }
    if (!obj[key].is_number()) return bad(key, "expected a number, got " + obj[key].dump());
    *out = obj[key].get<double>();
    if (!std::isfinite(*out) || *out <= 0) return bad(key, "must be > 0, got " + obj[key].dump());
    return Status::Ok();
  };
  auto want_false = [&](const std::string& key) -> Status {
    if (!j.contains(key) || j[key].is_null() || j[key] == false) return Status::Ok();
    return bad(key, j[key].dump() + ": Forge's Llama has no " +
                        (key == "attention_bias" ? std::string("attention biases")
                         : key == "mlp_bias"     ? std::string("MLP biases")
                                                 : std::string("sliding-window attention")));
  };

  if (j.contains("architectures")) {
    const json& a = j["architectures"];
    if (!a.is_array() || a.size() != 1 || a[0] != "LlamaForCausalLM")
      return bad("architectures", a.dump() + ": Forge imports [\"LlamaForCausalLM\"] only");
  }
  if (!j.contains("model_type") || j["model_type"] != "llama")
    return bad("model_type", (j.contains("model_type") ? j["model_type"].dump() : "missing") +
                                 ": Forge imports model_type \"llama\" only");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    return bad("hidden_act", j["hidden_act"].dump() + ": Forge's MLP is SwiGLU (silu)");
  FORGE_RETURN_IF_ERROR(want_false("attention_bias"));
  FORGE_RETURN_IF_ERROR(want_false("mlp_bias"));
  FORGE_RETURN_IF_ERROR(want_false("use_sliding_window"));
  if (j.contains("sliding_window") && !j["sliding_window"].is_null())
    return bad("sliding_window", j["sliding_window"].dump() +
                                     ": Forge's attention is over the whole causal context");
  if (j.contains("attention_dropout") && !j["attention_dropout"].is_null() &&
      !(j["attention_dropout"].is_number() && j["attention_dropout"].get<double>() == 0.0))
    return bad("attention_dropout",
               j["attention_dropout"].dump() + ": Forge trains without dropout");

  LlamaConfig c;
  for (const LlamaDimension& d : kLlamaDimensions) {
    // Only num_key_value_heads may be absent: then there is a key/value head per query head
    // (read after num_attention_heads in kLlamaDimensions' order).
    const bool kv_heads = d.hf == &LlamaConfig::num_key_value_heads;
    FORGE_RETURN_IF_ERROR(get_int(d.hf_name, !kv_heads, c.num_attention_heads, &(c.*d.hf)));
  }
  if (c.num_attention_heads == 0) return bad("num_attention_heads", "must be > 0");
  FORGE_RETURN_IF_ERROR(
      get_int("head_dim", false, c.hidden_size / c.num_attention_heads, &c.head_dim));
  // transformers' LlamaConfig defaults where a key is absent.
  FORGE_RETURN_IF_ERROR(
      get_int("max_position_embeddings", false, 2048, &c.max_position_embeddings));
  FORGE_RETURN_IF_ERROR(get_double(j, "rms_norm_eps", 1e-6, &c.rms_norm_eps));
  if (j.contains("tie_word_embeddings") && !j["tie_word_embeddings"].is_boolean())
    return bad("tie_word_embeddings", "expected true or false");
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);

  // RoPE: transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; earlier
  // versions rope_theta and rope_scaling {rope_type | type, ...}.
  json rope = json::object();
  std::string rope_key = "rope_scaling";
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    rope = j["rope_parameters"];
    rope_key = "rope_parameters";
    if (!rope.is_object()) return bad(rope_key, "expected an object");
    FORGE_RETURN_IF_ERROR(get_double(rope, "rope_theta", 10000.0, &c.rope_theta));
  } else {
    FORGE_RETURN_IF_ERROR(get_double(j, "rope_theta", 10000.0, &c.rope_theta));
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) rope = j["rope_scaling"];
    if (!rope.is_object()) return bad(rope_key, "expected an object or null");
  }
  std::string type = "default";
  if (rope.contains("rope_type")) type = rope["rope_type"].is_string() ? rope["rope_type"].get<std::string>() : "?";
  else if (rope.contains("type")) type = rope["type"].is_string() ? rope["type"].get<std::string>() : "?";
  if (type == "llama3") {
    Llama3RopeScaling s;
    FORGE_RETURN_IF_ERROR(get_double(rope, "factor", s.factor, &s.factor));
    FORGE_RETURN_IF_ERROR(get_double(rope, "low_freq_factor", s.low_freq_factor, &s.low_freq_factor));
    FORGE_RETURN_IF_ERROR(
        get_double(rope, "high_freq_factor", s.high_freq_factor, &s.high_freq_factor));
    double orig = double(s.original_max_position_embeddings);
    FORGE_RETURN_IF_ERROR(get_double(rope, "original_max_position_embeddings", orig, &orig));
    s.original_max_position_embeddings = static_cast<int64_t>(orig);
    c.rope_scaling = s;
  } else if (type != "default") {
    return bad(rope_key, "rope type \"" + type +
                             "\": Forge implements plain RoPE and Llama 3.1's \"llama3\" scaling");
  }

  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer())
    c.bos_token_id = j["bos_token_id"].get<int>();
  if (j.contains("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_number_integer()) c.eos_token_ids.push_back(e.get<int>());
    else if (e.is_array())
      for (const json& x : e)
        if (x.is_number_integer()) c.eos_token_ids.push_back(x.get<int>());
  }
  const std::string dtype_key = j.contains("dtype") ? "dtype" : "torch_dtype";
  if (j.contains(dtype_key) && j[dtype_key].is_string()) c.dtype = j[dtype_key].get<std::string>();
  return c;
}

StatusOr<LlamaConfig> ReadLlamaConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  return ParseLlamaConfigJson(text, path);
}

}  // namespace forge::hf
