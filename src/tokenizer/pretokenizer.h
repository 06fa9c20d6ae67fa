// Pre-tokenizers: the split patterns of the GPT-2, cl100k_base (= Llama 3), Qwen2 and
// o200k_base families, written out by hand instead of run by a regex engine.
//
// Each pattern is an ordered alternation tried at each position with backtracking semantics
// (the first alternative that matches wins; greedy quantifiers take the most that still lets
// the rest match); the matchers below follow the alternatives in order. A pattern is recognised
// from its exact string (tiktoken's pat_str, a tokenizer.json's Split regex); any other
// string is an error that quotes it.
//
// The regex engines of the references disagree on details, so each pre-tokenizer also has a
// flavour: which Unicode tables (unicode_classes.h), which \s, and whether (?i:'s...) folds
// U+017F LATIN SMALL LETTER LONG S to 's' as Unicode simple case folding does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/utf8.h"
#include "tokenizer/unicode_classes.h"

namespace forge {

enum class PretokenPattern : uint8_t {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
  // \s*[\r\n]+|\s+(?!\S)|\s+    (cl100k_base, Llama 3)
  kCl100k,
  // the same with \p{N} (single digits) instead of \p{N}{1,3}    (Qwen2, Qwen2.5)
  kQwen2,
  // [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|...)?|
  // [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|...)?|
  // \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+    (o200k_base)
  kO200k,
};

enum class RegexFlavor : uint8_t {
  // The Rust regex crate as tiktoken runs it: the crate's Unicode tables, \s = White_Space,
  // Unicode case folding.
  kTiktoken,
  // @huggingface/tokenizers' rewrite of a tokenizer.json regex for JavaScript: node's tables,
  // \s rewritten to \p{White_Space}, (?i:...) folded for ASCII letters only.
  kHuggingFaceJs,
  // A JavaScript /u regex as written (ByteLevel's built-in pattern; llama3-tokenizer-js):
  // node's tables, JavaScript's \s, ASCII-only case folding.
  kEcmaScript,
};

// The exact pattern string of each family (tiktoken's spelling).
std::string_view PatternString(PretokenPattern p);
// Which family a regex is, or an error quoting it.
StatusOr<PretokenPattern> RecognisePattern(std::string_view regex, const std::string& where);
const char* FlavorName(RegexFlavor f);

class Pretokenizer {
 public:
  Pretokenizer(PretokenPattern pattern, RegexFlavor flavor);

  PretokenPattern pattern() const { return pattern_; }
  RegexFlavor flavor() const { return flavor_; }

  // Calls f(const uint8_t* piece, size_t length) for each piece of `text`, in order; the
  // pieces cover the text exactly. Bytes that are not well-formed UTF-8 count as one
  // character each, of no class (callers repair text first: common/utf8.h).
  template <class F>
  void ForEach(std::string_view text, F&& f) const;

  std::vector<std::string_view> Pieces(std::string_view text) const;

 private:
  struct Ch {
    UnicodeCategory cat;
    uint32_t len;
  };
  Ch At(const uint8_t* s, size_t n, size_t pos) const;
  size_t Contraction(const uint8_t* s, size_t n, size_t pos, bool ignore_case) const;
  size_t Whitespace(const uint8_t* s, size_t n, size_t pos, bool newline_first) const;
  size_t OtherEnd(const uint8_t* s, size_t n, size_t pos) const;
  size_t OtherRun(const uint8_t* s, size_t n, size_t pos, bool slash) const;
  size_t NextGpt2(const uint8_t* s, size_t n, size_t pos) const;
  size_t NextCl100k(const uint8_t* s, size_t n, size_t pos, size_t max_digits) const;
  size_t NextO200k(const uint8_t* s, size_t n, size_t pos) const;
  size_t O200kWordA(const uint8_t* s, size_t n, size_t p0) const;
  size_t O200kWordB(const uint8_t* s, size_t n, size_t p0) const;
  size_t DigitsOtherOrSpace(const uint8_t* s, size_t n, size_t pos, Ch c0, size_t max_digits,
                            bool slash) const;

  PretokenPattern pattern_;
  RegexFlavor flavor_;
  const CategoryTable* table_;
  const uint8_t* ascii_;
  bool long_s_;  // (?i:'s) also matches "'ſ"
};

// --- inline implementation (the hot path) ---------------------------------------------------

inline Pretokenizer::Ch Pretokenizer::At(const uint8_t* s, size_t n, size_t pos) const {
  const uint8_t b0 = s[pos];
  if (b0 < 0x80) return {static_cast<UnicodeCategory>(ascii_[b0]), 1};
  const Utf8Char c = DecodeUtf8At(s, n, pos);
  if (c.len == 0) return {UnicodeCategory::kOther, 1};
  return {table_->Of(c.cp), c.len};
}

namespace pretokenizer_detail {
// Coarse classes of GPT-2 / cl100k: letter, number, space, other (marks are other).
inline bool IsSpace(UnicodeCategory c) { return c == UnicodeCategory::kSpace; }
inline bool IsNumber(UnicodeCategory c) { return c == UnicodeCategory::kNumber; }
inline bool IsOther(UnicodeCategory c) {
  return c == UnicodeCategory::kOther || c == UnicodeCategory::kMark;
}
// o200k's two letter sets: U = Lu Lt Lm Lo M, W = Ll Lm Lo M.
inline bool InUpperSet(UnicodeCategory c) {
  return c == UnicodeCategory::kUpper || c == UnicodeCategory::kOtherLetter ||
         c == UnicodeCategory::kMark;
}
inline bool InLowerSet(UnicodeCategory c) {
  return c == UnicodeCategory::kLower || c == UnicodeCategory::kOtherLetter ||
         c == UnicodeCategory::kMark;
}
inline bool IsCrLf(uint8_t b) { return b == '\r' || b == '\n'; }
}  // namespace pretokenizer_detail

// 's|'t|'re|'ve|'m|'ll|'d at pos (s[pos] == '\''): the length matched, or 0.
inline size_t Pretokenizer::Contraction(const uint8_t* s, size_t n, size_t pos,
                                        bool ignore_case) const {
  if (pos + 1 >= n) return 0;
  uint8_t c1 = s[pos + 1];
  if (ignore_case && c1 >= 'A' && c1 <= 'Z') c1 |= 0x20;
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (ignore_case && long_s_ && c1 == 0xC5 && pos + 2 < n && s[pos + 2] == 0xBF) return 3;
  if (pos + 2 >= n) return 0;
  uint8_t c2 = s[pos + 2];
  if (ignore_case && c2 >= 'A' && c2 <= 'Z') c2 |= 0x20;
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// The whitespace alternatives at pos (a space character): [\s*[\r\n]+|] \s+(?!\S) | \s+.
// \s*[\r\n]+ ends after the last CR or LF of the run; \s+(?!\S) leaves the run's last
// character to the next piece when a non-space follows and the run has two or more.
inline size_t Pretokenizer::Whitespace(const uint8_t* s, size_t n, size_t pos,
                                       bool newline_first) const {
  size_t e = pos, last = pos, newline_end = 0;
  int count = 0;
  while (e < n) {
    const Ch c = At(s, n, e);
    if (c.cat != UnicodeCategory::kSpace) break;
    last = e;
    e += c.len;
    ++count;
    if (pretokenizer_detail::IsCrLf(s[last])) newline_end = e;
  }
  if (newline_first && newline_end > 0) return newline_end - pos;
  if (e == n || count == 1) return e - pos;
  return last - pos;
}

// The end of the run of [^\s\p{L}\p{N}] from pos.
inline size_t Pretokenizer::OtherEnd(const uint8_t* s, size_t n, size_t pos) const {
  size_t e = pos;
  while (e < n) {
    const Ch c = At(s, n, e);
    if (!pretokenizer_detail::IsOther(c.cat)) break;
    e += c.len;
  }
  return e;
}

// [^\s\p{L}\p{N}]+ then [\r\n]* (with '/' too for o200k) from pos.
inline size_t Pretokenizer::OtherRun(const uint8_t* s, size_t n, size_t pos, bool slash) const {
  size_t e = OtherEnd(s, n, pos);
  while (e < n && (pretokenizer_detail::IsCrLf(s[e]) || (slash && s[e] == '/'))) ++e;
  return e;
}

inline size_t Pretokenizer::NextGpt2(const uint8_t* s, size_t n, size_t pos) const {
  using namespace pretokenizer_detail;
  if (s[pos] == '\'') {
    if (size_t c = Contraction(s, n, pos, /*ignore_case=*/false)) return c;
  }
  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : an optional U+0020, then a run of one class.
  const size_t start = s[pos] == ' ' && pos + 1 < n ? pos + 1 : pos;
  const Ch first = At(s, n, start);
  if (!IsSpace(first.cat)) {
    size_t e = start + first.len;
    if (IsLetter(first.cat)) {
      while (e < n) {
        const Ch c = At(s, n, e);
        if (!IsLetter(c.cat)) break;
        e += c.len;
      }
    } else if (IsNumber(first.cat)) {
      while (e < n) {
        const Ch c = At(s, n, e);
        if (!IsNumber(c.cat)) break;
        e += c.len;
      }
    } else {
      e = OtherEnd(s, n, e);
    }
    return e - pos;
  }
  return Whitespace(s, n, pos, /*newline_first=*/false);
}

inline size_t Pretokenizer::NextCl100k(const uint8_t* s, size_t n, size_t pos,
                                       size_t max_digits) const {
  using namespace pretokenizer_detail;
  const uint8_t b = s[pos];
  if (b == '\'') {
    if (size_t c = Contraction(s, n, pos, /*ignore_case=*/true)) return c;
  }
  const Ch c0 = At(s, n, pos);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t letters = n;  // where the letter run starts, if this alternative matches
  if (IsLetter(c0.cat)) {
    letters = pos;
  } else if (!IsNumber(c0.cat) && !IsCrLf(b) && pos + c0.len < n &&
             IsLetter(At(s, n, pos + c0.len).cat)) {
    letters = pos + c0.len;
  }
  if (letters < n) {
    size_t e = letters;
    while (e < n) {
      const Ch c = At(s, n, e);
      if (!IsLetter(c.cat)) break;
      e += c.len;
    }
    return e - pos;
  }
  return DigitsOtherOrSpace(s, n, pos, c0, max_digits, /*slash=*/false);
}

// The alternatives cl100k and o200k end with alike: \p{N}{1,max_digits}, then
// ` ?[^\s\p{L}\p{N}]+[\r\n]*` ([\r\n/]* with `slash`, o200k's), then white space.
inline size_t Pretokenizer::DigitsOtherOrSpace(const uint8_t* s, size_t n, size_t pos, Ch c0,
                                               size_t max_digits, bool slash) const {
  using namespace pretokenizer_detail;
  if (IsNumber(c0.cat)) {
    size_t e = pos + c0.len, k = 1;
    while (k < max_digits && e < n) {
      const Ch c = At(s, n, e);
      if (!IsNumber(c.cat)) break;
      e += c.len, ++k;
    }
    return e - pos;
  }
  if (IsOther(c0.cat)) return OtherRun(s, n, pos, slash) - pos;
  if (s[pos] == ' ' && pos + 1 < n && IsOther(At(s, n, pos + 1).cat)) {
    return OtherRun(s, n, pos + 1, slash) - pos;
  }
  return Whitespace(s, n, pos, /*newline_first=*/true);
}

// [U]*[W]+ from p0 with backtracking: the end, or 0 when it cannot match. U* takes the whole
// run of U; if a W (necessarily Ll) follows, W+ runs on from it; otherwise U* gives back
// characters until one it gave back is in W too (Lm Lo M), and W+ is that one character.
inline size_t Pretokenizer::O200kWordA(const uint8_t* s, size_t n, size_t p0) const {
  using namespace pretokenizer_detail;
  size_t q = p0, last_both_end = 0;
  while (q < n) {
    const Ch c = At(s, n, q);
    if (!InUpperSet(c.cat)) break;
    q += c.len;
    if (InLowerSet(c.cat)) last_both_end = q;
  }
  if (q < n) {
    const Ch c = At(s, n, q);
    if (c.cat == UnicodeCategory::kLower) {
      size_t e = q + c.len;
      while (e < n) {
        const Ch d = At(s, n, e);
        if (!InLowerSet(d.cat)) break;
        e += d.len;
      }
      return e;
    }
  }
  return last_both_end;
}

// [U]+[W]* from p0: the end, or 0.
inline size_t Pretokenizer::O200kWordB(const uint8_t* s, size_t n, size_t p0) const {
  using namespace pretokenizer_detail;
  size_t q = p0;
  while (q < n) {
    const Ch c = At(s, n, q);
    if (!InUpperSet(c.cat)) break;
    q += c.len;
  }
  if (q == p0) return 0;
  while (q < n) {
    const Ch c = At(s, n, q);
    if (!InLowerSet(c.cat)) break;
    q += c.len;
  }
  return q;
}

inline size_t Pretokenizer::NextO200k(const uint8_t* s, size_t n, size_t pos) const {
  using namespace pretokenizer_detail;
  const uint8_t b = s[pos];
  const Ch c0 = At(s, n, pos);
  const bool prefix = !IsCrLf(b) && !IsLetter(c0.cat) && !IsNumber(c0.cat);
  auto with_suffix = [&](size_t e) {
    if (e < n && s[e] == '\'') e += Contraction(s, n, e, /*ignore_case=*/true);
    return e - pos;
  };
  const bool in_u_or_w = InUpperSet(c0.cat) || InLowerSet(c0.cat);
  size_t e = 0;
  if (prefix && pos + c0.len < n && (e = O200kWordA(s, n, pos + c0.len)) != 0) return with_suffix(e);
  if (in_u_or_w && (e = O200kWordA(s, n, pos)) != 0) return with_suffix(e);
  if (prefix && pos + c0.len < n && (e = O200kWordB(s, n, pos + c0.len)) != 0) return with_suffix(e);
  if (InUpperSet(c0.cat) && (e = O200kWordB(s, n, pos)) != 0) return with_suffix(e);
  return DigitsOtherOrSpace(s, n, pos, c0, /*max_digits=*/3, /*slash=*/true);
}

template <class F>
void Pretokenizer::ForEach(std::string_view text, F&& f) const {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  // The loop over the pieces, instantiated once per pattern so that `next` inlines.
  auto pieces = [&](auto next) {
    for (size_t pos = 0; pos < n;) {
      const size_t len = next(pos);
      f(s + pos, len);
      pos += len;
    }
  };
  switch (pattern_) {
    case PretokenPattern::kGpt2:
      pieces([&](size_t pos) { return NextGpt2(s, n, pos); });
      break;
    case PretokenPattern::kCl100k:
    case PretokenPattern::kQwen2: {
      const size_t digits = pattern_ == PretokenPattern::kCl100k ? 3 : 1;
      pieces([&](size_t pos) { return NextCl100k(s, n, pos, digits); });
      break;
    }
    case PretokenPattern::kO200k:
      pieces([&](size_t pos) { return NextO200k(s, n, pos); });
      break;
  }
}

}  // namespace forge
