// Hashing of short byte strings (pre-tokens, vocabulary entries) for the tokenizer's
// open-addressing tables: eight bytes at a time, the first eight also returned packed so that
// a table can compare short keys without touching their bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace forge {

// The first min(n, 8) bytes of p as a little-endian word, zero-padded.
inline uint64_t PackHead(const uint8_t* p, size_t n) {
  uint64_t w = 0;
  std::memcpy(&w, p, n < 8 ? n : 8);
  return w;
}

inline uint64_t MixHash(uint64_t h) {
  h ^= h >> 31;
  h *= 0x7fb5d329728ea185ull;
  h ^= h >> 27;
  h *= 0x81dadef4bc2dd44dull;
  h ^= h >> 33;
  return h;
}

// Hash of p[0, n) where head == PackHead(p, n).
inline uint64_t HashBytes(const uint8_t* p, size_t n, uint64_t head) {
  uint64_t h = head ^ (static_cast<uint64_t>(n) * 0x9E3779B97F4A7C15ull);
  for (size_t i = 8; i < n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, n - i < 8 ? n - i : 8);
    h = (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9ull + w;
  }
  return MixHash(h);
}

}  // namespace forge
