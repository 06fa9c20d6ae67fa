// Text in, text out over a DecodeBackend, as `forge generate` does it: each prompt starts with
// the tokenizer's begin-of-text token (its end-of-text where it has none), generation stops at
// the end-of-text token (not shown in the completion), and completions are valid UTF-8 (a
// character split by the last token is replaced). For the trainer's eval.samples.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"
#include "worker/infer/decode_backend.h"
#include "worker/infer/generate.h"

namespace forge {

struct TextCompletion {
  std::string prompt, completion;
  std::string stop;  // Generation::stop
};

// opt.stop_ids is replaced by the tokenizer's end-of-text token. A prompt longer than the
// context (opt.max_len, else the model's seq_len) keeps its last tokens.
StatusOr<std::vector<TextCompletion>> CompleteTexts(DecodeBackend* backend, Tokenizer* tok,
                                                    const std::vector<std::string>& prompts,
                                                    GenerateOptions opt);

}  // namespace forge
