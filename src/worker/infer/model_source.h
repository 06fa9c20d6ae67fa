// Where `forge generate`, `forge eval` and `forge export` get a model: a Forge checkpoint
// (a step directory or its manifest.json, or "latest" / "step_N" under <run_dir>/checkpoints)
// or a Hugging Face Llama directory (hf/hf_import.h), and the tokenizer that goes with it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/hf/hf_export.h"
#include "worker/model/unit_buffers.h"

namespace forge {

struct LoadedModel {
  ModelConfig model;
  UnitBuffers params;              // MakeParamLayout(model), full FP32
  std::string source;              // the step directory or the HF directory
  bool from_hf = false;
  int64_t step = -1;               // a Forge checkpoint's step
  std::optional<RunConfig> run;    // a Forge checkpoint's config
  // The tokenizer found for it ("" when none): for an HF directory the directory itself when
  // it holds tokenizer.json; for a checkpoint <run_dir>/tokenizer/ (written by `forge import`)
  // when present, else the tokenizer its (first) dataset's manifest names ("gpt2" for GPT-2
  // datasets; the sources of a mixture share one tokenizer).
  std::string tokenizer;
  std::vector<std::string> warnings;  // damaged checkpoints skipped by "latest"
};

// The step directory `spec` names: a path, or latest / step_N under run_dir/checkpoints.
StatusOr<std::string> ResolveCheckpointSpec(const std::string& spec, const std::string& run_dir,
                                            std::vector<std::string>* warnings);

StatusOr<LoadedModel> LoadModel(const std::string& spec, const std::string& run_dir);

// `forge export --format hf` of `spec` (LoadModel's forms) into out_dir, with the tokenizer
// `tokenizer` or, when "", the one found with the model (none found: an error).
StatusOr<hf::HfExportSummary> ExportModelHf(const std::string& spec, const std::string& out_dir,
                                            SafetensorsDtype dtype, const std::string& tokenizer,
                                            const std::string& run_dir = "");

// The tokenizer spec a prepared dataset names (what `forge data prepare --tokenizer` was given;
// "gpt2" for version 1 datasets), "" when the dataset cannot be read.
std::string DatasetTokenizerSpec(const std::string& dataset_dir);

}  // namespace forge
