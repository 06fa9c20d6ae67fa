// Unicode categories for the pre-tokenizer patterns, as a given regex engine sees them.
//
// The patterns use \p{L} (split by o200k_base into Lu+Lt, Ll and Lm+Lo), \p{M}, \p{N} and \s.
// Engines disagree at the edges: the Rust regex crate (tiktoken) has its own Unicode version's
// tables and takes \s as White_Space; JavaScript's /u regexes (node) have ICU's tables and a \s
// that adds U+FEFF and lacks U+0085. The generated unicode_classes.cc holds both versions
// (scripts/gen_unicode_classes.py): node's ranges, and the few ranges where the regex crate's
// differ; CategoryTable answers in O(1) for one of them.
#pragma once

#include <cstdint>

namespace forge {

// One category per code point. kWhiteSpaceOnly (U+0085) and kJsSpaceOnly (U+FEFF) are
// whitespace for one definition of \s only; a CategoryTable resolves them to kSpace or kOther.
enum class UnicodeCategory : uint8_t {
  kOther = 0,
  kUpper = 1,        // Lu, Lt
  kLower = 2,        // Ll
  kOtherLetter = 3,  // Lm, Lo
  kMark = 4,         // Mn, Mc, Me
  kNumber = 5,       // Nd, Nl, No
  kSpace = 6,
  kWhiteSpaceOnly = 7,
  kJsSpaceOnly = 8,
};

inline bool IsLetter(UnicodeCategory c) {
  return c == UnicodeCategory::kUpper || c == UnicodeCategory::kLower ||
         c == UnicodeCategory::kOtherLetter;
}

struct UnicodeRange {
  uint32_t first;
  uint32_t last;  // inclusive
  uint8_t category;
};

namespace unicode_tables {
extern const UnicodeRange kNodeRanges[];  // node's regex engine (ICU)
extern const int kNodeRangeCount;
// The Rust regex crate, as in npm tiktoken: node's categories, changed on these ranges.
extern const UnicodeRange kRegexCrateChanges[];
extern const int kRegexCrateChangeCount;
}  // namespace unicode_tables

enum class UnicodeTables : uint8_t { kNode, kRegexCrate };
enum class SpaceDefinition : uint8_t {
  kWhiteSpace,  // the Unicode White_Space property: \s of the Rust regex crate
  kEcmaScript,  // JavaScript's \s
};

// Code point -> category (kOther .. kSpace) for one table version and \s definition. Two
// levels (blocks of 128 code points, identical blocks shared): one load each, any plane.
class CategoryTable {
 public:
  // Built once per combination, on first use; thread-safe.
  static const CategoryTable& Get(UnicodeTables tables, SpaceDefinition space);

  UnicodeCategory Of(uint32_t cp) const {
    if (cp > 0x10FFFF) return UnicodeCategory::kOther;
    return static_cast<UnicodeCategory>(blocks_[index_[cp >> 7] * 128u + (cp & 127u)]);
  }
  // Categories of the 128 ASCII code points (block 0), for the hot path.
  const uint8_t* ascii() const { return blocks_; }

 private:
  CategoryTable() = default;
  const uint16_t* index_ = nullptr;
  const uint8_t* blocks_ = nullptr;
};

}  // namespace forge
