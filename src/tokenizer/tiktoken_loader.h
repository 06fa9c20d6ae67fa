// tiktoken-format tokenizers: byte strings with ranks, where a pair of tokens merges with the
// rank of its concatenation (BpeModel::FromRanks), and the whole piece is looked up first.
//
//  - npm tiktoken's encoders/<name>.json (gpt2, cl100k_base, o200k_base, ...): {"pat_str",
//    "special_tokens", "bpe_ranks"}, where bpe_ranks holds lines of "<base64> <rank>" or, for
//    consecutive ranks, "! <first rank> <base64> <base64> ...".
//  - a rank file as Meta ships Llama 3's tokenizer.model: one "<base64> <rank>" per line.
//    Llama 3's conventions apply: its pattern (the cl100k_base one) and its 256 special tokens
//    from id <number of ranks>: <|begin_of_text|>, <|end_of_text|>,
//    <|reserved_special_token_0..3|>, <|start_header_id|>, <|end_header_id|>,
//    <|reserved_special_token_4|>, <|eot_id|>, <|reserved_special_token_5..250|>;
//    bos <|begin_of_text|>, end of document <|end_of_text|>.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace forge {

StatusOr<std::unique_ptr<Tokenizer>> LoadTiktokenJson(const std::string& path,
                                                      const std::string& name);

// `flavor`: the regex flavour of the pre-tokenizer; tiktoken's own unless a test compares
// with a JavaScript implementation.
StatusOr<std::unique_ptr<Tokenizer>> LoadTiktokenFile(const std::string& path,
                                                      const std::string& name,
                                                      RegexFlavor flavor = RegexFlavor::kTiktoken);

// Llama 3's special tokens in id order (256), starting at the number of ranks.
std::vector<std::string> Llama3SpecialTokens();

}  // namespace forge
