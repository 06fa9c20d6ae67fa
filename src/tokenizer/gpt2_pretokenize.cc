// GPT-2 pre-tokenisation, written out by hand instead of a regex engine. The pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// is an ordered alternation tried at each position; the cases below follow that order.
// The classes of code points come from unicode_classes.h (the same as node's /u regexes).
#include <cstdint>

#include "tokenizer/gpt2_bpe.h"
#include "tokenizer/unicode_classes.h"

namespace forge {
namespace {

struct Char {
  CharClass cls;
  uint32_t len;  // bytes
};

// Decodes the UTF-8 character at `pos`. Invalid sequences (bad lead byte, bad continuation,
// overlong, surrogate, > U+10FFFF) count as one byte of class kOther, which is the class of
// U+FFFD that a UTF-8 decoder would put there.
inline Char CharAt(const uint8_t* s, size_t n, size_t pos) {
  const uint8_t b0 = s[pos];
  if (b0 < 0x80) {
    static const CharClass* ascii = [] {
      static CharClass t[128];
      for (uint32_t c = 0; c < 128; ++c) t[c] = ClassifyCodePoint(c);
      return t;
    }();
    return {ascii[b0], 1};
  }
  uint32_t len, cp, min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {CharClass::kOther, 1};
  }
  if (pos + len > n) return {CharClass::kOther, 1};
  for (uint32_t k = 1; k < len; ++k) {
    const uint8_t b = s[pos + k];
    if ((b & 0xC0) != 0x80) return {CharClass::kOther, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {CharClass::kOther, 1};
  return {ClassifyCodePoint(cp), len};
}

// End of the run of characters of class `cls` starting at `pos`.
inline size_t RunEnd(const uint8_t* s, size_t n, size_t pos, CharClass cls) {
  while (pos < n) {
    const Char c = CharAt(s, n, pos);
    if (c.cls != cls) break;
    pos += c.len;
  }
  return pos;
}

}  // namespace

size_t Gpt2PretokenLength(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const uint8_t b = s[pos];

  // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, as in GPT-2).
  if (b == '\'' && pos + 1 < n) {
    const uint8_t c1 = s[pos + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (pos + 2 < n) {
      const uint8_t c2 = s[pos + 2];
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
        return 3;
      }
    }
  }

  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+  (the optional prefix is U+0020 only).
  size_t start = pos;
  if (b == ' ' && pos + 1 < n) start = pos + 1;
  const Char first = CharAt(s, n, start);
  if (first.cls != CharClass::kSpace) {
    return RunEnd(s, n, start + first.len, first.cls) - pos;
  }
  // \s+(?!\S) | \s+ : the whitespace run [pos, end). If it reaches the end of the text, take
  // it all. Otherwise a non-space follows: the greedy run backs off one character so that
  // the lookahead sees whitespace (needs >= 2 characters); a single one is taken by \s+.
  size_t end = pos, last_start = pos;
  int count = 0;
  while (end < n) {
    const Char c = CharAt(s, n, end);
    if (c.cls != CharClass::kSpace) break;
    last_start = end;
    end += c.len;
    ++count;
  }
  if (end == n || count == 1) return end - pos;
  return last_start - pos;
}

std::vector<size_t> Gpt2PretokenEnds(std::string_view text) {
  std::vector<size_t> ends;
  size_t pos = 0;
  while (pos < text.size()) {
    pos += Gpt2PretokenLength(text, pos);
    ends.push_back(pos);
  }
  return ends;
}

}  // namespace forge
