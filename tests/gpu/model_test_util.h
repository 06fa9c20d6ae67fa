// What the CUDA model tests share: Markov-chain token batches a tiny model learns quickly, the
// seed's initial parameters and a CUDA backend made with EXPECT on failure.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "common/config.h"
#include "worker/model/init.h"
#include "worker/model/param_layout.h"
#include "worker/train/backend.h"
#include "worker/train/cuda_backend.h"

namespace forge::test {

// Token sequences from a fixed sparse Markov chain (each token has four likely successors, plus
// 10% uniform noise): text-like statistics a small model learns within a few dozen steps.
class MarkovTokens {
 public:
  MarkovTokens(int vocab, uint64_t seed) : vocab_(vocab), rng_(seed), succ_(vocab * 4) {
    std::uniform_int_distribution<int> tok(0, vocab - 1);
    for (int& s : succ_) s = tok(rng_);
  }
  struct Batch {
    std::vector<int32_t> inputs, targets;
  };
  Batch Next(int B, int T) {
    Batch b;
    b.inputs.resize(size_t(B) * T);
    b.targets.resize(size_t(B) * T);
    std::uniform_int_distribution<int> tok(0, vocab_ - 1);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int s = 0; s < B; ++s) {
      int cur = tok(rng_);
      for (int t = 0; t < T; ++t) {
        const float r = u(rng_);
        int next;
        if (r < 0.1f) next = tok(rng_);
        else if (r < 0.6f) next = succ_[cur * 4 + 0];
        else if (r < 0.8f) next = succ_[cur * 4 + 1];
        else if (r < 0.9f) next = succ_[cur * 4 + 2];
        else next = succ_[cur * 4 + 3];
        b.inputs[size_t(s) * T + t] = cur;
        b.targets[size_t(s) * T + t] = next;
        cur = next;
      }
    }
    return b;
  }

 private:
  int vocab_;
  std::mt19937_64 rng_;
  std::vector<int> succ_;
};

inline std::vector<MarkovTokens::Batch> MakeBatches(const RunConfig& c, int count, uint64_t seed) {
  MarkovTokens gen(c.model.vocab, seed);
  std::vector<MarkovTokens::Batch> out;
  for (int i = 0; i < count; ++i) out.push_back(gen.Next(c.batch.micro_batch, c.model.seq_len));
  return out;
}

inline std::vector<MicroBatch> Views(const std::vector<MarkovTokens::Batch>& batches, size_t first,
                              size_t count) {
  std::vector<MicroBatch> v;
  for (size_t i = first; i < first + count; ++i) {
    v.push_back({batches[i].inputs.data(), batches[i].targets.data()});
  }
  return v;
}

inline UnitBuffers InitialParams(const RunConfig& c) {
  UnitBuffers p;
  InitParams(c.model, MakeParamLayout(c.model), c.seed, &p);
  return p;
}

inline std::unique_ptr<CudaTrainBackend> MakeGpu(const RunConfig& c, CudaBackendOptions o = {}) {
  auto made = MakeCudaTrainBackend(c, o);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  if (!made.ok()) return nullptr;
  return std::move(made).value();
}

}  // namespace forge::test
