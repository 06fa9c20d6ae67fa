// ClassifyCodePoint: O(1) for the BMP through a table built once from the generated ranges.
#include <array>
#include <memory>

#include "tokenizer/unicode_classes.h"

namespace forge {
namespace {

using unicode_tables::kLetterRangeCount;
using unicode_tables::kLetterRanges;
using unicode_tables::kNumberRangeCount;
using unicode_tables::kNumberRanges;
using unicode_tables::kSpaceRangeCount;
using unicode_tables::kSpaceRanges;

bool InRanges(const CodePointRange* ranges, int count, uint32_t cp) {
  int lo = 0, hi = count - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (cp < ranges[mid].first) {
      hi = mid - 1;
    } else if (cp > ranges[mid].last) {
      lo = mid + 1;
    } else {
      return true;
    }
  }
  return false;
}

CharClass ClassifySlow(uint32_t cp) {
  if (InRanges(kLetterRanges, kLetterRangeCount, cp)) return CharClass::kLetter;
  if (InRanges(kNumberRanges, kNumberRangeCount, cp)) return CharClass::kNumber;
  if (InRanges(kSpaceRanges, kSpaceRangeCount, cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

constexpr uint32_t kBmpSize = 0x10000;

const std::array<CharClass, kBmpSize>& BmpTable() {
  // Function-local static: thread-safe one-time initialisation.
  static const std::unique_ptr<std::array<CharClass, kBmpSize>> table = [] {
    auto t = std::make_unique<std::array<CharClass, kBmpSize>>();
    for (uint32_t cp = 0; cp < kBmpSize; ++cp) (*t)[cp] = ClassifySlow(cp);
    return t;
  }();
  return *table;
}

}  // namespace

CharClass ClassifyCodePoint(uint32_t cp) {
  if (cp < kBmpSize) return BmpTable()[cp];
  return ClassifySlow(cp);
}

}  // namespace forge
