// BpeTokenizer: the Tokenizer over BpeModel + Pretokenizer + PieceCache.
#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>

#include "tokenizer/nfc.h"
#include "tokenizer/piece_cache.h"

namespace forge {
namespace {

struct Shared {
  BpeTokenizerSpec spec;
  int32_t vocab_size = 0;
  std::vector<std::string_view> special_text;  // by id ("" where none)
  // Specials sorted longest first, for EncodeWithSpecials' matching at one position.
  std::vector<SpecialToken> by_length;
  bool first_byte[256] = {};
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(std::shared_ptr<const Shared> shared)
      : shared_(std::move(shared)),
        model_(*shared_->spec.model),
        pre_(shared_->spec.pattern, shared_->spec.flavor) {}

  const std::string& name() const override { return shared_->spec.name; }
  const std::string& identity() const override { return shared_->spec.identity; }
  int32_t vocab_size() const override { return shared_->vocab_size; }

  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) override {
    if (shared_->spec.normalization == Normalization::kNfc && !IsNfcQuick(text)) {
      NfcNormalize(text, &normalized_);
      EncodeText(normalized_, out);
      return;
    }
    EncodeText(text, out);
  }

  void EncodeWithSpecials(std::string_view text, std::vector<int32_t>* out) override {
    const Shared& sh = *shared_;
    size_t start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      if (!sh.first_byte[static_cast<uint8_t>(text[i])]) continue;
      for (const SpecialToken& t : sh.by_length) {
        if (text.compare(i, t.text.size(), t.text) == 0) {
          EncodeOrdinary(text.substr(start, i - start), out);
          out->push_back(t.id);
          start = i + t.text.size();
          i = start - 1;
          break;
        }
      }
    }
    EncodeOrdinary(text.substr(start), out);
  }

  StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    std::string out;
    const Shared& sh = *shared_;
    for (int32_t id : ids) {
      if (model_.HasToken(id)) {
        out += model_.TokenBytes(id);
        continue;
      }
      if (id >= 0 && id < sh.vocab_size && !sh.special_text[id].empty()) {
        out += sh.special_text[id];
        continue;
      }
      return Status::Invalid("Decode: token id " + std::to_string(id) + " is not in the vocabulary of " +
                             sh.spec.name + " (" + std::to_string(sh.vocab_size) + " ids)");
    }
    return out;
  }

  const std::vector<SpecialToken>& special_tokens() const override { return shared_->spec.specials; }
  int32_t eot_id() const override { return shared_->spec.eot_id; }
  int32_t bos_id() const override { return shared_->spec.bos_id; }
  std::unique_ptr<Tokenizer> Clone() const override {
    return std::make_unique<BpeTokenizer>(shared_);
  }
  const BpeModel& model() const { return model_; }
  const Pretokenizer& pretokenizer() const { return pre_; }

 private:
  void EncodeText(std::string_view text, std::vector<int32_t>* out) {
    pre_.ForEach(text, [&](const uint8_t* p, size_t n) {
      if (n == 1) {
        out->push_back(model_.ByteId(p[0]));
        return;
      }
      if (cache_.Lookup(p, n, out)) return;
      const size_t before = out->size();
      model_.EncodePiece(p, n, out);
      cache_.Insert(p, n, out->data() + before, out->size() - before);
    });
  }

  std::shared_ptr<const Shared> shared_;
  const BpeModel& model_;
  Pretokenizer pre_;
  PieceCache cache_;
  std::string normalized_;
};

}  // namespace

const BpeModel* BpeModelOf(const Tokenizer& t) {
  const auto* b = dynamic_cast<const BpeTokenizer*>(&t);
  return b == nullptr ? nullptr : &b->model();
}

const Pretokenizer* PretokenizerOf(const Tokenizer& t) {
  const auto* b = dynamic_cast<const BpeTokenizer*>(&t);
  return b == nullptr ? nullptr : &b->pretokenizer();
}

StatusOr<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(BpeTokenizerSpec spec) {
  if (spec.model == nullptr) return Status::Invalid(spec.name + ": no BPE model");
  auto shared = std::make_shared<Shared>();
  shared->spec = std::move(spec);
  const BpeTokenizerSpec& s = shared->spec;
  int32_t vocab = s.model->size();
  for (const SpecialToken& t : s.specials) {
    if (t.text.empty()) return Status::Invalid(s.name + ": a special token with no text");
    if (t.id < 0 || s.model->HasToken(t.id)) {
      return Status::Invalid(s.name + ": special token " + t.text + " has id " +
                             std::to_string(t.id) + ", which is negative or an ordinary token");
    }
    vocab = std::max(vocab, t.id + 1);
  }
  shared->vocab_size = vocab;
  shared->special_text.assign(static_cast<size_t>(vocab), std::string_view());
  for (const SpecialToken& t : s.specials) {
    if (!shared->special_text[t.id].empty()) {
      return Status::Invalid(s.name + ": two special tokens have id " + std::to_string(t.id));
    }
    shared->special_text[t.id] = t.text;
    shared->first_byte[static_cast<uint8_t>(t.text[0])] = true;
  }
  shared->by_length = shared->spec.specials;
  std::stable_sort(shared->by_length.begin(), shared->by_length.end(),
                   [](const SpecialToken& a, const SpecialToken& b) { return a.text.size() > b.text.size(); });
  auto is_special = [&](int32_t id) {
    return std::any_of(s.specials.begin(), s.specials.end(), [&](const SpecialToken& t) { return t.id == id; });
  };
  if (!is_special(s.eot_id)) {
    return Status::Invalid(s.name + ": no end-of-text token among the special tokens");
  }
  if (s.bos_id >= 0 && !is_special(s.bos_id)) {
    return Status::Invalid(s.name + ": the begin-of-text id " + std::to_string(s.bos_id) +
                           " is not a special token");
  }
  return std::unique_ptr<Tokenizer>(std::make_unique<BpeTokenizer>(std::move(shared)));
}

}  // namespace forge
