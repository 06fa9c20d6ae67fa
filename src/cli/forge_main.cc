// `forge`: the local command-line entry point.
//   forge train CONFIG [--steps N] [--backend auto|cpu|cuda] [--run-dir DIR]
//                      [--resume latest|step_N|PATH] [--checkpoint-every N] [--direct]
//     Launched alone, it starts an in-process coordinator (state, address and a user token in
//     <run_dir>/coordinator, so forgectl can watch) and one local worker that trains the run
//     (cli/local_launch.h); --direct trains without them.
//     Under `mpirun -np N` (or `srun --mpi=pmix`) the N processes train one model
//     data-parallel in parallel.mode (CPU backend); rank 0 prints and writes metrics.
//     --resume overrides checkpoint.resume, --checkpoint-every checkpoint.every_steps.
//     SIGINT, SIGTERM or SIGUSR1 (Ctrl-C, scancel, sbatch --signal) save a checkpoint at the
//     next step boundary and end the run cleanly (exit 0); a second signal kills at once. Under Open MPI's mpirun signal the ranks, or
//     mpirun with SIGUSR1 (which it forwards): on SIGTERM/SIGINT mpirun kills them itself.
//   forge export --checkpoint PATH|latest [--run-dir DIR] -o FILE [--dtype f32|bf16]
//     Writes a checkpoint's weights as one safetensors file (GPT-2-style names,
//     worker/checkpoint/safetensors.h). "latest": the newest intact checkpoint under
//     DIR/checkpoints.
//   forge eval --checkpoint PATH|latest|step_N [--run-dir DIR] [--config CONFIG]
//              [--dataset DIR] [--batches N] [--dump-tokens FILE]
//     The validation loss of a checkpoint's weights on the CPU backend (fp32): the first N
//     validation micro-batches (default eval.batches), exactly as the trainer evaluates them.
//     Prints one JSON line {"loss", "per_batch", ...}; --dump-tokens writes the batches
//     (TokenDumpFormat below) so another implementation can evaluate the identical tokens.
//     The config is the checkpoint's own unless --config is given (its model must match).
//   forge data prepare [--out DIR] [--threads N] [--force]
//   forge data baseline [--dataset DIR]
//   forge has-gpu
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/data_commands.h"
#include "cli/local_launch.h"
#include "common/config.h"
#include "common/flags.h"
#include "metrics/train_metrics.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/dataset.h"
#include "worker/data/sampler.h"
#include "worker/parallel/bootstrap.h"
#include "worker/parallel/comm.h"
#include "worker/parallel/mpi_comm.h"
#include "worker/train/backend.h"
#include "worker/train/process_run.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "forge: %s\n", s.ToString().c_str());
  return 1;
}

const char* UsageText() {
  return "usage:\n"
               "  forge train CONFIG [--steps N] [--backend auto|cpu|cuda] [--run-dir DIR]\n"
               "                     [--resume latest|step_N|PATH] [--checkpoint-every N]"
               " [--direct] [--print-config]\n"
               "  forge export --checkpoint PATH|latest [--run-dir DIR] -o FILE"
               " [--dtype f32|bf16]\n"
               "  forge eval --checkpoint PATH|latest|step_N [--run-dir DIR] [--config CONFIG]\n"
               "             [--dataset DIR] [--batches N] [--dump-tokens FILE]\n"
               "  forge data prepare [--out DIR] [--threads N] [--force]\n"
               "  forge data baseline [--dataset DIR]\n"
               "  forge has-gpu\n";
}

int Usage() {
  std::fputs(UsageText(), stderr);
  return 2;
}

// Minimal "--flag value" parser: positional args in order, flags in a map.
struct Args {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> flags;
  std::string Get(const std::string& name, const std::string& def = "") const {
    for (const auto& [k, v] : flags)
      if (k == name) return v;
    return def;
  }
  bool Has(const std::string& name) const {
    for (const auto& [k, v] : flags)
      if (k == name) return true;
    return false;
  }
};

StatusOr<Args> ParseArgs(int argc, char** argv, int first,
                         const std::vector<std::string>& boolean_flags) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string s = argv[i];
    if (s.size() < 2 || s[0] != '-') {  // "--flag" or "-o"
      a.positional.push_back(s);
      continue;
    }
    bool is_bool = false;
    for (const auto& b : boolean_flags) is_bool |= (b == s);
    if (is_bool) {
      a.flags.emplace_back(s, "1");
    } else {
      if (i + 1 >= argc) return Status::Invalid(s + ": expects a value");
      a.flags.emplace_back(s, argv[++i]);
    }
  }
  return a;
}

// Set by SIGINT/SIGTERM/SIGUSR1; the trainer checkpoints at the next step boundary and returns. The
// handler then restores the default action, so a second signal ends the process at once.
std::atomic<bool> g_stop_requested{false};

extern "C" void OnStopSignal(int sig) {
  g_stop_requested.store(true);
  std::signal(sig, SIG_DFL);
}

void InstallStopHandlers() {
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  std::signal(SIGUSR1, OnStopSignal);
}

// The closing line of `forge train` (rank 0): how the run ended, its losses and metrics file.
int ReportTrain(const ProcessRunResult& run, bool leader) {
  const std::string& metrics_path = run.metrics_path;
  const UnigramBaseline base{run.unigram_baseline};
  const TrainResult* r = &run.train;
  if (leader && r->stopped) {
    const std::string saved = r->checkpoints.empty()
                                  ? "nothing new to save"
                                  : "checkpoint step_" + std::to_string(r->checkpoints.back());
    std::printf("forge: stopped on a signal after step %ld (%s); continue with --resume latest "
                "| metrics %s\n",
                long(r->steps), saved.c_str(), metrics_path.c_str());
  } else if (leader) {
    std::printf("forge: done: %ld steps", long(r->steps));
    if (!r->resumed_from.empty())
      std::printf(" (%ld after resuming at step %ld)", long(r->steps - r->resumed_step),
                  long(r->resumed_step));
    if (r->steps > r->resumed_step)
      std::printf(" in %.1f s, %.0f tokens/s | train loss %.4f", r->seconds, r->tokens_per_s,
                  r->final_train_loss);
    std::printf(" | val loss ");
    if (r->initial_val_loss >= 0) std::printf("%.4f -> ", r->initial_val_loss);
    std::printf("%.4f (unigram baseline %.4f) | metrics %s\n", r->final_val_loss,
                base.val_cross_entropy, metrics_path.c_str());
  }
  return 0;
}

FlagParser TrainFlags() {
  FlagParser f("forge train", "CONFIG",
               "Trains the model CONFIG describes: alone, through an in-process coordinator and a "
               "local worker;\nunder mpirun/srun (or with --direct), directly in these processes.");
  f.Value("--steps", "N", "stop after N optimizer steps (the schedule keeps schedule.total_steps)");
  f.Value("--backend", "auto|cpu|cuda", "overrides train.backend");
  f.Value("--run-dir", "DIR", "overrides train.run_dir");
  f.Value("--resume", "latest|step_N|PATH", "overrides checkpoint.resume");
  f.Value("--checkpoint-every", "N", "overrides checkpoint.every_steps");
  f.Bool("--direct", "train in this process, without a coordinator");
  f.Bool("--print-config", "print the resolved config (YAML) and exit");
  f.MaxPositional(1);
  return f;
}

int Train(const FlagParser& a, ProcessGroup* group) {
  if (a.positional().size() != 1) {
    std::fprintf(stderr, "forge train: expects one CONFIG (see 'forge train --help')\n");
    return 2;
  }
  auto loaded = LoadRunConfig(a.positional()[0]);
  if (!loaded.ok()) return Fail(loaded.status());
  RunConfig cfg = std::move(loaded).value();
  if (a.Has("--backend")) {
    const std::string b = a.Get("--backend");
    if (b == "cpu") cfg.train.backend = Backend::kCpu;
    else if (b == "cuda") cfg.train.backend = Backend::kCuda;
    else if (b == "auto") cfg.train.backend = Backend::kAuto;
    else return Fail(Status::Invalid("--backend: expected auto, cpu or cuda, got " + b));
  }
  if (a.Has("--run-dir")) cfg.train.run_dir = a.Get("--run-dir");
  if (a.Has("--resume")) cfg.checkpoint.resume = a.Get("--resume");
  if (a.Has("--checkpoint-every")) {
    const std::string n = a.Get("--checkpoint-every");
    char* end = nullptr;
    const long long every = std::strtoll(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || every < 0)
      return Fail(Status::Invalid("--checkpoint-every: expected a step count >= 0, got " + n));
    cfg.checkpoint.every_steps = every;
  }
  if (a.Has("--print-config")) {  // the resolved config, as the run would use it
    std::fputs(RunConfigToYaml(cfg).c_str(), stdout);
    return 0;
  }
  TrainOptions opt;
  opt.stop_requested = &g_stop_requested;
  if (Status s = a.GetInt("--steps", &opt.max_steps); !s.ok()) return Fail(s);

  // Launched alone (no mpirun / srun / torchrun variables): through an in-process coordinator
  // and a local worker (cli/local_launch.h), as on a cluster. --direct trains right here.
  auto launch = DetectLaunch();
  if (!launch.ok()) return Fail(launch.status());
  if (launch->kind == LaunchKind::kSingle && !a.Has("--direct")) {
    // /metrics come from the in-process worker once placed: labelled with the coordinator's
    // run id and the run's world size, as the other GPUs' forge-workers label theirs.
    InstallStopHandlers();
    auto local = cli::TrainWithLocalCoordinator(cfg, opt);
    if (!local.ok()) return Fail(local.status());
    return ReportTrain(*local, true);
  }
  // /metrics when metrics.port is set: a series per step record (and, under MPI, collective
  // wait times), on port + local rank. No coordinator here: the run's id is its name.
  auto metrics = TrainMetrics::Start(cfg, cfg.name, launch->rank, launch->local_rank,
                                     launch->world);
  if (!metrics.ok()) return Fail(metrics.status());
  if (*metrics) opt.on_step = (*metrics)->StepCallback(opt.on_step);
  auto finish = [&](const StatusOr<ProcessRunResult>& run) {
    if (*metrics)
      (*metrics)->Finish(!run.ok() ? "failed" : run->train.stopped ? "stopped" : "completed");
  };

  auto joined = JoinProcessGroup(cfg);
  if (!joined.ok()) return Fail(joined.status());
  *group = std::move(joined).value();
  if (*metrics) group->comm = (*metrics)->TimeCollectives(std::move(group->comm));
  const bool leader = group->rank() == 0;
  InstallStopHandlers();
  auto run = TrainInProcessGroup(cfg, group, opt);
  finish(run);
  if (!run.ok()) return Fail(run.status());
  return ReportTrain(*run, leader);
}

// Names and shapes of what an export wrote, with the blocks folded: one line per tensor of
// block 0 standing for h.{0..L-1}.
void PrintExportSummary(const Manifest& m, const std::string& path, SafetensorsDtype dtype) {
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

// The checkpoint directory named by --checkpoint: a path, or latest / step_N under
// --run-dir's checkpoints.
StatusOr<std::string> CheckpointArg(const Args& a) {
  const std::string spec = a.Get("--checkpoint");
  if (spec != "latest" && spec.rfind("step_", 0) != 0) return spec;
  if (!a.Has("--run-dir"))
    return Status::Invalid("--checkpoint " + spec + " needs --run-dir (or pass a path)");
  FORGE_ASSIGN_OR_RETURN(ResumeChoice c, ResolveResume(spec, a.Get("--run-dir") + "/checkpoints"));
  for (const std::string& w : c.warnings) std::fprintf(stderr, "forge: warning: %s\n", w.c_str());
  if (c.dir.empty()) return Status::NotFound("no checkpoint under " + a.Get("--run-dir"));
  return c.dir;
}

int Export(const Args& a) {
  const std::string out = a.Has("-o") ? a.Get("-o") : a.Get("--out");
  if (a.Get("--checkpoint").empty() || out.empty() || !a.positional.empty()) return Usage();
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  const std::string d = a.Get("--dtype", "f32");
  if (d == "bf16") dtype = SafetensorsDtype::kBF16;
  else if (d != "f32") return Fail(Status::Invalid("--dtype: expected f32 or bf16, got " + d));
  auto resolved = CheckpointArg(a);
  if (!resolved.ok()) return Fail(resolved.status());
  const std::string dir = *resolved;
  Status st = ExportCheckpointSafetensors(dir, out, dtype);
  if (!st.ok()) return Fail(st);
  auto m = ReadManifest(CheckpointDirOf(dir));
  if (!m.ok()) return Fail(m.status());
  PrintExportSummary(*m, out, dtype);
  return 0;
}

// TokenDumpFormat (`forge eval --dump-tokens FILE`), little-endian int32 throughout:
//   header  batches, micro_batch, seq_len                        (3 values)
//   inputs  [batches, micro_batch, seq_len]  validation micro-batches 0..batches-1 in order
//   targets [batches, micro_batch, seq_len]
// scripts/check_export_torch.py reads it.
Status WriteTokenDump(const std::string& path, int batches, int micro_batch, int seq_len,
                      const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::IoError("cannot create " + path);
  const int32_t header[3] = {batches, micro_batch, seq_len};
  bool ok = std::fwrite(header, sizeof header, 1, f) == 1;
  ok = ok && std::fwrite(inputs.data(), 4, inputs.size(), f) == inputs.size();
  ok = ok && std::fwrite(targets.data(), 4, targets.size(), f) == targets.size();
  ok = (std::fclose(f) == 0) && ok;
  return ok ? Status::Ok() : Status::IoError("cannot write " + path);
}

int Eval(const Args& a) {
  if (a.Get("--checkpoint").empty() || !a.positional.empty()) return Usage();
  auto resolved = CheckpointArg(a);
  if (!resolved.ok()) return Fail(resolved.status());
  auto ck = LoadFullCheckpoint(*resolved);
  if (!ck.ok()) return Fail(ck.status());
  auto loaded = a.Has("--config")
                    ? LoadRunConfig(a.Get("--config"))
                    : ParseRunConfig(ck->manifest.config_yaml,
                                     ck->dir + "/manifest.json:config_yaml");
  if (!loaded.ok()) return Fail(loaded.status());
  RunConfig cfg = std::move(loaded).value();
  const ParamLayout layout = MakeParamLayout(cfg.model);
  if (Status st = CheckSameShapes(ck->manifest, layout); !st.ok())
    return Fail(st.Annotate("the config's model does not match checkpoint " + ck->dir));
  if (a.Has("--batches")) cfg.eval.batches = std::atoi(a.Get("--batches").c_str());
  if (cfg.eval.batches <= 0)
    return Fail(Status::Invalid("--batches: expected a count > 0, got " + a.Get("--batches")));

  // The trainer validates on its first data source.
  const std::string dataset_dir = a.Get("--dataset", DataSources(cfg).front().dir);
  auto ds = TokenDataset::Open(dataset_dir);
  if (!ds.ok()) return Fail(ds.status().Annotate("opening dataset " + dataset_dir));
  if (ds->manifest().vocab_size > cfg.model.vocab)
    return Fail(Status::Invalid("the dataset's vocabulary (" +
                                std::to_string(ds->manifest().vocab_size) +
                                ") exceeds model.vocab (" + std::to_string(cfg.model.vocab) + ")"));
  const TokenStream& val = ds->split(Split::kVal);

  cfg.train.backend = Backend::kCpu;
  std::unique_ptr<TrainBackend> backend = MakeCpuBackend(cfg);
  if (Status st = backend->SetParams(ck->master); !st.ok()) return Fail(st);
  if (Status st = backend->BeginEval(); !st.ok()) return Fail(st);

  // The trainer's Evaluate: batch i is FillEvalBatch(val, T, i, micro_batch); the mean is
  // summed in batch order in double.
  const int n = cfg.eval.batches, mb = cfg.batch.micro_batch, T = cfg.model.seq_len;
  const size_t tokens = size_t(mb) * size_t(T);
  std::vector<int32_t> inputs(tokens * n), targets(tokens * n);
  std::vector<float> losses(n);
  double total = 0.0;
  for (int i = 0; i < n; ++i) {
    int32_t* in = inputs.data() + tokens * i;
    int32_t* tgt = targets.data() + tokens * i;
    Status st = FillEvalBatch(val, T, i, mb, in, tgt);
    if (st.ok()) st = backend->EvalLoss({in, tgt}, &losses[i]);
    if (!st.ok()) return Fail(st.Annotate("validation batch " + std::to_string(i)));
    total += losses[i];
  }
  const float loss = static_cast<float>(total / n);
  if (a.Has("--dump-tokens")) {
    Status st = WriteTokenDump(a.Get("--dump-tokens"), n, mb, T, inputs, targets);
    if (!st.ok()) return Fail(st);
  }
  nlohmann::json out = {{"loss", loss},
                        {"per_batch", losses},
                        {"step", ck->manifest.step},
                        {"batches", n},
                        {"micro_batch", mb},
                        {"seq_len", T},
                        {"checkpoint", ck->dir}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) {
  using namespace forge;
  if (argc < 2) return Usage();
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(UsageText(), stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("%s\n", VersionString("forge").c_str());
    return 0;
  }
  if (cmd == "has-gpu") {
    const bool gpu = CudaDeviceAvailable();
    std::printf("%s\n", gpu ? "yes" : "no");
    return gpu ? 0 : 1;
  }
  if (cmd == "train") {
    FlagParser flags = TrainFlags();
    if (int rc; flags.ParseOrExit(argc, argv, 2, &rc)) return rc;
    ProcessGroup group;
    const int rc = Train(flags, &group);
    // A rank that failed alone would leave the others blocked in their next collective.
    if (rc != 0 && group.comm && group.world() > 1)
      group.comm->Abort(Status::Internal("rank " + std::to_string(group.rank()) + " failed"));
    group.comm.reset();
    FinalizeMpi();
    return rc;
  }
  if (cmd == "export") {
    auto a = ParseArgs(argc, argv, 2, {});
    if (!a.ok()) return Fail(a.status());
    return Export(*a);
  }
  if (cmd == "eval") {
    auto a = ParseArgs(argc, argv, 2, {});
    if (!a.ok()) return Fail(a.status());
    return Eval(*a);
  }
  if (cmd == "data") return RunDataCommand(argc, argv);
  return Usage();
}
