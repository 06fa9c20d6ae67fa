#include "tokenizer/gpt2_bpe.h"

#include "tokenizer/gpt2_tokenizer.h"

namespace forge {

StatusOr<Gpt2Bpe> Gpt2Bpe::Load(const std::string& encoder_json_path,
                               const std::string& vocab_bpe_path) {
  FORGE_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok,
                         LoadGpt2Tokenizer(encoder_json_path, vocab_bpe_path));
  return Gpt2Bpe(std::move(tok));
}

}  // namespace forge
