// Text generation over a DecodeBackend: prefill every prompt in one call, then one token per
// unfinished sequence per call until each stops (a stop token such as the tokenizer's
// end-of-text, max_new_tokens, or the model's context).
//
// Sampling (SampleToken): temperature 0 is greedy (argmax, the lowest id on a tie); otherwise
// logits / temperature, then top-k (k > 0 keeps the k largest), then top-p (the smallest set of
// the most likely tokens whose probability reaches p), renormalised, and one draw. The draw of
// sequence i at step j is a pure function of (seed, i, j), so a prompt's completion is the same
// whatever else is in its batch and however often it runs. Only real vocabulary ids (below
// ModelConfig::vocab) are ever produced: the padding rows' logits are ignored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/infer/decode_backend.h"

namespace forge {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy
  int top_k = 0;             // 0: no limit
  double top_p = 1.0;        // 1: no limit
  uint64_t seed = 0;
};

// The next token from logits[0, vocab).
int32_t SampleToken(const float* logits, int vocab, const SamplingOptions& opt, uint64_t stream,
                    uint64_t step);

struct GenerateOptions {
  int max_new_tokens = 64;
  SamplingOptions sampling;
  std::vector<int32_t> stop_ids;  // generation of a sequence ends after one of these
  int max_len = 0;                // tokens a sequence may hold; 0: the model's seq_len
};

struct Generation {
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;     // the new tokens (a final stop token included)
  std::string stop;                // "stop_token", "max_new_tokens" or "context"
};

struct GenerateStats {
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t prompt_tokens = 0, new_tokens = 0;
};

// Every prompt must hold at least one token and fit max_len. With prompt_logits set, it gets
// the logits of every prompt position, prompt by prompt ([sum of prompt lengths, vocab], the
// real vocabulary's columns only).
StatusOr<std::vector<Generation>> Generate(DecodeBackend* backend,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opt,
                                           std::vector<float>* prompt_logits = nullptr,
                                           GenerateStats* stats = nullptr);

// A generation dump (safetensors): per prompt i, "prompt.<i>" (I32 [n]), "logits.<i>" (F32
// [n, vocab], the prompt positions' logits) and "generated.<i>" (I32 [m]); metadata holds the
// options and, where given, each prompt's text ("prompt_text.<i>"). For independent
// implementations to compare against (scripts/hf_llama_numpy.py,
// scripts/check_hf_transformers.py).
Status WriteGenerationDump(const std::string& path, const std::vector<Generation>& gens,
                           const std::vector<float>& prompt_logits, int vocab,
                           const GenerateOptions& opt,
                           const std::vector<std::string>& texts = {});

}  // namespace forge
