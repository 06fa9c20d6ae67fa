// Excerpts of untrusted text for messages, and where text stops being UTF-8 by line and column:
// the ill-formed cases of the Unicode standard (overlong forms, surrogates, beyond U+10FFFF,
// truncated and stray bytes) against the well-formed ones at each boundary.
#include "common/text_excerpt.h"

#include <gtest/gtest.h>

#include <string>

namespace forge {
namespace {

TEST(TextExcerpt, ShortTextIsKeptPrintableAndLongTextIsCut) {
  EXPECT_EQ(TextExcerpt("hello"), "hello");
  EXPECT_EQ(TextExcerpt("a\nb\\c\x01"), "a\\x0ab\\\\c\\x01");
  EXPECT_EQ(TextExcerpt("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 stays as it is
  EXPECT_EQ(TextExcerpt("caf\xe9"), "caf\\xe9");         // a Latin-1 byte is escaped
  const std::string cut = TextExcerpt(std::string(100000, 'x'), 64);
  EXPECT_EQ(cut, std::string(64, 'x') + "... (100000 bytes)");
  // A multi-byte character is never split at the cut.
  std::string euros;
  for (int i = 0; i < 30; ++i) euros += "\xe2\x82\xac";
  const std::string e = TextExcerpt(euros, 10);
  EXPECT_EQ(e, "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac... (90 bytes)");
  EXPECT_EQ(TextExcerpt(""), "");
}

TEST(LocateInvalidUtf8, WellFormedBoundaries) {
  for (const char* ok : {"", "plain ascii\n", "\x7f", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80",
                         "\xed\x9f\xbf", "\xee\x80\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80",
                         "\xf4\x8f\xbf\xbf", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"})
    EXPECT_FALSE(LocateInvalidUtf8(ok).has_value()) << TextExcerpt(ok);
}

TEST(LocateInvalidUtf8, IllFormedSequencesAreFoundWithTheirPlace) {
  struct Case {
    std::string text;
    size_t offset;
    unsigned char byte;
  };
  const Case cases[] = {
      {"\x80", 0, 0x80},                  // a lone continuation byte
      {"ab\xc0\xaf", 2, 0xc0},            // overlong '/'
      {"\xc1\xbf", 0, 0xc1},              // overlong
      {"\xe0\x9f\xbf", 0, 0xe0},          // overlong 3-byte form
      {"x\xed\xa0\x80", 1, 0xed},         // a UTF-16 surrogate
      {"\xf0\x8f\xbf\xbf", 0, 0xf0},      // overlong 4-byte form
      {"\xf4\x90\x80\x80", 0, 0xf4},      // beyond U+10FFFF
      {"\xf5\x80\x80\x80", 0, 0xf5},      // no such lead byte
      {"\xff", 0, 0xff},
      {"ok \xe2\x82", 3, 0xe2},           // truncated at the end
      {"\xe2\x82x", 0, 0xe2},             // truncated by an ASCII byte
      {"\xc3\xa9\xc3", 2, 0xc3},
  };
  for (const Case& c : cases) {
    auto e = LocateInvalidUtf8(c.text);
    ASSERT_TRUE(e.has_value()) << TextExcerpt(c.text);
    EXPECT_EQ(e->offset, c.offset) << TextExcerpt(c.text);
    EXPECT_EQ(e->byte, c.byte) << TextExcerpt(c.text);
  }
  auto e = LocateInvalidUtf8("line one\n\xc3\xa9t\xc3\xa9\nab\xff");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->line, 3);
  EXPECT_EQ(e->column, 3);
  EXPECT_EQ(DescribeUtf8Error(*e), "column 3 (byte offset 17): ill-formed UTF-8 at byte 0xff");
}

}  // namespace
}  // namespace forge
