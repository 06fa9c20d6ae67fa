#include "tokenizer/tiktoken_loader.h"

#include <charconv>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/file_io.h"
#include "tokenizer/bpe_tokenizer.h"

namespace forge {
namespace {

// Standard base64 ('=' padding optional); false on any other character.
bool DecodeBase64(std::string_view in, std::string* out) {
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : in) {
    int v;
    if (ch >= 'A' && ch <= 'Z') {
      v = ch - 'A';
    } else if (ch >= 'a' && ch <= 'z') {
      v = ch - 'a' + 26;
    } else if (ch >= '0' && ch <= '9') {
      v = ch - '0' + 52;
    } else if (ch == '+') {
      v = 62;
    } else if (ch == '/') {
      v = 63;
    } else if (ch == '=') {
      break;
    } else {
      return false;
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return !out->empty();
}

bool ParseInt(std::string_view s, int64_t* v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size();
}

std::vector<std::string_view> SplitSpaces(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t j = line.find(' ', i);
    const size_t end = j == std::string_view::npos ? line.size() : j;
    if (end > i) out.push_back(line.substr(i, end - i));
    i = end;
  }
  return out;
}

// Lines of "<base64> <rank>" or "! <first rank> <base64>..." into tokens.
Status ParseRanks(std::string_view text, const std::string& path, bool allow_runs,
                  std::vector<BpeModel::Token>* tokens) {
  size_t pos = 0;
  int line_no = 0;
  std::string bytes;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    const std::vector<std::string_view> f = SplitSpaces(line);
    int64_t rank = 0;
    if (allow_runs && !f.empty() && f[0] == "!") {
      if (f.size() < 2 || !ParseInt(f[1], &rank) || rank < 0) {
        return Status::DataLoss(where + ": expected '! <first rank> <base64>...'");
      }
      for (size_t k = 2; k < f.size(); ++k) {
        if (!DecodeBase64(f[k], &bytes)) {
          return Status::DataLoss(where + ": field " + std::to_string(k + 1) + " is not base64");
        }
        tokens->push_back({bytes, static_cast<int32_t>(rank + static_cast<int64_t>(k) - 2)});
      }
      continue;
    }
    if (f.size() != 2 || !ParseInt(f[1], &rank) || rank < 0 || rank > INT32_MAX) {
      return Status::DataLoss(where + ": expected '<base64 token> <rank>'");
    }
    if (!DecodeBase64(f[0], &bytes)) return Status::DataLoss(where + ": token is not base64");
    tokens->push_back({bytes, static_cast<int32_t>(rank)});
  }
  if (tokens->empty()) return Status::DataLoss(path + ": no ranks");
  return Status::Ok();
}

std::string Identity(const std::string& name, std::string_view content) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), ":crc32c=0x%08x", Crc32c(content));
  return name + buf;
}

}  // namespace

std::vector<std::string> Llama3SpecialTokens() {
  std::vector<std::string> t = {"<|begin_of_text|>", "<|end_of_text|>"};
  for (int i = 0; i < 4; ++i) t.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  t.push_back("<|start_header_id|>");
  t.push_back("<|end_header_id|>");
  t.push_back("<|reserved_special_token_4|>");
  t.push_back("<|eot_id|>");
  for (int i = 5; i <= 250; ++i) t.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return t;
}

StatusOr<std::unique_ptr<Tokenizer>> LoadTiktokenJson(const std::string& path,
                                                      const std::string& name) {
  FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::DataLoss(path + ": not a JSON object");
  for (const char* key : {"pat_str", "bpe_ranks"}) {
    if (!j.contains(key) || !j[key].is_string()) {
      return Status::DataLoss(path + ": key '" + key + "' missing or not a string");
    }
  }
  if (!j.contains("special_tokens") || !j["special_tokens"].is_object()) {
    return Status::DataLoss(path + ": key 'special_tokens' missing or not an object");
  }
  FORGE_ASSIGN_OR_RETURN(PretokenPattern pattern,
                         RecognisePattern(j["pat_str"].get<std::string>(), path + ": pat_str"));
  std::vector<BpeModel::Token> tokens;
  FORGE_RETURN_IF_ERROR(ParseRanks(j["bpe_ranks"].get<std::string>(), path + ": bpe_ranks",
                                   /*allow_runs=*/true, &tokens));
  FORGE_ASSIGN_OR_RETURN(auto model, BpeModel::FromRanks(std::move(tokens), path));
  BpeTokenizerSpec spec;
  spec.name = name;
  spec.identity = Identity(name, text);
  spec.model = std::move(model);
  spec.pattern = pattern;
  spec.flavor = RegexFlavor::kTiktoken;
  for (const auto& [tok, id] : j["special_tokens"].items()) {
    if (!id.is_number_integer()) {
      return Status::DataLoss(path + ": special_tokens." + tok + " is not an integer");
    }
    spec.specials.push_back({tok, id.get<int32_t>()});
    if (tok == "<|endoftext|>") spec.eot_id = id.get<int32_t>();
  }
  if (spec.eot_id < 0) return Status::DataLoss(path + ": special_tokens has no <|endoftext|>");
  return MakeBpeTokenizer(std::move(spec));
}

StatusOr<std::unique_ptr<Tokenizer>> LoadTiktokenFile(const std::string& path,
                                                      const std::string& name,
                                                      RegexFlavor flavor) {
  FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  std::vector<BpeModel::Token> tokens;
  FORGE_RETURN_IF_ERROR(ParseRanks(text, path, /*allow_runs=*/false, &tokens));
  const auto base = static_cast<int32_t>(tokens.size());
  FORGE_ASSIGN_OR_RETURN(auto model, BpeModel::FromRanks(std::move(tokens), path));
  if (model->size() != base) {
    return Status::DataLoss(path + ": ranks are not 0.." + std::to_string(base - 1) +
                            " (largest is " + std::to_string(model->size() - 1) + ")");
  }
  BpeTokenizerSpec spec;
  spec.name = name;
  spec.identity = Identity(name, text);
  spec.model = std::move(model);
  spec.pattern = PretokenPattern::kCl100k;
  spec.flavor = flavor;
  const std::vector<std::string> names = Llama3SpecialTokens();
  for (size_t i = 0; i < names.size(); ++i) {
    spec.specials.push_back({names[i], base + static_cast<int32_t>(i)});
  }
  spec.bos_id = base;
  spec.eot_id = base + 1;
  return MakeBpeTokenizer(std::move(spec));
}

}  // namespace forge
