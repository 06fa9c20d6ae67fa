// What generation and multiple-choice evaluation need from a model: sequences that grow by a
// few tokens per call, each keeping its attention keys and values (a KV cache), so a new token
// costs one position's work instead of the whole prefix's.
//
//   backend->Reset(batch, max_len);
//   backend->Append(prefill: each sequence's prompt)        -> each one's last logits
//   loop: backend->Append(each unfinished sequence's token)  -> its next logits
//
// Sequences are independent: each has its own length, so prompts of different lengths share
// every call. Logits are over the padded vocabulary (ModelConfig::padded_vocab); callers use
// the first model().vocab of each row.
//
// Implementations: the CPU one (cpu_decode_backend.cc, float32, the reference) and the CUDA one
// (cuda_decode_backend.cc: BF16 weights and KV cache, fp32 residual stream).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/model/unit_buffers.h"

namespace forge {

class DecodeBackend {
 public:
  virtual ~DecodeBackend() = default;

  virtual const ModelConfig& model() const = 0;
  // "cpu" or "cuda".
  virtual const char* name() const = 0;

  // Forgets every sequence; makes room for `batch` sequences of up to max_len tokens each.
  virtual Status Reset(int batch, int max_len) = 0;

  // Appends tokens[k] (at least one) to sequence seqs[k], for every k (each sequence at most
  // once per call). Writes to *logits, resized here, the logits of each sequence's last
  // appended token in order ([seqs.size(), padded_vocab]), or with all_positions those of every
  // appended token, sequence by sequence ([sum of sizes, padded_vocab]).
  virtual Status Append(std::span<const int> seqs,
                        std::span<const std::vector<int32_t>> tokens, bool all_positions,
                        std::vector<float>* logits) = 0;

  // Append for greedy decoding: instead of the logits, each sequence's next token, the argmax
  // of its last row's logits over the real vocabulary (the lowest id on a tie). The default
  // takes Append's logits; the CUDA backend computes it on the GPU (only the ids travel).
  virtual Status AppendGreedy(std::span<const int> seqs,
                              std::span<const std::vector<int32_t>> tokens,
                              std::vector<int32_t>* next);

  // Append for evaluation: for every appended token (sequence by sequence, as all_positions
  // orders them) the loss of predicting targets[k][i] from it, -log softmax over the padded
  // vocabulary (the padding columns take part, as in training). The default takes Append's
  // logits; the CUDA backend computes the losses on the GPU.
  virtual Status AppendLosses(std::span<const int> seqs,
                              std::span<const std::vector<int32_t>> tokens,
                              std::span<const std::vector<int32_t>> targets,
                              std::vector<float>* losses);

  // Tokens sequence `seq` holds.
  virtual int length(int seq) const = 0;
};

// The rows one Append adds: the appended tokens, sequence by sequence, each row's token id,
// sequence and position, and the index of each sequence's last row.
struct AppendRows {
  std::vector<int32_t> ids, pos, row_seq, last;
};

// Append's request checked against the batch (lengths: each sequence's tokens so far, as many
// as Reset's batch), the reserved max_len and the vocabulary, and laid out as rows.
// Precondition when lengths is empty (no Reset yet). Invalid, naming what is wrong, for: a
// sequence count that differs from the token lists', a sequence out of range or given twice, an
// empty token list, a sequence that would outgrow max_len, a token id outside [0, padded_vocab)
// (the message names `vocab`, the model's own size).
StatusOr<AppendRows> PlanAppend(std::span<const int> seqs,
                                std::span<const std::vector<int32_t>> tokens,
                                std::span<const int> lengths, int max_len, int padded_vocab,
                                int vocab);

// Reset's arguments: Invalid unless batch and max_len are both at least 1.
Status CheckReset(int batch, int max_len);

// AppendLosses' targets: one per token, each below padded_vocab (Invalid otherwise).
Status CheckTargets(std::span<const std::vector<int32_t>> tokens,
                    std::span<const std::vector<int32_t>> targets, int padded_vocab);

std::unique_ptr<DecodeBackend> MakeCpuDecodeBackend(const ModelConfig& m, UnitBuffers params);

// Unavailable without a CUDA device or in a build without CUDA.
StatusOr<std::unique_ptr<DecodeBackend>> MakeCudaDecodeBackend(const ModelConfig& m,
                                                               const UnitBuffers& params);

// The backend `kind` names; kAuto: CUDA when a device is visible (as training chooses), else
// the CPU.
StatusOr<std::unique_ptr<DecodeBackend>> MakeDecodeBackend(Backend kind, const ModelConfig& m,
                                                           UnitBuffers params);

}  // namespace forge
