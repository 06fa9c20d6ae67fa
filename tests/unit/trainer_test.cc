// The training loop on the CPU backend with an in-memory batch provider: the loss must fall
// on a learnable stream, and the same seed must give bitwise-identical weights.
#include "worker/train/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../common/skipped_step_check.h"

namespace forge {
namespace {

RunConfig TinyConfig() {
  RunConfig c;
  c.model.n_layer = 2;
  c.model.d_model = 32;
  c.model.n_head = 4;
  c.model.n_kv_head = 4;
  c.model.ffn = 64;
  c.model.vocab = 64;
  c.model.seq_len = 16;
  c.batch.micro_batch = 2;
  c.batch.global_batch = 4;  // two micro-steps of accumulation
  c.optimizer.lr = 1e-2f;
  c.schedule.total_steps = 60;
  c.schedule.warmup_steps = 5;
  c.eval.every_steps = 30;
  c.eval.batches = 2;
  c.train.log_every = 10;
  return c;
}

// A deterministic, learnable stream: token t+1 = (3 * token t + 1) mod 64, from varied starts.
BatchProvider PatternData(const RunConfig& c) {
  auto fill = [c](int64_t seq0, int32_t* in, int32_t* tgt) {
    for (int b = 0; b < c.batch.micro_batch; ++b) {
      int32_t tok = static_cast<int32_t>((seq0 + b) * 7 % 64);
      for (int t = 0; t < c.model.seq_len; ++t) {
        in[b * c.model.seq_len + t] = tok;
        tok = (3 * tok + 1) % 64;
        tgt[b * c.model.seq_len + t] = tok;
      }
    }
    return Status::Ok();
  };
  BatchProvider p;
  p.train = [fill, c](int64_t cursor, int k, int32_t* in, int32_t* tgt) {
    return fill(cursor + int64_t{k} * c.batch.micro_batch, in, tgt);
  };
  p.val = [fill](int64_t i, int32_t* in, int32_t* tgt) { return fill(1000 + i, in, tgt); };
  return p;
}

TEST(Trainer, LossFallsOnLearnableStream) {
  RunConfig c = TinyConfig();
  auto backend = MakeCpuBackend(c);
  TrainOptions opt;
  opt.print_progress = false;
  int logged = 0;
  opt.on_step = [&](const StepRecord& r) {
    ++logged;
    EXPECT_GT(r.tokens_per_s, 0.0);
  };
  auto r = RunTraining(c, backend.get(), PatternData(c), opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->steps, 60);
  EXPECT_GT(logged, 5);
  // Counted without a step_done observer too (the summary's tokens/s and the progress ETA).
  EXPECT_GT(r->seconds, 0.0);
  EXPECT_GT(r->tokens_per_s, 0.0);
  EXPECT_NEAR(r->initial_val_loss, std::log(float(c.model.padded_vocab())), 0.1f);  // ln(128)
  EXPECT_LT(r->final_val_loss, 0.5f * r->initial_val_loss);
  EXPECT_LT(r->final_train_loss, r->first_loss);
}

TEST(CpuBackend, NonFiniteStepIsSkipped) {
  RunConfig c = TinyConfig();
  c.batch.global_batch = c.batch.micro_batch;
  auto backend = MakeCpuBackend(c);
  const BatchProvider data = PatternData(c);
  const size_t n = size_t(c.batch.micro_batch) * c.model.seq_len;
  std::vector<std::vector<int32_t>> in(3, std::vector<int32_t>(n)), tgt = in;
  std::vector<MicroBatch> batches;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(data.train(i * c.batch.micro_batch, 0, in[i].data(), tgt[i].data()).ok());
    batches.push_back({in[i].data(), tgt[i].data()});
  }
  test::ExpectNonFiniteStepSkipped(backend.get(), c, batches);
}

TEST(Trainer, SameSeedGivesBitwiseIdenticalWeights) {
  RunConfig c = TinyConfig();
  c.schedule.total_steps = 8;
  TrainOptions opt;
  opt.print_progress = false;
  UnitBuffers w[2];
  for (auto& out : w) {
    auto backend = MakeCpuBackend(c);
    ASSERT_TRUE(RunTraining(c, backend.get(), PatternData(c), opt).ok());
    ASSERT_TRUE(backend->GetParams(&out).ok());
  }
  ASSERT_EQ(w[0].size(), w[1].size());
  for (size_t u = 0; u < w[0].size(); ++u) {
    ASSERT_EQ(w[0][u].size(), w[1][u].size());
    EXPECT_EQ(0, std::memcmp(w[0][u].data(), w[1][u].data(), w[0][u].size() * sizeof(float)))
        << "unit " << u;
  }
}

TEST(Trainer, RejectsIndivisibleGlobalBatch) {
  RunConfig c = TinyConfig();
  c.batch.global_batch = 3;
  auto backend = MakeCpuBackend(c);
  TrainOptions opt;
  opt.print_progress = false;
  auto r = RunTraining(c, backend.get(), PatternData(c), opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("global_batch"), std::string::npos);
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

// eval.samples' plumbing: the hook runs at every eval step (not between), its samples land in
// that step's record and in metrics.jsonl (JSON-escaped), and the weights it reads are the
// trainer's current ones.
TEST(Trainer, EvalSamplesGoIntoTheEvalStepsRecords) {
  RunConfig c = TinyConfig();
  c.schedule.total_steps = 6;
  c.eval.every_steps = 3;
  c.train.log_every = 1;
  auto backend = MakeCpuBackend(c);
  TrainOptions opt;
  opt.print_progress = false;
  opt.metrics_path = ::testing::TempDir() + "/trainer_samples_metrics.jsonl";
  int calls = 0;
  std::vector<float> first_weights;
  opt.eval_samples = [&](TrainBackend* b) -> StatusOr<std::vector<EvalSample>> {
    UnitBuffers p;
    FORGE_RETURN_IF_ERROR(b->GetParams(&p));
    if (calls == 0) first_weights = p[1];
    else EXPECT_NE(p[1], first_weights);  // trained in between
    ++calls;
    return std::vector<EvalSample>{{"a \"prompt\"", "line\nbreak " + std::to_string(calls)}};
  };
  std::vector<StepRecord> recs;
  opt.on_step = [&](const StepRecord& r) { recs.push_back(r); };
  auto r = RunTraining(c, backend.get(), PatternData(c), opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(calls, 2);  // steps 3 and 6
  ASSERT_EQ(recs.size(), 6u);
  for (const StepRecord& rec : recs) {
    SCOPED_TRACE(rec.step);
    if (rec.step % 3 == 0) {
      ASSERT_EQ(rec.samples.size(), 1u);
      EXPECT_EQ(rec.samples[0].prompt, "a \"prompt\"");
      EXPECT_EQ(rec.samples[0].completion, "line\nbreak " + std::to_string(rec.step / 3));
    } else {
      EXPECT_TRUE(rec.samples.empty());
    }
  }
  std::ifstream in(opt.metrics_path);
  std::string line;
  int with_samples = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("samples")) continue;
    ++with_samples;
    EXPECT_EQ(j["step"].get<int>() % 3, 0);
    EXPECT_EQ(j["samples"][0]["prompt"], "a \"prompt\"");
    EXPECT_EQ(j["samples"][0]["completion"], "line\nbreak " + std::to_string(j["step"].get<int>() / 3));
  }
  EXPECT_EQ(with_samples, 2);
}

}  // namespace
}  // namespace forge
