#include "tokenizer/gpt2_tokenizer.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/checksum.h"
#include "tokenizer/gpt2_bpe.h"

namespace forge {
namespace {

StatusOr<uint32_t> FileCrc(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return Crc32c(ss.str());
}

class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(Gpt2Bpe bpe, std::string identity)
      : bpe_(std::move(bpe)),
        name_("gpt2"),
        identity_(std::move(identity)),
        specials_{{"<|endoftext|>", Gpt2Bpe::kEndOfText}} {}

  const std::string& name() const override { return name_; }
  const std::string& identity() const override { return identity_; }
  int32_t vocab_size() const override { return bpe_.vocab_size(); }
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) override {
    bpe_.EncodeAppend(text, out);
  }
  void EncodeWithSpecials(std::string_view text, std::vector<int32_t>* out) override {
    const std::string_view eot = specials_[0].text;
    size_t pos = 0;
    for (size_t hit; (hit = text.find(eot, pos)) != std::string_view::npos; pos = hit + eot.size()) {
      bpe_.EncodeAppend(text.substr(pos, hit - pos), out);
      out->push_back(Gpt2Bpe::kEndOfText);
    }
    bpe_.EncodeAppend(text.substr(pos), out);
  }
  StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    return bpe_.Decode(std::vector<int32_t>(ids.begin(), ids.end()));
  }
  const std::vector<SpecialToken>& special_tokens() const override { return specials_; }
  int32_t eot_id() const override { return Gpt2Bpe::kEndOfText; }
  int32_t bos_id() const override { return -1; }
  std::unique_ptr<Tokenizer> Clone() const override {
    return std::make_unique<Gpt2Tokenizer>(*this);
  }

 private:
  Gpt2Bpe bpe_;
  std::string name_;
  std::string identity_;
  std::vector<SpecialToken> specials_;
};

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> LoadGpt2Tokenizer(const std::string& encoder_json,
                                                       const std::string& vocab_bpe) {
  FORGE_ASSIGN_OR_RETURN(Gpt2Bpe bpe, Gpt2Bpe::Load(encoder_json, vocab_bpe));
  FORGE_ASSIGN_OR_RETURN(uint32_t a, FileCrc(encoder_json));
  FORGE_ASSIGN_OR_RETURN(uint32_t b, FileCrc(vocab_bpe));
  char id[64];
  std::snprintf(id, sizeof(id), "gpt2:crc32c=0x%08x%08x", a, b);
  return std::unique_ptr<Tokenizer>(std::make_unique<Gpt2Tokenizer>(std::move(bpe), id));
}

}  // namespace forge
