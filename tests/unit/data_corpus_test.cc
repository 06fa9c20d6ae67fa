// Corpus assembly on small fixture trees: order, train/val hold-out, exclusions, GCIDE
// clean-up and UTF-8 sanitising.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "worker/data/corpus.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

void WriteText(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

void WriteGzip(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  gzFile gz = gzopen(p.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  gzclose(gz);
}

const char kGcide[] =
    "00-database-info\n"
    "   This file was converted from the original database.\n"
    "GCIDE is free software; licence text.\n"
    "Abacinate \\A*bac\"i*nate\\ ([.a]*b[a^]s\"[i^]*n[=a]t), v. t. [LL.\n"
    "   abacinare.] To blind. See {Blind}. Caf['e] na[\"i]ve [ae]ther.\n"
    "   [1913 Webster]\n"
    "\n"
    "            As might affect the earth.                  --Milton.\n"
    "      [1913 Webster +PJC]\n"
    "\n"
    "Zythum \\Zy\"thum\\ (z[i^]\"th[u^]m), n. A malt beverage. [Obs.] [root]2.\n"
    "   [WordNet 1.5]\n"
    "fox trot \\fox\" trot`\\, foxtrot \\fox\"trot`\\n.\n";

CorpusSources MakeFixture(const fs::path& root) {
  fs::remove_all(root);
  for (int year = 1990; year < 2002; ++year) {
    WriteText(root / "sotu" / (std::to_string(year) + "_someone_x.txt"),
              "Address of " + std::to_string(year) + " \xe2\x80\x94 \xff bad byte.");
  }
  WriteText(root / "sotu" / "data.txt", "not an address");
  for (int ch = 1; ch <= 12; ++ch) {
    WriteText(root / "moby" / ("chapter_" + std::to_string(ch) + ".txt"),
              "CHAPTER " + std::to_string(ch) + ".");
  }
  WriteText(root / "moby" / "etymology.txt", "ETYMOLOGY.");
  WriteText(root / "moby" / "contents.txt", "table of contents (skipped)");
  WriteGzip(root / "gcide.dict.dz", kGcide);
  WriteGzip(root / "linux" / "b" / "two.rst.gz", "Two\n===\n");
  WriteGzip(root / "linux" / "a" / "one.rst.gz", "One\n===\n");
  WriteGzip(root / "linux" / "translations" / "zh_CN" / "one.rst.gz", "translated");
  WriteText(root / "linux" / "a" / "notes.txt", "not rst");
  WriteText(root / "python" / "library" / "re.rst.txt", "re \xe2\x80\x94 Regular expressions");
  CorpusSources s;
  s.sotu_dir = (root / "sotu").string();
  s.moby_dick_dir = (root / "moby").string();
  s.gcide_dict = (root / "gcide.dict.dz").string();
  s.linux_doc_dir = (root / "linux").string();
  s.python_doc_dir = (root / "python").string();
  s.sotu_val_docs = 3;
  s.moby_val_chapters = 2;
  return s;
}

TEST(DataCorpusTest, OrderAndSplitsOnFixtures) {
  const std::string root =
      ::testing::TempDir() + "/forge_corpus_fixture_" + std::to_string(::getpid());
  const CorpusSources src = MakeFixture(root);
  auto corpus = LoadCorpus(src);
  ASSERT_TRUE(corpus.ok()) << corpus.status().ToString();
  const std::vector<Document>& d = corpus->docs;

  // SOTU: 12 addresses in year order, the last 3 held out; data.txt ignored.
  ASSERT_EQ(corpus->stats.at("sotu").docs[0], 9);
  ASSERT_EQ(corpus->stats.at("sotu").docs[1], 3);
  EXPECT_NE(d[0].text.find("1990"), std::string::npos);
  EXPECT_EQ(d[8].split, Split::kTrain);
  EXPECT_EQ(d[9].split, Split::kVal);
  EXPECT_NE(d[11].text.find("2001"), std::string::npos);
  // Invalid UTF-8 became U+FFFD, valid multi-byte text kept.
  EXPECT_NE(d[0].text.find("\xe2\x80\x94 \xef\xbf\xbd bad"), std::string::npos);

  // Moby-Dick: etymology, then chapters 1..12 by number (not name), last 2 held out.
  EXPECT_EQ(d[12].text, "ETYMOLOGY.");
  EXPECT_EQ(d[13].text, "CHAPTER 1.");
  EXPECT_EQ(d[14].text, "CHAPTER 2.");
  EXPECT_EQ(d[23].text, "CHAPTER 11.");
  EXPECT_EQ(d[23].split, Split::kVal);
  EXPECT_EQ(d[24].text, "CHAPTER 12.");
  EXPECT_EQ(d[22].split, Split::kTrain);
  EXPECT_EQ(corpus->stats.at("moby_dick").docs[1], 2);

  // GCIDE: header skipped, one document (fixture is smaller than a chunk), cleaned.
  ASSERT_EQ(corpus->stats.at("gcide").docs[0], 1);
  const std::string& g = d[25].text;
  EXPECT_EQ(g.rfind("Abacinate (ȧ*băs\"ĭ*nāt), v. t. [LL.\n", 0), 0u) << g;
  EXPECT_EQ(g.find("licence"), std::string::npos);

  // Linux docs: sorted, *.rst.gz only, translations excluded. Python docs last.
  EXPECT_EQ(d[26].text, "One\n===\n");
  EXPECT_EQ(d[27].text, "Two\n===\n");
  EXPECT_EQ(d[28].source, "python_doc");
  EXPECT_EQ(d.size(), 29u);
  EXPECT_EQ(corpus->docs_in[1], 5);
  EXPECT_NE(corpus->Summary().find("val"), std::string::npos);
  fs::remove_all(root);
}

TEST(DataCorpusTest, GcideCleanup) {
  const std::string raw = kGcide;
  const std::string clean = CleanGcideText(raw.substr(raw.find("Abacinate")));
  EXPECT_EQ(clean,
            "Abacinate (ȧ*băs\"ĭ*nāt), v. t. [LL.\n"
            "abacinare.] To blind. See Blind. Café naïve æther.\n"
            "\n"
            "As might affect the earth. --Milton.\n"
            "\n"
            "Zythum (zĭ\"thŭm), n. A malt beverage. [Obs.] √2.\n"
            "fox trot, foxtrot n.\n");
}

TEST(DataCorpusTest, MissingSourceIsAnErrorNamingIt) {
  CorpusSources s;
  s.sotu_dir = "/nonexistent/sotu";
  auto c = LoadCorpus(s);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/sotu"), std::string::npos);
  EXPECT_FALSE(LoadCorpus(CorpusSources{}).ok());  // nothing configured
}

}  // namespace
}  // namespace forge
