// UTF-8 repair as the WHATWG decoder does it: one U+FFFD per maximal ill-formed subpart. The
// expected strings are what node's `new TextDecoder().decode(bytes)` and Python's
// `bytes.decode("utf-8", "replace")` return for the same bytes.
#include <gtest/gtest.h>

#include <string>

#include "common/utf8.h"

namespace forge {
namespace {

const std::string kR = "\xef\xbf\xbd";  // U+FFFD

TEST(Utf8Test, ValidTextIsUnchanged) {
  const std::string s = "ok \xc3\xa9 \xe4\xbd\xa0 \xf0\x9f\x8c\x8d \xf4\x8f\xbf\xbf";
  EXPECT_EQ(FindInvalidUtf8(s), kUtf8Valid);
  EXPECT_EQ(SanitizeUtf8(s), s);
  EXPECT_EQ(SanitizeUtf8(""), "");
}

TEST(Utf8Test, OneReplacementPerMaximalSubpart) {
  EXPECT_EQ(SanitizeUtf8("\xc3"), kR);                        // truncated 2-byte
  EXPECT_EQ(SanitizeUtf8("\xe2\x82" "A"), kR + "A");           // truncated 3-byte: one U+FFFD
  EXPECT_EQ(SanitizeUtf8("\xf0\x9f\x98"), kR);                 // truncated 4-byte: one U+FFFD
  EXPECT_EQ(SanitizeUtf8("\xf0\x9f\x98\xf0\x9f\x98\x80"), kR + "\xf0\x9f\x98\x80");
  EXPECT_EQ(SanitizeUtf8("\xc0\xaf"), kR + kR);                // C0 can never lead
  EXPECT_EQ(SanitizeUtf8("\xed\xa0\x80"), kR + kR + kR);       // surrogate: ED then A0 is bad
  EXPECT_EQ(SanitizeUtf8("\xe0\x80\x80"), kR + kR + kR);       // overlong 3-byte
  EXPECT_EQ(SanitizeUtf8("\xf4\x90\x80\x80"), kR + kR + kR + kR);  // above U+10FFFF
  EXPECT_EQ(SanitizeUtf8("\xf5\x80"), kR + kR);                // F5 can never lead
  EXPECT_EQ(SanitizeUtf8("\x80\xbf"), kR + kR);                // lone continuations
  EXPECT_EQ(SanitizeUtf8("a\xe4\xbd"), "a" + kR);              // truncated at the end
  EXPECT_EQ(SanitizeUtf8("\xe4\xbd\xe4\xbd\xa0"), kR + "\xe4\xbd\xa0");
}

TEST(Utf8Test, FindsTheFirstBadByte) {
  EXPECT_EQ(FindInvalidUtf8("abc\xe2\x82"), 3u);
  EXPECT_EQ(FindInvalidUtf8("\xc3\xa9\xff"), 2u);
  EXPECT_EQ(Utf8CharLength("\xf0\x9f\x8c\x8d", 0), 4u);
  EXPECT_EQ(Utf8CharLength("\xf0\x9f\x8c", 0), 0u);
  EXPECT_EQ(Utf8MaximalSubpartLength("\xf0\x9f\x8c", 0), 3u);
  EXPECT_EQ(Utf8MaximalSubpartLength("\xff", 0), 1u);
}

}  // namespace
}  // namespace forge
