// CategoryTable: the generated ranges expanded into a two-level table, once per combination.
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tokenizer/unicode_classes.h"

namespace forge {
namespace {

constexpr uint32_t kCodePoints = 0x110000;
constexpr uint32_t kBlock = 128;

struct Storage {
  std::vector<uint16_t> index;
  std::vector<uint8_t> blocks;
};

// Writes `ranges` into `cat`, resolving the one-definition-only whitespace categories.
void Apply(const UnicodeRange* ranges, int count, SpaceDefinition space, std::vector<uint8_t>& cat) {
  for (int i = 0; i < count; ++i) {
    auto c = static_cast<UnicodeCategory>(ranges[i].category);
    if (c == UnicodeCategory::kWhiteSpaceOnly) {
      c = space == SpaceDefinition::kWhiteSpace ? UnicodeCategory::kSpace : UnicodeCategory::kOther;
    } else if (c == UnicodeCategory::kJsSpaceOnly) {
      c = space == SpaceDefinition::kEcmaScript ? UnicodeCategory::kSpace : UnicodeCategory::kOther;
    }
    for (uint32_t cp = ranges[i].first; cp <= ranges[i].last; ++cp) cat[cp] = static_cast<uint8_t>(c);
  }
}

Storage Build(UnicodeTables tables, SpaceDefinition space) {
  std::vector<uint8_t> cat(kCodePoints, static_cast<uint8_t>(UnicodeCategory::kOther));
  Apply(unicode_tables::kNodeRanges, unicode_tables::kNodeRangeCount, space, cat);
  if (tables == UnicodeTables::kRegexCrate) {
    Apply(unicode_tables::kRegexCrateChanges, unicode_tables::kRegexCrateChangeCount, space, cat);
  }
  Storage s;
  std::map<std::string, uint16_t> seen;
  s.index.resize(kCodePoints / kBlock);
  for (uint32_t b = 0; b < kCodePoints / kBlock; ++b) {
    std::string key(reinterpret_cast<const char*>(cat.data() + b * kBlock), kBlock);
    auto [it, added] = seen.emplace(key, static_cast<uint16_t>(seen.size()));
    if (added) s.blocks.insert(s.blocks.end(), key.begin(), key.end());
    s.index[b] = it->second;
  }
  return s;
}

}  // namespace

const CategoryTable& CategoryTable::Get(UnicodeTables tables, SpaceDefinition space) {
  static std::mutex mu;
  static CategoryTable built[2][2];
  static Storage storage[2][2];
  static bool ready[2][2] = {};
  const int t = static_cast<int>(tables), s = static_cast<int>(space);
  std::lock_guard<std::mutex> lock(mu);
  if (!ready[t][s]) {
    storage[t][s] = Build(tables, space);
    built[t][s].index_ = storage[t][s].index.data();
    built[t][s].blocks_ = storage[t][s].blocks.data();
    ready[t][s] = true;
  }
  return built[t][s];
}

}  // namespace forge
