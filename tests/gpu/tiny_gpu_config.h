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

// Llama 3's architecture knobs on the tiny model: heads of 64 (width 256 over d 128, so
// head_dim != d / n_head), GQA n_head : n_kv_head, an untied LM head, QK-norm, rope_theta
// 500000 and Llama 3.1's RoPE frequency scaling (original context 16, below T, so it acts).
inline void SetLlamaKnobs(ModelConfig* m, int n_kv_head) {
  m->explicit_head_dim = 64;
  m->n_kv_head = n_kv_head;
  m->tie_embeddings = false;
  m->qk_norm = true;
  m->rope_theta = 500000.0f;
  m->rope_scaling.type = RopeScalingType::kLlama3;
  m->rope_scaling.factor = 8.0f;
  m->rope_scaling.original_max_position_embeddings = 16;
}

}  // namespace forge::test
