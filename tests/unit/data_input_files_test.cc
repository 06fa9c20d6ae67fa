// Input discovery and work-unit planning: directories walked, globs expanded, links followed
// once, unknown formats skipped in walks and refused when named; units that group small files
// and chunk large plain JSONL files, the same for the same inputs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "worker/data/input_files.h"
#include "worker/data/prepare_plan.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

class DataInputFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir() + "/forge_inputs_test_" + std::to_string(::getpid()))
               .lexically_normal()
               .string();
    fs::remove_all(dir_);
    for (const char* d : {"corpus/a", "corpus/b/deep", "corpus/.hidden", "other"}) {
      fs::create_directories(dir_ + "/" + d);
    }
    for (const char* f : {"corpus/a/1.txt", "corpus/a/2.md", "corpus/a/notes.pdf",
                          "corpus/b/deep/x.jsonl", "corpus/b/y.jsonl.gz", "corpus/b/z.ndjson.zst",
                          "corpus/.hidden/secret.txt", "corpus/.DS_Store", "other/o.jsonl",
                          "other/readme"}) {
      std::ofstream(dir_ + "/" + f) << "{\"text\": \"" << f << "\"}\n";
    }
    fs::create_symlink(dir_ + "/other/o.jsonl", dir_ + "/corpus/link.jsonl");
    fs::create_directory_symlink(dir_ + "/other", dir_ + "/corpus/dirlink");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(DataInputFilesTest, DirectoriesGlobsAndLinks) {
  auto list = DiscoverInputs({dir_ + "/corpus"}, InputFormat::kAuto, false);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  std::vector<std::string> names;
  for (const InputFile& f : list->files) names.push_back(f.path.substr(dir_.size() + 1));
  EXPECT_EQ(names, (std::vector<std::string>{"corpus/a/1.txt", "corpus/a/2.md",
                                             "corpus/b/deep/x.jsonl", "corpus/b/y.jsonl.gz",
                                             "corpus/b/z.ndjson.zst", "corpus/link.jsonl"}));
  EXPECT_EQ(list->skipped, 1);  // notes.pdf (hidden files and linked directories not walked)
  EXPECT_EQ(list->files[3].compression, Compression::kGzip);
  EXPECT_EQ(list->files[3].format, InputFormat::kJsonl);
  EXPECT_EQ(list->files[0].format, InputFormat::kText);
  EXPECT_GT(list->files[0].size, 0u);

  // A file reached twice (the link and its target) is listed once, under the first path.
  auto both = DiscoverInputs({dir_ + "/corpus/link.jsonl", dir_ + "/other"}, InputFormat::kAuto,
                             false);
  ASSERT_TRUE(both.ok());
  ASSERT_EQ(both->files.size(), 1u);
  EXPECT_EQ(both->files[0].path, dir_ + "/corpus/link.jsonl");

  // Globs (quoted, so the program expands them), in argument order independent of the result.
  auto glob = DiscoverInputs({dir_ + "/corpus/b/*.{gz,zst}", dir_ + "/corpus/a/*.txt"},
                             InputFormat::kAuto, false);
  ASSERT_TRUE(glob.ok()) << glob.status().ToString();
  ASSERT_EQ(glob->files.size(), 3u);
  EXPECT_EQ(glob->files[0].path, dir_ + "/corpus/a/1.txt");

  // An explicit format reads every file found.
  auto all = DiscoverInputs({dir_ + "/other"}, InputFormat::kJsonl, true);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->files.size(), 2u);
  EXPECT_TRUE(all->files[0].val);
}

TEST_F(DataInputFilesTest, ErrorsNameThePath) {
  auto named = DiscoverInputs({dir_ + "/other/readme"}, InputFormat::kAuto, false);
  ASSERT_FALSE(named.ok());
  EXPECT_NE(named.status().message().find(dir_ + "/other/readme: unknown format"), std::string::npos)
      << named.status().ToString();
  auto missing = DiscoverInputs({dir_ + "/nope.jsonl"}, InputFormat::kAuto, false);
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.jsonl"), std::string::npos);
  auto glob = DiscoverInputs({dir_ + "/*.parquet"}, InputFormat::kAuto, false);
  EXPECT_EQ(glob.status().code(), Code::kNotFound);
  EXPECT_NE(glob.status().message().find("*.parquet: no file matches"), std::string::npos);
  fs::create_directories(dir_ + "/empty");
  auto empty = DiscoverInputs({dir_ + "/empty"}, InputFormat::kAuto, false);
  EXPECT_EQ(empty.status().code(), Code::kNotFound);
}

TEST(DataPlanTest, GroupsSmallFilesAndChunksLargeJsonl) {
  std::vector<InputFile> files;
  auto add = [&](std::string path, uint64_t size, InputFormat f, Compression c) {
    InputFile x;
    x.path = std::move(path);
    x.size = size;
    x.format = f;
    x.compression = c;
    files.push_back(x);
  };
  add("/d/a.txt", 30, InputFormat::kText, Compression::kNone);
  add("/d/b.txt", 30, InputFormat::kText, Compression::kNone);
  add("/d/c.jsonl", 250, InputFormat::kJsonl, Compression::kNone);  // chunked: 3 units
  add("/d/d.jsonl.zst", 20, InputFormat::kJsonl, Compression::kZstd);  // weighs 80
  add("/d/e.jsonl", 50, InputFormat::kJsonl, Compression::kNone);
  add("/d/f.txt", 500, InputFormat::kText, Compression::kNone);  // one document: not chunked
  const std::vector<PlannedUnit> units = PlanUnits(files, 100);
  ASSERT_EQ(units.size(), 7u);
  EXPECT_EQ(units[0].files, (std::vector<int>{0, 1}));
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(units[1 + k].files, (std::vector<int>{2}));
    EXPECT_EQ(units[1 + k].chunk, static_cast<uint64_t>(k));
    EXPECT_EQ(units[1 + k].chunk_bytes, 100u);
  }
  EXPECT_EQ(units[3].bytes, 50u);
  EXPECT_EQ(units[4].files, (std::vector<int>{3}));
  EXPECT_EQ(units[5].files, (std::vector<int>{4}));
  EXPECT_EQ(units[6].files, (std::vector<int>{5}));
  // Same inputs, same plan; another mtime, another key.
  const std::vector<PlannedUnit> again = PlanUnits(files, 100);
  for (size_t i = 0; i < units.size(); ++i) EXPECT_EQ(units[i].key, again[i].key);
  files[1].mtime_ns = 1;
  EXPECT_NE(PlanUnits(files, 100)[0].key, units[0].key);
  EXPECT_EQ(PlanUnits(files, 100)[1].key, units[1].key);
}

}  // namespace
}  // namespace forge
