// `forge eval` over a prepared dataset: loss, perplexity and bits per byte of a model on a
// split, evaluated as the trainer evaluates (FillEvalBatch's sequences in order, the backend's
// EvalLoss, the padded vocabulary in the softmax as in training).
//
// Bits per byte = (sum of the targets' losses in nats) / ln 2 / (bytes of the targets' text).
// The bytes come from decoding the evaluated target tokens with the dataset's tokenizer
// ("decoded": every token's byte length, special tokens counting 0, since a document's text
// does not hold them), or, where the tokenizer cannot be loaded, from the manifest's
// text_bytes / tokens of the split times the evaluated token count ("manifest_ratio").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"
#include "worker/data/dataset.h"
#include "worker/infer/decode_backend.h"
#include "worker/train/backend.h"

namespace forge {

struct DatasetEvalOptions {
  Split split = Split::kVal;
  int seq_len = 0;
  int micro_batch = 1;
  int64_t batches = 0;  // <= 0: every whole batch the split holds (at least one)
};

struct DatasetEvalResult {
  double loss = 0;        // mean over the evaluated targets, nats
  double perplexity = 0;  // exp(loss)
  double bits_per_byte = 0;
  int64_t tokens = 0;     // targets evaluated
  int64_t bytes = 0;      // their text bytes (see bytes_source)
  std::string bytes_source;  // "decoded", "manifest_ratio" or "" (no bits per byte)
  int64_t batches = 0;
  std::vector<float> per_batch;
  std::vector<int32_t> inputs, targets;  // the batches evaluated, for --dump-tokens
};

// `tok` may be null (bytes from the manifest's ratio).
StatusOr<DatasetEvalResult> EvaluateDataset(TrainBackend* backend, const TokenDataset& ds,
                                            const DatasetEvalOptions& opt, Tokenizer* tok);
// The same over the KV-cache forward (`forge eval --backend cuda`): each micro-batch's
// sequences are one DecodeBackend::AppendLosses call, their mean loss the batch's.
StatusOr<DatasetEvalResult> EvaluateDataset(DecodeBackend* backend, const TokenDataset& ds,
                                            const DatasetEvalOptions& opt, Tokenizer* tok);

// Each id's byte length under `tok` (special tokens 0), for ids [0, vocab).
StatusOr<std::vector<int32_t>> TokenByteLengths(Tokenizer* tok, int vocab);

}  // namespace forge
