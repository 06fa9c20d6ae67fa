// UTF-8 validation and repair, as the WHATWG Encoding Standard's decoder does it (the behaviour
// of node's TextDecoder, Python's bytes.decode(errors="replace") and browsers): each maximal
// subpart of an ill-formed sequence becomes one U+FFFD. So a truncated 3-byte sequence
// "\xE2\x82" followed by "A" is one U+FFFD then "A", not two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace forge {

inline constexpr size_t kUtf8Valid = static_cast<size_t>(-1);

// Byte offset of the first ill-formed sequence, or kUtf8Valid when `s` is valid UTF-8.
size_t FindInvalidUtf8(std::string_view s);

// `s` with every maximal ill-formed subpart replaced by U+FFFD (EF BF BD); valid input is
// returned unchanged.
std::string SanitizeUtf8(std::string_view s);

// Length in bytes of the valid code point at s[pos], or 0 when the bytes there are ill-formed
// (then MaximalSubpartLength says how many bytes one U+FFFD replaces).
size_t Utf8CharLength(std::string_view s, size_t pos);
size_t Utf8MaximalSubpartLength(std::string_view s, size_t pos);

// A code point and its length in UTF-8 bytes; len 0 for ill-formed bytes.
struct Utf8Char {
  uint32_t cp;
  uint32_t len;
};

// The code point that starts at s[pos] (pos < n), or len 0 when the bytes there are not one
// well-formed sequence (a bad lead or continuation byte, truncated, overlong, a surrogate or
// above U+10FFFF). Inline: the tokenizers' hot paths decode with it.
inline Utf8Char DecodeUtf8At(const uint8_t* s, size_t n, size_t pos) {
  const uint8_t b0 = s[pos];
  uint32_t len, cp, min;
  if (b0 < 0x80) {
    return {b0, 1};
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {0, 0};
  }
  if (pos + len > n) return {0, 0};
  for (uint32_t k = 1; k < len; ++k) {
    const uint8_t b = s[pos + k];
    if ((b & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, len};
}

// Appends code point `cp` (at most U+10FFFF) to `out` as UTF-8.
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace forge
