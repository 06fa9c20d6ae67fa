// Pretokenizer: recognising patterns, flavours, and the piece list for tests.
#include "tokenizer/pretokenizer.h"

#include "common/named_values.h"

namespace forge {

std::string_view PatternString(PretokenPattern p) {
  switch (p) {
    case PretokenPattern::kGpt2:
      return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    case PretokenPattern::kCl100k:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PretokenPattern::kQwen2:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PretokenPattern::kO200k:
      return R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  }
  return {};
}

StatusOr<PretokenPattern> RecognisePattern(std::string_view regex, const std::string& where) {
  for (PretokenPattern p : {PretokenPattern::kGpt2, PretokenPattern::kCl100k,
                            PretokenPattern::kQwen2, PretokenPattern::kO200k}) {
    if (regex == PatternString(p)) return p;
  }
  return Status::Invalid(where + ": pre-tokenizer pattern not implemented: '" + std::string(regex) +
                         "' (known: the exact patterns of GPT-2, cl100k_base/Llama 3, Qwen2 "
                         "and o200k_base)");
}

const char* FlavorName(RegexFlavor f) {
  static constexpr std::array<NamedValue<RegexFlavor>, 3> kNames{
      {{"tiktoken", RegexFlavor::kTiktoken},
       {"huggingface-js", RegexFlavor::kHuggingFaceJs},
       {"ecmascript", RegexFlavor::kEcmaScript}}};
  return NameOf(kNames, f);
}

Pretokenizer::Pretokenizer(PretokenPattern pattern, RegexFlavor flavor)
    : pattern_(pattern), flavor_(flavor) {
  const UnicodeTables tables =
      flavor == RegexFlavor::kTiktoken ? UnicodeTables::kRegexCrate : UnicodeTables::kNode;
  const SpaceDefinition space = flavor == RegexFlavor::kEcmaScript ? SpaceDefinition::kEcmaScript
                                                                   : SpaceDefinition::kWhiteSpace;
  table_ = &CategoryTable::Get(tables, space);
  ascii_ = table_->ascii();
  long_s_ = flavor == RegexFlavor::kTiktoken;
}

std::vector<std::string_view> Pretokenizer::Pieces(std::string_view text) const {
  std::vector<std::string_view> out;
  ForEach(text, [&](const uint8_t* p, size_t n) {
    out.emplace_back(reinterpret_cast<const char*>(p), n);
  });
  return out;
}

}  // namespace forge
