// Multiple-choice evaluation in the HellaSwag / ARC form (`forge eval --tasks FILE.jsonl`).
//
// One JSON object a line, any of:
//   {"context": "...", "endings": ["...", ...], "label": 2}            Forge's form ("ctx" /
//                                                                       "query" and "choices" /
//                                                                       "gold" also read)
//   HellaSwag's release {"activity_label", "ctx_a", "ctx_b", "endings", "label"}: the context
//   is lm-eval's preprocessing of activity_label + ": " + ctx_a + " " + capitalised ctx_b
//   ARC {"question": "..." | {"stem", "choices": [{"text", "label"}]},
//        "choices": {"text": [...], "label": [...]}, "answerKey": "B"}: the context is
//   "Question: <question>\nAnswer:"
// A label may be an integer or a string holding one. Blank lines are skipped; anything else
// that does not parse is an InvalidArgument naming the file and line.
//
// Scoring, as lm-eval's loglikelihood: the continuation is " " + ending; the tokens of the
// continuation are those of encode(context + continuation) after the first
// len(encode(context)); the sequence starts with the tokenizer's begin-of-text token (its
// end-of-text where it has none, which is what precedes every document in a Forge dataset)
// and is cut from the left to the model's context. An ending's score is the sum of its tokens'
// log-probabilities (log-softmax over the real vocabulary, in double). acc takes the ending
// with the highest sum; acc_norm the highest sum per byte of the ending (lm-eval's acc_norm
// divides by the ending's length in characters: the same for ASCII text).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"
#include "worker/infer/decode_backend.h"

namespace forge {

struct McExample {
  std::string context;
  std::vector<std::string> endings;
  int label = 0;
  int line = 0;  // in the file, for messages
};

StatusOr<std::vector<McExample>> ReadMcTasks(const std::string& path);

struct McScore {
  std::vector<double> loglik;         // per ending
  std::vector<int64_t> ending_bytes;  // per ending
  std::vector<int> ending_tokens;     // per ending
  int pred = 0, pred_norm = 0;
};

struct McResult {
  int64_t examples = 0;
  double acc = 0, acc_norm = 0;
  double chance = 0;  // the mean of 1 / (number of endings)
  std::vector<McScore> scores;  // per example
};

// The token sequence scored for one ending and where its continuation begins in it.
struct McSequence {
  std::vector<int32_t> tokens;
  size_t continuation_begin = 0;
};
StatusOr<McSequence> McTokens(Tokenizer* tok, const std::string& context, const std::string& ending,
                              int max_len);

// `max_tokens_per_call` bounds how many tokens one backend call holds (their logits are
// kept, vocabulary-wide, until scored).
StatusOr<McResult> ScoreMcTasks(DecodeBackend* backend, Tokenizer* tok,
                                const std::vector<McExample>& examples,
                                int max_tokens_per_call = 512);

// log p(tokens[c] | tokens[< c]) summed over c in [begin, tokens.size()), from logits rows
// (row j predicts token j + 1), over the first `vocab` columns of rows `stride` wide.
double ContinuationLogLikelihood(const float* logits, int64_t stride, int vocab,
                                 const std::vector<int32_t>& tokens, size_t begin);

}  // namespace forge
