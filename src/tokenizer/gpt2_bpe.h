// Gpt2Bpe: GPT-2 through the older value-type interface (tests still use it; programs load
// tokenizers through tokenizer.h). A thin adapter over the Tokenizer that LoadGpt2Tokenizer
// builds (one BPE engine for all).
// New code uses tokenizer.h.
//
// Thread safety: an instance is not thread-safe (its cache mutates). Copies share the
// immutable tables and get their own cache, so give each thread a copy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace forge {

class Gpt2Bpe {
 public:
  static constexpr int32_t kEndOfText = 50256;
  static constexpr const char* kTokenizerId = "gpt2-bpe";

  // encoder_json_path: {"token": id, ...}; vocab_bpe_path: "#version" line + merges.
  static StatusOr<Gpt2Bpe> Load(const std::string& encoder_json_path,
                                const std::string& vocab_bpe_path);

  Gpt2Bpe(const Gpt2Bpe& other) : tok_(other.tok_->Clone()) {}
  Gpt2Bpe& operator=(const Gpt2Bpe& other) {
    if (this != &other) tok_ = other.tok_->Clone();
    return *this;
  }
  Gpt2Bpe(Gpt2Bpe&&) noexcept = default;
  Gpt2Bpe& operator=(Gpt2Bpe&&) noexcept = default;

  int32_t vocab_size() const { return tok_->vocab_size(); }
  std::vector<int32_t> Encode(std::string_view text) { return tok_->Encode(text); }
  void EncodeAppend(std::string_view text, std::vector<int32_t>* out) {
    tok_->EncodeOrdinary(text, out);
  }
  StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const { return tok_->Decode(ids); }

 private:
  explicit Gpt2Bpe(std::unique_ptr<Tokenizer> tok) : tok_(std::move(tok)) {}
  std::unique_ptr<Tokenizer> tok_;
};

}  // namespace forge
