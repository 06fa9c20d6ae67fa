// `forge export --format hf`: a directory that transformers' AutoModelForCausalLM.from_pretrained
// loads as LlamaForCausalLM without custom code:
//
//   config.json                  LlamaConfigJson (llama_config.h)
//   generation_config.json       bos/eos ids, greedy
//   model.safetensors            every tensor (llama_weights.h names), F32 or BF16, or when they
//                                exceed max_shard_bytes: model-0000k-of-0000n.safetensors
//                                shards (tensors in order, a new shard when the next tensor
//                                would not fit) and model.safetensors.index.json
//                                {"metadata": {"total_size"}, "weight_map": {tensor: file}}
//   tokenizer.json               the run's tokenizer (hf_tokenizer_files.h), unless none is given
//   tokenizer_config.json
//
// The directory is written beside its destination and renamed into place, so a reader sees a
// whole export or none. A destination that exists must be an earlier export (it holds
// config.json) or empty; it is replaced.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model/unit_buffers.h"

namespace forge::hf {

inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;  // transformers' "5GB"

struct HfExportOptions {
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  std::string tokenizer;  // a tokenizer spec (hf_tokenizer_files.h); "" writes none
  std::string data_dir;   // where "gpt2" finds its files
};

struct HfExportSummary {
  std::vector<std::string> files;  // written, relative to the directory
  int64_t tensors = 0;
  int64_t params = 0;              // exported elements (padding rows excluded)
  uint64_t tensor_bytes = 0;
};

StatusOr<HfExportSummary> ExportHfDirectory(const ModelConfig& m, const UnitBuffers& params,
                                            const std::string& out_dir,
                                            const HfExportOptions& opt);

}  // namespace forge::hf
