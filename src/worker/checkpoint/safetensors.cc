#include "worker/checkpoint/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
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
  if (n == "lm_head") return std::string("lm_head.weight");
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
          {"tied_embeddings", m.tie_embeddings ? "true" : "false"},
          {"n_layer", std::to_string(m.n_layer)},
          {"d_model", std::to_string(m.d_model)},
          {"n_head", std::to_string(m.n_head)},
          {"n_kv_head", std::to_string(m.n_kv_head)},
          {"head_dim", std::to_string(m.head_dim())},
          {"ffn", std::to_string(m.ffn)},
          {"seq_len", std::to_string(m.seq_len)},
          {"rope_theta", FloatText(m.rope_theta)},
          {"rope_scaling", RopeScalingTypeName(m.rope_scaling.type)},
          {"norm_eps", FloatText(m.norm_eps)},
          {"qk_norm", m.qk_norm ? "true" : "false"}};
}

uint64_t SafetensorsBytes(SafetensorsDtype dtype, int64_t numel) {
  return (dtype == SafetensorsDtype::kBF16 ? 2 : 4) * static_cast<uint64_t>(numel);
}

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsOut>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (const SafetensorsOut& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (t.dtype == SafetensorsDtype::kI32 ? int64_t(t.ints.size()) != numel : !t.fill)
      return Status::Invalid(path + ": tensor " + t.name + " has no data of its shape");
    if (header.contains(t.name)) return Status::Invalid(path + ": tensor " + t.name + " twice");
    const uint64_t bytes = SafetensorsBytes(t.dtype, numel);
    const char* dtype = t.dtype == SafetensorsDtype::kBF16  ? "BF16"
                        : t.dtype == SafetensorsDtype::kI32 ? "I32"
                                                            : "F32";
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
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
  std::vector<float> values;
  std::vector<uint16_t> halves;
  for (const SafetensorsOut& t : tensors) {
    if (!st.ok()) break;
    if (t.dtype == SafetensorsDtype::kI32) {
      st = w->Write(t.ints.data(), 4 * t.ints.size());
      continue;
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    values.assign(static_cast<size_t>(numel), 0.0f);
    t.fill(values.data());
    if (t.dtype == SafetensorsDtype::kF32) {
      st = w->Write(values.data(), 4 * values.size());
    } else {
      halves.resize(values.size());
      for (size_t i = 0; i < values.size(); ++i) halves[i] = FloatToBf16(values[i]);
      st = w->Write(halves.data(), 2 * halves.size());
    }
  }
  if (st.ok()) st = w->Close();
  if (st.ok()) st = CommitRename(tmp, path);
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

Status ExportSafetensors(const UnitBuffers& params, const ParamLayout& layout,
                         const std::string& path, const ExportOptions& opt) {
  if (params.size() != layout.units.size()) {
    return Status::Invalid(path + ": " + std::to_string(params.size()) + " buffers for " +
                           std::to_string(layout.units.size()) + " units");
  }
  std::vector<SafetensorsOut> out;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    if (static_cast<int64_t>(params[u].size()) != layout.units[u].numel) {
      return Status::Invalid(path + ": unit " + layout.units[u].name + " buffer holds " +
                             std::to_string(params[u].size()) + " floats, expected " +
                             std::to_string(layout.units[u].numel));
    }
    for (const TensorSlot& t : layout.units[u].tensors) {
      FORGE_ASSIGN_OR_RETURN(std::string name, SafetensorsTensorName(t.name));
      const float* src = params[u].data() + t.offset;
      const int64_t numel = t.numel;
      out.push_back({name, t.shape, opt.dtype,
                     [src, numel](float* dst) { std::copy(src, src + numel, dst); }, {}});
    }
  }
  return WriteSafetensors(path, out, opt.metadata);
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

namespace {

struct HeaderEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// Parses and checks the header of a file mapped at [data, data + size): the tensors' byte
// ranges must tile the data section exactly.
Status ParseHeader(const uint8_t* data, size_t size, const std::string& path,
                   std::vector<HeaderEntry>* entries, std::map<std::string, std::string>* meta,
                   uint64_t* data_start) {
  if (size < 8) return Status::DataLoss(path + ": shorter than the header length");
  uint64_t n = 0;
  std::memcpy(&n, data, 8);
  if (n > size - 8) return Status::DataLoss(path + ": header length past the end");
  *data_start = 8 + n;
  const uint64_t data_size = size - 8 - n;
  try {
    const json h = json::parse(data + 8, data + 8 + n);
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const auto& [name, v] : h.items()) {
      if (name == "__metadata__") {
        *meta = v.get<std::map<std::string, std::string>>();
        continue;
      }
      HeaderEntry e;
      e.name = name;
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = v.at("shape").get<std::vector<int64_t>>();
      const auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
      if (off.size() != 2 || off[0] > off[1] || off[1] > data_size) {
        return Status::DataLoss(path + ": tensor " + name + ": bad data_offsets");
      }
      e.begin = off[0];
      e.end = off[1];
      spans.emplace_back(off[0], off[1]);
      entries->push_back(std::move(e));
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
  return Status::Ok();
}

int DtypeWidth(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

}  // namespace

float Bf16ToFloat(uint16_t x) {
  const uint32_t bits = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float F16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);  // zero and subnormals
    if (sign) f = -f;
    return f;
  }
  uint32_t bits;
  if (exp == 31) bits = sign | 0x7f800000u | (mant << 13);  // Inf, NaN
  else bits = sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13);
  std::memcpy(&f, &bits, 4);
  return f;
}

int64_t SafetensorsMap::Entry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StatusOr<SafetensorsMap> SafetensorsMap::Open(const std::string& path) {
  SafetensorsMap m;
  FORGE_ASSIGN_OR_RETURN(m.file_, MappedFile::Open(path, MapAdvice::kNormal));
  std::vector<HeaderEntry> entries;
  uint64_t start = 0;
  FORGE_RETURN_IF_ERROR(
      ParseHeader(m.file_.data(), m.file_.size(), path, &entries, &m.metadata_, &start));
  for (HeaderEntry& e : entries) {
    Entry t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.data = m.file_.data() + start + e.begin;
    t.bytes = e.end - e.begin;
    const int width = DtypeWidth(t.dtype);
    if (width == 0) return Status::DataLoss(path + ": tensor " + e.name + ": unknown dtype " + t.dtype);
    for (int64_t d : t.shape)
      if (d < 0) return Status::DataLoss(path + ": tensor " + e.name + ": negative dimension");
    if (uint64_t(t.numel()) * uint64_t(width) != t.bytes)
      return Status::DataLoss(path + ": tensor " + e.name + ": " + std::to_string(t.bytes) +
                              " bytes do not hold its shape of " + t.dtype);
    m.tensors_[e.name] = std::move(t);
  }
  return m;
}

Status SafetensorsMap::ToFloat(const std::string& name, float* out) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) return Status::NotFound(path() + ": no tensor " + name);
  const Entry& e = it->second;
  const int64_t n = e.numel();
  if (e.dtype == "F32") {
    std::memcpy(out, e.data, 4 * size_t(n));
  } else if (e.dtype == "BF16" || e.dtype == "F16") {
    const bool bf = e.dtype == "BF16";
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, e.data + 2 * i, 2);
      out[i] = bf ? Bf16ToFloat(h) : F16ToFloat(h);
    }
  } else {
    return Status::Invalid(path() + ": tensor " + name + " is " + e.dtype +
                           ": expected F32, BF16 or F16");
  }
  return Status::Ok();
}

StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  FORGE_ASSIGN_OR_RETURN(MappedFile f, MappedFile::Open(path));
  SafetensorsFile out;
  std::vector<HeaderEntry> entries;
  uint64_t start = 0;
  FORGE_RETURN_IF_ERROR(ParseHeader(f.data(), f.size(), path, &entries, &out.metadata, &start));
  for (HeaderEntry& e : entries) {
    SafetensorsTensor t;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.bytes.assign(reinterpret_cast<const char*>(f.data() + start + e.begin), e.end - e.begin);
    out.tensors[e.name] = std::move(t);
  }
  return out;
}

}  // namespace forge
