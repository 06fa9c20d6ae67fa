#include "tokenizer/hf_tokenizer_json.h"

#include <cstdio>
#include <filesystem>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/file_io.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/byte_level.h"

namespace forge {
namespace {

using nlohmann::json;

std::string TypeOf(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                       : std::string("?");
}

bool IsFalseOrMissing(const json& j, const char* key) {
  return !j.contains(key) || j[key].is_null() || (j[key].is_boolean() && !j[key].get<bool>());
}

// "bos_token": "<s>" or {"content": "<s>", ...} or null.
std::string TokenContent(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return "";
}

Status CheckByteLevel(const json& bl, const std::string& where, bool want_regex) {
  if (!IsFalseOrMissing(bl, "add_prefix_space")) {
    return Status::Invalid(where + ".add_prefix_space: true is not implemented");
  }
  const bool use_regex = !bl.contains("use_regex") || bl["use_regex"].is_null() ||
                         (bl["use_regex"].is_boolean() && bl["use_regex"].get<bool>());
  if (use_regex != want_regex) {
    return Status::Invalid(where + ".use_regex: " + (use_regex ? "true" : "false") +
                           " is not implemented here (ByteLevel alone must split with its "
                           "regex; after a Split it must not)");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizerJson(const std::string& path) {
  namespace fs = std::filesystem;
  FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::DataLoss(path + ": not a JSON object");
  const std::string p = path + ": ";

  // model
  if (!j.contains("model") || !j["model"].is_object()) return Status::DataLoss(p + "no 'model' object");
  const json& model = j["model"];
  if (TypeOf(model) != "BPE") {
    return Status::Invalid(p + "model.type '" + TypeOf(model) +
                           "' is not implemented (only byte-level BPE)");
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    return Status::Invalid(p + "model.dropout is set: BPE dropout is not implemented");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty())) {
      return Status::Invalid(p + "model." + key + " is set: not implemented");
    }
  }
  if (!IsFalseOrMissing(model, "byte_fallback")) {
    return Status::Invalid(p + "model.byte_fallback: true is not implemented (byte-level only)");
  }
  const bool ignore_merges = !IsFalseOrMissing(model, "ignore_merges");
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Status::DataLoss(p + "model.vocab missing or not an object");
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return Status::DataLoss(p + "model.merges missing or not an array");
  }
  if (j.contains("truncation") && !j["truncation"].is_null()) {
    return Status::Invalid(p + "truncation is set: not implemented (Forge never truncates)");
  }

  // added_tokens: the special tokens.
  BpeTokenizerSpec spec;
  std::unordered_map<std::string, int32_t> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
      const json& t = j["added_tokens"][i];
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          !t.contains("content") || !t["content"].is_string()) {
        return Status::DataLoss(p + "added_tokens[" + std::to_string(i) + "] needs 'id' and 'content'");
      }
      spec.specials.push_back({t["content"].get<std::string>(), t["id"].get<int32_t>()});
      added.emplace(spec.specials.back().text, spec.specials.back().id);
    }
  }

  // vocab (an added token that is also in the vocabulary stays a special token only).
  std::vector<BpeModel::Token> tokens;
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(model["vocab"].size());
  std::string bytes;
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer()) {
      return Status::DataLoss(p + "model.vocab['" + key + "'] is not an integer id");
    }
    const auto id = value.get<int32_t>();
    vocab.emplace(key, id);
    if (auto a = added.find(key); a != added.end()) {
      if (a->second != id) {
        return Status::DataLoss(p + "added token '" + key + "' has id " + std::to_string(a->second) +
                                " but model.vocab says " + std::to_string(id));
      }
      continue;
    }
    if (!ByteLevelToBytes(key, &bytes)) {
      return Status::Invalid(p + "model.vocab token '" + key +
                             "' is not byte-level (GPT-2's byte alphabet): not implemented");
    }
    tokens.push_back({bytes, id});
  }
  std::vector<BpeModel::Merge> merges;
  merges.reserve(model["merges"].size());
  for (size_t i = 0; i < model["merges"].size(); ++i) {
    const json& m = model["merges"][i];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Status::DataLoss(p + "model.merges[" + std::to_string(i) + "] '" + s +
                                "' is not 'left right'");
      }
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      return Status::DataLoss(p + "model.merges[" + std::to_string(i) +
                              "] is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto l = vocab.find(a), r = vocab.find(b);
    if (l == vocab.end() || r == vocab.end()) {
      return Status::DataLoss(p + "model.merges[" + std::to_string(i) + "] ('" + a + "' '" + b +
                              "') uses a token missing from model.vocab");
    }
    merges.push_back({l->second, r->second});
  }
  FORGE_ASSIGN_OR_RETURN(spec.model, BpeModel::FromMerges(std::move(tokens), merges,
                                                          ignore_merges, path));

  // normalizer
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const json& n = j["normalizer"];
    if (TypeOf(n) == "NFC") {
      spec.normalization = Normalization::kNfc;
    } else if (!(TypeOf(n) == "Sequence" && n.contains("normalizers") &&
                 n["normalizers"].is_array() && n["normalizers"].empty())) {
      return Status::Invalid(p + "normalizer.type '" + TypeOf(n) +
                             "' is not implemented (none or NFC)");
    }
  }

  // pre_tokenizer
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null()) {
    return Status::Invalid(p + "pre_tokenizer is null: not implemented (byte-level needs ByteLevel)");
  }
  const json& pre = j["pre_tokenizer"];
  if (TypeOf(pre) == "ByteLevel") {
    FORGE_RETURN_IF_ERROR(CheckByteLevel(pre, p + "pre_tokenizer", /*want_regex=*/true));
    spec.pattern = PretokenPattern::kGpt2;
    spec.flavor = RegexFlavor::kEcmaScript;
  } else if (TypeOf(pre) == "Sequence" && pre.contains("pretokenizers") &&
             pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2 &&
             TypeOf(pre["pretokenizers"][0]) == "Split" &&
             TypeOf(pre["pretokenizers"][1]) == "ByteLevel") {
    const json& split = pre["pretokenizers"][0];
    const std::string w = p + "pre_tokenizer.pretokenizers[0]";
    if (!split.contains("pattern") || !split["pattern"].is_object() ||
        !split["pattern"].contains("Regex") || !split["pattern"]["Regex"].is_string()) {
      return Status::Invalid(w + ".pattern: only {\"Regex\": ...} is implemented");
    }
    if (!split.contains("behavior") || split["behavior"] != "Isolated") {
      return Status::Invalid(w + ".behavior: only Isolated is implemented");
    }
    if (!IsFalseOrMissing(split, "invert")) return Status::Invalid(w + ".invert: true is not implemented");
    FORGE_ASSIGN_OR_RETURN(spec.pattern,
                           RecognisePattern(split["pattern"]["Regex"].get<std::string>(),
                                            w + ".pattern.Regex"));
    FORGE_RETURN_IF_ERROR(CheckByteLevel(pre["pretokenizers"][1],
                                         p + "pre_tokenizer.pretokenizers[1]", /*want_regex=*/false));
    spec.flavor = RegexFlavor::kHuggingFaceJs;
  } else {
    return Status::Invalid(p + "pre_tokenizer (type '" + TypeOf(pre) +
                           "') is not implemented: ByteLevel, or Sequence[Split(Regex), ByteLevel]");
  }
  if (!j.contains("decoder") || TypeOf(j["decoder"]) != "ByteLevel") {
    return Status::Invalid(p + "decoder.type '" +
                           (j.contains("decoder") ? TypeOf(j["decoder"]) : std::string("null")) +
                           "' is not implemented (ByteLevel)");
  }

  // bos / eos: tokenizer_config.json beside the file, else the post-processor's template.
  std::string bos, eos, config_text;
  const fs::path config_path = fs::path(path).parent_path() / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    FORGE_ASSIGN_OR_RETURN(config_text, ReadSmallFile(config_path.string()));
    const json c = json::parse(config_text, nullptr, /*allow_exceptions=*/false);
    if (!c.is_object()) return Status::DataLoss(config_path.string() + ": not a JSON object");
    if (c.contains("bos_token")) bos = TokenContent(c["bos_token"]);
    if (c.contains("eos_token")) eos = TokenContent(c["eos_token"]);
  } else if (j.contains("post_processor") && TypeOf(j["post_processor"]) == "TemplateProcessing") {
    const json& single = j["post_processor"]["single"];
    bool seen_sequence = false;
    for (const json& item : single) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
      } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
        (seen_sequence ? eos : bos) = item["SpecialToken"]["id"].get<std::string>();
      }
    }
  }
  auto id_of = [&](const std::string& t) {
    for (const SpecialToken& s : spec.specials)
      if (s.text == t) return s.id;
    return -1;
  };
  if (eos.empty()) {
    return Status::Invalid(p + "no end-of-text token: no eos_token in tokenizer_config.json beside "
                           "it and none at the end of the post-processor's template");
  }
  spec.eot_id = id_of(eos);
  if (spec.eot_id < 0) return Status::DataLoss(p + "eos token '" + eos + "' is not an added token");
  if (!bos.empty()) {
    spec.bos_id = id_of(bos);
    if (spec.bos_id < 0) return Status::DataLoss(p + "bos token '" + bos + "' is not an added token");
  }

  const fs::path dir = fs::path(path).parent_path();
  spec.name = dir.filename().empty() ? "tokenizer.json" : dir.filename().string();
  char id[48];
  std::snprintf(id, sizeof(id), ":crc32c=0x%08x%08x", Crc32c(text), Crc32c(config_text));
  spec.identity = spec.name + id;
  return MakeBpeTokenizer(std::move(spec));
}

}  // namespace forge
