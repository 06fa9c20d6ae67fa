// `forge import HF_DIR` and `model.init_from: HF_DIR`: a Hugging Face Llama directory
// (config.json + model.safetensors, or model.safetensors.index.json and its shards) as Forge
// parameters, by the inverse of the export mapping (llama_weights.h). F32, BF16 and F16
// tensors are read exactly (each widens to float); the padding rows of Forge's vocabulary are
// zero. So exporting an imported directory in its own dtype gives it back bit for bit.
//
// Checked, each error naming the file and the field or tensor: config.json as
// ParseLlamaConfigJson checks it and what ModelFromLlamaConfig refuses; every tensor the model
// needs present with its shape and a float dtype; no tensor the model has no place for (a bias,
// a tensor of another architecture). Tolerated: a tied model's lm_head.weight when it equals the
// embedding, and rotary inv_freq buffers (derived, not weights).
#pragma once

#include <string>

#include "common/config.h"
#include "common/status.h"
#include "worker/hf/llama_config.h"
#include "worker/model/unit_buffers.h"

namespace forge::hf {

struct HfModel {
  std::string dir;
  LlamaConfig llama;
  ModelConfig model;   // seq_len = max_position_embeddings
  UnitBuffers params;  // MakeParamLayout(model)
};

StatusOr<HfModel> ReadHfModel(const std::string& dir);

// Whether `dir` looks like a Hugging Face model directory (holds config.json, and is not a
// Forge checkpoint).
bool IsHfModelDir(const std::string& dir);

// The weights of `dir` for a run whose model is `m` (model.init_from): every dimension of the
// directory's config must equal m's (seq_len aside: positions are not weights); the first that
// differs is an InvalidArgument naming both.
StatusOr<UnitBuffers> LoadHfWeightsFor(const ModelConfig& m, const std::string& dir);

// Writes `model` as a Forge checkpoint <cfg's checkpoint root>/step_0 (master weights, zero
// AdamW moments, step 0, data cursor 0) for cfg, whose model must be model.model's, and copies
// the directory's tokenizer.json / tokenizer_config.json to <run_dir>/tokenizer/ where it has
// them. Returns the step directory.
StatusOr<std::string> WriteImportedCheckpoint(const HfModel& model, const RunConfig& cfg);

}  // namespace forge::hf
