// The Tokenizer every loader builds: optional normalisation (NFC), a hand-written
// pre-tokenizer, the byte-level BPE engine with a per-instance piece cache, and the special
// tokens. Loaders (gpt2_tokenizer, tiktoken_loader, hf_tokenizer_json) differ only in how they
// fill BpeTokenizerSpec.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/bpe_model.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace forge {

enum class Normalization : uint8_t { kNone, kNfc };

struct BpeTokenizerSpec {
  std::string name;
  std::string identity;
  std::shared_ptr<const BpeModel> model;
  PretokenPattern pattern = PretokenPattern::kGpt2;
  RegexFlavor flavor = RegexFlavor::kTiktoken;
  Normalization normalization = Normalization::kNone;
  std::vector<SpecialToken> specials;  // ids outside the model's ordinary ids
  int32_t eot_id = -1;                 // must be one of the specials
  int32_t bos_id = -1;
};

// Checks the spec (special ids unique and not ordinary tokens, eot present) and builds it.
StatusOr<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(BpeTokenizerSpec spec);

// The BPE model and pre-tokenizer under a tokenizer MakeBpeTokenizer built (tests, benchmarks);
// nullptr for any other.
const BpeModel* BpeModelOf(const Tokenizer& t);
const Pretokenizer* PretokenizerOf(const Tokenizer& t);

}  // namespace forge
