#include "worker/hf/hf_export.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "worker/hf/hf_tokenizer_files.h"
#include "worker/hf/llama_weights.h"

namespace forge::hf {
namespace {

namespace fs = std::filesystem;

std::string ShardName(size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return buf;
}

// Moves the finished `tmp` directory to `dst`, replacing an earlier export there.
Status Install(const std::string& tmp, const std::string& dst) {
  std::error_code ec;
  if (fs::exists(dst, ec)) {
    const bool empty = fs::is_directory(dst, ec) && fs::is_empty(dst, ec);
    if (!empty && !fs::exists(fs::path(dst) / "config.json", ec))
      return Status::Precondition(dst + " exists and is not an earlier export (no config.json); "
                                        "choose another output directory");
    const std::string old = dst + ".old-" + std::to_string(::getpid());
    fs::rename(dst, old, ec);
    if (ec) return Status::IoError("cannot move " + dst + " aside: " + ec.message());
    fs::rename(tmp, dst, ec);
    if (ec) return Status::IoError("cannot rename " + tmp + " to " + dst + ": " + ec.message());
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp, dst, ec);
    if (ec) return Status::IoError("cannot rename " + tmp + " to " + dst + ": " + ec.message());
  }
  return SyncDirectory(fs::path(dst).parent_path().string().empty()
                           ? "."
                           : fs::path(dst).parent_path().string());
}

}  // namespace

StatusOr<HfExportSummary> ExportHfDirectory(const ModelConfig& m, const UnitBuffers& params,
                                            const std::string& out_dir,
                                            const HfExportOptions& opt) {
  if (opt.dtype == SafetensorsDtype::kI32) return Status::Invalid("export dtype must be f32 or bf16");
  FORGE_ASSIGN_OR_RETURN(LlamaWeightMap map, LlamaWeightMap::Make(m));
  const ParamLayout& layout = map.layout();
  if (params.size() != layout.units.size())
    return Status::Invalid("export: " + std::to_string(params.size()) + " parameter units for " +
                           std::to_string(layout.units.size()));
  for (size_t u = 0; u < params.size(); ++u)
    if (int64_t(params[u].size()) != layout.units[u].numel)
      return Status::Invalid("export: unit " + layout.units[u].name + " holds " +
                             std::to_string(params[u].size()) + " floats, expected " +
                             std::to_string(layout.units[u].numel));

  const std::string dst = fs::path(out_dir).lexically_normal().string();
  const std::string tmp = dst + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return Status::IoError("cannot create " + tmp + ": " + ec.message());
  auto fail = [&](const Status& s) {
    fs::remove_all(tmp, ec);
    return s;
  };

  HfExportSummary sum;
  LlamaConfig cfg = map.config();
  cfg.dtype = opt.dtype == SafetensorsDtype::kBF16 ? "bfloat16" : "float32";
  if (!opt.tokenizer.empty()) {
    auto ids = WriteHfTokenizerFiles(opt.tokenizer, opt.data_dir, m.vocab, m.seq_len, tmp);
    if (!ids.ok()) return fail(ids.status().Annotate("tokenizer"));
    cfg.bos_token_id = ids->bos;
    cfg.eos_token_ids = ids->eos;
    sum.files.push_back("tokenizer.json");
    sum.files.push_back("tokenizer_config.json");
  }

  // Tensors into shards: in order, a new shard when the next tensor would overflow this one.
  const auto& tensors = map.tensors();
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    int64_t numel = 1;
    for (int64_t d : tensors[i].shape) numel *= d;
    const uint64_t bytes = SafetensorsBytes(opt.dtype, numel);
    if (!shards.back().empty() && in_shard + bytes > opt.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    sum.tensor_bytes += bytes;
    sum.params += numel;
  }
  sum.tensors = int64_t(tensors.size());

  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = shards.size() == 1 ? "model.safetensors" : ShardName(k, shards.size());
    std::vector<SafetensorsOut> out;
    for (size_t i : shards[k]) {
      out.push_back({tensors[i].name, tensors[i].shape, opt.dtype,
                     [&map, &params, i](float* dst) { map.Gather(params, i, dst); }, {}});
      weight_map[tensors[i].name] = name;
    }
    Status s = WriteSafetensors(tmp + "/" + name, out, {{"format", "pt"}});
    if (!s.ok()) return fail(s);
    sum.files.push_back(name);
  }
  if (shards.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", sum.tensor_bytes}}},
                            {"weight_map", weight_map}};
    Status s = WriteFileAtomic(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
    if (!s.ok()) return fail(s);
    sum.files.push_back("model.safetensors.index.json");
  }
  Status s = WriteFileAtomic(tmp + "/config.json", LlamaConfigJson(cfg));
  if (s.ok()) s = WriteFileAtomic(tmp + "/generation_config.json", GenerationConfigJson(cfg));
  if (s.ok()) s = SyncDirectory(tmp);
  if (s.ok()) s = Install(tmp, dst);
  if (!s.ok()) return fail(s);
  sum.files.insert(sum.files.begin(), {"config.json", "generation_config.json"});
  return sum;
}

}  // namespace forge::hf
