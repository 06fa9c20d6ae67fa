// The tiny BF16 model the CUDA backend tests train: 2 layers, d 128, 4 heads of 32, ffn 256,
// vocab 500 (padded to 512: the padded rows take part in the softmax), T 64, B 4, AdamW with
// weight decay and an active grad clip. Tests add their own schedule, eval and checkpoints.
#pragma once

#include <string>

#include "common/config.h"

namespace forge::test {

inline RunConfig TinyGpuConfig(const std::string& name) {
  RunConfig c;
  c.name = name;
  c.seed = 7;
  c.model.preset = "";
  c.model.n_layer = 2;
  c.model.d_model = 128;
  c.model.n_head = 4;
  c.model.n_kv_head = 4;
  c.model.ffn = 256;
  c.model.vocab = 500;
  c.model.seq_len = 64;
  c.batch.micro_batch = 4;
  c.batch.global_batch = 4;
  c.optimizer.lr = 2e-3f;
  c.optimizer.weight_decay = 0.1f;
  c.optimizer.grad_clip = 1.0f;
  c.precision.compute = Precision::kBf16;
  return c;
}

}  // namespace forge::test
