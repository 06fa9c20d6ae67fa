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
// Implementations: the CPU one (cpu_decode_backend.h, float32, the reference); a CUDA one
// plugs in behind the same calls (MakeDecodeBackend says "not yet" for now).
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

  // Forgets every sequence; makes room for `batch` sequences of up to max_len tokens each.
  virtual Status Reset(int batch, int max_len) = 0;

  // Appends tokens[k] (at least one) to sequence seqs[k], for every k (each sequence at most
  // once per call). Writes to *logits, resized here, the logits of each sequence's last
  // appended token in order ([seqs.size(), padded_vocab]), or with all_positions those of every
  // appended token, sequence by sequence ([sum of sizes, padded_vocab]).
  virtual Status Append(std::span<const int> seqs,
                        std::span<const std::vector<int32_t>> tokens, bool all_positions,
                        std::vector<float>* logits) = 0;

  // Tokens sequence `seq` holds.
  virtual int length(int seq) const = 0;
};

std::unique_ptr<DecodeBackend> MakeCpuDecodeBackend(const ModelConfig& m, UnitBuffers params);

// The backend `kind` names (kAuto: CPU until a GPU one exists). CUDA: FailedPrecondition, not
// implemented yet.
StatusOr<std::unique_ptr<DecodeBackend>> MakeDecodeBackend(Backend kind, const ModelConfig& m,
                                                           UnitBuffers params);

}  // namespace forge
