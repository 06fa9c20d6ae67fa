// forge-gemm-bench: the GEMMs of one gpt350m training step, one by one, as JSON lines.
//
//   forge-gemm-bench [--tokens 16384] [--d 1024] [--qkv 3072] [--ffn 2816] [--layers 24]
//                    [--vocab 50304] [--lm-chunk 4096] [--dw-accumulate 0|1] [--reps 20]
//                    [--warmup 3] [--sets 3] [--max-candidates 32] [--workspace-mb 64]
//                    [--only SUBSTRING] [--no-sweep] [--all]
//
// For each GEMM (forward, backward-data and weight-gradient of wqkv, wo, w_gate_up, w_down,
// then the LM head's logits, dh and dWte on one chunk of rows), with the operand layouts,
// types and accumulation the CUDA model uses (cuda_model.cc: Linear, LinearBackwardData,
// LinearBackwardWeight):
// - "heuristic": a GemmRunner with the split-K rule and autotuning off (the heuristic's
//   first choice, what the step ran before the rule);
// - "default": a GemmRunner as Init configures it (split-K rule on, autotuning off), i.e. what
//   the step runs, with the split-K rule's note;
// - "best": the fastest of a sweep over every heuristic candidate (up to --max-candidates)
//   x split-K {as returned, 1, 2, 3, 4, 6, 8} with the fp32 workspace reduction, skipping
//   what cublasLtMatmulAlgoCheck rejects or needs more than the workspace;
// - "cand0_split_us": the heuristic's first candidate at each split, next to the rule's
//   model prediction ("model_us"), to check the model against the card;
// - "check_rel_diff": ||best - default|| / ||default|| on the same operands (the sweep's
//   configuration computes the same product).
// Times: CUDA events around each call, median of --reps calls after --warmup, the calls
// rotating over --sets independent operand sets (so L2 holds none of them from the previous
// call). Random non-zero bf16 inputs. A last line sums each column over a whole step (block
// GEMMs x layers, LM-head GEMMs x tokens / lm-chunk). --all adds one line per timed
// configuration.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cuda_bench_util.h"
#include "common/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"

namespace forge {
namespace {

using cuda::DType;
using cuda::GemmAlgoInfo;
using cuda::GemmArgs;
using cuda::GemmRunner;
using Json = nlohmann::ordered_json;
using bench::Alloc;
using bench::DevBuf;
using bench::DownloadBf16;
using bench::RandomPool;
using bench::RelDiff;
using bench::Timer;

struct Args {
  int64_t tokens = 16384, d = 1024, qkv = 3072, ffn = 2816, layers = 24, vocab = 50304;
  int64_t lm_chunk = 4096;
  bool dw_accumulate = false;  // block dW GEMMs: beta = 0 is the first (here only) micro-step
  int reps = 20, warmup = 3, sets = 3, max_candidates = 32, workspace_mb = 64;
  std::string only;
  bool sweep = true;
  bool all = false;
};

// One GEMM of the step, in GemmArgs terms.
struct Spec {
  std::string name;  // e.g. "w_down.dW"
  std::string kind;  // fwd | bwd_data | bwd_weight
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = true;
  DType d_type = DType::kBf16;
  bool accumulate = false;
  bool separate_c = false;  // residual add from another buffer (forward wo, w_down)
  int64_t per_step = 1;
};

std::vector<Spec> StepGemms(const Args& a) {
  struct Linear {
    const char* name;
    int64_t in, out;
    bool residual;
  };
  const Linear linears[] = {{"wqkv", a.d, a.qkv, false},
                            {"wo", a.d, a.d, true},
                            {"w_gate_up", a.d, 2 * a.ffn, false},
                            {"w_down", a.ffn, a.d, true}};
  std::vector<Spec> out;
  for (const Linear& l : linears) {
    const std::string n = l.name;
    // y[T, out] = x[T, in] W[out, in]^T (+ residual)
    out.push_back({n + ".fwd", "fwd", a.tokens, l.out, l.in, false, true, DType::kBf16,
                   l.residual, l.residual, a.layers});
    // dx[T, in] = dy[T, out] W[out, in]
    out.push_back({n + ".dx", "bwd_data", a.tokens, l.in, l.out, false, false, DType::kBf16,
                   false, false, a.layers});
    // dW[out, in] (+)= dy[T, out]^T x[T, in], fp32
    out.push_back({n + ".dW", "bwd_weight", l.out, l.in, a.tokens, true, false, DType::kFp32,
                   a.dw_accumulate, false, a.layers});
  }
  const int64_t chunks = (a.tokens + a.lm_chunk - 1) / a.lm_chunk;
  const int64_t rows = std::min(a.lm_chunk, a.tokens);
  out.push_back({"lm_head.fwd", "fwd", rows, a.vocab, a.d, false, true, DType::kBf16, false,
                 false, chunks});
  out.push_back({"lm_head.dx", "bwd_data", rows, a.d, a.vocab, false, false, DType::kBf16, false,
                 false, chunks});
  // Every chunk but the first of a step accumulates into dWte.
  out.push_back({"lm_head.dW", "bwd_weight", a.vocab, a.d, rows, true, false, DType::kFp32, true,
                 false, chunks});
  return out;
}

int Fail(const std::string& msg) { return bench::FailJson("forge-gemm-bench", msg); }

FlagParser MakeFlags() {
  FlagParser f("forge-gemm-bench", "",
               "Times cuBLASLt's algorithms for the step's GEMM shapes; prints JSON lines.");
  f.Value("--tokens", "T", "token rows (default 16384)");
  f.Value("--d", "D", "model width (default 1024)");
  f.Value("--qkv", "N", "QKV output width (default 3072)");
  f.Value("--ffn", "F", "SwiGLU hidden width (default 2816)");
  f.Value("--layers", "L", "blocks (default 24)");
  f.Value("--vocab", "V", "padded vocabulary (default 50304)");
  f.Value("--lm-chunk", "R", "LM-head rows per chunk (default 4096)");
  f.Value("--dw-accumulate", "0|1", "block dW GEMMs accumulate (beta 1)");
  f.Value("--reps", "N", "timed calls per set (default 20)");
  f.Value("--warmup", "N", "untimed calls first (default 3)");
  f.Value("--sets", "N", "timed sets, the best kept (default 3)");
  f.Value("--max-candidates", "N", "algorithms tried per shape (default 32)");
  f.Value("--workspace-mb", "MB", "cuBLASLt workspace (default 64)");
  f.Value("--only", "NAME", "only the shapes whose name contains NAME");
  f.Bool("--no-sweep", "time the heuristic's choice only");
  f.Bool("--all", "print every candidate's time");
  return f;
}

// Reads the parsed flags into *a; returns an error message, or "" when they are fine.
std::string ReadArgs(const FlagParser& f, Args* a) {
  a->sweep = !f.Has("--no-sweep");
  a->all = f.Has("--all");
  a->only = f.Get("--only");
  const std::pair<const char*, int64_t*> sizes[] = {
      {"--tokens", &a->tokens}, {"--d", &a->d},         {"--qkv", &a->qkv},
      {"--ffn", &a->ffn},       {"--layers", &a->layers}, {"--vocab", &a->vocab},
      {"--lm-chunk", &a->lm_chunk}};
  const std::pair<const char*, int*> counts[] = {
      {"--reps", &a->reps}, {"--warmup", &a->warmup}, {"--sets", &a->sets},
      {"--max-candidates", &a->max_candidates}, {"--workspace-mb", &a->workspace_mb}};
  for (const auto& [flag, out] : sizes)
    if (!bench::FlagInt(f, flag, out) || *out < 0) return bench::BadValue(f, flag);
  for (const auto& [flag, out] : counts)
    if (!bench::FlagInt(f, flag, out) || *out < 0) return bench::BadValue(f, flag);
  int dw = a->dw_accumulate ? 1 : 0;
  if (!bench::FlagInt(f, "--dw-accumulate", &dw)) return bench::BadValue(f, "--dw-accumulate");
  a->dw_accumulate = dw != 0;
  if (a->tokens < 1 || a->d < 1 || a->qkv < 1 || a->ffn < 1 || a->vocab < 1 || a->lm_chunk < 1 ||
      a->reps < 1 || a->sets < 1 || a->max_candidates < 1) {
    return "sizes, --reps, --sets and --max-candidates must be >= 1";
  }
  return "";
}

double Round(double x, int digits) {
  const double f = std::pow(10.0, digits);
  return std::round(x * f) / f;
}

Json AlgoJson(const GemmAlgoInfo& i) {
  return Json{{"id", i.id},
              {"tile", cuda::TileName(i.tile)},
              {"tile_id", i.tile},
              {"stages", cuda::StagesName(i.stages)},
              {"stages_id", i.stages},
              {"splitk", i.splitk},
              {"reduction", cuda::ReductionName(i.reduction)},
              {"swizzle", i.swizzle},
              {"custom", i.custom},
              {"inner_shape", i.inner_shape},
              {"cluster", cuda::ClusterName(i.cluster)},
              {"waves", Round(i.waves, 3)},
              {"workspace", i.workspace}};
}

// Operands of one GEMM, `sets` times over.
struct Operands {
  std::vector<DevBuf> a, b, c, d;
  std::vector<GemmArgs> args;
};

Status MakeOperands(const Spec& s, int sets, const RandomPool& pool, Operands* o) {
  const size_t d_elem = s.d_type == DType::kFp32 ? 4 : 2;
  for (int i = 0; i < sets; ++i) {
    o->a.emplace_back();
    o->b.emplace_back();
    o->d.emplace_back();
    FORGE_RETURN_IF_ERROR(Alloc(&o->a.back(), size_t(s.M * s.K) * 2));
    FORGE_RETURN_IF_ERROR(Alloc(&o->b.back(), size_t(s.N * s.K) * 2));
    FORGE_RETURN_IF_ERROR(Alloc(&o->d.back(), size_t(s.M * s.N) * d_elem));
    FORGE_RETURN_IF_ERROR(pool.Fill(o->a.back().p, size_t(s.M * s.K), 3 * i + 1));
    FORGE_RETURN_IF_ERROR(pool.Fill(o->b.back().p, size_t(s.N * s.K), 3 * i + 2));
    FORGE_CUDA_CHECK(cudaMemset(o->d.back().p, 0, o->d.back().bytes));
    GemmArgs g;
    g.M = s.M, g.N = s.N, g.K = s.K;
    g.trans_a = s.trans_a, g.trans_b = s.trans_b;
    g.d_type = s.d_type;
    g.accumulate = s.accumulate;
    g.A = o->a.back().p, g.B = o->b.back().p, g.D = o->d.back().p;
    if (s.separate_c) {  // bf16 residual
      o->c.emplace_back();
      FORGE_RETURN_IF_ERROR(Alloc(&o->c.back(), size_t(s.M * s.N) * 2));
      FORGE_RETURN_IF_ERROR(pool.Fill(o->c.back().p, size_t(s.M * s.N), 3 * i + 3));
      g.C = o->c.back().p;
    }
    o->args.push_back(g);
  }
  return Status::Ok();
}

// D of set 0 as floats, after zeroing it and running `launch(0)` (an in-place accumulation
// then holds exactly the product; a separate C is only read).
StatusOr<std::vector<float>> ResultOf(const Spec& s, Operands& o,
                                      const std::function<Status(int)>& launch,
                                      cudaStream_t stream) {
  FORGE_CUDA_CHECK(cudaMemsetAsync(o.d[0].p, 0, o.d[0].bytes, stream));
  FORGE_RETURN_IF_ERROR(launch(0));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  const size_t n = size_t(s.M * s.N);
  if (s.d_type != DType::kFp32) return DownloadBf16(o.d[0].p, n);
  std::vector<float> out(n);
  FORGE_CUDA_CHECK(cudaMemcpy(out.data(), o.d[0].p, n * 4, cudaMemcpyDeviceToHost));
  return out;
}

double Tflops(const Spec& s, double us) {
  return us > 0.0 ? 2.0 * double(s.M) * double(s.N) * double(s.K) / (us * 1e6) : 0.0;
}

Json Timing(const Spec& s, double us, const GemmAlgoInfo& algo) {
  return Json{{"us", Round(us, 1)}, {"tflops", Round(Tflops(s, us), 1)}, {"algo", AlgoJson(algo)}};
}

struct Totals {
  double heuristic = 0.0, deflt = 0.0, best = 0.0;  // us per step
};

struct Config {
  int candidate = 0;
  cublasLtMatmulAlgo_t algo{};
  GemmAlgoInfo info;
  float us = 0.0f;
};

Status BenchOne(const Args& args, const Spec& s, const RandomPool& pool, GemmRunner& plain,
                GemmRunner& deflt, cudaStream_t stream, Totals* sums, Totals* kind_sums) {
  Operands o;
  FORGE_RETURN_IF_ERROR(MakeOperands(s, args.sets, pool, &o));
  Timer timer(stream, args.warmup, args.reps, args.sets);

  auto run_plain = [&](int set) { return plain.Run(o.args[size_t(set)], stream); };
  auto run_default = [&](int set) { return deflt.Run(o.args[size_t(set)], stream); };
  FORGE_ASSIGN_OR_RETURN(const auto us, timer.MedianPair(run_plain, run_default));
  const float heuristic_us = us.first, default_us = us.second;
  FORGE_ASSIGN_OR_RETURN(const cuda::GemmTuneRecord heuristic_rec,
                         plain.PlanRecord(o.args[0], stream));
  FORGE_ASSIGN_OR_RETURN(const cuda::GemmTuneRecord default_rec,
                         deflt.PlanRecord(o.args[0], stream));

  Json line{{"gemm", s.name},
            {"kind", s.kind},
            {"M", s.M},
            {"N", s.N},
            {"K", s.K},
            {"trans_a", s.trans_a},
            {"trans_b", s.trans_b},
            {"out", s.d_type == DType::kFp32 ? "fp32" : "bf16"},
            {"accumulate", s.accumulate ? (s.separate_c ? "separate_c" : "in_place") : "no"},
            {"per_step", s.per_step},
            {"heuristic", Timing(s, heuristic_us, heuristic_rec.algo)}};
  Json def = Timing(s, default_us, default_rec.algo);
  def["splitk_rule"] = default_rec.splitk;
  def["splitk_note"] = default_rec.splitk_note;
  if (default_rec.note != "autotune off") def["autotune"] = default_rec.note;
  line["default"] = def;

  double best_us = default_us;
  if (args.sweep) {
    FORGE_ASSIGN_OR_RETURN(const std::vector<cuda::GemmCandidate> cands,
                           plain.Candidates(o.args[0], args.max_candidates, stream));
    std::vector<Config> timed;
    int rejected = 0, failed = 0;
    Json cand0_split = Json::object(), model = Json::object();
    const cuda::SplitKProblem problem{s.M, s.N, s.K, double(cands[0].info.waves)};
    for (size_t ci = 0; ci < cands.size(); ++ci) {
      // The candidate as returned, then at each split it was not returned with.
      std::vector<int> splits{0};
      for (int k : {1, 2, 3, 4, 6, 8}) {
        if (k != cands[ci].info.splitk) splits.push_back(k);
      }
      for (int k : splits) {
        Config c;
        c.candidate = int(ci);
        c.algo = cands[ci].algo;
        if (k > 0 && !cuda::SetSplitK(&c.algo, k).ok()) {
          ++rejected;
          continue;
        }
        StatusOr<GemmAlgoInfo> info = plain.CheckAlgo(o.args[0], c.algo, stream);
        if (!info.ok()) {
          ++rejected;
          continue;
        }
        c.info = info.value();
        StatusOr<float> us = timer.Median(
            [&](int set) { return plain.RunWithAlgo(o.args[size_t(set)], c.algo, stream); });
        if (!us.ok()) {
          ++failed;
          (void)cudaGetLastError();
          continue;
        }
        c.us = us.value();
        timed.push_back(c);
        if (ci == 0) {
          const std::string key = std::to_string(c.info.splitk);
          if (!cand0_split.contains(key)) cand0_split[key] = Round(c.us, 1);
          model[key] = Round(cuda::PredictSplitKUs(problem, c.info.splitk), 1);
        }
        if (args.all) {
          Json cfg{{"gemm", s.name}, {"candidate", ci}, {"us", Round(c.us, 1)},
                   {"tflops", Round(Tflops(s, c.us), 1)}, {"algo", AlgoJson(c.info)}};
          std::printf("%s\n", cfg.dump().c_str());
        }
      }
    }
    if (timed.empty()) return Status::Internal(s.name + ": no configuration of the sweep ran");
    std::stable_sort(timed.begin(), timed.end(),
                     [](const Config& x, const Config& y) { return x.us < y.us; });
    const Config& best = timed.front();
    best_us = std::min<double>(best.us, default_us);
    Json bj = Timing(s, best.us, best.info);
    bj["candidate"] = best.candidate;
    line["best"] = bj;
    Json top = Json::array();
    for (size_t i = 0; i < std::min<size_t>(5, timed.size()); ++i) {
      top.push_back(Json{{"candidate", timed[i].candidate},
                         {"us", Round(timed[i].us, 1)},
                         {"desc", cuda::Describe(timed[i].info)}});
    }
    line["top5"] = top;
    line["cand0_split_us"] = cand0_split;
    line["model_us"] = model;
    line["candidates"] = cands.size();
    line["configs_timed"] = timed.size();
    line["configs_rejected"] = rejected;
    line["configs_failed"] = failed;

    FORGE_ASSIGN_OR_RETURN(const std::vector<float> ref, ResultOf(s, o, run_default, stream));
    FORGE_ASSIGN_OR_RETURN(
        const std::vector<float> got,
        ResultOf(s, o, [&](int set) { return plain.RunWithAlgo(o.args[size_t(set)], best.algo, stream); },
                 stream));
    line["check_rel_diff"] = RelDiff(got, ref);
  }
  line["gain_default_vs_heuristic_us_per_step"] =
      Round((heuristic_us - default_us) * double(s.per_step), 1);
  line["gain_best_vs_default_us_per_step"] = Round((default_us - best_us) * double(s.per_step), 1);
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);

  for (Totals* t : {sums, kind_sums}) {
    t->heuristic += heuristic_us * double(s.per_step);
    t->deflt += default_us * double(s.per_step);
    t->best += best_us * double(s.per_step);
  }
  return Status::Ok();
}

Json TotalsJson(const Totals& t) {
  return Json{{"heuristic_ms", Round(t.heuristic / 1000.0, 3)},
              {"default_ms", Round(t.deflt / 1000.0, 3)},
              {"best_ms", Round(t.best / 1000.0, 3)}};
}

int Run(int argc, char** argv) {
  FlagParser flags = MakeFlags();
  if (int rc; bench::ParseFlagsOrExit(flags, "forge-gemm-bench", argc, argv, &rc)) return rc;
  Args args;
  if (std::string err = ReadArgs(flags, &args); !err.empty()) return Fail(err);
  int device = 0, sms = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    return Fail("no CUDA device");
  }
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);

  const size_t ws = size_t(args.workspace_mb) << 20;
  GemmRunner plain, deflt;
  Status st = plain.Init(ws);
  if (st.ok()) st = deflt.Init(ws);
  if (!st.ok()) return Fail(st.ToString());
  plain.set_splitk(false);
  plain.set_autotune(false);
  RandomPool pool;
  if (Status p = pool.Init(); !p.ok()) return Fail(p.ToString());
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return Fail("cudaStreamCreate failed");
  }

  Json header{{"device", prop.name},
              {"sms", sms},
              {"l2_mb", prop.l2CacheSize >> 20},
              {"cublaslt_version", cublasLtGetVersion()},
              {"default_splitk_rule", deflt.splitk()},
              {"default_autotune", deflt.autotune()},
              {"tokens", args.tokens},
              {"layers", args.layers},
              {"reps", args.reps},
              {"sets", args.sets},
              {"workspace_mb", args.workspace_mb}};
  std::printf("%s\n", header.dump().c_str());
  std::fflush(stdout);

  Totals total, by_kind[3];
  const char* kinds[3] = {"fwd", "bwd_data", "bwd_weight"};
  int rc = 0;
  for (const Spec& s : StepGemms(args)) {
    if (!args.only.empty() && s.name.find(args.only) == std::string::npos) continue;
    int k = 0;
    while (k < 2 && s.kind != kinds[k]) ++k;
    const Status r = BenchOne(args, s, pool, plain, deflt, stream, &total, &by_kind[k]);
    if (!r.ok()) {
      std::printf("%s\n", Json{{"gemm", s.name}, {"error", r.ToString()}}.dump().c_str());
      rc = 1;
    }
  }
  Json step{{"step", TotalsJson(total)}};
  for (int k = 0; k < 3; ++k) step[kinds[k]] = TotalsJson(by_kind[k]);
  step["gain_default_vs_heuristic_ms"] = Round((total.heuristic - total.deflt) / 1000.0, 3);
  step["gain_best_vs_default_ms"] = Round((total.deflt - total.best) / 1000.0, 3);
  std::printf("%s\n", step.dump().c_str());
  cudaStreamDestroy(stream);
  return rc;
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) { return forge::Run(argc, argv); }
