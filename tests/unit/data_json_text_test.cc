// The JSON Lines text extractor against nlohmann::json (an independent parser): the same text
// for valid lines, the same verdict on malformed ones (thousands of random mutations of real
// lines), and the documented repair of ill-formed text.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/data/json_text.h"

namespace forge {
namespace {

using nlohmann::json;

std::string Extract(const std::string& line, InvalidUtf8 p = InvalidUtf8::kReplace,
                    bool* repaired = nullptr, Status* st = nullptr) {
  std::string text;
  JsonTextResult r;
  Status s = ExtractJsonText(line, "text", p, &text, &r);
  if (repaired != nullptr) *repaired = r.repaired;
  if (st != nullptr) *st = s;
  return s.ok() ? text : "<error: " + s.message() + ">";
}

const std::vector<std::string>& Lines() {
  static const std::vector<std::string> lines = {
      R"({"text": "Hello, world."})",
      R"({"id": 7, "text": "tab\there\nnewline \"quoted\" back\\slash \/ \b\f\r", "meta": {"a": [1, 2.5e-3, -0, true, false, null]}})",
      R"(  {"text":"caf\u00e9 \u4e2d\u6587 \ud83d\ude00 emoji", "x": {}}  )",
      R"({"text": "raw UTF-8: żółć, 日本語, 🧑‍💻"})",
      R"({"meta": {"text": "nested, not this"}, "text": "top level"})",
      R"({"text": "first", "text": "last wins"})",
      R"({"text": "", "url": "https://example.com/?q=1&r=[2]"})",
      R"({"a": [[[[{"b": [{}]}]]]], "text": "deep", "n": 123456789012345678901234567890})",
      R"({"text": "\u0000 nul and \u001f unit separator"})",
      R"({"score": 0.92, "lang": "en", "text": "A line with\u2028a separator."})",
  };
  return lines;
}

TEST(DataJsonTextTest, ValidLinesGiveNlohmannsText) {
  for (const std::string& line : Lines()) {
    const json j = json::parse(line);
    EXPECT_EQ(Extract(line), j.at("text").get<std::string>()) << line;
  }
}

TEST(DataJsonTextTest, MissingOrNonStringKeyAndNonObjects) {
  Status st;
  Extract(R"({"content": "x"})", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "no \"text\" key");
  Extract(R"({"text": 42})", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "\"text\" is a number, not a string");
  Extract(R"({"text": null})", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "\"text\" is null, not a string");
  Extract(R"({"text": ["a"]})", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "\"text\" is an array, not a string");
  Extract(R"({"text": "a", "text": {"b": 1}})", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "\"text\" is an object, not a string");
  Extract(R"(["text", "a"])", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "column 1: expected a JSON object, found an array");
  Extract(R"({"text": "a"} {"text": "b"})", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "column 15: unexpected text after the JSON object");
  Extract(R"({"text": "a" "b": 1})", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "column 14: expected ',' or '}', found '\"'");
  Extract(R"({"text": "unterminated)", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "column 23: unterminated string");
  Extract("{\"text\": \"raw\tcontrol\"}", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "column 14: control character in a string (must be escaped)");
  Extract(R"({"text": "\x41"})", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "column 11: invalid escape '\\x'");
  Extract(R"({"text": 01})", InvalidUtf8::kReplace, nullptr, &st);
  EXPECT_EQ(st.message(), "column 11: expected ',' or '}', found '1'");
}

TEST(DataJsonTextTest, IllFormedTextIsRepairedOrRejected) {
  bool repaired = false;
  // Raw bytes: one U+FFFD per maximal subpart (a truncated 3-byte sequence is one).
  EXPECT_EQ(Extract("{\"text\": \"a\xE2\x82z\xFF\"}", InvalidUtf8::kReplace, &repaired),
            "a\xEF\xBF\xBDz\xEF\xBF\xBD");
  EXPECT_TRUE(repaired);
  // Escapes: a lone surrogate is one U+FFFD, a pair is one character.
  EXPECT_EQ(Extract(R"({"text": "x\ud800y\udc00\ud83d\ude00"})", InvalidUtf8::kReplace, &repaired),
            "x\xEF\xBF\xBDy\xEF\xBF\xBD\xF0\x9F\x98\x80");
  EXPECT_TRUE(repaired);
  EXPECT_EQ(Extract(R"({"text": "\ud800\ud800\udc00"})"), "\xEF\xBF\xBD\xF0\x90\x80\x80");
  Extract(R"({"text": "ok"})", InvalidUtf8::kReplace, &repaired);
  EXPECT_FALSE(repaired);

  Status st;
  Extract("{\"text\": \"a\xE2\x82z\"}", InvalidUtf8::kReject, nullptr, &st);
  EXPECT_EQ(st.message(), "column 12: invalid UTF-8");
  Extract(R"({"text": "ab\udfff"})", InvalidUtf8::kReject, nullptr, &st);
  EXPECT_EQ(st.message(), "column 13: lone surrogate escape (not a character)");
  Extract("{\"id\": \"\xC0\xAF\", \"text\": \"fine\"}", InvalidUtf8::kReject, nullptr, &st);
  EXPECT_EQ(st.message(), "column 9: invalid UTF-8");  // rejected anywhere in the line
}

// Random edits of valid lines: we accept exactly when nlohmann accepts and the text key is a
// string at the top level; then the texts agree. (Reject mode: nlohmann rejects ill-formed
// UTF-8 and lone surrogates too.)
TEST(DataJsonTextTest, MutationsAgreeWithNlohmann) {
  uint64_t x = 12345;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  const std::string alphabet = "{}[]\",:\\ tnfu0123456789.eE+-\xC3\xA9\x80\xFFx";
  int accepted = 0, rejected = 0, overflow = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string line = Lines()[next() % Lines().size()];
    const int edits = 1 + static_cast<int>(next() % 3);
    for (int e = 0; e < edits && !line.empty(); ++e) {
      const size_t pos = next() % line.size();
      switch (next() % 3) {
        case 0: line.erase(pos, 1); break;
        case 1: line.insert(pos, 1, alphabet[next() % alphabet.size()]); break;
        default: line[pos] = alphabet[next() % alphabet.size()]; break;
      }
    }
    std::string ours;
    JsonTextResult r;
    const Status st = ExtractJsonText(line, "text", InvalidUtf8::kReject, &ours, &r);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::out_of_range&) {
      // A number too large for a double: nlohmann refuses it, JSON.parse (and we) do not
      // (only the text's value is taken from a line).
      ++overflow;
      continue;
    } catch (const json::exception&) {
      j = json(json::value_t::discarded);
    }
    const bool theirs_ok = !j.is_discarded() && j.is_object() && j.contains("text") &&
                           j["text"].is_string();
    ASSERT_EQ(st.ok(), theirs_ok) << "line: " << line << "\nours: " << st.ToString();
    if (theirs_ok) {
      ASSERT_EQ(ours, j["text"].get<std::string>()) << line;
      ++accepted;
    } else {
      ++rejected;
    }
  }
  std::printf("[ json ] %d mutated lines accepted, %d rejected, all as nlohmann (%d with a number "
              "out of a double's range left out)\n", accepted, rejected, overflow);
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace forge
