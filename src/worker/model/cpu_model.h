// The float32 CPU reference model: forward and backward of the whole decoder over per-unit
// flat parameter buffers. Clear rather than fast (OpenBLAS GEMMs, OpenMP-free threads where
// they pay); it is the oracle the CUDA backend is tested against.
#pragma once

#include <cstdint>
#include <memory>

#include "common/config.h"
#include "worker/model/param_layout.h"
#include "worker/model/unit_buffers.h"

namespace forge {

class CpuModel {
 public:
  // Activations are sized for micro-batches of up to max_batch sequences of m.seq_len tokens.
  CpuModel(const ModelConfig& m, int max_batch);
  ~CpuModel();

  const ParamLayout& layout() const;

  // Forward over inputs/targets [B, T] (T = seq_len, B <= max_batch); returns the mean loss
  // over the B*T tokens and keeps the activations for Backward.
  float Forward(const UnitBuffers& params, const int32_t* inputs, const int32_t* targets, int B);

  // The same forward without a loss: logits [B, T, padded_vocab] of every position (T =
  // seq_len), for evaluation and as the reference the generation backends are tested against.
  // Leaves nothing for Backward.
  void ForwardLogits(const UnitBuffers& params, const int32_t* inputs, int B, float* logits);

  // Backward of the last Forward: grads += d(dloss * mean_loss)/d(params). Accumulating lets
  // gradient accumulation sum micro-steps; pass dloss = 1/accum_steps.
  void Backward(const UnitBuffers& params, float dloss, UnitBuffers* grads);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace forge
