// Token shards: round trip in both dtypes and the DataLoss errors for damaged files
// (truncation, flipped payload byte, flipped header byte, wrong magic, trailing bytes).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "worker/data/shard.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

std::string TestDir() {
  return ::testing::TempDir() + "/forge_shard_test_" + std::to_string(::getpid());
}

std::string TempPath(const std::string& name) {
  fs::create_directories(TestDir());
  return TestDir() + "/" + name;
}

// Removes this process's test directory when the tests end.
struct CleanUp : ::testing::Environment {
  void TearDown() override { fs::remove_all(TestDir()); }
};
[[maybe_unused]] ::testing::Environment* const kCleanUp =
    ::testing::AddGlobalTestEnvironment(new CleanUp);

std::vector<int32_t> SomeTokens(size_t n, int32_t mod) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + 13) % mod);
  return t;
}

void PatchByte(const std::string& path, size_t offset, uint8_t xor_mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ xor_mask));
}

void ExpectDataLoss(const std::string& path, const std::string& what) {
  auto r = ShardReader::Open(path);
  ASSERT_FALSE(r.ok()) << "opened a damaged shard (" << what << ")";
  EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path), std::string::npos)
      << "error does not name the file: " << r.status().ToString();
  EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
}

TEST(DataShardTest, RoundTripUint16) {
  const std::string path = TempPath("rt16.tok");
  std::vector<int32_t> tokens = SomeTokens(10007, 50257);
  tokens.push_back(0);
  tokens.push_back(65535);
  auto info = WriteShard(path, tokens, TokenDtype::kUint16);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->tokens, tokens.size());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(fs::file_size(path), kShardHeaderSize + 2 * tokens.size());

  auto r = ShardReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), tokens.size());
  EXPECT_EQ(r->dtype(), TokenDtype::kUint16);
  EXPECT_EQ(r->crc32c(), info->crc32c);
  std::vector<int32_t> back(tokens.size());
  r->Copy(0, tokens.size(), back.data());
  EXPECT_EQ(back, tokens);
  EXPECT_EQ((*r)[tokens.size() - 1], 65535u);
}

TEST(DataShardTest, RoundTripUint32AndEmpty) {
  const std::string path = TempPath("rt32.tok");
  std::vector<int32_t> tokens = SomeTokens(999, 1 << 30);
  tokens.push_back(100000);
  ASSERT_TRUE(WriteShard(path, tokens, TokenDtype::kUint32).ok());
  auto r = ShardReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->dtype(), TokenDtype::kUint32);
  std::vector<int32_t> back(5);
  r->Copy(tokens.size() - 5, 5, back.data());
  EXPECT_EQ(back, std::vector<int32_t>(tokens.end() - 5, tokens.end()));

  const std::string empty = TempPath("empty.tok");
  ASSERT_TRUE(WriteShard(empty, {}, TokenDtype::kUint16).ok());
  auto e = ShardReader::Open(empty);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->size(), 0u);
}

TEST(DataShardTest, TokenTooLargeForDtypeIsRejected) {
  const std::vector<int32_t> tokens = {1, 2, 70000};
  auto info = WriteShard(TempPath("big.tok"), tokens, TokenDtype::kUint16);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), Code::kInvalidArgument);
  EXPECT_NE(info.status().message().find("70000"), std::string::npos);
}

TEST(DataShardTest, DamagedShardsAreDataLossNamingTheFile) {
  const std::vector<int32_t> tokens = SomeTokens(4096, 50257);
  const size_t file_size = kShardHeaderSize + 2 * tokens.size();

  const std::string truncated = TempPath("truncated.tok");
  ASSERT_TRUE(WriteShard(truncated, tokens, TokenDtype::kUint16).ok());
  fs::resize_file(truncated, file_size - 10);
  ExpectDataLoss(truncated, "truncated");

  const std::string header_only = TempPath("header_cut.tok");
  ASSERT_TRUE(WriteShard(header_only, tokens, TokenDtype::kUint16).ok());
  fs::resize_file(header_only, 20);
  ExpectDataLoss(header_only, "truncated");

  const std::string flipped = TempPath("flipped.tok");
  ASSERT_TRUE(WriteShard(flipped, tokens, TokenDtype::kUint16).ok());
  PatchByte(flipped, kShardHeaderSize + 1234, 0x01);
  ExpectDataLoss(flipped, "checksum mismatch");

  const std::string magic = TempPath("magic.tok");
  ASSERT_TRUE(WriteShard(magic, tokens, TokenDtype::kUint16).ok());
  PatchByte(magic, 0, 0x20);
  ExpectDataLoss(magic, "bad magic");

  const std::string count = TempPath("count.tok");  // token count field altered
  ASSERT_TRUE(WriteShard(count, tokens, TokenDtype::kUint16).ok());
  PatchByte(count, 16, 0x01);
  ExpectDataLoss(count, "header checksum mismatch");

  const std::string trailing = TempPath("trailing.tok");
  ASSERT_TRUE(WriteShard(trailing, tokens, TokenDtype::kUint16).ok());
  std::ofstream(trailing, std::ios::app | std::ios::binary) << "xx";
  ExpectDataLoss(trailing, "trailing bytes");
}

TEST(DataShardTest, MissingFileIsNotFound) {
  auto r = ShardReader::Open(TempPath("does_not_exist.tok"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().message().find("does_not_exist.tok"), std::string::npos);
}

}  // namespace
}  // namespace forge
