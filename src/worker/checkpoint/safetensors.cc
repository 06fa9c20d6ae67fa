#include "worker/checkpoint/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "worker/checkpoint/checkpoint_loader.h"

namespace forge {
namespace {

using json = nlohmann::json;
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

// Splits "blocks.<i>.<rest>" into i and rest.
bool SplitBlock(const std::string& name, std::string* index, std::string* rest) {
  if (name.rfind("blocks.", 0) != 0) return false;
  const size_t dot = name.find('.', 7);
  if (dot == std::string::npos || dot == 7) return false;
  *index = name.substr(7, dot - 7);
  *rest = name.substr(dot + 1);
  return std::all_of(index->begin(), index->end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string FloatText(float x) {
  std::ostringstream s;
  s.precision(9);
  s << x;
  return s.str();
}

}  // namespace

uint16_t FloatToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

StatusOr<std::string> SafetensorsTensorName(const std::string& n) {
  if (n == "wte") return std::string("transformer.wte.weight");
  if (n == "final_norm") return std::string("transformer.ln_f.weight");
  static const std::map<std::string, std::string> kBlock = {
      {"attn_norm", "ln_1"},           {"attn.q_norm", "attn.q_norm"},
      {"attn.k_norm", "attn.k_norm"},  {"attn.wqkv", "attn.c_attn"},
      {"attn.wo", "attn.c_proj"},      {"mlp_norm", "ln_2"},
      {"mlp.w_gate_up", "mlp.c_fc"},   {"mlp.w_down", "mlp.c_proj"}};
  std::string index, rest;
  if (SplitBlock(n, &index, &rest)) {
    const auto it = kBlock.find(rest);
    if (it != kBlock.end()) return "transformer.h." + index + "." + it->second + ".weight";
  }
  return Status::Invalid("no safetensors name for tensor \"" + n + "\"");
}

std::map<std::string, std::string> ExportMetadata(const RunConfig& cfg) {
  const ModelConfig& m = cfg.model;
  return {{"format", "pt"},
          {"forge_config", RunConfigToYaml(cfg)},
          {"vocab", std::to_string(m.vocab)},
          {"padded_vocab", std::to_string(m.padded_vocab())},
          {"tied_embeddings", "true"},
          {"n_layer", std::to_string(m.n_layer)},
          {"d_model", std::to_string(m.d_model)},
          {"n_head", std::to_string(m.n_head)},
          {"n_kv_head", std::to_string(m.n_kv_head)},
          {"ffn", std::to_string(m.ffn)},
          {"seq_len", std::to_string(m.seq_len)},
          {"rope_theta", FloatText(m.rope_theta)},
          {"norm_eps", FloatText(m.norm_eps)},
          {"qk_norm", m.qk_norm ? "true" : "false"}};
}

Status ExportSafetensors(const UnitBuffers& params, const ParamLayout& layout,
                         const std::string& path, const ExportOptions& opt) {
  if (params.size() != layout.units.size()) {
    return Status::Invalid(path + ": " + std::to_string(params.size()) + " buffers for " +
                           std::to_string(layout.units.size()) + " units");
  }
  const bool bf16 = opt.dtype == SafetensorsDtype::kBF16;
  const size_t width = bf16 ? 2 : 4;
  json header = json::object();
  uint64_t offset = 0;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    if (static_cast<int64_t>(params[u].size()) != layout.units[u].numel) {
      return Status::Invalid(path + ": unit " + layout.units[u].name + " buffer holds " +
                             std::to_string(params[u].size()) + " floats, expected " +
                             std::to_string(layout.units[u].numel));
    }
    for (const TensorSlot& t : layout.units[u].tensors) {
      FORGE_ASSIGN_OR_RETURN(std::string name, SafetensorsTensorName(t.name));
      const uint64_t bytes = width * static_cast<uint64_t>(t.numel);
      header[name] = {{"dtype", bf16 ? "BF16" : "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
  }
  if (!opt.metadata.empty()) header["__metadata__"] = opt.metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  const uint64_t n = text.size();
  std::memcpy(len, &n, 8);

  const std::string tmp = path + ".tmp";
  auto w = FileWriter::Create(tmp);
  if (!w.ok()) return w.status();
  Status st = w->Write(len, 8);
  if (st.ok()) st = w->Write(text.data(), text.size());
  std::vector<uint16_t> chunk;
  for (size_t u = 0; st.ok() && u < layout.units.size(); ++u) {
    for (const TensorSlot& t : layout.units[u].tensors) {
      const float* src = params[u].data() + t.offset;
      if (!bf16) {
        st = w->Write(src, 4 * static_cast<size_t>(t.numel));
      } else {
        constexpr int64_t kChunk = 1 << 20;
        for (int64_t i = 0; st.ok() && i < t.numel; i += kChunk) {
          const int64_t k = std::min(kChunk, t.numel - i);
          chunk.resize(static_cast<size_t>(k));
          for (int64_t j = 0; j < k; ++j) chunk[j] = FloatToBf16(src[i + j]);
          st = w->Write(chunk.data(), 2 * static_cast<size_t>(k));
        }
      }
      if (!st.ok()) break;
    }
  }
  if (st.ok()) st = w->Close();
  if (st.ok()) st = CommitRename(tmp, path);
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

Status ExportCheckpointSafetensors(const std::string& checkpoint_path, const std::string& path,
                                   SafetensorsDtype dtype) {
  FORGE_ASSIGN_OR_RETURN(FullCheckpoint ck, LoadFullCheckpoint(checkpoint_path));
  ParamLayout layout;
  layout.units = ck.manifest.units;
  ExportOptions opt;
  opt.dtype = dtype;
  auto cfg = ParseRunConfig(ck.manifest.config_yaml, ck.dir + "/manifest.json:config_yaml");
  if (cfg.ok()) {
    opt.metadata = ExportMetadata(*cfg);
  } else {
    opt.metadata = {{"format", "pt"}};
  }
  opt.metadata["forge_checkpoint_step"] = std::to_string(ck.manifest.step);
  return ExportSafetensors(ck.master, layout, path, opt);
}

StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  FORGE_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(path));
  if (f.size() < 8) return Status::DataLoss(path + ": shorter than the header length");
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  if (n > f.size() - 8) return Status::DataLoss(path + ": header length past the end");
  const uint8_t* data = f.data() + 8 + n;
  const uint64_t data_size = f.size() - 8 - n;
  SafetensorsFile out;
  try {
    const json h = json::parse(f.data() + 8, f.data() + 8 + n);
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const auto& [name, v] : h.items()) {
      if (name == "__metadata__") {
        out.metadata = v.get<std::map<std::string, std::string>>();
        continue;
      }
      SafetensorsTensor t;
      t.dtype = v.at("dtype").get<std::string>();
      t.shape = v.at("shape").get<std::vector<int64_t>>();
      const auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
      if (off.size() != 2 || off[0] > off[1] || off[1] > data_size) {
        return Status::DataLoss(path + ": tensor " + name + ": bad data_offsets");
      }
      spans.emplace_back(off[0], off[1]);
      t.bytes.assign(reinterpret_cast<const char*>(data + off[0]), off[1] - off[0]);
      out.tensors[name] = std::move(t);
    }
    // Safetensors requires the tensors to tile the data section exactly.
    std::sort(spans.begin(), spans.end());
    uint64_t next = 0;
    for (const auto& [b, e] : spans) {
      if (b != next) return Status::DataLoss(path + ": tensor data has a gap or overlap");
      next = e;
    }
    if (next != data_size) return Status::DataLoss(path + ": trailing bytes after the tensors");
  } catch (const json::exception& e) {
    return Status::DataLoss(path + ": bad header: " + e.what());
  }
  return out;
}

}  // namespace forge
