// Dataset manifest + loader: a split spread over several shards reads as one stream;
// disagreements between the manifest and the shards are errors naming the shard; the
// unigram baseline matches a hand computation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
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

TEST(DataDatasetTest, ManifestShardMismatchesAreErrorsNamingTheShard) {
  const std::vector<int32_t> train = Iota(600, 1000), val = Iota(50, 1000);

  {  // manifest token count disagrees with the shard
    const std::string dir = TempDir("count");
    DatasetManifest m = WriteTestDataset(dir, train, val, 300, 1000);
    m.splits[0].shards[1].tokens += 1;
    m.splits[0].tokens += 1;
    ASSERT_TRUE(WriteDatasetManifest(dir, m).ok());
    auto ds = TokenDataset::Open(dir);
    ASSERT_FALSE(ds.ok());
    EXPECT_EQ(ds.status().code(), Code::kDataLoss);
    EXPECT_NE(ds.status().message().find("train_1.tok"), std::string::npos)
        << ds.status().ToString();
  }
  {  // shard replaced by another valid shard with other content
    const std::string dir = TempDir("swap");
    WriteTestDataset(dir, train, val, 300, 1000);
    std::vector<int32_t> other = Iota(300, 7);
    ASSERT_TRUE(WriteShard(dir + "/train_0.tok", other, TokenDtype::kUint16).ok());
    auto ds = TokenDataset::Open(dir);
    ASSERT_FALSE(ds.ok());
    EXPECT_NE(ds.status().message().find("train_0.tok"), std::string::npos)
        << ds.status().ToString();
  }
  {  // shard missing
    const std::string dir = TempDir("missing");
    WriteTestDataset(dir, train, val, 300, 1000);
    fs::remove(dir + "/val_0.tok");
    auto ds = TokenDataset::Open(dir);
    ASSERT_FALSE(ds.ok());
    EXPECT_EQ(ds.status().code(), Code::kNotFound);
    EXPECT_NE(ds.status().message().find("val_0.tok"), std::string::npos);
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
  {  // no manifest at all / not JSON
    const std::string dir = TempDir("nomanifest");
    fs::remove_all(dir);
    fs::create_directories(dir);
    EXPECT_EQ(TokenDataset::Open(dir).status().code(), Code::kNotFound);
    std::ofstream(dir + "/manifest.json") << "{ not json";
    EXPECT_EQ(TokenDataset::Open(dir).status().code(), Code::kDataLoss);
  }
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
}

}  // namespace
}  // namespace forge
