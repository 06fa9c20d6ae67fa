// Hugging Face tokenizer.json files of byte-level BPE models (GPT-2, Llama 3, Qwen2, GPT-NeoX
// and many others), given by path.
//
// Implemented: model BPE with vocab and merges ("a b" strings or ["a", "b"] pairs, in
// priority order) and ignore_merges; pre_tokenizer ByteLevel (GPT-2's built-in pattern) or
// Sequence[Split(Regex, Isolated), ByteLevel(use_regex false)] with a pattern Forge knows
// (pretokenizer.h); normalizer none or NFC; decoder ByteLevel; added_tokens as the special
// tokens. The end-of-document token is tokenizer_config.json's eos_token (the file beside
// tokenizer.json) or else the last special token of the post-processor's template; bos
// likewise. Anything else that would change the ids (other normalizers or pre-tokenizers,
// dropout, add_prefix_space, word suffixes, byte fallback, truncation) is an error naming the
// field. The pre-tokenizer follows @huggingface/tokenizers' regex flavour (pretokenizer.h).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace forge {

StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizerJson(const std::string& path);

}  // namespace forge
