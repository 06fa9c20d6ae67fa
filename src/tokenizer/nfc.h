// Unicode Normalization Form C (canonical decomposition, canonical ordering, canonical
// composition; UAX #15), for tokenizer.json files whose normalizer is NFC (Qwen2, Qwen2.5).
// The data is generated from node's String.prototype.normalize (scripts/gen_nfc_tables.py),
// the normaliser of the reference @huggingface/tokenizers, so the two agree code point for
// code point.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace forge {

// True when `text` is certainly NFC already without looking closer: no character at or above
// U+0300 (lead byte 0xCC), below which nothing decomposes, composes or reorders under NFC.
bool IsNfcQuick(std::string_view text);

// NFC of UTF-8 text into *out. Bytes that are not well-formed UTF-8 are copied unchanged and
// act as starters that compose with nothing.
void NfcNormalize(std::string_view text, std::string* out);

struct NfcDecomposition {
  uint32_t cp;
  uint32_t offset;  // into kDecompositionData
  uint32_t length;
};
struct NfcClass {
  uint32_t cp;
  uint32_t rank;  // the canonical combining class's rank among the non-zero classes (1..)
};
struct NfcComposition {
  uint32_t first;
  uint32_t second;
  uint32_t composite;
};

namespace nfc_tables {
extern const NfcDecomposition kDecompositions[];
extern const int kDecompositionCount;
extern const uint32_t kDecompositionData[];
extern const NfcClass kCombiningClasses[];
extern const int kCombiningClassCount;
extern const NfcComposition kCompositions[];
extern const int kCompositionCount;
}  // namespace nfc_tables

}  // namespace forge
