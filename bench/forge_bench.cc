// forge-bench: throughput of the CUDA training step for a model config, as one JSON line.
//
//   forge-bench --config configs/gpt350m.yaml [--micro-batch B] [--steps N] [--warmup W]
//               [--recompute none|selective|full] [--precision bf16|fp8] [--fp8-lm-head 0|1]
//               [--fp8-fast-accum none|fprop|fprop_dgrad] [--recipe config|torch] [--profile]
//
// One micro-batch per optimizer step (global = micro), random tokens in [0, vocab) like the
// PyTorch anchors (shared/anchors/torch_baseline.py, torch_llama.py). The first `warmup` steps (graph warm-up
// and capture included) are not timed; the next `steps` are timed with CUDA events on the
// backend's stream. MFU = tokens/s * TrainFlopsPerToken / dense BF16 peak of the detected GPU
// (--peak-tflops, or the config's metrics.peak_tflops, overrides). The config's `engine:` keys
// apply. --profile adds a per-phase breakdown of one eager
// step (events around GEMMs, attention, elementwise kernels, the LM-head GEMMs and the
// cross-entropy kernel separately, optimizer; no graph; single-stream even when the step runs
// its weight-gradient GEMMs on a second stream, so phases add up serially).
// --precision fp8 runs the blocks' linear layers in FP8 (precision.fp8 of the config); MFU stays
// counted against the dense BF16 peak so BF16 and FP8 numbers compare. --fp8-lm-head 1 adds
// the LM head's logits GEMM (precision.fp8.lm_head).
// --recipe torch trains as the anchor does: PyTorch's default initialisation (model.init torch:
// embedding ~ N(0, 1), linear weights ~ U(+-1/sqrt(fan_in))) and its AdamW (lr 3e-4, betas 0.9 /
// 0.999, weight decay 0.01, no clipping). Why: the step is power-limited, and its speed depends
// on the values it multiplies by ~1.5% (docs/performance.md), so a like-for-like comparison
// trains the same numbers; FLOPs and kernels are the same either way.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_profile.h"
#include "bench_step.h"
#include "bench_util.h"
#include "common/config.h"
#include "common/peak_flops.h"
#include "worker/model/param_layout.h"
#include "worker/train/cuda_backend.h"

namespace forge {
namespace {

using Json = nlohmann::ordered_json;

struct Args {
  std::string config;
  int micro_batch = 0;  // 0: the config's
  int steps = 20;
  int warmup = 3;
  std::string recompute;  // none|selective|full; empty: the config's
  int cuda_graph = -1;  // --cuda-graph; -1: the config's engine.cuda_graph
  std::string precision;  // "": the config's
  int fp8_lm_head = -1;   // -1: the config's
  std::string fp8_fast;   // --fp8-fast-accum; empty: the config's
  std::string recipe = "config";  // --recipe config|torch
  bool profile = false;
  double peak_tflops = 0.0;  // --peak-tflops; 0: the config's or the device's
};

int Fail(const std::string& msg) { return bench::FailJson("forge-bench", msg); }

FlagParser MakeFlags() {
  FlagParser f("forge-bench", "",
               "Times training steps of one GPU on synthetic tokens; prints one JSON line.");
  f.Value("--config", "PATH", "run config (required)");
  f.Value("--micro-batch", "B", "sequences per step (default: the config's)");
  f.Value("--steps", "N", "timed steps (default 20)");
  f.Value("--warmup", "W", "untimed steps first, >= 1 (default 3)");
  f.Value("--recompute", "none|selective|full", "activation recompute (default: the config's)");
  f.Value("--cuda-graph", "0|1", "replay the step as a CUDA graph (default: engine.cuda_graph)");
  f.Value("--precision", "bf16|fp8", "compute precision (default: the config's)");
  f.Value("--fp8-lm-head", "0|1", "the LM head in FP8 too (default: the config's)");
  f.Value("--fp8-fast-accum", "none|fprop|fprop_dgrad", "FP8 fast accumulation");
  f.Value("--recipe", "config|torch", "torch: init and batches as the PyTorch anchor's");
  f.Value("--peak-tflops", "T", "MFU denominator (default: metrics.peak_tflops or the GPU's)");
  f.Bool("--profile", "per-phase timings (forward, backward, optimizer) in the JSON");
  return f;
}

// Reads the parsed flags into *a; returns an error message, or "" when they are fine.
std::string ReadArgs(const FlagParser& f, Args* a) {
  a->config = f.Get("--config");
  a->profile = f.Has("--profile");
  a->fp8_fast = f.Get("--fp8-fast-accum");
  a->recipe = f.Get("--recipe", a->recipe);
  auto bad = [&](const char* flag) { return bench::BadValue(f, flag); };
  if (!bench::FlagInt(f, "--micro-batch", &a->micro_batch) || (f.Has("--micro-batch") && a->micro_batch <= 0))
    return bad("--micro-batch");
  if (!bench::FlagInt(f, "--steps", &a->steps) || a->steps <= 0) return bad("--steps");
  if (!bench::FlagInt(f, "--warmup", &a->warmup) || a->warmup < 1) return bad("--warmup");
  if (!bench::FlagRecompute(f, &a->recompute)) return bad("--recompute");
  if (!bench::FlagInt(f, "--cuda-graph", &a->cuda_graph) ||
      (f.Has("--cuda-graph") && a->cuda_graph != 0 && a->cuda_graph != 1))
    return bad("--cuda-graph");
  if (!bench::FlagInt(f, "--fp8-lm-head", &a->fp8_lm_head) ||
      (f.Has("--fp8-lm-head") && a->fp8_lm_head != 0 && a->fp8_lm_head != 1))
    return bad("--fp8-lm-head");
  if (!bench::FlagPrecision(f, &a->precision)) return bad("--precision");
  if (a->recipe != "config" && a->recipe != "torch") return bad("--recipe");
  if (!f.GetDouble("--peak-tflops", &a->peak_tflops).ok() || a->peak_tflops < 0.0)
    return bad("--peak-tflops");
  if (a->config.empty()) return "--config is required (see forge-bench --help)";
  return "";
}

// Seconds this process has existed (from /proc: start time vs uptime), so first_step_s counts
// the dynamic loading and CUDA initialisation before main too. 0 where /proc is unreadable.
double ProcessAgeSeconds() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string line;
  double up = 0.0;
  if (!std::getline(stat, line) || !(uptime >> up)) return 0.0;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return 0.0;
  std::istringstream rest(line.substr(paren + 2));
  std::string field;
  // Fields after "pid (comm)" start at 3 (state); starttime is field 22.
  for (int f = 3; f <= 22 && (rest >> field); ++f) {
    if (f == 22) {
      const double ticks = std::strtod(field.c_str(), nullptr);
      const double age = up - ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
      return age > 0.0 ? age : 0.0;
    }
  }
  return 0.0;
}

// Dense BF16 tensor-core peak of the GPU (TFLOP/s): the given one when > 0, else the GPU's
// entry in common/peak_flops.h (0 when unknown).
double PeakTflops(const std::string& gpu, double given) {
  return given > 0.0 ? given : DenseBf16PeakTflops(gpu);
}

int Run(int argc, char** argv) {
  const auto t_main = std::chrono::steady_clock::now();
  const double age_at_main = ProcessAgeSeconds();
  FlagParser flags = MakeFlags();
  if (int rc; bench::ParseFlagsOrExit(flags, "forge-bench", argc, argv, &rc)) return rc;
  Args args;
  if (std::string err = ReadArgs(flags, &args); !err.empty()) return Fail(err);

  StatusOr<RunConfig> loaded = LoadRunConfig(args.config);
  if (!loaded.ok()) return Fail(loaded.status().ToString());
  RunConfig cfg = loaded.value();
  if (args.micro_batch > 0) cfg.batch.micro_batch = args.micro_batch;
  cfg.batch.global_batch = cfg.batch.micro_batch;
  bench::ApplyPrecisionAndRecompute(args.precision, args.recompute, &cfg);
  if (args.fp8_lm_head >= 0) cfg.precision.fp8.lm_head = args.fp8_lm_head == 1;
  if (!args.fp8_fast.empty()) {
    const Status st =
        Fp8FastAccumFromName(args.fp8_fast, "--fp8-fast-accum", &cfg.precision.fp8.fast_accum);
    if (!st.ok()) return bench::FailJson("forge-bench", st.message());
  }
  if (args.recipe == "torch") {  // ../shared/anchors/torch_baseline.py's model and optimizer
    cfg.model.init = InitScheme::kTorch;
    cfg.optimizer.lr = 3e-4f;
    cfg.optimizer.beta1 = 0.9f;
    cfg.optimizer.beta2 = 0.999f;
    cfg.optimizer.eps = 1e-8f;
    cfg.optimizer.weight_decay = 0.01f;
    cfg.optimizer.grad_clip = 0.0f;
  }
  const ModelConfig& m = cfg.model;

  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    return Fail("no CUDA device");
  }
  const std::string gpu = prop.name;

  if (args.cuda_graph >= 0) cfg.engine.cuda_graph = args.cuda_graph == 1;
  const CudaBackendOptions options = CudaBackendOptionsFromConfig(cfg.engine);
  auto made = bench::BenchStep::Make(cfg, options);
  if (!made.ok()) return Fail(made.status().ToString());
  std::unique_ptr<bench::BenchStep> bench_step = std::move(made).value();
  CudaTrainBackend* backend = &bench_step->backend();
  const int64_t n = bench_step->tokens();

  StepStats stats;
  if (Status st = bench_step->Train(true, &stats); !st.ok())
    return Fail("first step: " + st.ToString());
  const double first_step_s =
      age_at_main +
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_main).count();
  for (int i = 1; i < args.warmup; ++i) {
    if (Status st = bench_step->Train(i + 1 == args.warmup, &stats); !st.ok()) {
      return Fail("warm-up: " + st.ToString());
    }
  }

  auto timed = bench_step->MeanStepMs(args.steps);
  if (!timed.ok()) return Fail("timed steps: " + timed.status().ToString());
  if (Status st = bench_step->Train(true, &stats); !st.ok())
    return Fail("last step: " + st.ToString());

  const double step_ms = *timed;
  const double tokens_per_s = static_cast<double>(n) / (step_ms * 1e-3);
  const double peak_tflops =
      PeakTflops(gpu, args.peak_tflops > 0.0 ? args.peak_tflops : cfg.metrics.peak_tflops);
  const ParamLayout layout = MakeParamLayout(m);

  Json out;
  out["model"] = m.preset.empty() ? cfg.name : m.preset;
  out["B"] = cfg.batch.micro_batch;
  out["T"] = m.seq_len;
  out["params"] = layout.total;
  out["step_ms"] = step_ms;
  out["tokens_per_s"] = tokens_per_s;
  out["mfu"] = peak_tflops > 0.0
                   ? Json(ModelFlopsUtilization(tokens_per_s, TrainFlopsPerToken(m), peak_tflops))
                   : Json(nullptr);
  out["peak_mem_gib"] = static_cast<double>(backend->peak_bytes()) / double(1ull << 30);
  out["first_step_s"] = first_step_s;
  out["gpu"] = gpu;
  out["peak_tflops"] = peak_tflops;
  out["recompute"] = RecomputeName(cfg.train.activation_recompute);
  out["precision"] = PrecisionName(cfg.precision.compute);
  out["fp8_lm_head"] = cfg.precision.compute == Precision::kFp8 && cfg.precision.fp8.lm_head;
  out["fp8_lm_head_wgrad"] = out["fp8_lm_head"].get<bool>() && options.fp8_lm_head_wgrad;
  out["fp8_fast_accum"] = cfg.precision.compute == Precision::kFp8
                              ? Fp8FastAccumName(cfg.precision.fp8.fast_accum)
                              : "none";
  out["mfu_basis"] = "dense BF16 peak";
  out["cuda_graph"] = backend->graph_active();
  out["deterministic_attention"] = options.deterministic_attention;
  out["lm_head_chunk_rows"] = options.lm_head_chunk_rows;
  out["wgrad_stream"] = options.wgrad_stream;
  out["norm_dw_on_wgrad"] = options.norm_dw_on_wgrad;
  out["wgrad_priority"] = options.wgrad_stream ? options.wgrad_priority : 0;
  out["wgrad_sm_margin"] = options.wgrad_sm_margin;  // -1: a quarter of the SMs (FP8: 3/8)
  out["defer_update"] = options.defer_update;
  out["fp8_attention_rope"] =
      cfg.precision.compute == Precision::kFp8 && options.fp8_attention_rope;
  out["recipe"] = args.recipe;
  out["loss"] = stats.loss;

  if (args.profile) {
    auto phases = bench_step->Profile();
    if (!phases.ok()) return Fail("profile: " + phases.status().ToString());
    out["phases_ms"] = bench::PhasesJson<Json>(*phases);
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) { return forge::Run(argc, argv); }
