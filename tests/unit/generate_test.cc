// Generation on the CPU: the KV-cache decode against the training model's full forward
// (CpuModel::ForwardLogits recomputed for every prefix), batching that does not change a
// prompt's tokens, and sampling that is a pure function of the seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "hf_test_util.h"
#include "worker/infer/decode_backend.h"
#include "worker/infer/generate.h"
#include "worker/model/cpu_model.h"
#include "worker/train/backend.h"

namespace forge {
namespace {

using hf_test::Model;
using hf_test::Params;

// The full forward's logits of `tokens` (every position), from the training model.
std::vector<float> FullLogits(ModelConfig m, const UnitBuffers& p, const std::vector<int32_t>& tokens) {
  m.seq_len = int(tokens.size());
  CpuModel model(m, 1);
  std::vector<float> out(tokens.size() * size_t(m.padded_vocab()));
  model.ForwardLogits(p, tokens.data(), 1, out.data());
  return out;
}

std::vector<int32_t> Tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    t[i] = int32_t((seed >> 8) % uint32_t(vocab));
  }
  return t;
}

struct DecodeCase {
  const char* name;
  ModelConfig m;
};

class KvCacheDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(KvCacheDecode, EqualsTheFullForwardAtEveryPosition) {
  const ModelConfig m = GetParam().m;
  const UnitBuffers p = Params(m, 21);
  const std::vector<int32_t> seq = Tokens(m.seq_len, m.vocab, 5);
  const std::vector<float> full = FullLogits(m, p, seq);
  const int V = m.padded_vocab();

  // Prefill 5 tokens, then one at a time; a second sequence decodes in the same calls from a
  // different prompt, so rows of several sequences share every GEMM.
  auto backend = MakeCpuDecodeBackend(m, p);
  ASSERT_TRUE(backend->Reset(2, m.seq_len).ok());
  const std::vector<int32_t> other = Tokens(m.seq_len, m.vocab, 99);
  std::vector<float> logits;
  ASSERT_TRUE(backend
                  ->Append(std::vector<int>{0, 1},
                           std::vector<std::vector<int32_t>>{{seq.begin(), seq.begin() + 5},
                                                             {other.begin(), other.begin() + 3}},
                           /*all_positions=*/true, &logits)
                  .ok());
  double worst = 0.0, scale = 0.0;
  auto check = [&](const float* got, int pos) {
    for (int v = 0; v < V; ++v) {
      const double want = full[size_t(pos) * V + v];
      worst = std::max(worst, std::fabs(got[v] - want));
      scale = std::max(scale, std::fabs(want));
    }
  };
  for (int t = 0; t < 5; ++t) check(logits.data() + size_t(t) * V, t);
  for (int t = 5; t < m.seq_len; ++t) {
    const int o = std::min(t - 2, m.seq_len - 1);
    std::vector<int> seqs = {0};
    std::vector<std::vector<int32_t>> toks = {{seq[t]}};
    if (backend->length(1) < m.seq_len) {
      seqs.push_back(1);
      toks.push_back({other[o]});
    }
    ASSERT_TRUE(backend->Append(seqs, toks, false, &logits).ok());
    check(logits.data(), t);
  }
  EXPECT_EQ(backend->length(0), m.seq_len);
  std::printf("%s: max |kv-cache - full| = %.3g (max |logit| %.3g)\n", GetParam().name, worst, scale);
  EXPECT_LE(worst, 2e-5 * scale);

  // Greedy generation: the same tokens as argmax over the full forward of each prefix.
  GenerateOptions opt;
  opt.max_new_tokens = 10;
  const std::vector<int32_t> prompt(seq.begin(), seq.begin() + 4);
  auto gens = Generate(backend.get(), {prompt}, opt);
  ASSERT_TRUE(gens.ok()) << gens.status().ToString();
  std::vector<int32_t> ctx = prompt;
  for (int32_t got : (*gens)[0].tokens) {
    const std::vector<float> f = FullLogits(m, p, ctx);
    const float* last = f.data() + (ctx.size() - 1) * V;
    const int32_t want = int32_t(std::max_element(last, last + m.vocab) - last);
    ASSERT_EQ(got, want) << "after " << ctx.size() << " tokens";
    ctx.push_back(got);
  }
  EXPECT_EQ((*gens)[0].tokens.size(), 10u);
  EXPECT_EQ((*gens)[0].stop, "max_new_tokens");
}

ModelConfig WithQkNorm(ModelConfig m) {
  m.qk_norm = true;
  return m;
}

// head_dim 24 over d_model 64 / 4 heads, an untied LM head and Llama 3.1 RoPE scaling (over 8
// original positions, so the sequences reach past it).
ModelConfig WithLlamaKnobs(ModelConfig m) {
  m.explicit_head_dim = 24;
  m.tie_embeddings = false;
  m.rope_theta = 500000.0f;
  m.rope_scaling.type = RopeScalingType::kLlama3;
  m.rope_scaling.factor = 8.0f;
  m.rope_scaling.original_max_position_embeddings = 8;
  return m;
}

INSTANTIATE_TEST_SUITE_P(
    Models, KvCacheDecode,
    ::testing::Values(DecodeCase{"mha_hd32", Model(2, 64, 2, 2, 96, 500, 24)},
                      DecodeCase{"gqa_hd16", Model(2, 64, 4, 2, 96, 500, 24)},
                      DecodeCase{"gqa_hd64_qknorm", WithQkNorm(Model(2, 128, 2, 1, 160, 300, 20))},
                      DecodeCase{"hd24_untied_llama3_rope",
                                 WithLlamaKnobs(Model(2, 64, 4, 2, 96, 500, 24))}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(GenerateTest, BatchingDoesNotChangeAPromptsTokens) {
  const ModelConfig m = Model(2, 64, 4, 2, 96, 500, 40);
  const UnitBuffers p = Params(m, 4);
  const std::vector<std::vector<int32_t>> prompts = {Tokens(3, m.vocab, 1), Tokens(9, m.vocab, 2),
                                                     Tokens(1, m.vocab, 3)};
  for (double temperature : {0.0, 0.9}) {
    GenerateOptions opt;
    opt.max_new_tokens = 12;
    opt.sampling.temperature = temperature;
    opt.sampling.top_k = temperature > 0 ? 50 : 0;
    opt.sampling.seed = 77;
    auto backend = MakeCpuDecodeBackend(m, p);
    auto batch = Generate(backend.get(), prompts, opt);
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    for (size_t i = 0; i < prompts.size(); ++i) {
      // Alone, a prompt is sequence 0: its draws would differ if they depended on the slot,
      // so compare with its own slot's stream by generating it at index i among fillers.
      std::vector<std::vector<int32_t>> alone(i + 1, std::vector<int32_t>{1});
      alone[i] = prompts[i];
      GenerateOptions o = opt;
      auto single = Generate(backend.get(), alone, o);
      ASSERT_TRUE(single.ok());
      EXPECT_EQ((*single)[i].tokens, (*batch)[i].tokens) << "prompt " << i << " T " << temperature;
    }
  }
}

TEST(GenerateTest, StopsAtTheStopTokenAndAtTheContext) {
  const ModelConfig m = Model(1, 32, 2, 2, 64, 300, 12);
  const UnitBuffers p = Params(m, 8);
  auto backend = MakeCpuDecodeBackend(m, p);
  GenerateOptions opt;
  opt.max_new_tokens = 50;
  auto g = Generate(backend.get(), {Tokens(4, m.vocab, 1)}, opt);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)[0].stop, "context");
  EXPECT_EQ((*g)[0].tokens.size(), 12u - 4u + 1u);  // the last one needs no cache slot
  opt.stop_ids = {(*g)[0].tokens[2]};
  auto s = Generate(backend.get(), {Tokens(4, m.vocab, 1)}, opt);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)[0].stop, "stop_token");
  EXPECT_LE((*s)[0].tokens.size(), 3u);
  EXPECT_EQ((*s)[0].tokens.back(), opt.stop_ids[0]);
  opt.max_new_tokens = 0;
  auto z = Generate(backend.get(), {Tokens(4, m.vocab, 1)}, opt);
  ASSERT_TRUE(z.ok());
  EXPECT_TRUE((*z)[0].tokens.empty());
  auto too_long = Generate(backend.get(), {Tokens(13, m.vocab, 1)}, opt);
  EXPECT_FALSE(too_long.ok());
}

TEST(GenerateTest, SamplingFollowsTheDistributionAndTheSeed) {
  // logits log(0.5), log(0.3), log(0.15), log(0.05): frequencies over many draws.
  const float logits[4] = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingOptions s;
  s.temperature = 1.0;
  s.seed = 1;
  std::map<int, int> count;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[SampleToken(logits, 4, s, 0, i)];
  EXPECT_NEAR(count[0] / double(n), 0.5, 0.015);
  EXPECT_NEAR(count[1] / double(n), 0.3, 0.015);
  EXPECT_NEAR(count[3] / double(n), 0.05, 0.01);
  // top-p 0.6 keeps the two most likely (0.5 + 0.3 >= 0.6); top-k 1 is greedy.
  s.top_p = 0.6;
  for (int i = 0; i < 2000; ++i) EXPECT_LT(SampleToken(logits, 4, s, 3, i), 2);
  s.top_p = 1.0;
  s.top_k = 1;
  for (int i = 0; i < 100; ++i) EXPECT_EQ(SampleToken(logits, 4, s, 3, i), 0);
  // A pure function of (seed, stream, step).
  s.top_k = 0;
  SamplingOptions s2 = s;
  s2.seed = 2;
  int same = 0;
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(SampleToken(logits, 4, s, 5, i), SampleToken(logits, 4, s, 5, i));
    same += SampleToken(logits, 4, s, 5, i) == SampleToken(logits, 4, s2, 5, i);
  }
  EXPECT_LT(same, 150);
  // Greedy: the lowest id among equal maxima.
  const float tie[3] = {1.0f, 2.0f, 2.0f};
  EXPECT_EQ(SampleToken(tie, 3, SamplingOptions{}, 0, 0), 1);
}

// AppendLosses (what `forge eval --backend cuda` averages; here the CPU backend's default over
// Append's logits) against the training backend's EvalLoss on the same micro-batch: the mean
// of the per-token losses is the batch loss. Greedy AppendGreedy is Append's argmax.
TEST(GenerateTest, AppendLossesAverageToTheTrainersEvalLoss) {
  RunConfig cfg;
  cfg.model = Model(2, 64, 4, 2, 96, 300, 12);
  cfg.batch.micro_batch = 3;
  cfg.batch.global_batch = 3;
  const UnitBuffers p = Params(cfg.model, 17);
  const int T = cfg.model.seq_len, mb = cfg.batch.micro_batch;
  std::vector<int32_t> in = Tokens(mb * T, cfg.model.vocab, 3), tgt = Tokens(mb * T, cfg.model.vocab, 4);
  auto train = MakeCpuBackend(cfg);
  ASSERT_TRUE(train->SetParams(p).ok());
  float want = 0;
  ASSERT_TRUE(train->EvalLoss({in.data(), tgt.data()}, &want).ok());

  auto dec = MakeCpuDecodeBackend(cfg.model, p);
  ASSERT_TRUE(dec->Reset(mb, T).ok());
  std::vector<int> seqs = {0, 1, 2};
  std::vector<std::vector<int32_t>> ti, tt;
  for (int b = 0; b < mb; ++b) {
    ti.emplace_back(in.begin() + b * T, in.begin() + (b + 1) * T);
    tt.emplace_back(tgt.begin() + b * T, tgt.begin() + (b + 1) * T);
  }
  std::vector<float> losses;
  ASSERT_TRUE(dec->AppendLosses(seqs, ti, tt, &losses).ok());
  ASSERT_EQ(losses.size(), size_t(mb * T));
  double sum = 0;
  for (float l : losses) sum += l;
  EXPECT_NEAR(sum / losses.size(), want, 1e-5 * want);

  // Targets must match the tokens one for one and lie in the padded vocabulary.
  tt[1].pop_back();
  EXPECT_FALSE(dec->AppendLosses(seqs, ti, tt, &losses).ok());
  tt[1].push_back(cfg.model.padded_vocab());
  EXPECT_FALSE(dec->AppendLosses(seqs, ti, tt, &losses).ok());

  // AppendGreedy: the argmax of Append's last rows over the real vocabulary.
  auto a = MakeCpuDecodeBackend(cfg.model, p), b = MakeCpuDecodeBackend(cfg.model, p);
  ASSERT_TRUE(a->Reset(mb, T).ok() && b->Reset(mb, T).ok());
  std::vector<float> logits;
  std::vector<int32_t> next;
  ASSERT_TRUE(a->Append(seqs, ti, false, &logits).ok());
  ASSERT_TRUE(b->AppendGreedy(seqs, ti, &next).ok());
  for (int k = 0; k < mb; ++k) {
    const float* r = logits.data() + size_t(k) * cfg.model.padded_vocab();
    EXPECT_EQ(next[k], int32_t(std::max_element(r, r + cfg.model.vocab) - r));
  }
}

// Append's request as rows (both backends take PlanAppend's): sequence by sequence, positions
// after what each sequence holds, each sequence's last row; every bad request refused.
TEST(PlanAppendTest, LaysOutRowsAndRefusesBadRequests) {
  const std::vector<int> lengths = {3, 0, 5};  // a batch of 3
  const std::vector<int> seqs = {2, 0};
  const std::vector<std::vector<int32_t>> tokens = {{7, 8}, {9}};
  auto rows = PlanAppend(seqs, tokens, lengths, 8, 512, 500);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ(rows->ids, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(rows->pos, (std::vector<int32_t>{5, 6, 3}));
  EXPECT_EQ(rows->row_seq, (std::vector<int32_t>{2, 2, 0}));
  EXPECT_EQ(rows->last, (std::vector<int32_t>{1, 2}));

  auto refused = [&](std::vector<int> s, std::vector<std::vector<int32_t>> t, int max_len,
                     const std::string& says) {
    auto r = PlanAppend(s, t, lengths, max_len, 512, 500);
    ASSERT_FALSE(r.ok()) << says;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().ToString();
  };
  refused({0}, {{1}, {2}}, 8, "1 sequences, 2 token lists");
  refused({3}, {{1}}, 8, "sequence 3 out of range");
  refused({1, 1}, {{1}, {2}}, 8, "sequence 1 out of range or given twice");
  refused({1}, {{}}, 8, "nothing to append to sequence 1");
  refused({2}, {{1, 2, 3, 4}}, 8, "would hold 9 tokens, more than the 8 reserved");
  refused({0}, {{512}}, 8, "token id 512 outside the vocabulary of 500");
  refused({0}, {{-1}}, 8, "token id -1");

  auto before_reset = PlanAppend(seqs, tokens, std::vector<int>{}, 8, 512, 500);
  ASSERT_FALSE(before_reset.ok());
  EXPECT_EQ(before_reset.status().code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace forge
