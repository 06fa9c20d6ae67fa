// Dataset manifest + loader: a split spread over several shards reads as one stream;
// disagreements between the manifest and the shards are errors naming the shard; the
// unigram baseline matches a hand computation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "worker/data/dataset.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// Writes `tokens` of each split into shards of at most `per_shard` tokens + a manifest.
DatasetManifest WriteTestDataset(const std::string& dir, const std::vector<int32_t>& train,
                                 const std::vector<int32_t>& val, size_t per_shard,
                                 int32_t vocab) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  DatasetManifest m;
  m.vocab_size = vocab;
  m.eot_token = vocab - 1;
  const std::vector<int32_t>* data[2] = {&train, &val};
  for (int s = 0; s < 2; ++s) {
    for (size_t i = 0, k = 0; i < data[s]->size(); i += per_shard, ++k) {
      const size_t n = std::min(per_shard, data[s]->size() - i);
      const std::string name = std::string(s == 0 ? "train" : "val") + "_" + std::to_string(k) +
                               ".tok";
      auto info = WriteShard(dir + "/" + name,
                             std::span<const int32_t>(data[s]->data() + i, n),
                             TokenDtype::kUint16);
      EXPECT_TRUE(info.ok()) << info.status().ToString();
      m.splits[s].shards.push_back({name, static_cast<int64_t>(n), info->crc32c});
      m.splits[s].tokens += static_cast<int64_t>(n);
    }
  }
  EXPECT_TRUE(WriteDatasetManifest(dir, m).ok());
  return m;
}

// Removes this process's test directories when the tests end.
struct CleanUp : ::testing::Environment {
  void TearDown() override {
    const std::string prefix = "forge_dataset_test_" + std::to_string(::getpid()) + "_";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(::testing::TempDir(), ec)) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove_all(e.path(), ec);
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kCleanUp =
    ::testing::AddGlobalTestEnvironment(new CleanUp);

std::string TempDir(const std::string& name) {
  return ::testing::TempDir() + "/forge_dataset_test_" + std::to_string(::getpid()) + "_" + name;
}

std::vector<int32_t> Iota(int n, int mod) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i % mod;
  return v;
}

TEST(DataDatasetTest, SplitReadsAsOneStreamAcrossShards) {
  const std::string dir = TempDir("stream");
  const std::vector<int32_t> train = Iota(1000, 50000), val = Iota(77, 50000);
  WriteTestDataset(dir, train, val, 300, 50257);
  auto ds = TokenDataset::Open(dir);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->split(Split::kTrain).size(), 1000);
  EXPECT_EQ(ds->split(Split::kVal).size(), 77);
  EXPECT_EQ(ds->manifest().splits[0].shards.size(), 4u);

  std::vector<int32_t> out(500);
  ASSERT_TRUE(ds->split(Split::kTrain).Read(250, 500, out.data()).ok());  // spans 3 shards
  EXPECT_EQ(out, std::vector<int32_t>(train.begin() + 250, train.begin() + 750));
  EXPECT_EQ(ds->split(Split::kTrain).At(999), 999u);
  EXPECT_EQ(ds->split(Split::kVal).At(76), 76u);

  Status past_end = ds->split(Split::kTrain).Read(990, 20, out.data());
  EXPECT_EQ(past_end.code(), Code::kInvalidArgument);
}

TEST(DataDatasetTest, ManifestRoundTripsFields) {
  const std::string dir = TempDir("fields");
  fs::create_directories(dir);
  DatasetManifest m;
  m.vocab_size = 50257;
  m.eot_token = 50256;
  m.options_hash = "0x0123456789abcdef";
  m.sources["sotu"].docs[1] = 10;
  m.sources["sotu"].bytes[0] = 12345;
  m.created_seconds = 1.5;
  ASSERT_TRUE(WriteDatasetManifest(dir, m).ok());
  auto back = ReadDatasetManifest(dir);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->options_hash, m.options_hash);
  EXPECT_EQ(back->vocab_size, 50257);
  EXPECT_EQ(back->sources["sotu"].docs[1], 10);
  EXPECT_EQ(back->sources["sotu"].bytes[0], 12345);
  EXPECT_DOUBLE_EQ(back->created_seconds, 1.5);
}

// Open reads the manifest and the shards table only; a shard that disagrees with the table
// is an error naming it when a read first needs it.
TEST(DataDatasetTest, ManifestShardMismatchesAreErrorsNamingTheShard) {
  const std::vector<int32_t> train = Iota(600, 1000), val = Iota(50, 1000);
  std::vector<int32_t> out(600);

  {  // manifest token count disagrees with the shard
    const std::string dir = TempDir("count");
    DatasetManifest m = WriteTestDataset(dir, train, val, 300, 1000);
    m.splits[0].shards[1].tokens += 1;
    m.splits[0].tokens += 1;
    ASSERT_TRUE(WriteDatasetManifest(dir, m).ok());
    auto ds = TokenDataset::Open(dir);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_TRUE(ds->split(Split::kTrain).Read(0, 300, out.data()).ok());  // shard 0 is fine
    Status st = ds->split(Split::kTrain).Read(250, 100, out.data());
    EXPECT_EQ(st.code(), Code::kDataLoss);
    EXPECT_NE(st.message().find("train_1.tok"), std::string::npos) << st.ToString();
  }
  {  // shard replaced by another valid shard with other content
    const std::string dir = TempDir("swap");
    WriteTestDataset(dir, train, val, 300, 1000);
    std::vector<int32_t> other = Iota(300, 7);
    ASSERT_TRUE(WriteShard(dir + "/train_0.tok", other, TokenDtype::kUint16).ok());
    auto ds = TokenDataset::Open(dir);
    ASSERT_TRUE(ds.ok());
    Status st = ds->split(Split::kTrain).Read(0, 10, out.data());
    EXPECT_EQ(st.code(), Code::kDataLoss);
    EXPECT_NE(st.message().find("train_0.tok"), std::string::npos) << st.ToString();
  }
  {  // shard missing
    const std::string dir = TempDir("missing");
    WriteTestDataset(dir, train, val, 300, 1000);
    fs::remove(dir + "/val_0.tok");
    auto ds = TokenDataset::Open(dir);
    ASSERT_TRUE(ds.ok());
    Status st = ds->split(Split::kVal).Read(0, 10, out.data());
    EXPECT_EQ(st.code(), Code::kNotFound);
    EXPECT_NE(st.message().find("val_0.tok"), std::string::npos);
    // The error stays: a second read gets it again.
    EXPECT_EQ(ds->split(Split::kVal).Read(5, 1, out.data()).code(), Code::kNotFound);
  }
  {  // a truncated shard fails its header check on first use
    const std::string dir = TempDir("truncated");
    WriteTestDataset(dir, train, val, 300, 1000);
    fs::resize_file(dir + "/train_1.tok", fs::file_size(dir + "/train_1.tok") - 2);
    auto ds = TokenDataset::Open(dir);
    ASSERT_TRUE(ds.ok());
    Status st = ds->split(Split::kTrain).Read(599, 1, out.data());
    EXPECT_EQ(st.code(), Code::kDataLoss);
    EXPECT_NE(st.message().find("train_1.tok: size"), std::string::npos) << st.ToString();
  }
  {  // a flipped payload byte passes the header check and fails VerifyShard
    const std::string dir = TempDir("payload");
    WriteTestDataset(dir, train, val, 300, 1000);
    {
      std::fstream f(dir + "/train_1.tok", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.put('\x7f');
    }
    auto ds = TokenDataset::Open(dir);
    ASSERT_TRUE(ds.ok());
    EXPECT_TRUE(ds->split(Split::kTrain).VerifyShard(0).ok());
    Status st = ds->split(Split::kTrain).VerifyShard(1);
    EXPECT_EQ(st.code(), Code::kDataLoss);
    EXPECT_NE(st.message().find("train_1.tok: checksum mismatch"), std::string::npos);
  }
  {  // split total disagrees with its shard list
    const std::string dir = TempDir("total");
    DatasetManifest m = WriteTestDataset(dir, train, val, 300, 1000);
    m.splits[1].tokens = 51;
    ASSERT_TRUE(WriteDatasetManifest(dir, m).ok());
    auto ds = TokenDataset::Open(dir);
    ASSERT_FALSE(ds.ok());
    EXPECT_EQ(ds.status().code(), Code::kDataLoss);
    EXPECT_NE(ds.status().message().find("manifest.json"), std::string::npos);
  }
  {  // the shards table does not match its checksum
    const std::string dir = TempDir("table");
    WriteTestDataset(dir, train, val, 300, 1000);
    std::ofstream(dir + "/shards-000000.tsv", std::ios::app) << "val\tval_9.tok\t1\t0x00000000\n";
    auto ds = TokenDataset::Open(dir);
    ASSERT_FALSE(ds.ok());
    EXPECT_EQ(ds.status().code(), Code::kDataLoss);
    EXPECT_NE(ds.status().message().find("shards-000000.tsv: checksum mismatch"), std::string::npos)
        << ds.status().ToString();
  }
  {  // no manifest at all / not JSON
    const std::string dir = TempDir("nomanifest");
    fs::remove_all(dir);
    fs::create_directories(dir);
    EXPECT_EQ(TokenDataset::Open(dir).status().code(), Code::kNotFound);
    std::ofstream(dir + "/manifest.json") << "{ not json";
    EXPECT_EQ(TokenDataset::Open(dir).status().code(), Code::kDataLoss);
  }
}

// Start-up does no per-shard work: a dataset whose shards are all gone still opens, and a
// read maps only the shards it touches.
TEST(DataDatasetTest, OpenTouchesNoShardAndReadsOpenOnlyWhatTheyNeed) {
  const std::string dir = TempDir("lazy");
  const std::vector<int32_t> train = Iota(1000, 1000), val = Iota(100, 1000);
  WriteTestDataset(dir, train, val, 100, 1000);
  {
    auto ds = TokenDataset::Open(dir);
    ASSERT_TRUE(ds.ok());
    const TokenStream& ts = ds->split(Split::kTrain);
    EXPECT_EQ(ts.num_shards(), 10);
    EXPECT_EQ(ts.opened_shards(), 0);
    std::vector<int32_t> out(50);
    ASSERT_TRUE(ts.Read(420, 50, out.data()).ok());
    EXPECT_EQ(ts.opened_shards(), 1);
    ASSERT_TRUE(ts.Read(480, 50, out.data()).ok());  // crosses into shard 5
    EXPECT_EQ(ts.opened_shards(), 2);
    EXPECT_EQ(out[0], 480);
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".tok") fs::remove(e.path());
  }
  auto ds = TokenDataset::Open(dir);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->split(Split::kTrain).size(), 1000);
}

// Datasets written by the version 1 manifest (shards inline) still open and read.
TEST(DataDatasetTest, Version1ManifestStillReads) {
  const std::string dir = TempDir("v1");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<int32_t> train = Iota(500, 50257), val = Iota(20, 50257);
  auto a = WriteShard(dir + "/train_00000.tok", train, TokenDtype::kUint16);
  auto b = WriteShard(dir + "/val_00000.tok", val, TokenDtype::kUint16);
  ASSERT_TRUE(a.ok() && b.ok());
  char crc_a[16], crc_b[16];
  std::snprintf(crc_a, sizeof crc_a, "0x%08x", a->crc32c);
  std::snprintf(crc_b, sizeof crc_b, "0x%08x", b->crc32c);
  std::ofstream(dir + "/manifest.json")
      << "{\"format\": \"forge-dataset\", \"version\": 1, \"tokenizer\": \"gpt2-bpe\", "
         "\"vocab_size\": 50257, \"eot_token\": 50256, \"dtype\": \"uint16\", "
         "\"options_hash\": \"0x0123456789abcdef\", \"splits\": {"
         "\"train\": {\"tokens\": 500, \"docs\": 3, \"text_bytes\": 2000, \"shards\": "
         "[{\"file\": \"train_00000.tok\", \"tokens\": 500, \"crc32c\": \"" << crc_a << "\"}]}, "
         "\"val\": {\"tokens\": 20, \"docs\": 1, \"text_bytes\": 80, \"shards\": "
         "[{\"file\": \"val_00000.tok\", \"tokens\": 20, \"crc32c\": \"" << crc_b << "\"}]}}, "
         "\"sources\": {\"sotu\": {\"train_docs\": 3, \"val_docs\": 1, \"train_bytes\": 2000, "
         "\"val_bytes\": 80}}, \"created\": {\"unix_time\": 1, \"seconds\": 2.5, \"threads\": 2}}\n";
  auto ds = TokenDataset::Open(dir);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  const DatasetManifest& m = ds->manifest();
  EXPECT_EQ(m.version, 1);
  EXPECT_EQ(m.tokenizer, "gpt2");  // "gpt2-bpe" in the file
  EXPECT_EQ(m.tokenizer_identity, "");
  EXPECT_EQ(m.options_hash, "0x0123456789abcdef");
  EXPECT_EQ(m.splits[0].docs, 3);
  EXPECT_EQ(m.sources.at("sotu").docs[1], 1);
  std::vector<int32_t> out(500);
  ASSERT_TRUE(ds->split(Split::kTrain).Read(0, 500, out.data()).ok());
  EXPECT_EQ(out, train);
  const UnigramBaseline u = ComputeUnigramBaseline(*ds);  // counted from the tokens
  EXPECT_EQ(u.train_tokens, 500);
  EXPECT_EQ(u.val_tokens, 20);
}

// Vocabularies over 65536 ids are stored as uint32 end to end.
TEST(DataDatasetTest, Uint32ShardsCarryLargeIds) {
  const std::string dir = TempDir("u32");
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<int32_t> ids;
  for (int i = 0; i < 5000; ++i) ids.push_back((i * 40503) % 200019);  // up to o200k's size
  EXPECT_FALSE(WriteShard(dir + "/bad.tok", ids, TokenDtype::kUint16).ok());
  auto w = ShardWriter::Create(dir + "/train_0.tok", TokenDtype::kUint32);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Append(std::span<const int32_t>(ids).first(1234)).ok());
  ASSERT_TRUE(w->Append(std::span<const int32_t>(ids).subspan(1234)).ok());
  auto info = w->Finish();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  auto same = WriteShard(dir + "/copy.tok", ids, TokenDtype::kUint32);  // the one-shot writer
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(info->crc32c, same->crc32c);
  DatasetManifest m;
  m.vocab_size = 200019;
  m.eot_token = 199999;
  m.dtype = TokenDtype::kUint32;
  m.splits[0].shards.push_back({"train_0.tok", 5000, info->crc32c});
  m.splits[0].tokens = 5000;
  ASSERT_TRUE(WriteDatasetManifest(dir, m).ok());
  auto ds = TokenDataset::Open(dir);
  ASSERT_TRUE(ds.ok());
  std::vector<int32_t> out(5000);
  ASSERT_TRUE(ds->split(Split::kTrain).Read(0, 5000, out.data()).ok());
  EXPECT_EQ(out, ids);
  EXPECT_GT(*std::max_element(out.begin(), out.end()), 65535);
}

TEST(DataDatasetTest, UnigramBaselineMatchesHandComputation) {
  // vocab 4; train: 0 x6, 1 x2, 2 x0, 3 x0 (8 tokens); val: 0, 1, 2.
  const std::string dir = TempDir("unigram");
  WriteTestDataset(dir, {0, 0, 0, 1, 0, 0, 1, 0}, {0, 1, 2}, 5, 4);
  auto ds = TokenDataset::Open(dir);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  const UnigramBaseline u = ComputeUnigramBaseline(*ds);
  // Add-one smoothing: p = (count + 1) / (8 + 4) -> 7/12, 3/12, 1/12.
  const double want = -(std::log(7.0 / 12) + std::log(3.0 / 12) + std::log(1.0 / 12)) / 3;
  EXPECT_NEAR(u.val_cross_entropy, want, 1e-12);
  EXPECT_NEAR(u.train_entropy, -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-12);
  EXPECT_EQ(u.train_tokens, 8);
  EXPECT_EQ(u.val_tokens, 3);

  // From a unigram table, with no token read: the same numbers with the shards gone.
  std::vector<uint64_t> counts[2] = {{6, 2, 0, 0}, {1, 1, 1, 0}};
  DatasetManifest m = ds->manifest();
  ASSERT_TRUE(WriteUnigramTable(dir, 0, counts, &m.unigram_table).ok());
  ASSERT_TRUE(WriteDatasetManifest(dir, m).ok());
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".tok") fs::remove(e.path());
  }
  auto again = TokenDataset::Open(dir);
  ASSERT_TRUE(again.ok());
  const UnigramBaseline t = ComputeUnigramBaseline(*again);
  EXPECT_NEAR(t.val_cross_entropy, want, 1e-12);
  EXPECT_EQ(t.train_tokens, 8);
}

}  // namespace
}  // namespace forge
