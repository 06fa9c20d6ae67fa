// Fixtures shared by the trainer tests on either backend (unit tests on the CPU, GPU tests on
// CUDA): an in-memory stream of pseudo-random tokens addressed by the data cursor alone, and a
// training run that keeps every step record and the final weights and AdamW moments.
// Header-only, no CUDA types.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "common/config.h"
#include "worker/train/backend.h"
#include "worker/train/trainer.h"

namespace forge::test {

// The tiny model the CPU trainer tests train: 2 layers, d 32, 4 heads over 2 KV heads, ffn 64,
// vocab 64, T `seq_len`.
inline ModelConfig TinyCpuModel(int seq_len) {
  ModelConfig m;
  m.n_layer = 2;
  m.d_model = 32;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.ffn = 64;
  m.vocab = 64;
  m.seq_len = seq_len;
  return m;
}

// Sequence s: tokens of an LCG seeded from s and `salt` (pseudo-random: a learnable stream
// would make later steps' gradients tiny). Micro-step k of the step at `cursor` reads
// sequences cursor + k*B ...; validation batch i reads val_first + i*B ...
inline BatchProvider HashedTokenData(const RunConfig& c, uint32_t salt, int64_t val_first) {
  auto fill = [c, salt](int64_t seq0, int32_t* in, int32_t* tgt) {
    const int T = c.model.seq_len;
    for (int b = 0; b < c.batch.micro_batch; ++b) {
      uint32_t x = static_cast<uint32_t>(seq0 + b) * 2654435761u + salt;
      for (int t = 0; t <= T; ++t) {
        x = x * 1664525u + 1013904223u;
        const int32_t tok = int32_t((x >> 16) % uint32_t(c.model.vocab));
        if (t < T) in[b * T + t] = tok;
        if (t > 0) tgt[b * T + t - 1] = tok;
      }
    }
    return Status::Ok();
  };
  BatchProvider p;
  p.train = [fill, c](int64_t cursor, int k, int32_t* in, int32_t* tgt) {
    return fill(cursor + int64_t{k} * c.batch.micro_batch, in, tgt);
  };
  p.val = [fill, c, val_first](int64_t i, int32_t* in, int32_t* tgt) {
    return fill(val_first + i * c.batch.micro_batch, in, tgt);
  };
  return p;
}

// Sequences that count up by one (mod `vocab`) from a hashed start, or down where down(q) says
// so: a model trained on the counting-up ones gets the counting-down ones badly wrong (the
// spike tests' loss spike). Addressed as HashedTokenData's: micro-step k of the step at
// `cursor` reads sequences cursor + k*B ..., validation batch i reads 1000000 + i*B ...;
// shift(cursor), when given, moves the train cursor first (a data window left out).
inline BatchProvider CountingData(const RunConfig& c, int vocab,
                                  std::function<bool(int64_t)> down,
                                  std::function<int64_t(int64_t)> shift = nullptr) {
  auto fill = [c, vocab, down](int64_t seq0, int32_t* in, int32_t* tgt) {
    const int T = c.model.seq_len, V = vocab;
    for (int b = 0; b < c.batch.micro_batch; ++b) {
      const int64_t q = seq0 + b;
      const bool d = down(q);
      int32_t tok = int32_t((uint32_t(q) * 2654435761u >> 7) % uint32_t(V));
      for (int t = 0; t <= T; ++t) {
        if (t < T) in[b * T + t] = tok;
        if (t > 0) tgt[b * T + t - 1] = tok;
        tok = (tok + (d ? V - 1 : 1)) % V;
      }
    }
    return Status::Ok();
  };
  BatchProvider p;
  p.train = [fill, c, shift](int64_t cursor, int k, int32_t* in, int32_t* tgt) {
    if (shift) cursor = shift(cursor);
    return fill(cursor + int64_t{k} * c.batch.micro_batch, in, tgt);
  };
  p.val = [fill, c](int64_t i, int32_t* in, int32_t* tgt) {
    return fill(1000000 + i * c.batch.micro_batch, in, tgt);
  };
  return p;
}

struct RunOutcome {
  TrainResult result;
  std::vector<StepRecord> records;
  UnitBuffers w, m, v;
};

// RunTraining on `backend` without progress output; opt.on_step, if set, still sees each step.
inline RunOutcome TrainKeepingState(const RunConfig& c, TrainBackend* backend,
                                    const BatchProvider& data, TrainOptions opt = {}) {
  RunOutcome run;
  opt.print_progress = false;
  auto user = opt.on_step;
  opt.on_step = [&run, user](const StepRecord& r) {
    run.records.push_back(r);
    if (user) user(r);
  };
  auto r = RunTraining(c, backend, data, opt);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return run;
  run.result = std::move(r).value();
  EXPECT_TRUE(backend->GetParams(&run.w).ok());
  EXPECT_TRUE(backend->GetMoments(&run.m, &run.v).ok());
  return run;
}

}  // namespace forge::test
