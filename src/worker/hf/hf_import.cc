#include "worker/hf/hf_import.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/hf/llama_weights.h"

namespace forge::hf {
namespace {

namespace fs = std::filesystem;

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Every tensor of the directory, by name, in its mapped file.
struct TensorFiles {
  std::vector<std::unique_ptr<SafetensorsMap>> files;
  std::map<std::string, const SafetensorsMap*> where;
};

StatusOr<TensorFiles> OpenTensors(const std::string& dir) {
  TensorFiles t;
  std::error_code ec;
  std::vector<std::string> names;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path));
    std::set<std::string> files;
    try {
      const nlohmann::json j = nlohmann::json::parse(text);
      for (const auto& [tensor, file] : j.at("weight_map").items()) files.insert(file.get<std::string>());
    } catch (const nlohmann::json::exception& e) {
      return Status::Invalid(index_path + ": expected {\"weight_map\": {tensor: file}}: " + e.what());
    }
    for (const std::string& f : files) {
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos)
        return Status::Invalid(index_path + ": shard file " + f + " is outside the directory");
      names.push_back(f);
    }
  } else if (fs::exists(dir + "/model.safetensors", ec)) {
    names.push_back("model.safetensors");
  } else {
    return Status::NotFound(dir + ": neither model.safetensors nor model.safetensors.index.json");
  }
  for (const std::string& n : names) {
    FORGE_ASSIGN_OR_RETURN(SafetensorsMap m, SafetensorsMap::Open(dir + "/" + n));
    t.files.push_back(std::make_unique<SafetensorsMap>(std::move(m)));
    for (const auto& [name, e] : t.files.back()->tensors()) {
      if (t.where.count(name))
        return Status::Invalid(dir + ": tensor " + name + " is in two files (" +
                               t.where[name]->path() + ", " + t.files.back()->path() + ")");
      t.where[name] = t.files.back().get();
    }
  }
  return t;
}

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

bool IsHfModelDir(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::exists(fs::path(dir) / "config.json", ec) &&
         !fs::exists(fs::path(dir) / kManifestName, ec);
}

StatusOr<HfModel> ReadHfModel(const std::string& dir) {
  HfModel out;
  out.dir = dir;
  FORGE_ASSIGN_OR_RETURN(out.llama, ReadLlamaConfig(dir));
  FORGE_ASSIGN_OR_RETURN(out.model, ModelFromLlamaConfig(out.llama, dir + "/config.json"));
  FORGE_ASSIGN_OR_RETURN(LlamaWeightMap map, LlamaWeightMap::Make(out.model));
  FORGE_ASSIGN_OR_RETURN(TensorFiles files, OpenTensors(dir));

  const ParamLayout& layout = map.layout();
  out.params.resize(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u)
    out.params[u].assign(size_t(layout.units[u].numel), 0.0f);

  std::set<std::string> used;
  std::vector<float> buf;
  for (size_t i = 0; i < map.tensors().size(); ++i) {
    const HfTensorMap& t = map.tensors()[i];
    const auto it = files.where.find(t.name);
    if (it == files.where.end()) return Status::Invalid(dir + ": tensor " + t.name + " is missing");
    const SafetensorsMap::Entry& e = it->second->tensors().at(t.name);
    if (e.shape != t.shape)
      return Status::Invalid(it->second->path() + ": tensor " + t.name + " has shape " +
                             ShapeText(e.shape) + ", config.json gives " + ShapeText(t.shape));
    buf.resize(size_t(e.numel()));
    FORGE_RETURN_IF_ERROR(it->second->ToFloat(t.name, buf.data()));
    map.Scatter(buf.data(), i, &out.params);
    used.insert(t.name);
  }
  for (const auto& [name, file] : files.where) {
    if (used.count(name) || EndsWith(name, ".rotary_emb.inv_freq")) continue;
    if (name == "lm_head.weight" && out.llama.tie_word_embeddings) {
      // A tied model that stores its head anyway: accepted when it is the embedding.
      const auto& head = file->tensors().at(name);
      const SafetensorsMap* ef = files.where.at("model.embed_tokens.weight");
      const auto& emb = ef->tensors().at("model.embed_tokens.weight");
      if (head.dtype == emb.dtype && head.bytes == emb.bytes &&
          std::memcmp(head.data, emb.data, head.bytes) == 0)
        continue;
      return Status::Invalid(file->path() + ": lm_head.weight differs from "
                             "model.embed_tokens.weight although config.json says "
                             "tie_word_embeddings: true");
    }
    return Status::Invalid(file->path() + ": tensor " + name +
                           " has no place in Forge's Llama model (biases and other "
                           "architectures' tensors are not supported)");
  }
  return out;
}

StatusOr<UnitBuffers> LoadHfWeightsFor(const ModelConfig& m, const std::string& dir) {
  FORGE_ASSIGN_OR_RETURN(LlamaConfig c, ReadLlamaConfig(dir));
  const LlamaConfig want = LlamaConfigFromModel(m);
  auto differ = [&](const char* key, const std::string& forge, const char* field,
                    const std::string& hf) {
    return Status::Invalid(std::string("model.") + key + " is " + forge + " but " + dir +
                           "/config.json has " + field + " " + hf);
  };
  auto num = [](double v) { return nlohmann::json(v).dump(); };
  for (const LlamaDimension& d : kLlamaDimensions) {
    if (c.*d.hf != want.*d.hf)
      return differ(d.forge_name, std::to_string(m.*d.forge), d.hf_name, std::to_string(c.*d.hf));
  }
  if (c.head_dim != want.head_dim)
    return differ("head_dim", std::to_string(want.head_dim), "head_dim", std::to_string(c.head_dim));
  if (ShortestDecimal(float(c.rope_theta)) != want.rope_theta)
    return differ("rope_theta", num(want.rope_theta), "rope_theta", num(c.rope_theta));
  if (ShortestDecimal(float(c.rms_norm_eps)) != want.rms_norm_eps)
    return differ("norm_eps", num(want.rms_norm_eps), "rms_norm_eps", num(c.rms_norm_eps));
  if (c.tie_word_embeddings != want.tie_word_embeddings)
    return differ("tie_embeddings", want.tie_word_embeddings ? "true" : "false",
                  "tie_word_embeddings", c.tie_word_embeddings ? "true" : "false");
  if (c.rope_scaling.has_value() != want.rope_scaling.has_value())
    return differ("rope_scaling", want.rope_scaling ? "llama3" : "none", "rope_scaling",
                  c.rope_scaling ? "llama3" : "null");
  if (c.rope_scaling && want.rope_scaling) {
    const Llama3RopeScaling &have = *c.rope_scaling, &w = *want.rope_scaling;
    auto same = [](double hf, double forge) { return ShortestDecimal(float(hf)) == forge; };
    if (!same(have.factor, w.factor))
      return differ("rope_scaling.factor", num(w.factor), "rope_scaling.factor", num(have.factor));
    if (!same(have.low_freq_factor, w.low_freq_factor))
      return differ("rope_scaling.low_freq_factor", num(w.low_freq_factor),
                    "rope_scaling.low_freq_factor", num(have.low_freq_factor));
    if (!same(have.high_freq_factor, w.high_freq_factor))
      return differ("rope_scaling.high_freq_factor", num(w.high_freq_factor),
                    "rope_scaling.high_freq_factor", num(have.high_freq_factor));
    if (have.original_max_position_embeddings != w.original_max_position_embeddings)
      return differ("rope_scaling.original_max_position_embeddings",
                    std::to_string(w.original_max_position_embeddings),
                    "rope_scaling.original_max_position_embeddings",
                    std::to_string(have.original_max_position_embeddings));
  }
  if (m.qk_norm) return Status::Invalid("model.qk_norm: a Llama directory has no QK-norm weights");
  FORGE_ASSIGN_OR_RETURN(HfModel hf, ReadHfModel(dir));
  return std::move(hf.params);
}

StatusOr<std::string> WriteImportedCheckpoint(const HfModel& model, const RunConfig& cfg) {
  const ParamLayout layout = MakeParamLayout(cfg.model);
  const ParamLayout from = MakeParamLayout(model.model);
  if (layout.units.size() != from.units.size())
    return Status::Invalid("the run's model does not match " + model.dir);
  for (size_t u = 0; u < layout.units.size(); ++u)
    if (layout.units[u].numel != from.units[u].numel)
      return Status::Invalid("the run's model does not match " + model.dir + " (unit " +
                             layout.units[u].name + ")");
  const std::string root = CheckpointRoot(cfg);
  const std::string step_dir = StepDir(root, 0);
  std::error_code ec;
  if (fs::exists(fs::path(step_dir) / kManifestName, ec))
    return Status::Precondition(step_dir + " already holds a checkpoint");
  fs::create_directories(step_dir, ec);
  if (ec) return Status::IoError("cannot create " + step_dir + ": " + ec.message());

  UnitBuffers zeros(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) zeros[u].assign(size_t(layout.units[u].numel), 0.0f);
  ShardState state = ShardStateFromFull(layout, 0, 1, model.params, zeros, zeros, TrainerState{});
  FORGE_ASSIGN_OR_RETURN(ShardReport report, WriteShard(step_dir, state));
  FORGE_RETURN_IF_ERROR(CommitCheckpoint(step_dir, cfg, layout, {report}).status());

  // The tokenizer travels with the run, where export and generation find it.
  const std::string tok_dir = cfg.train.run_dir + "/tokenizer";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    const fs::path src = fs::path(model.dir) / f;
    if (!fs::exists(src, ec)) continue;
    fs::create_directories(tok_dir, ec);
    FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(src.string()));
    FORGE_RETURN_IF_ERROR(WriteFileAtomic(tok_dir + "/" + f, text));
  }
  return step_dir;
}

}  // namespace forge::hf
