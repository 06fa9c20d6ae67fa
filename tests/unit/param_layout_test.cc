#include "worker/model/param_layout.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace forge {
namespace {

TEST(ParamLayout, Gpt350mMatchesAnchorParamCount) {
  ModelConfig m;
  m.n_layer = 24; m.d_model = 1024; m.n_head = 16; m.n_kv_head = 16; m.ffn = 2816;
  m.vocab = 50304; m.seq_len = 1024;
  ParamLayout p = MakeParamLayout(m);
  ASSERT_EQ(p.units.size(), 26u);
  // Same count as the PyTorch anchor's GPT(cfg("gpt350m")): embedding + 24 blocks + norm.
  const int64_t d = 1024, ff = 2816, V = 50304;
  const int64_t block = d + 3 * d * d + d * d + d + 2 * ff * d + ff * d;
  EXPECT_EQ(p.total, V * d + 24 * block + d);
  EXPECT_EQ(MatmulParamCount(m), p.total - (2 * 24 + 1) * d);
  // Tensors are contiguous and in order inside every unit.
  for (const auto& u : p.units) {
    int64_t off = 0;
    for (const auto& t : u.tensors) {
      EXPECT_EQ(t.offset, off) << t.name;
      off += t.numel;
    }
    EXPECT_EQ(off, u.numel);
  }
}

TEST(ParamLayout, BlockLinearsAreTheBlocksFourMatricesInOrder) {
  ModelConfig m;
  m.n_layer = 3; m.d_model = 192; m.n_head = 6; m.n_kv_head = 2; m.explicit_head_dim = 32;
  m.ffn = 320; m.qk_norm = true;
  const ParamLayout p = MakeParamLayout(m);
  const char* names[kBlockLinears] = {"attn.wqkv", "attn.wo", "mlp.w_gate_up", "mlp.w_down"};
  const int64_t shapes[kBlockLinears][2] = {{(6 + 2 * 2) * 32, 192}, {192, 6 * 32},
                                            {2 * 320, 192}, {192, 320}};
  EXPECT_EQ(p.linears[0].offset, p.block.wqkv);
  EXPECT_EQ(p.linears[1].offset, p.block.wo);
  EXPECT_EQ(p.linears[2].offset, p.block.w_gate_up);
  EXPECT_EQ(p.linears[3].offset, p.block.w_down);
  for (int l = 0; l < m.n_layer; ++l) {
    const UnitLayout& u = p.units[size_t(p.block_unit(l))];
    int found = 0;
    for (const TensorSlot& t : u.tensors) {
      for (int k = 0; k < kBlockLinears; ++k) {
        const BlockLinear& w = p.linears[size_t(k)];
        if (t.name != "blocks." + std::to_string(l) + "." + names[k]) continue;
        ++found;
        EXPECT_EQ(std::string(w.name), names[k]);
        EXPECT_EQ(w.offset, t.offset) << t.name;
        EXPECT_EQ(w.rows, shapes[k][0]) << t.name;
        EXPECT_EQ(w.cols, shapes[k][1]) << t.name;
        EXPECT_EQ(t.shape, (std::vector<int64_t>{w.rows, w.cols})) << t.name;
        EXPECT_EQ(w.numel(), t.numel) << t.name;
      }
    }
    EXPECT_EQ(found, kBlockLinears) << u.name;
  }
}

TEST(ParamLayout, VocabIsPaddedTo128) {
  ModelConfig m;
  m.vocab = 50257;
  EXPECT_EQ(m.padded_vocab(), 50304);
  m.vocab = 256;
  EXPECT_EQ(m.padded_vocab(), 256);
}

}  // namespace
}  // namespace forge
