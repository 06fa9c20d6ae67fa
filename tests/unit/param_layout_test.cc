#include "worker/model/param_layout.h"

#include <gtest/gtest.h>

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

TEST(ParamLayout, VocabIsPaddedTo128) {
  ModelConfig m;
  m.vocab = 50257;
  EXPECT_EQ(m.padded_vocab(), 50304);
  m.vocab = 256;
  EXPECT_EQ(m.padded_vocab(), 256);
}

}  // namespace
}  // namespace forge
