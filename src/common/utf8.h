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

// Appends code point `cp` (at most U+10FFFF) to `out` as UTF-8.
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace forge
