// NFC: decode, decompose fully, order non-starters by combining class, compose (UAX #15).
#include "tokenizer/nfc.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "common/utf8.h"

namespace forge {
namespace {

// Hangul syllables decompose and compose by arithmetic.
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr uint32_t kSCount = kLCount * kNCount;
// Ill-formed bytes travel as these "code points" (never decomposed or composed).
constexpr uint32_t kRawByte = 0x110000;

struct Tables {
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomposition;  // offset, length
  std::unordered_map<uint32_t, uint8_t> rank;
  std::unordered_map<uint64_t, uint32_t> composition;
  std::vector<bool> second;  // may be the second of a composition pair (BMP and beyond)
};

const Tables& Get() {
  static const Tables t = [] {
    Tables t;
    using namespace nfc_tables;
    for (int i = 0; i < kDecompositionCount; ++i) {
      t.decomposition[kDecompositions[i].cp] = {kDecompositions[i].offset, kDecompositions[i].length};
    }
    for (int i = 0; i < kCombiningClassCount; ++i) {
      t.rank[kCombiningClasses[i].cp] = static_cast<uint8_t>(kCombiningClasses[i].rank);
    }
    t.second.assign(0x110000, false);
    for (int i = 0; i < kCompositionCount; ++i) {
      const NfcComposition& c = kCompositions[i];
      t.composition[(static_cast<uint64_t>(c.first) << 32) | c.second] = c.composite;
      t.second[c.second] = true;
    }
    for (uint32_t v = 0; v < kVCount; ++v) t.second[kVBase + v] = true;
    for (uint32_t k = 1; k < kTCount; ++k) t.second[kTBase + k] = true;
    return t;
  }();
  return t;
}

uint8_t Rank(const Tables& t, uint32_t cp) {
  if (cp < 0x300 || cp >= kRawByte) return 0;
  auto it = t.rank.find(cp);
  return it == t.rank.end() ? 0 : it->second;
}

void Decompose(const Tables& t, uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0 && cp < kRawByte) {
    auto it = t.decomposition.find(cp);
    if (it != t.decomposition.end()) {
      const uint32_t* d = nfc_tables::kDecompositionData + it->second.first;
      out->insert(out->end(), d, d + it->second.second);
      return;
    }
  }
  out->push_back(cp);
}

// The composite of (first, second), or 0.
uint32_t Compose(const Tables& t, uint32_t first, uint32_t second) {
  if (second >= kRawByte || !t.second[second]) return 0;
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase && second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  auto it = t.composition.find((static_cast<uint64_t>(first) << 32) | second);
  return it == t.composition.end() ? 0 : it->second;
}

// A code point, or a raw byte (kRawByte + byte) passed through as it was.
void AppendCodePoint(uint32_t cp, std::string* out) {
  if (cp >= kRawByte) {
    out->push_back(static_cast<char>(cp - kRawByte));
  } else {
    AppendUtf8(cp, out);
  }
}

// The code point at s[*pos] (advancing *pos), or kRawByte + byte when ill-formed.
uint32_t Next(std::string_view s, size_t* pos) {
  const Utf8Char c = DecodeUtf8At(reinterpret_cast<const uint8_t*>(s.data()), s.size(), *pos);
  if (c.len == 0) return kRawByte + static_cast<uint8_t>(s[(*pos)++]);
  *pos += c.len;
  return c.cp;
}

}  // namespace

bool IsNfcQuick(std::string_view text) {
  for (char c : text) {
    if (static_cast<uint8_t>(c) >= 0xCC) return false;
  }
  return true;
}

void NfcNormalize(std::string_view text, std::string* out) {
  const Tables& t = Get();
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) Decompose(t, Next(text, &pos), &cps);
  // Canonical ordering: each run of non-starters sorted by class, stably.
  std::vector<uint8_t> rank(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) rank[i] = Rank(t, cps[i]);
  for (size_t i = 0; i < cps.size();) {
    if (rank[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && rank[j] != 0) ++j;
    if (j - i > 1) {
      std::vector<std::pair<uint8_t, uint32_t>> run;
      for (size_t k = i; k < j; ++k) run.emplace_back(rank[k], cps[k]);
      std::stable_sort(run.begin(), run.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t k = i; k < j; ++k) rank[k] = run[k - i].first, cps[k] = run[k - i].second;
    }
    i = j;
  }
  // Canonical composition: each character joins the last starter unless blocked (a character
  // between them of class 0 or of a class >= its own).
  size_t w = 0;
  size_t starter = SIZE_MAX;
  int last = -1;  // class of the last character kept after the starter; -1: none
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t c = cps[i];
    const int cc = rank[i];
    if (starter != SIZE_MAX && (last == -1 || (last != 0 && last < cc))) {
      if (const uint32_t composite = Compose(t, cps[starter], c)) {
        cps[starter] = composite;
        continue;
      }
    }
    if (cc == 0) {
      starter = w;
      last = -1;
    } else {
      last = cc;
    }
    cps[w] = c;
    rank[w] = static_cast<uint8_t>(cc);
    ++w;
  }
  out->clear();
  out->reserve(text.size());
  for (size_t i = 0; i < w; ++i) AppendCodePoint(cps[i], out);
}

}  // namespace forge
