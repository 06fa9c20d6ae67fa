#include "common/text_excerpt.h"

#include <algorithm>
#include <cstdio>

#include "common/utf8.h"

namespace forge {

std::string TextExcerpt(std::string_view text, size_t max_bytes) {
  std::string out;
  size_t i = 0;
  while (i < text.size() && out.size() < max_bytes) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    const size_t n = Utf8CharLength(text, i);
    if (n == 0 || b < 0x20 || b == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(b));
      out += buf;
      ++i;
    } else if (b == '\\') {
      out += "\\\\";
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::optional<Utf8ErrorPlace> LocateInvalidUtf8(std::string_view text) {
  const size_t bad = FindInvalidUtf8(text);
  if (bad == kUtf8Valid) return std::nullopt;
  Utf8ErrorPlace e;
  e.offset = bad;
  e.byte = static_cast<unsigned char>(text[bad]);
  const std::string_view before = text.substr(0, bad);
  e.line = 1 + int(std::count(before.begin(), before.end(), '\n'));
  const size_t line_start = before.rfind('\n');
  e.column = int(bad - (line_start == std::string_view::npos ? 0 : line_start + 1)) + 1;
  return e;
}

std::string DescribeUtf8Error(const Utf8ErrorPlace& e) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "column %d (byte offset %zu): ill-formed UTF-8 at byte 0x%02x",
                e.column, e.offset, unsigned(e.byte));
  return buf;
}

}  // namespace forge
