// The Tokenizer interface over GPT-2's byte-level BPE (encoder.json + vocab.bpe).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace forge {

StatusOr<std::unique_ptr<Tokenizer>> LoadGpt2Tokenizer(const std::string& encoder_json,
                                                       const std::string& vocab_bpe);

}  // namespace forge
