// Forge's parameters as Hugging Face Llama tensors, and back.
//
//   Forge (param_layout.h)             transformers' LlamaForCausalLM
//   wte [padded_vocab, d]           -> model.embed_tokens.weight [vocab, d] (padding rows dropped;
//                                      on import they are zero)
//   lm_head [padded_vocab, d]       -> lm_head.weight [vocab, d] (an untied model only; a tied
//                                      model has no such tensor, transformers ties it)
//   blocks.i.attn_norm              -> model.layers.i.input_layernorm.weight
//   blocks.i.attn.wqkv rows Q|K|V   -> model.layers.i.self_attn.{q,k,v}_proj.weight, the Q and K
//                                      rows of each head permuted (below)
//   blocks.i.attn.wo                -> model.layers.i.self_attn.o_proj.weight
//   blocks.i.mlp_norm               -> model.layers.i.post_attention_layernorm.weight
//   blocks.i.mlp.w_gate_up rows g|u -> model.layers.i.mlp.{gate,up}_proj.weight
//   blocks.i.mlp.w_down             -> model.layers.i.mlp.down_proj.weight
//   final_norm                      -> model.norm.weight
//
// RoPE: Forge rotates interleaved pairs (2i, 2i+1) of a head; transformers rotates the halves
// (i, i + hd/2) ("rotate_half") with the same frequency for pair i. So HF row i of a head is
// Forge row 2i, and HF row i + hd/2 is Forge row 2i + 1: the same model with the pairs moved
// apart, which is exactly a permutation of the projection's output rows (and the inverse
// permutation on import). V rows and every other tensor are copied as they are.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/hf/llama_config.h"
#include "worker/model/param_layout.h"
#include "worker/model/unit_buffers.h"

namespace forge::hf {

// One HF tensor: a block of whole rows [row0, row0 + rows) of a Forge tensor of `cols`
// columns, its rows permuted per RoPE head of `rope_head_dim` (0: not permuted).
struct HfTensorMap {
  std::string name;
  std::vector<int64_t> shape;  // [rows, cols] or [rows] for norms
  int unit = 0;
  int64_t offset = 0;          // float offset of row0 inside the unit buffer
  int64_t rows = 0, cols = 1;
  int rope_head_dim = 0;
};

class LlamaWeightMap {
 public:
  // The map for model `m` (LlamaConfigFromModel(m) gives its config). A model Forge cannot
  // export as Llama (QK-norm) is an InvalidArgument naming the knob.
  static StatusOr<LlamaWeightMap> Make(const ModelConfig& m);

  const std::vector<HfTensorMap>& tensors() const { return tensors_; }
  const ParamLayout& layout() const { return layout_; }
  const LlamaConfig& config() const { return config_; }

  // HF tensor i's values (shape numel floats) from Forge's parameters.
  void Gather(const UnitBuffers& params, size_t i, float* out) const;
  // The inverse: HF tensor i's values into Forge's parameters.
  void Scatter(const float* in, size_t i, UnitBuffers* params) const;

 private:
  ParamLayout layout_;
  LlamaConfig config_;
  std::vector<HfTensorMap> tensors_;
};

// Row r of an HF Q/K projection head is row RopeSourceRow(r, hd) of Forge's.
inline int64_t RopeSourceRow(int64_t r, int64_t hd) {
  const int64_t head = r / hd, j = r % hd;
  return head * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);
}

}  // namespace forge::hf
