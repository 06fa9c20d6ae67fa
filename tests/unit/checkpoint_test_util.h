// Shared fixtures of the checkpoint tests: a small model config, deterministic states with
// awkward bit patterns (NaN payloads, -0, denormals) so "bitwise" means bitwise, a helper that
// saves a checkpoint the way W ranks would, and file-damage helpers.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/model/param_layout.h"

namespace forge::ckpt_test {

namespace fs = std::filesystem;

inline std::string BaseDir() {
  return ::testing::TempDir() + "/forge_ckpt_test_" + std::to_string(::getpid());
}

// A fresh, empty directory for one test.
inline std::string FreshDir(const std::string& name) {
  const std::string dir = BaseDir() + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct CleanUp : ::testing::Environment {
  void TearDown() override { fs::remove_all(BaseDir()); }
};
inline ::testing::Environment* const kCleanUp = ::testing::AddGlobalTestEnvironment(new CleanUp);

// 2 layers, d 16, vocab 100 (padded 128): units of 2048, 2592, 2592 and 16 floats, so the
// final norm is smaller than one 32-element shard slot and lives on rank 0 only.
inline RunConfig SmallConfig(bool qk_norm = false) {
  RunConfig cfg;
  cfg.model.preset = "";
  cfg.model.n_layer = 2;
  cfg.model.d_model = 16;
  cfg.model.n_head = 2;
  cfg.model.n_kv_head = 2;
  cfg.model.ffn = 32;
  cfg.model.vocab = 100;
  cfg.model.seq_len = 8;
  cfg.model.qk_norm = qk_norm;
  return cfg;
}

inline float Bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

struct FullState {
  UnitBuffers master, m, v;
};

// Distinct values per (seed, buffer, unit, index); a few special bit patterns included.
inline FullState MakeState(const ParamLayout& layout, uint32_t seed) {
  FullState s;
  UnitBuffers* bufs[3] = {&s.master, &s.m, &s.v};
  for (int k = 0; k < 3; ++k) {
    for (size_t u = 0; u < layout.units.size(); ++u) {
      std::vector<float> b(layout.units[u].numel);
      for (size_t i = 0; i < b.size(); ++i) {
        uint32_t h = seed * 2654435761u ^ (k * 97 + 1) * 40503u ^ static_cast<uint32_t>(u) * 7919u ^
                     static_cast<uint32_t>(i) * 2246822519u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        b[i] = Bits((h & 0x807fffffu) | 0x3c000000u);  // |x| in [2^-7, 2^-6), either sign
      }
      if (b.size() >= 4) {
        b[0] = Bits(0x7fc01234u);  // NaN with payload
        b[1] = Bits(0x80000000u);  // -0
        b[2] = Bits(0x00000001u);  // smallest denormal
        b[3] = Bits(0xff800000u);  // -inf
      }
      (*bufs[k]).push_back(std::move(b));
    }
  }
  return s;
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

inline TrainerState MakeTrainer(int64_t step, int64_t cursor, int rank) {
  TrainerState t;
  t.step = step;
  t.data_cursor = cursor;
  t.rng = "rng-of-rank-" + std::to_string(rank) + std::string("\0\x01\xff", 3);
  t.extra["fp8"] = "scales-" + std::to_string(rank);
  t.extra["zz_empty"] = "";
  return t;
}

// Saves `full` as W ranks would (each writes its slice via ShardStateFromFull) and commits.
inline std::string SaveAll(const std::string& root, const RunConfig& cfg, const ParamLayout& layout,
                           const FullState& full, int world, int64_t step, int64_t cursor) {
  const std::string dir = StepDir(root, step);
  std::vector<ShardReport> reports;
  for (int r = 0; r < world; ++r) {
    ShardState s = ShardStateFromFull(layout, r, world, full.master, full.m, full.v,
                                      MakeTrainer(step, cursor, r));
    auto rep = WriteShard(dir, s);
    EXPECT_TRUE(rep.ok()) << rep.status().ToString();
    if (rep.ok()) reports.push_back(*rep);
  }
  auto m = CommitCheckpoint(dir, cfg, layout, reports);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return dir;
}

inline std::string ShardPath(const std::string& dir, int rank, int world) {
  return dir + "/" + ShardFileName(rank, world);
}

inline void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x10));
}

inline bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace forge::ckpt_test
