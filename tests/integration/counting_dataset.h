// A small on-disk dataset for end-to-end `forge` runs: train and val shards over a 256-token
// vocabulary (EOT 255), mostly "previous token + 1" with 1 in 16 tokens random, so a tiny
// model learns it within a few steps. `seed` picks the stream (split s uses seed + s).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "worker/data/dataset.h"
#include "worker/data/shard.h"

namespace forge::test {

inline void WriteCountingDataset(const std::string& dir, uint32_t seed, int64_t train_tokens,
                                 int64_t val_tokens) {
  std::filesystem::create_directories(dir);
  DatasetManifest m;
  m.vocab_size = 256;
  m.eot_token = 255;
  for (int s = 0; s < 2; ++s) {
    std::vector<int32_t> tokens(s == 0 ? train_tokens : val_tokens);
    uint32_t x = seed + s;
    for (size_t i = 0; i < tokens.size(); ++i) {
      x = x * 1664525u + 1013904223u;
      const bool jump = i == 0 || (x >> 28) == 0;
      tokens[i] = jump ? int32_t((x >> 8) % 256) : (tokens[i - 1] + 1) % 256;
    }
    const std::string name = s == 0 ? "train_0.tok" : "val_0.tok";
    auto info = WriteShard(dir + "/" + name, tokens, TokenDtype::kUint16);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    m.splits[s].shards.push_back({name, int64_t(tokens.size()), info->crc32c});
    m.splits[s].tokens = int64_t(tokens.size());
  }
  ASSERT_TRUE(WriteDatasetManifest(dir, m).ok());
}

}  // namespace forge::test
