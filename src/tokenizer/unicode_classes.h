// Unicode character classes used by the GPT-2 pre-tokeniser: letter (\p{L}), number (\p{N})
// and whitespace (\s, ECMAScript definition). The range tables live in the generated
// unicode_classes.cc (scripts/gen_unicode_classes.py); lookups for the Basic Multilingual
// Plane go through a 64 KiB table built once, the rest through binary search.
#pragma once

#include <cstdint>

namespace forge {

enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

struct CodePointRange {
  uint32_t first;
  uint32_t last;  // inclusive
};

namespace unicode_tables {
extern const CodePointRange kLetterRanges[];
extern const int kLetterRangeCount;
extern const CodePointRange kNumberRanges[];
extern const int kNumberRangeCount;
extern const CodePointRange kSpaceRanges[];
extern const int kSpaceRangeCount;
}  // namespace unicode_tables

// Class of one code point; anything outside the three classes (punctuation, symbols, marks,
// unassigned, invalid) is kOther.
CharClass ClassifyCodePoint(uint32_t cp);

}  // namespace forge
