// A Hugging Face Llama model's config.json (transformers' LlamaConfig) and its correspondence
// with Forge's ModelConfig.
//
// LlamaConfigFromModel is the one place that reads Forge's model knobs for export: head_dim
// (model.head_dim), the LM head (model.tie_embeddings -> tie_word_embeddings) and RoPE frequency
// scaling (model.rope_scaling -> rope_scaling {rope_type: llama3, ...}) are a field each here.
// ModelFromLlamaConfig is its inverse (model.head_dim set only where head_dim is not
// hidden_size / num_attention_heads) and refuses, naming the field, what Forge's model cannot
// represent.
//
// ParseLlamaConfigJson is strict: a model other than LlamaForCausalLM, a field whose value
// changes the computation in a way Forge does not implement (attention or MLP biases, an
// activation other than silu, sliding-window attention, a rope_scaling type other than llama3,
// quantization) or a key it does not know is an InvalidArgument naming the file and the key.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace forge::hf {

// Llama 3.1's RoPE frequency scaling (rope_type "llama3").
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;            // the real vocabulary: Forge's padding rows are not exported
  int max_position_embeddings = 0;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_scaling;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = true;
  int bos_token_id = -1;         // -1: none (written as null)
  std::vector<int> eos_token_ids;  // one id is written as a number, several as a list
  std::string dtype = "float32";   // float32 | bfloat16 | float16: the tensors' type
};

// The dimensions the tensors' shapes follow, by their names and places in config.json and in
// ModelConfig: the one list that export, import, config.json and the weights' check go by
// (head_dim, which ModelConfig derives, is handled beside it).
struct LlamaDimension {
  const char* hf_name;     // "num_hidden_layers"
  int LlamaConfig::*hf;
  const char* forge_name;  // "n_layer" (model.n_layer)
  int ModelConfig::*forge;
};
inline constexpr std::array<LlamaDimension, 6> kLlamaDimensions{{
    {"num_hidden_layers", &LlamaConfig::num_hidden_layers, "n_layer", &ModelConfig::n_layer},
    {"hidden_size", &LlamaConfig::hidden_size, "d_model", &ModelConfig::d_model},
    {"num_attention_heads", &LlamaConfig::num_attention_heads, "n_head", &ModelConfig::n_head},
    {"num_key_value_heads", &LlamaConfig::num_key_value_heads, "n_kv_head",
     &ModelConfig::n_kv_head},
    {"intermediate_size", &LlamaConfig::intermediate_size, "ffn", &ModelConfig::ffn},
    {"vocab_size", &LlamaConfig::vocab_size, "vocab", &ModelConfig::vocab},
}};

// Forge's model as a Llama config. bos/eos ids and dtype are the caller's (tokenizer, export).
LlamaConfig LlamaConfigFromModel(const ModelConfig& m);

// The Forge model a Llama config describes (dims, rope_theta, norm_eps, seq_len =
// max_position_embeddings); `source` names the file in errors. A field Forge's model cannot
// represent is an InvalidArgument naming it.
StatusOr<ModelConfig> ModelFromLlamaConfig(const LlamaConfig& c, const std::string& source);

// config.json text (sorted keys, 2-space indent, trailing newline).
std::string LlamaConfigJson(const LlamaConfig& c);
// generation_config.json text: bos/eos ids, greedy by default.
std::string GenerationConfigJson(const LlamaConfig& c);

StatusOr<LlamaConfig> ParseLlamaConfigJson(const std::string& text, const std::string& source);
StatusOr<LlamaConfig> ReadLlamaConfig(const std::string& dir);  // <dir>/config.json

// The decimal a float prints as in shortest form, as a double ("1e-05", not 9.99999974e-06), so
// that JSON holds what a person would write and reads back to the same float.
double ShortestDecimal(float x);

}  // namespace forge::hf
