#include "worker/infer/model_source.h"

#include <filesystem>

#include "worker/checkpoint/checkpoint.h"
#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/run_sources.h"
#include "worker/hf/hf_import.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

}  // namespace

StatusOr<std::string> ResolveCheckpointSpec(const std::string& spec, const std::string& run_dir,
                                            std::vector<std::string>* warnings) {
  if (spec.empty()) return Status::Invalid("--checkpoint: expected latest, step_N or a path");
  if (spec != "latest" && spec.rfind("step_", 0) != 0) return spec;
  if (run_dir.empty())
    return Status::Invalid("--checkpoint " + spec + " needs --run-dir (or pass a path)");
  FORGE_ASSIGN_OR_RETURN(ResumeChoice c, ResolveResume(spec, run_dir + "/checkpoints"));
  if (warnings) warnings->insert(warnings->end(), c.warnings.begin(), c.warnings.end());
  if (c.dir.empty()) return Status::NotFound("no checkpoint under " + run_dir + "/checkpoints");
  return c.dir;
}

StatusOr<hf::HfExportSummary> ExportModelHf(const std::string& spec, const std::string& out_dir,
                                            SafetensorsDtype dtype, const std::string& tokenizer,
                                            const std::string& run_dir) {
  FORGE_ASSIGN_OR_RETURN(LoadedModel model, LoadModel(spec, run_dir));
  hf::HfExportOptions opt;
  opt.dtype = dtype;
  opt.data_dir = DefaultDataDir();
  opt.tokenizer = tokenizer.empty() ? model.tokenizer : tokenizer;
  if (opt.tokenizer.empty())
    return Status::Invalid("no tokenizer is known for " + model.source +
                           " (its dataset names none); export it with forge export --tokenizer");
  return hf::ExportHfDirectory(model.model, model.params, out_dir, opt);
}

std::string DatasetTokenizerSpec(const std::string& dataset_dir) {
  auto m = ReadDatasetManifest(dataset_dir);
  if (!m.ok()) return "";
  // How prepare named the tokenizer (a name, or the path it was given); version 1 datasets
  // were GPT-2's.
  return m->tokenizer_spec.empty() ? m->tokenizer : m->tokenizer_spec;
}

StatusOr<LoadedModel> LoadModel(const std::string& spec, const std::string& run_dir) {
  LoadedModel out;
  if (hf::IsHfModelDir(spec)) {
    FORGE_ASSIGN_OR_RETURN(hf::HfModel m, hf::ReadHfModel(spec));
    out.model = m.model;
    out.params = std::move(m.params);
    out.source = spec;
    out.from_hf = true;
    std::error_code ec;
    if (fs::exists(fs::path(spec) / "tokenizer.json", ec)) out.tokenizer = spec;
    return out;
  }
  FORGE_ASSIGN_OR_RETURN(std::string dir, ResolveCheckpointSpec(spec, run_dir, &out.warnings));
  FORGE_ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(dir));
  FORGE_ASSIGN_OR_RETURN(RunConfig cfg,
                         ParseRunConfig(manifest.config_yaml, dir + "/manifest.json:config_yaml"));
  // In the units of this build's layout for its own config (an older grouping is read by name).
  const ParamLayout layout = MakeParamLayout(cfg.model);
  StatusOr<FullCheckpoint> loaded = LoadFullCheckpoint(dir, &layout);
  if (!loaded.ok()) return loaded.status().Annotate("checkpoint " + dir + " and its own config");
  FullCheckpoint ck = std::move(loaded).value();
  out.model = cfg.model;
  out.params = std::move(ck.master);
  out.source = ck.dir;
  out.step = ck.manifest.step;
  // <run_dir>/checkpoints/step_N -> <run_dir>/tokenizer
  fs::path step = fs::path(ck.dir).lexically_normal();
  if (step.filename().empty()) step = step.parent_path();  // a trailing '/'
  const fs::path run = step.parent_path().parent_path();
  std::error_code ec;
  if (fs::exists(run / "tokenizer" / "tokenizer.json", ec)) out.tokenizer = (run / "tokenizer").string();
  else out.tokenizer = DatasetTokenizerSpec(DataSources(cfg).front().dir);  // every source's
  out.run = std::move(cfg);
  return out;
}

}  // namespace forge
