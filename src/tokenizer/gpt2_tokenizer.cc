#include "tokenizer/gpt2_tokenizer.h"

#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/file_io.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"

namespace forge {

StatusOr<std::unique_ptr<Tokenizer>> LoadGpt2Tokenizer(const std::string& encoder_json,
                                                       const std::string& vocab_bpe) {
  constexpr int32_t kEndOfText = 50256;
  FORGE_ASSIGN_OR_RETURN(std::string enc_text, ReadSmallFile(encoder_json));
  const nlohmann::json enc = nlohmann::json::parse(enc_text, nullptr, /*allow_exceptions=*/false);
  if (!enc.is_object() || enc.empty()) {
    return Status::DataLoss(encoder_json + ": not a JSON object of token -> id");
  }
  std::vector<BpeModel::Token> tokens;
  tokens.reserve(enc.size());
  std::unordered_map<std::string, int32_t> by_string;
  bool has_eot = false;
  std::string bytes;
  for (const auto& [key, value] : enc.items()) {
    if (!value.is_number_integer()) {
      return Status::DataLoss(encoder_json + ": token '" + key + "' has a non-integer id");
    }
    const auto id = value.get<int64_t>();
    if (id < 0 || id > INT32_MAX) {
      return Status::DataLoss(encoder_json + ": token '" + key + "' has id " + std::to_string(id));
    }
    if (key == "<|endoftext|>") {
      if (id != kEndOfText) {
        return Status::DataLoss(encoder_json + ": <|endoftext|> has id " + std::to_string(id) +
                                ", not " + std::to_string(kEndOfText));
      }
      has_eot = true;
      continue;
    }
    if (!ByteLevelToBytes(key, &bytes)) {
      return Status::DataLoss(encoder_json + ": token '" + key +
                              "' is not in GPT-2's byte-to-unicode alphabet");
    }
    tokens.push_back({bytes, static_cast<int32_t>(id)});
    by_string.emplace(key, static_cast<int32_t>(id));
  }
  if (!has_eot) return Status::DataLoss(encoder_json + ": no <|endoftext|> token");

  FORGE_ASSIGN_OR_RETURN(std::string merges_text, ReadSmallFile(vocab_bpe));
  std::vector<BpeModel::Merge> merges;
  std::istringstream lines(merges_text);
  std::string line;
  int line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
      return Status::DataLoss(vocab_bpe + ":" + std::to_string(line_no) + ": expected 'left right'");
    }
    auto l = by_string.find(line.substr(0, sp));
    auto r = by_string.find(line.substr(sp + 1));
    if (l == by_string.end() || r == by_string.end()) {
      return Status::DataLoss(vocab_bpe + ":" + std::to_string(line_no) + ": merge '" + line +
                              "' uses a token missing from " + encoder_json);
    }
    merges.push_back({l->second, r->second});
  }
  if (merges.empty()) return Status::DataLoss(vocab_bpe + ": no merges");
  FORGE_ASSIGN_OR_RETURN(auto model, BpeModel::FromMerges(std::move(tokens), merges,
                                                          /*whole_piece_lookup=*/false, vocab_bpe));
  char id[64];
  std::snprintf(id, sizeof(id), "gpt2:crc32c=0x%08x%08x", Crc32c(enc_text), Crc32c(merges_text));
  BpeTokenizerSpec spec;
  spec.name = "gpt2";
  spec.identity = id;
  spec.model = std::move(model);
  spec.pattern = PretokenPattern::kGpt2;
  spec.flavor = RegexFlavor::kTiktoken;
  spec.specials = {{"<|endoftext|>", kEndOfText}};
  spec.eot_id = kEndOfText;
  return MakeBpeTokenizer(std::move(spec));
}

}  // namespace forge
