#include "worker/hf/llama_weights.h"

#include <algorithm>

namespace forge::hf {
namespace {

const TensorSlot* FindSlot(const UnitLayout& u, const std::string& name) {
  for (const TensorSlot& t : u.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace

StatusOr<LlamaWeightMap> LlamaWeightMap::Make(const ModelConfig& m) {
  if (m.qk_norm)
    return Status::Invalid("model.qk_norm: Llama has no QK-norm; a model trained with it cannot "
                           "be exported as LlamaForCausalLM");
  LlamaWeightMap w;
  w.layout_ = MakeParamLayout(m);
  w.config_ = LlamaConfigFromModel(m);
  const LlamaConfig& c = w.config_;
  const ParamLayout& p = w.layout_;
  const int64_t d = c.hidden_size, hd = c.head_dim, V = c.vocab_size, ffn = c.intermediate_size;
  const int64_t q_rows = int64_t{c.num_attention_heads} * hd;
  const int64_t kv_rows = int64_t{c.num_key_value_heads} * hd;

  auto add = [&](std::string name, int unit, const std::string& slot_name, int64_t row0,
                 int64_t rows, int rope) -> Status {
    const TensorSlot* slot = FindSlot(p.units[unit], slot_name);
    if (slot == nullptr)
      return Status::Internal("no tensor " + slot_name + " in unit " + p.units[unit].name);
    const int64_t cols = slot->shape.size() == 2 ? slot->shape[1] : 1;
    HfTensorMap t;
    t.name = std::move(name);
    t.shape = slot->shape.size() == 2 ? std::vector<int64_t>{rows, cols}
                                      : std::vector<int64_t>{rows};
    t.unit = unit;
    t.offset = slot->offset + row0 * cols;
    t.rows = rows;
    t.cols = cols;
    t.rope_head_dim = rope;
    w.tensors_.push_back(std::move(t));
    return Status::Ok();
  };

  FORGE_RETURN_IF_ERROR(add("model.embed_tokens.weight", p.embedding_unit(), "wte", 0, V, 0));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int u = p.block_unit(l);
    const std::string f = "blocks." + std::to_string(l) + ".";
    const std::string h = "model.layers." + std::to_string(l) + ".";
    FORGE_RETURN_IF_ERROR(add(h + "input_layernorm.weight", u, f + "attn_norm", 0, d, 0));
    FORGE_RETURN_IF_ERROR(add(h + "self_attn.q_proj.weight", u, f + "attn.wqkv", 0, q_rows, hd));
    FORGE_RETURN_IF_ERROR(
        add(h + "self_attn.k_proj.weight", u, f + "attn.wqkv", q_rows, kv_rows, hd));
    FORGE_RETURN_IF_ERROR(
        add(h + "self_attn.v_proj.weight", u, f + "attn.wqkv", q_rows + kv_rows, kv_rows, 0));
    FORGE_RETURN_IF_ERROR(add(h + "self_attn.o_proj.weight", u, f + "attn.wo", 0, d, 0));
    FORGE_RETURN_IF_ERROR(
        add(h + "post_attention_layernorm.weight", u, f + "mlp_norm", 0, d, 0));
    FORGE_RETURN_IF_ERROR(add(h + "mlp.gate_proj.weight", u, f + "mlp.w_gate_up", 0, ffn, 0));
    FORGE_RETURN_IF_ERROR(add(h + "mlp.up_proj.weight", u, f + "mlp.w_gate_up", ffn, ffn, 0));
    FORGE_RETURN_IF_ERROR(add(h + "mlp.down_proj.weight", u, f + "mlp.w_down", 0, d, 0));
  }
  FORGE_RETURN_IF_ERROR(add("model.norm.weight", p.final_norm_unit(), "final_norm", 0, d, 0));
  if (!c.tie_word_embeddings) {
    // An untied head is a tensor of its own in the layout (named lm_head, in the embedding
    // unit or a unit of its own).
    bool found = false;
    for (size_t u = 0; u < p.units.size() && !found; ++u) {
      if (FindSlot(p.units[u], "lm_head") != nullptr) {
        FORGE_RETURN_IF_ERROR(add("lm_head.weight", int(u), "lm_head", 0, V, 0));
        found = true;
      }
    }
    if (!found) return Status::Internal("an untied model without an lm_head tensor");
  }
  return w;
}

void LlamaWeightMap::Gather(const UnitBuffers& params, size_t i, float* out) const {
  const HfTensorMap& t = tensors_[i];
  const float* base = params[t.unit].data() + t.offset;
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t src = t.rope_head_dim ? RopeSourceRow(r, t.rope_head_dim) : r;
    std::copy(base + src * t.cols, base + (src + 1) * t.cols, out + r * t.cols);
  }
}

void LlamaWeightMap::Scatter(const float* in, size_t i, UnitBuffers* params) const {
  const HfTensorMap& t = tensors_[i];
  float* base = (*params)[t.unit].data() + t.offset;
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t dst = t.rope_head_dim ? RopeSourceRow(r, t.rope_head_dim) : r;
    std::copy(in + r * t.cols, in + (r + 1) * t.cols, base + dst * t.cols);
  }
}

}  // namespace forge::hf
