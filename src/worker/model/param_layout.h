// Where every parameter lives. Parameters are grouped into *units* (embedding, each block,
// final norm); each unit is one flat float buffer. A unit is the grain of DDP gradient buckets,
// ZeRO/FSDP shards and checkpoint tensors, so this table is shared by every backend.
//
// Weight matrices are stored [out, in] row-major (y = x W^T), as PyTorch's nn.Linear does.
// Embedding unit: wte[padded_vocab, d]. Final unit: final_norm[d], then lm_head[padded_vocab,
// d] when the head is untied (model.tie_embeddings false; tied, the LM head is wte). The untied
// head sits with the final norm, whose gradient is complete at the same point of the backward
// (its start), so the unit's collective need not wait for the embedding's, at the backward's
// end (fsdp lets the two units' gradients share one buffer).
// Block tensor order: attn_norm[d], (q_norm[hd], k_norm[hd] if qk_norm), wqkv[(H+2KV)*hd, d]
// (rows: all Q heads, then K heads, then V heads), wo[d, H*hd], mlp_norm[d],
// w_gate_up[2*ffn, d] (rows: gate then up), w_down[d, ffn].
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"

namespace forge {

struct TensorSlot {
  std::string name;             // GPT-2 style, e.g. "blocks.3.attn.wqkv"
  std::vector<int64_t> shape;
  int64_t offset = 0;           // in floats, within the unit buffer
  int64_t numel = 0;
  bool weight_decay = false;    // matrices decay; norms do not
  bool is_matmul = false;       // counts towards N_matmul for FLOPs
};

struct UnitLayout {
  std::string name;             // "embedding", "block.0", ..., "final_norm"
  std::vector<TensorSlot> tensors;
  int64_t numel = 0;
};

// Offsets of a block's tensors inside its unit (-1 where absent).
struct BlockOffsets {
  int64_t attn_norm = 0, q_norm = -1, k_norm = -1, wqkv = 0, wo = 0, mlp_norm = 0,
          w_gate_up = 0, w_down = 0;
};

// One of a block's four linear weights: [rows, cols] = [out, in] at `offset` in the block's
// unit.
struct BlockLinear {
  const char* name = "";  // within the block: "attn.wqkv", "attn.wo", "mlp.w_gate_up", "mlp.w_down"
  int64_t offset = 0, rows = 0, cols = 0;
  int64_t numel() const { return rows * cols; }
};
inline constexpr int kBlockLinears = 4;

struct ParamLayout {
  std::vector<UnitLayout> units;  // [0] embedding, [1..L] blocks, [L+1] final norm (+ head)
  BlockOffsets block;             // identical for every block
  // The block's linear weights in the order of the model's LinearKind: wqkv, wo, w_gate_up,
  // w_down (identical for every block; zero without blocks). What casts, gathers or shards
  // them per weight reads them here.
  std::array<BlockLinear, kBlockLinears> linears{};
  // The LM head's weights: unit and offset (tied: wte, at 0 of the embedding unit).
  int head_unit = 0;
  int64_t lm_head = 0;
  int64_t total = 0;

  int embedding_unit() const { return 0; }
  int block_unit(int layer) const { return 1 + layer; }
  int final_norm_unit() const { return static_cast<int>(units.size()) - 1; }
  bool is_block_unit(int unit) const { return unit > embedding_unit() && unit < final_norm_unit(); }
};

ParamLayout MakeParamLayout(const ModelConfig& m);

// Matmul parameters as used by the FLOPs formula: the LM head counted once, as a matmul (tied:
// wte; untied: lm_head, wte being a lookup).
int64_t MatmulParamCount(const ModelConfig& m);
// FLOPs per token of one training step: 6*N_matmul + 12*L*(H*hd)*T (DESIGN.md's 12*L*d*T
// with the attention width, d unless model.head_dim sets another).
double TrainFlopsPerToken(const ModelConfig& m);

}  // namespace forge
