#include "cli/model_commands.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/flags.h"
#include "common/utf8.h"
#include "tokenizer/tokenizer.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/dataset_check.h"
#include "worker/hf/hf_export.h"
#include "worker/hf/hf_import.h"
#include "worker/infer/dataset_eval.h"
#include "worker/infer/decode_backend.h"
#include "worker/infer/generate.h"
#include "worker/infer/mc_eval.h"
#include "worker/infer/model_source.h"
#include "worker/run/process_run.h"
#include "worker/train/backend.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

int Fail(const Status& s) {
  std::fprintf(stderr, "forge: %s\n", s.ToString().c_str());
  return 1;
}

void PrintWarnings(const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) std::fprintf(stderr, "forge: warning: %s\n", w.c_str());
}

// --checkpoint and --run-dir: the model a command loads (LoadModel's arguments).
void AddCheckpointFlags(FlagParser* flags) {
  flags->Value("--checkpoint", "SPEC",
               "latest, step_N (under --run-dir), a checkpoint directory, or a Hugging Face "
               "Llama directory");
  flags->Value("--run-dir", "DIR", "the run whose checkpoints latest / step_N name");
}

// The flags of a command that runs a model: which (required), where (BackendFlag) and with
// which tokenizer (ModelTokenizer).
void AddRunModelFlags(FlagParser* flags) {
  AddCheckpointFlags(flags);
  flags->Require("--checkpoint");
  flags->Value("--backend", "auto|cpu|cuda",
               "where to run (auto, the default: cuda when a GPU is visible, else cpu)");
  flags->Value("--tokenizer", "NAME|PATH", "the tokenizer (default: the model's own)");
}

// --backend for the inference commands: auto (default: the GPU when one is visible, as
// training chooses), cpu or cuda.
StatusOr<Backend> BackendFlag(const FlagParser& flags) {
  const std::string b = flags.Get("--backend", "auto");
  if (b == "auto") return Backend::kAuto;
  if (b == "cpu") return Backend::kCpu;
  if (b == "cuda") return Backend::kCuda;
  return Status::Invalid("--backend: expected auto, cpu or cuda, got " + b);
}

// The tokenizer for a model: --tokenizer, else the one found with the model.
StatusOr<std::unique_ptr<Tokenizer>> ModelTokenizer(const FlagParser& flags,
                                                    const LoadedModel& model) {
  const std::string spec = flags.Get("--tokenizer", model.tokenizer);
  if (spec.empty())
    return Status::Invalid("no tokenizer is known for " + model.source +
                           "; pass --tokenizer NAME|PATH");
  auto tok = LoadTokenizer(spec, DefaultDataDir());
  if (!tok.ok()) return tok.status().Annotate("tokenizer '" + spec + "' (--tokenizer overrides)");
  if ((*tok)->vocab_size() > model.model.vocab)
    return Status::Invalid("tokenizer '" + spec + "' has " + std::to_string((*tok)->vocab_size()) +
                           " ids, more than the model's vocabulary of " +
                           std::to_string(model.model.vocab));
  return tok;
}

// ---------------------------------------------------------------------------------- export

void PrintForgeExportSummary(const Manifest& m, const std::string& path, SafetensorsDtype dtype) {
  int64_t total = 0, tensors = 0;
  int n_layer = 0;
  for (const UnitLayout& u : m.units) {
    total += u.numel;
    tensors += int64_t(u.tensors.size());
    if (u.name.rfind("block.", 0) == 0) ++n_layer;
  }
  std::printf("forge: exported step %ld (%.2fM params, %ld tensors, %s) to %s\n", long(m.step),
              total / 1e6, long(tensors), dtype == SafetensorsDtype::kBF16 ? "bf16" : "f32",
              path.c_str());
  for (const UnitLayout& u : m.units) {
    const bool block = u.name.rfind("block.", 0) == 0;
    if (block && u.name != "block.0") continue;
    for (const auto& t : u.tensors) {
      auto name = SafetensorsTensorName(t.name);
      std::string shown = name.ok() ? *name : t.name;
      if (block) {
        const std::string h0 = "transformer.h.0.";
        if (shown.rfind(h0, 0) == 0)
          shown = "transformer.h.{0.." + std::to_string(n_layer - 1) + "}." +
                  shown.substr(h0.size());
      }
      std::string shape;
      for (int64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      std::printf("  %-48s [%s]\n", shown.c_str(), shape.c_str());
    }
  }
}

}  // namespace

int RunExportCommand(int argc, char** argv) {
  FlagParser flags("forge export", "",
                   "Writes a checkpoint's weights: --format forge, one safetensors file with "
                   "Forge's GPT-2-style names; --format hf, a directory transformers loads as "
                   "LlamaForCausalLM (config.json, safetensors, tokenizer).");
  AddCheckpointFlags(&flags);
  flags.Value("--out", "PATH", "the file (forge) or directory (hf) to write");
  flags.Alias("-o", "--out");
  flags.Value("--format", "forge|hf", "what to write (default forge)");
  flags.Value("--dtype", "f32|bf16", "tensor type (default f32; bf16 rounds to nearest even)");
  flags.Value("--tokenizer", "NAME|PATH",
              "hf: the tokenizer to write (default: the run's own, from its dataset or "
              "<run_dir>/tokenizer)");
  flags.Bool("--no-tokenizer", "hf: write no tokenizer files");
  if (int rc; flags.ParseOrExit(argc, argv, 2, &rc)) return rc;
  const std::string out = flags.Get("--out");
  if (flags.Get("--checkpoint").empty() || out.empty())
    return Fail(Status::Invalid("--checkpoint and -o/--out are required (see --help)"));
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  const std::string d = flags.Get("--dtype", "f32");
  if (d == "bf16") dtype = SafetensorsDtype::kBF16;
  else if (d != "f32") return Fail(Status::Invalid("--dtype: expected f32 or bf16, got " + d));
  const std::string format = flags.Get("--format", "forge");
  const std::string run_dir = flags.Get("--run-dir");

  if (format == "forge") {
    std::vector<std::string> warnings;
    auto dir = ResolveCheckpointSpec(flags.Get("--checkpoint"), run_dir, &warnings);
    PrintWarnings(warnings);
    if (!dir.ok()) return Fail(dir.status());
    if (Status st = ExportCheckpointSafetensors(*dir, out, dtype); !st.ok()) return Fail(st);
    auto m = ReadManifest(CheckpointDirOf(*dir));
    if (!m.ok()) return Fail(m.status());
    PrintForgeExportSummary(*m, out, dtype);
    return 0;
  }
  if (format != "hf") return Fail(Status::Invalid("--format: expected forge or hf, got " + format));

  auto model = LoadModel(flags.Get("--checkpoint"), run_dir);
  if (!model.ok()) return Fail(model.status());
  PrintWarnings(model->warnings);
  hf::HfExportOptions opt;
  opt.dtype = dtype;
  opt.data_dir = DefaultDataDir();
  if (!flags.Has("--no-tokenizer")) {
    opt.tokenizer = flags.Get("--tokenizer", model->tokenizer);
    if (opt.tokenizer.empty())
      return Fail(Status::Invalid("no tokenizer is known for " + model->source +
                                  "; pass --tokenizer NAME|PATH or --no-tokenizer"));
  }
  auto sum = hf::ExportHfDirectory(model->model, model->params, out, opt);
  if (!sum.ok()) return Fail(sum.status());
  std::printf("forge: exported %s%s as LlamaForCausalLM (%.2fM params, %ld tensors, %s, %.1f MB) "
              "to %s:",
              model->source.c_str(),
              model->step >= 0 ? (" (step " + std::to_string(model->step) + ")").c_str() : "",
              sum->params / 1e6, long(sum->tensors), d.c_str(), sum->tensor_bytes / 1e6,
              out.c_str());
  for (const std::string& f : sum->files) std::printf(" %s", f.c_str());
  std::printf("\n");
  return 0;
}

int RunImportCommand(int argc, char** argv) {
  FlagParser flags("forge import", "HF_DIR",
                   "Reads a Hugging Face Llama directory (config.json + safetensors) into a Forge "
                   "checkpoint <run-dir>/checkpoints/step_0 (zero optimizer state) and its "
                   "tokenizer into <run-dir>/tokenizer.");
  flags.Value("--run-dir", "DIR", "where the checkpoint goes (required)");
  flags.Value("--seq-len", "N",
              "the model's context (default: max_position_embeddings, at most 8192)");
  flags.Value("--name", "NAME", "the run name in the checkpoint's config (default imported)");
  flags.MaxPositional(1);
  if (int rc; flags.ParseOrExit(argc, argv, 2, &rc)) return rc;
  if (flags.positional().size() != 1 || !flags.Has("--run-dir"))
    return Fail(Status::Invalid("give HF_DIR and --run-dir (see --help)"));
  const std::string src = flags.positional()[0];
  auto model = hf::ReadHfModel(src);
  if (!model.ok()) return Fail(model.status());
  RunConfig cfg;
  cfg.name = flags.Get("--name", "imported");
  cfg.model = model->model;
  cfg.model.seq_len = std::min(model->model.seq_len, 8192);
  if (Status s = flags.GetInt("--seq-len", &cfg.model.seq_len); !s.ok()) return Fail(s);
  cfg.train.run_dir = flags.Get("--run-dir");
  if (Status s = ValidateRunConfig(cfg); !s.ok()) return Fail(s);
  hf::HfModel in = std::move(model).value();
  in.model.seq_len = cfg.model.seq_len;
  auto step_dir = hf::WriteImportedCheckpoint(in, cfg);
  if (!step_dir.ok()) return Fail(step_dir.status());
  int64_t params = 0;
  for (const auto& u : in.params) params += int64_t(u.size());
  std::printf("forge: imported %s (%.2fM params) into %s\n", src.c_str(), params / 1e6,
              step_dir->c_str());
  std::printf("train from it with this model section and checkpoint.resume: %s\n"
              "(or model.init_from: %s, which starts from the same weights):\n",
              step_dir->c_str(), src.c_str());
  const std::string yaml = RunConfigToYaml(cfg);
  const size_t b = yaml.find("model:\n"), e = yaml.find("\ndata:");
  std::printf("%s\n", yaml.substr(b, e - b).c_str());
  return 0;
}

// -------------------------------------------------------------------------------- generate

int RunGenerateCommand(int argc, char** argv) {
  FlagParser flags("forge generate", "",
                   "Completes prompts with a model (KV-cache decoding, batched, on the GPU when "
                   "one is visible, else on the CPU): greedy by "
                   "default, sampling with --temperature > 0. Each prompt starts with the "
                   "tokenizer's begin-of-text token (its end-of-text where it has none); "
                   "generation stops at the end-of-text token.");
  AddRunModelFlags(&flags);
  flags.Value("--prompt", "TEXT", "one prompt");
  flags.Value("--prompt-file", "FILE", "prompts, one a line (a batch)");
  flags.Value("--max-new-tokens", "N", "tokens to generate at most per prompt (default 64)");
  flags.Value("--temperature", "T", "0: greedy (default); > 0 samples");
  flags.Value("--top-k", "K", "sample among the K most likely tokens (0: all)");
  flags.Value("--top-p", "P", "sample among the most likely tokens of total probability P");
  flags.Value("--seed", "S", "sampling seed (default 0): the same seed gives the same text");
  flags.Bool("--json", "one JSON object per prompt instead of text");
  flags.Value("--dump", "FILE",
              "also write prompt ids, prompt logits and generated ids (safetensors) for "
              "scripts/hf_llama_numpy.py and scripts/check_hf_transformers.py");
  if (int rc; flags.ParseOrExit(argc, argv, 2, &rc)) return rc;
  if (flags.Has("--prompt") == flags.Has("--prompt-file"))
    return Fail(Status::Invalid("give one of --prompt and --prompt-file"));
  auto backend_kind = BackendFlag(flags);
  if (!backend_kind.ok()) return Fail(backend_kind.status());

  GenerateOptions opt;
  int64_t seed = 0;
  Status s = flags.GetInt("--max-new-tokens", &opt.max_new_tokens);
  if (s.ok()) s = flags.GetDouble("--temperature", &opt.sampling.temperature);
  if (s.ok()) s = flags.GetInt("--top-k", &opt.sampling.top_k);
  if (s.ok()) s = flags.GetDouble("--top-p", &opt.sampling.top_p);
  if (s.ok()) s = flags.GetInt("--seed", &seed);
  if (!s.ok()) return Fail(s);
  opt.sampling.seed = uint64_t(seed);
  if (opt.max_new_tokens < 0) return Fail(Status::Invalid("--max-new-tokens: must be >= 0"));
  if (!(opt.sampling.temperature >= 0)) return Fail(Status::Invalid("--temperature: must be >= 0"));
  if (opt.sampling.top_k < 0) return Fail(Status::Invalid("--top-k: must be >= 0"));
  if (!(opt.sampling.top_p > 0 && opt.sampling.top_p <= 1))
    return Fail(Status::Invalid("--top-p: must be in (0, 1]"));

  std::vector<std::string> texts;
  if (flags.Has("--prompt")) {
    texts.push_back(flags.Get("--prompt"));
  } else {
    std::ifstream in(flags.Get("--prompt-file"));
    if (!in) return Fail(Status::NotFound(flags.Get("--prompt-file") + ": cannot open"));
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) texts.push_back(line);
    }
    if (texts.empty()) return Fail(Status::Invalid(flags.Get("--prompt-file") + ": no prompts"));
  }
  for (size_t i = 0; i < texts.size(); ++i)
    if (FindInvalidUtf8(texts[i]) != kUtf8Valid)
      return Fail(Status::Invalid("prompt " + std::to_string(i + 1) + " is not valid UTF-8"));

  auto model = LoadModel(flags.Get("--checkpoint"), flags.Get("--run-dir"));
  if (!model.ok()) return Fail(model.status());
  PrintWarnings(model->warnings);
  auto tok = ModelTokenizer(flags, *model);
  if (!tok.ok()) return Fail(tok.status());
  const int32_t start = (*tok)->bos_id() >= 0 ? (*tok)->bos_id() : (*tok)->eot_id();
  opt.stop_ids = {(*tok)->eot_id()};
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& t : texts) {
    std::vector<int32_t> ids = {start};
    (*tok)->EncodeOrdinary(t, &ids);
    prompts.push_back(std::move(ids));
  }
  const ModelConfig m = model->model;
  auto backend = MakeDecodeBackend(*backend_kind, m, std::move(model->params));
  if (!backend.ok()) return Fail(backend.status());
  std::vector<float> prompt_logits;
  GenerateStats stats;
  auto gens = Generate(backend->get(), prompts, opt,
                       flags.Has("--dump") ? &prompt_logits : nullptr, &stats);
  if (!gens.ok()) return Fail(gens.status());
  if (flags.Has("--dump")) {
    if (Status st = WriteGenerationDump(flags.Get("--dump"), *gens, prompt_logits, m.vocab, opt, texts);
        !st.ok())
      return Fail(st);
  }
  for (size_t i = 0; i < gens->size(); ++i) {
    const Generation& g = (*gens)[i];
    std::vector<int32_t> shown = g.tokens;
    if (g.stop == "stop_token" && !shown.empty()) shown.pop_back();
    auto text = (*tok)->Decode(shown);
    if (!text.ok()) return Fail(text.status());
    const std::string completion = SanitizeUtf8(*text);
    if (flags.Has("--json")) {
      json j = {{"prompt", texts[i]},   {"completion", completion}, {"prompt_ids", g.prompt},
                {"ids", g.tokens},       {"stop", g.stop}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      if (gens->size() > 1) std::printf("--- %zu ---\n", i + 1);
      std::printf("%s%s\n", texts[i].c_str(), completion.c_str());
    }
  }
  std::fprintf(stderr,
               "forge: %zu prompt%s, %ld prompt tokens (%.3f s), %ld new tokens in %.3f s "
               "(%.1f tokens/s), %s backend\n",
               gens->size(), gens->size() == 1 ? "" : "s", long(stats.prompt_tokens),
               stats.prefill_seconds, long(stats.new_tokens), stats.decode_seconds,
               stats.decode_seconds > 0 ? stats.new_tokens / stats.decode_seconds : 0.0,
               (*backend)->name());
  return 0;
}

// ------------------------------------------------------------------------------------ eval

namespace {

// TokenDumpFormat (`forge eval --dump-tokens FILE`), little-endian int32 throughout:
//   header  batches, micro_batch, seq_len                        (3 values)
//   inputs  [batches, micro_batch, seq_len]  the evaluated micro-batches in order
//   targets [batches, micro_batch, seq_len]
// scripts/check_hf_transformers.py reads it.
Status WriteTokenDump(const std::string& path, int64_t batches, int micro_batch, int seq_len,
                      const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::IoError("cannot create " + path);
  const int32_t header[3] = {int32_t(batches), micro_batch, seq_len};
  bool ok = std::fwrite(header, sizeof header, 1, f) == 1;
  ok = ok && std::fwrite(inputs.data(), 4, inputs.size(), f) == inputs.size();
  ok = ok && std::fwrite(targets.data(), 4, targets.size(), f) == targets.size();
  ok = (std::fclose(f) == 0) && ok;
  return ok ? Status::Ok() : Status::IoError("cannot write " + path);
}

}  // namespace

int RunEvalCommand(int argc, char** argv) {
  FlagParser flags("forge eval", "",
                   "Evaluates a model on the GPU (BF16 weights, the KV-cache forward of forge "
                   "generate) when one is visible, else on the CPU (fp32, the trainer's own "
                   "evaluation): loss, perplexity and bits per byte over "
                   "a prepared dataset's split (the first N micro-batches, as the trainer "
                   "evaluates), and with --tasks multiple-choice accuracy (acc, acc_norm). "
                   "Prints one JSON line.");
  AddRunModelFlags(&flags);
  flags.Value("--config", "CONFIG", "evaluate with this config's batch settings (its model must match)");
  flags.Value("--dataset", "DIR", "a prepared dataset (default: the run's, its first source's)");
  flags.Value("--split", "val|train", "which split (default val)");
  flags.Value("--batches", "N|all", "micro-batches to evaluate (default eval.batches)");
  flags.Value("--micro-batch", "N", "sequences per micro-batch (default the run's)");
  flags.Value("--tasks", "FILE.jsonl", "multiple-choice tasks (HellaSwag / ARC JSONL form)");
  flags.Value("--dump-tokens", "FILE", "write the evaluated batches (int32)");
  if (int rc; flags.ParseOrExit(argc, argv, 2, &rc)) return rc;
  auto backend_kind = BackendFlag(flags);
  if (!backend_kind.ok()) return Fail(backend_kind.status());
  const bool gpu = *backend_kind == Backend::kCuda ||
                   (*backend_kind == Backend::kAuto && CudaDeviceAvailable());

  auto model = LoadModel(flags.Get("--checkpoint"), flags.Get("--run-dir"));
  if (!model.ok()) return Fail(model.status());
  PrintWarnings(model->warnings);
  RunConfig cfg;
  if (flags.Has("--config")) {
    auto loaded = LoadRunConfig(flags.Get("--config"));
    if (!loaded.ok()) return Fail(loaded.status());
    cfg = std::move(loaded).value();
    Manifest shapes;  // the model's tensors, to compare with the config's
    shapes.units = MakeParamLayout(model->model).units;
    if (Status st = CheckSameShapes(shapes, MakeParamLayout(cfg.model)); !st.ok())
      return Fail(st.Annotate(std::string("the config's model does not match ") +
                              (model->from_hf ? "" : "checkpoint ") + model->source));
  } else if (model->run) {
    cfg = *model->run;
  } else {
    cfg.model = model->model;
    cfg.batch.micro_batch = 1;
    cfg.batch.global_batch = 1;
  }
  cfg.train.backend = Backend::kCpu;
  json out = {{"checkpoint", model->source}, {"backend", gpu ? "cuda" : "cpu"}};
  if (model->step >= 0) out["step"] = model->step;
  // The GPU's forward serves both the dataset and the tasks.
  std::unique_ptr<DecodeBackend> gpu_backend;
  if (gpu) {
    auto b = MakeCudaDecodeBackend(model->model, model->params);
    if (!b.ok()) return Fail(b.status());
    gpu_backend = std::move(b).value();
  }

  const bool tasks = flags.Has("--tasks");
  std::unique_ptr<Tokenizer> tok;
  if (tasks || flags.Has("--tokenizer") || !model->tokenizer.empty()) {
    auto t = ModelTokenizer(flags, *model);
    if (t.ok()) tok = std::move(t).value();
    else if (tasks) return Fail(t.status());
  }

  if (!tasks || flags.Has("--dataset")) {
    DatasetEvalOptions opt;
    opt.seq_len = cfg.model.seq_len;
    opt.micro_batch = cfg.batch.micro_batch;
    opt.batches = cfg.eval.batches;
    if (Status s = flags.GetInt("--micro-batch", &opt.micro_batch); !s.ok()) return Fail(s);
    const std::string b = flags.Get("--batches");
    if (b == "all") {
      opt.batches = 0;
    } else if (!b.empty()) {
      if (Status s = flags.GetInt("--batches", &opt.batches); !s.ok()) return Fail(s);
      if (opt.batches <= 0) return Fail(Status::Invalid("--batches: expected a count > 0 or all, got " + b));
    }
    if (opt.micro_batch < 1) return Fail(Status::Invalid("--micro-batch: must be >= 1"));
    const std::string split = flags.Get("--split", "val");
    if (split == "train") opt.split = Split::kTrain;
    else if (split != "val") return Fail(Status::Invalid("--split: expected val or train, got " + split));
    cfg.batch.micro_batch = opt.micro_batch;
    cfg.batch.global_batch = opt.micro_batch;

    const std::string dataset_dir = flags.Get("--dataset", DataSources(cfg).front().dir);
    auto ds = TokenDataset::Open(dataset_dir);
    if (!ds.ok()) return Fail(ds.status().Annotate("opening dataset " + dataset_dir));
    if (Status st = CheckDatasetForRun(ds->manifest(), dataset_dir, cfg.model.vocab,
                                       cfg.data.tokenizer, DefaultDataDir());
        !st.ok())
      return Fail(st);
    // Bits per byte decode with the dataset's own tokenizer.
    std::unique_ptr<Tokenizer> ds_tok;
    const std::string ds_spec = DatasetTokenizerSpec(dataset_dir);
    if (!ds_spec.empty()) {
      auto t = LoadTokenizer(ds_spec, DefaultDataDir());
      if (t.ok()) ds_tok = std::move(t).value();
    }
    StatusOr<DatasetEvalResult> r = Status::Internal("not evaluated");
    if (gpu_backend) {
      r = EvaluateDataset(gpu_backend.get(), *ds, opt, ds_tok.get());
    } else {
      std::unique_ptr<TrainBackend> backend = MakeCpuBackend(cfg);
      if (Status st = backend->SetParams(model->params); !st.ok()) return Fail(st);
      r = EvaluateDataset(backend.get(), *ds, opt, ds_tok.get());
    }
    if (!r.ok()) return Fail(r.status());
    if (flags.Has("--dump-tokens")) {
      Status st = WriteTokenDump(flags.Get("--dump-tokens"), r->batches, opt.micro_batch,
                                 opt.seq_len, r->inputs, r->targets);
      if (!st.ok()) return Fail(st);
    }
    out["loss"] = float(r->loss);
    out["perplexity"] = r->perplexity;
    out["per_batch"] = r->per_batch;
    out["batches"] = r->batches;
    out["micro_batch"] = opt.micro_batch;
    out["seq_len"] = opt.seq_len;
    out["dataset"] = dataset_dir;
    out["split"] = split;
    out["tokens"] = r->tokens;
    if (!r->bytes_source.empty()) {
      out["bytes"] = r->bytes;
      out["bytes_source"] = r->bytes_source;
      out["bits_per_byte"] = r->bits_per_byte;
    }
  }
  if (tasks) {
    auto examples = ReadMcTasks(flags.Get("--tasks"));
    if (!examples.ok()) return Fail(examples.status());
    std::unique_ptr<DecodeBackend> cpu_backend;
    if (!gpu_backend) cpu_backend = MakeCpuDecodeBackend(model->model, model->params);
    auto r = ScoreMcTasks(gpu_backend ? gpu_backend.get() : cpu_backend.get(), tok.get(),
                          *examples);
    if (!r.ok()) return Fail(r.status());
    json per = json::array();
    for (const McScore& s : r->scores)
      per.push_back({{"loglik", s.loglik}, {"pred", s.pred}, {"pred_norm", s.pred_norm}});
    out["tasks"] = {{"file", flags.Get("--tasks")}, {"examples", r->examples},
                    {"acc", r->acc},               {"acc_norm", r->acc_norm},
                    {"chance", r->chance},         {"per_example", per}};
  }
  // The legacy loss key stays a float's shortest form, so it compares bitwise with the trainer.
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace forge
