// The model as one safetensors file (https://huggingface.co/docs/safetensors): 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {string: string}} padded with spaces to a multiple of 8, then the tensor bytes in layout
// order.
//
// Tensor names (GPT-2 style; shapes are PyTorch nn.Linear [out, in], not HF GPT-2's transposed
// Conv1D [in, out]):
//   wte                    -> transformer.wte.weight            [padded_vocab, d] (the LM head
//                                                                when tied; rows >= vocab are
//                                                                padding)
//   lm_head                -> lm_head.weight                    [padded_vocab, d] (untied only)
//   blocks.i.attn_norm     -> transformer.h.i.ln_1.weight        [d]           (RMSNorm gain)
//   blocks.i.attn.q_norm   -> transformer.h.i.attn.q_norm.weight [head_dim]    (qk_norm only)
//   blocks.i.attn.k_norm   -> transformer.h.i.attn.k_norm.weight [head_dim]    (qk_norm only)
//   blocks.i.attn.wqkv     -> transformer.h.i.attn.c_attn.weight [(H+2KV)*hd, d] rows: all Q
//                                                                heads, then K, then V
//   blocks.i.attn.wo       -> transformer.h.i.attn.c_proj.weight [d, H*hd]
//   blocks.i.mlp_norm      -> transformer.h.i.ln_2.weight        [d]
//   blocks.i.mlp.w_gate_up -> transformer.h.i.mlp.c_fc.weight    [2*ffn, d] rows: gate, then up
//   blocks.i.mlp.w_down    -> transformer.h.i.mlp.c_proj.weight  [d, ffn]
//   final_norm             -> transformer.ln_f.weight            [d]
// Writes are atomic (temp + fsync + rename).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/file_io.h"
#include "common/status.h"
#include "worker/model/param_layout.h"
#include "worker/model/unit_buffers.h"

namespace forge {

enum class SafetensorsDtype { kF32, kBF16, kI32 };

struct ExportOptions {
  SafetensorsDtype dtype = SafetensorsDtype::kF32;  // BF16: round to nearest even
  std::map<std::string, std::string> metadata;      // "__metadata__"
};

// The GPT-2-style name of a Forge tensor name (table above); InvalidArgument for others.
StatusOr<std::string> SafetensorsTensorName(const std::string& forge_name);

// __metadata__ for a run: format=pt, forge_config (the YAML), vocab, padded_vocab,
// tied_embeddings, n_layer, d_model, n_head, n_kv_head, head_dim, ffn, seq_len, rope_theta,
// rope_scaling (none | llama3; its numbers are in forge_config), norm_eps, qk_norm.
std::map<std::string, std::string> ExportMetadata(const RunConfig& cfg);

// `params`: the full FP32 master weights, one buffer per unit of `layout`.
Status ExportSafetensors(const UnitBuffers& params, const ParamLayout& layout,
                         const std::string& path, const ExportOptions& opt);

// Loads a checkpoint's master weights (LoadFullCheckpoint, verified) and exports them, with
// ExportMetadata of the checkpoint's own config.
Status ExportCheckpointSafetensors(const std::string& checkpoint_path, const std::string& path,
                                   SafetensorsDtype dtype);

// One tensor of a file being written: float tensors come from `fill` (numel floats, converted to
// the tensor's dtype: BF16 rounds to nearest even), I32 tensors from `ints`.
struct SafetensorsOut {
  std::string name;
  std::vector<int64_t> shape;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::function<void(float* out)> fill;
  std::vector<int32_t> ints;
};

// The header's tensor table and data bytes of `tensors` (data in the given order, header keys
// sorted), written atomically (temp + fsync + rename). Tensors are filled one at a time, so
// memory stays at one tensor whatever the file's size.
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsOut>& tensors,
                        const std::map<std::string, std::string>& metadata);
// Bytes a tensor of `numel` elements takes in the file.
uint64_t SafetensorsBytes(SafetensorsDtype dtype, int64_t numel);

// A memory-mapped file, for reading large checkpoints without copying them: the header is
// checked as ReadSafetensors checks it, the data is read in place.
class SafetensorsMap {
 public:
  struct Entry {
    std::string dtype;  // "F32", "BF16", "F16", "I32", ...
    std::vector<int64_t> shape;
    const uint8_t* data = nullptr;
    uint64_t bytes = 0;
    int64_t numel() const;
  };
  static StatusOr<SafetensorsMap> Open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::map<std::string, Entry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The values of an F32, BF16 or F16 tensor as floats (exact: each widens to float);
  // `out` holds numel() floats. Another dtype is an InvalidArgument naming the tensor.
  Status ToFloat(const std::string& name, float* out) const;

 private:
  MappedFile file_;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A small reader (tests, tooling): every tensor's raw little-endian bytes.
struct SafetensorsTensor {
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::string bytes;
};
struct SafetensorsFile {
  std::map<std::string, SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
};
StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

uint16_t FloatToBf16(float x);
float Bf16ToFloat(uint16_t x);
float F16ToFloat(uint16_t x);

}  // namespace forge
