#include "tokenizer/byte_level.h"

#include <array>
#include <cstdint>

namespace forge {
namespace {

// code point (< 0x144) -> byte, or -1.
const std::array<int16_t, 0x144>& CharToByte() {
  static const std::array<int16_t, 0x144> table = [] {
    std::array<int16_t, 0x144> t;
    t.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[printable ? b : next++] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

}  // namespace

bool ByteLevelToBytes(std::string_view s, std::string* out) {
  const auto& map = CharToByte();
  out->clear();
  for (size_t i = 0; i < s.size();) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    uint32_t cp;
    if (b0 < 0x80) {
      cp = b0, i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3Fu), i += 2;
    } else {
      return false;  // the map only uses code points below U+0800
    }
    if (cp >= map.size() || map[cp] < 0) return false;
    out->push_back(static_cast<char>(map[cp]));
  }
  return true;
}

}  // namespace forge
