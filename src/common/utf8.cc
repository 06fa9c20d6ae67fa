#include "common/utf8.h"

#include <cstdint>

namespace forge {
namespace {

// The second byte's allowed range after a lead byte (Unicode Table 3-7); later continuation
// bytes are always 80..BF.
bool SecondByteOk(uint8_t lead, uint8_t b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;  // no overlongs
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;  // no surrogates
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;  // no overlongs
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;  // <= U+10FFFF
  return b >= 0x80 && b <= 0xBF;
}

// Bytes a well-formed sequence starting with `lead` has; 0 for a byte that cannot lead.
size_t SequenceLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// How many bytes from pos form a valid prefix of a sequence (the maximal subpart), and
// whether the whole sequence is there.
size_t ValidPrefix(std::string_view s, size_t pos, bool* complete) {
  const auto* b = reinterpret_cast<const uint8_t*>(s.data());
  const uint8_t lead = b[pos];
  const size_t len = SequenceLength(lead);
  *complete = false;
  if (len == 0) return 0;
  if (len == 1) {
    *complete = true;
    return 1;
  }
  size_t k = 1;
  for (; k < len && pos + k < s.size(); ++k) {
    const uint8_t c = b[pos + k];
    const bool ok = k == 1 ? SecondByteOk(lead, c) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return k;
  }
  *complete = k == len;
  return k;
}

}  // namespace

size_t Utf8CharLength(std::string_view s, size_t pos) {
  bool complete = false;
  const size_t n = ValidPrefix(s, pos, &complete);
  return complete ? n : 0;
}

size_t Utf8MaximalSubpartLength(std::string_view s, size_t pos) {
  bool complete = false;
  const size_t n = ValidPrefix(s, pos, &complete);
  return n == 0 ? 1 : n;  // a byte that cannot start a sequence is replaced on its own
}

size_t FindInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = Utf8CharLength(s, i);
    if (n == 0) return i;
    i += n;
  }
  return kUtf8Valid;
}

std::string SanitizeUtf8(std::string_view s) {
  size_t bad = FindInvalidUtf8(s);
  if (bad == kUtf8Valid) return std::string(s);
  std::string out;
  out.reserve(s.size() + 16);
  out.append(s.substr(0, bad));
  size_t i = bad;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    const size_t n = Utf8CharLength(s, i);
    if (n != 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += Utf8MaximalSubpartLength(s, i);
    }
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace forge
