// GPT-2 byte-level BPE tokenizer (OpenAI's encoder.json + vocab.bpe, 50,257 ids).
//
// Encoding = pre-tokenise the UTF-8 text with GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (implemented by hand in gpt2_pretokenize.cc; classes from unicode_classes.h), then apply
// the BPE merges of vocab.bpe to each pre-token's bytes, lowest merge rank first.
// Results per pre-token are cached, so common words cost one hash lookup.
//
// Text is always treated as plain text: a literal "<|endoftext|>" in the input is encoded as
// ordinary characters; the id kEndOfText is only ever inserted by the caller (as the document
// separator in prepared datasets).
//
// Thread safety: an instance is not thread-safe (its cache mutates). Copies share the
// immutable vocabulary and merge tables and get their own cache, so give each thread a copy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace forge {

// Splits text into GPT-2 pre-tokens: returns the end offsets (bytes) of consecutive pieces
// covering the whole input. Invalid UTF-8 bytes are single "other" characters.
std::vector<size_t> Gpt2PretokenEnds(std::string_view text);
// Length in bytes of the pre-token starting at `pos` (pos < text.size()).
size_t Gpt2PretokenLength(std::string_view text, size_t pos);

class Gpt2Bpe {
 public:
  static constexpr int32_t kEndOfText = 50256;
  static constexpr const char* kTokenizerId = "gpt2-bpe";

  // encoder_json_path: {"token": id, ...}; vocab_bpe_path: "#version" line + merges.
  static StatusOr<Gpt2Bpe> Load(const std::string& encoder_json_path,
                                const std::string& vocab_bpe_path);

  Gpt2Bpe(const Gpt2Bpe& other);
  Gpt2Bpe& operator=(const Gpt2Bpe& other);
  Gpt2Bpe(Gpt2Bpe&&) noexcept;
  Gpt2Bpe& operator=(Gpt2Bpe&&) noexcept;
  ~Gpt2Bpe();

  int32_t vocab_size() const;  // 50257 for GPT-2

  std::vector<int32_t> Encode(std::string_view text);
  // Appends the ids of `text` to `out` (avoids a copy when building long streams).
  void EncodeAppend(std::string_view text, std::vector<int32_t>* out);
  // Bytes of the ids concatenated (may be invalid UTF-8 if ids split a character).
  // Unknown ids are an InvalidArgument error naming the id.
  StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;
  // Bytes of one id ("" for an unknown id).
  std::string_view TokenBytes(int32_t id) const;
  // Merges the bytes of one pre-token with the quadratic (long_algorithm=false) or the
  // heap-based algorithm, bypassing the cache. Encode picks by length; tests compare both.
  std::vector<int32_t> MergePiece(std::string_view piece, bool long_algorithm) const;

 private:
  struct Tables;  // vocabulary + merges, shared by copies
  struct Cache;   // per-instance pre-token -> ids cache
  // Pieces longer than this (bytes) use the O(n log n) merge (MergeLong).
  static constexpr size_t kLongPiece = 128;

  Gpt2Bpe(std::shared_ptr<const Tables> tables);
  void EncodePiece(std::string_view piece, std::vector<int32_t>* out);
  static void MergeShort(const Tables& t, std::vector<int32_t>* symbols);
  static void MergeLong(const Tables& t, std::vector<int32_t>* symbols);

  std::shared_ptr<const Tables> tables_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace forge
