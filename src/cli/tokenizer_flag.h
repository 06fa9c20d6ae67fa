// --tokenizer NAME|PATH of the commands that read text with a tokenizer the user picks (forge
// data prepare, forge data tokenize): a name or a file LoadTokenizer opens, gpt2 by default.
#pragma once

#include <string>

#include "common/flags.h"

namespace forge {

inline void AddTokenizerFlag(FlagParser* flags) {
  flags->Value("--tokenizer", "NAME|PATH",
               "gpt2 (default), cl100k_base, o200k_base, llama3, a tiktoken rank file, or a "
               "tokenizer.json (or its directory)");
}

// The tokenizer named: --tokenizer, or "gpt2".
inline std::string TokenizerFlag(const FlagParser& flags) {
  return flags.Get("--tokenizer", "gpt2");
}

}  // namespace forge
