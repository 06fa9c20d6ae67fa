// forge-sdpa-bench: cuDNN causal flash attention (SdpaRunner) engine by engine, as JSON lines.
//
//   forge-sdpa-bench [--reps 20] [--warmup 3] [--sets 3] [--batch 16] [--seq 1024]
//                    [--only gpt350m|gpt124m|llama3-1b|llama3-3b|llama3-8b] [--no-tune]
//
// Shapes: the attention of gpt350m (H = 16, 24 layers) and gpt124m (H = 12, 12 layers), both
// hd = 64 (MHA: KV = H), by default; with --only, Llama 3's 1B (32 heads over 8 KV heads of 64,
// 16 layers), 3B (24 / 8 of 128, 28 layers) or 8B (32 / 8 of 128, 32 layers). B and T from
// --batch and --seq (16 and 1024 by default). Graph kinds: "fwd" (one graph in both modes),
// "bwd" (fp32 dQ accumulator) and "bwd-det" (deterministic backward). For each (shape, kind)
// every engine config the runner's tuner would consider (SdpaRunner::EngineCandidates: up to
// kMaxCandidates from heuristics modes A, B, fallback; index 0 is heuristics' first, what
// FORGE_PLAN_CACHE=off runs) is forced with UseEngine and timed through Forward / Backward:
// CUDA events between consecutive calls, median of --reps calls after --warmup, the calls
// rotating over --sets independent operand sets (random bf16, ~unit variance). One line per
// (shape, kind): first and best engine and time, every engine's time, ||best - first|| /
// ||first|| of the output (O, or the whole dQKV), and "tuned": what the runner's own tuning
// picks (a fresh runner on a private temporary plan cache; --no-tune skips it) with the
// bench's time for that engine. A last line gives per-step totals (x layers, fwd + bwd) for
// first vs best vs tuned, in both modes. A "bwd-flash" line times our own backward
// (SdpaBackwardKernel::kFlash) on the same O and Stats interleaved with cuDNN's best engine of
// each mode (Timer::MedianPair: every rep runs both, in turn first, so both see the same power
// state; the engines above are timed one after another), and a "bwd-flash-fp8" line the same
// with FP8 outputs (FlashBackwardFp8Out: an FP8 step's QKV gradient casts with RoPE's inverse)
// interleaved with the bf16 backward followed by RopeBackwardFp8 over the whole gradient (what
// it replaces).
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "common/status.h"
#include "cuda_bench_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/plan_cache.h"
#include "kernels/cuda/rope_fp8.h"
#include "kernels/cuda/sdpa.h"

namespace forge {
namespace {

using bench::Alloc;
using bench::DevBuf;
using cuda::bf16;
using cuda::SdpaEngineCandidate;
using cuda::SdpaRunner;
using cuda::SdpaShape;
using Json = nlohmann::ordered_json;

struct Args {
  int reps = 20, warmup = 3, sets = 3, batch = 16, seq = 1024;
  std::string only;
  bool tune = true;
};

struct Model {
  std::string name;
  int heads = 0, kv_heads = 0, hd = 0, layers = 0;
  bool by_default = true;  // else only with --only NAME
};

FlagParser MakeFlags() {
  FlagParser f("forge-sdpa-bench", "",
               "Times causal flash attention forward and backward (cuDNN and ours) at the "
               "models' shapes; prints JSON lines.");
  f.Value("--reps", "N", "timed calls per set (default 20)");
  f.Value("--warmup", "N", "untimed calls first (default 3)");
  f.Value("--sets", "N", "timed sets, the best kept (default 3)");
  f.Value("--batch", "B", "sequences (default 16)");
  f.Value("--seq", "T", "sequence length (default 1024)");
  f.Value("--only", "NAME", "only this model (gpt350m, gpt124m, llama3-1b, llama3-3b, llama3-8b)");
  f.Bool("--no-tune", "the heuristic's engine only");
  return f;
}

// Reads the parsed flags into *a; returns an error message, or "" when they are fine.
std::string ReadArgs(const FlagParser& f, Args* a) {
  a->tune = !f.Has("--no-tune");
  a->only = f.Get("--only");
  const std::pair<const char*, int*> counts[] = {{"--reps", &a->reps}, {"--warmup", &a->warmup},
                                                 {"--sets", &a->sets}, {"--batch", &a->batch},
                                                 {"--seq", &a->seq}};
  for (const auto& [flag, out] : counts)
    if (!bench::FlagInt(f, flag, out) || *out < 1 || *out > (1 << 20))
      return bench::BadValue(f, flag);
  return "";
}

double Round(double x, int digits) {
  const double f = std::pow(10.0, digits);
  return std::round(x * f) / f;
}

// Random bf16 with unit variance (uniform on [-sqrt 3, sqrt 3]), from a xorshift stream. Not
// bench::RandomPool (|v| in [0.25, 1), variance ~0.44): the attention's score scale and the
// first-vs-best difference reported are for unit-variance operands, as they always were.
std::vector<uint16_t> RandomBf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float u = float(x >> 40) * (1.0f / float(1 << 24));  // [0, 1)
    out[i] = bench::Bf16Bits((2.0f * u - 1.0f) * 1.7320508f);
  }
  return out;
}

// One independent set of operands and outputs for forward + backward.
struct OperandSet {
  DevBuf qkv, out, dout, dqkv;           // bf16
  DevBuf stats, softmax_sum, dq_accum;   // fp32
};

Status MakeSet(const SdpaShape& s, uint64_t seed, OperandSet* o) {
  const size_t tokens = size_t(s.B) * s.T, rows = size_t(s.B) * s.H * s.T;
  const size_t n_qkv = tokens * (s.H + 2 * s.KV) * s.hd, n_out = tokens * s.H * s.hd;
  FORGE_RETURN_IF_ERROR(Alloc(&o->qkv, n_qkv * sizeof(bf16)));
  FORGE_RETURN_IF_ERROR(Alloc(&o->out, n_out * sizeof(bf16)));
  FORGE_RETURN_IF_ERROR(Alloc(&o->dout, n_out * sizeof(bf16)));
  FORGE_RETURN_IF_ERROR(Alloc(&o->dqkv, n_qkv * sizeof(bf16)));
  FORGE_RETURN_IF_ERROR(Alloc(&o->stats, rows * sizeof(float)));
  FORGE_RETURN_IF_ERROR(Alloc(&o->softmax_sum, rows * sizeof(float)));
  FORGE_RETURN_IF_ERROR(Alloc(&o->dq_accum, rows * s.hd * sizeof(float)));
  const std::vector<uint16_t> qkv = RandomBf16(n_qkv, seed), dout = RandomBf16(n_out, seed + 1);
  FORGE_CUDA_CHECK(cudaMemcpy(o->qkv.p, qkv.data(), n_qkv * 2, cudaMemcpyHostToDevice));
  FORGE_CUDA_CHECK(cudaMemcpy(o->dout.p, dout.data(), n_out * 2, cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status Forward(SdpaRunner& r, const SdpaShape& s, OperandSet& o, cudaStream_t stream) {
  return r.Forward(s, o.qkv.As<bf16>(), o.out.As<bf16>(), o.stats.As<float>(), stream);
}

Status Backward(SdpaRunner& r, const SdpaShape& s, OperandSet& o, bool det,
                cudaStream_t stream) {
  return r.Backward(s, o.qkv.As<bf16>(), o.out.As<bf16>(), o.dout.As<bf16>(),
                    o.stats.As<float>(), o.dqkv.As<bf16>(), o.softmax_sum.As<float>(),
                    det ? nullptr : o.dq_accum.As<float>(), stream);
}

// Median ms of call(set) over a.reps calls after a.warmup, sets rotating (bench::Timer with
// back-to-back events: a call's time runs from the end of the one before).
StatusOr<double> MedianMs(const Args& a, cudaStream_t stream,
                          const std::function<Status(int)>& call) {
  bench::Timer timer(stream, a.warmup, a.reps, a.sets, bench::Timer::Events::kBackToBack);
  FORGE_ASSIGN_OR_RETURN(const float ms, timer.MedianMs(call));
  return double(ms);
}

// Median ms of two calls timed interleaved (bench::Timer::MedianPair: each rep runs both, in
// turn first), so that both run in the same power state.
StatusOr<std::pair<double, double>> MedianPairMs(const Args& a, cudaStream_t stream,
                                                 const std::function<Status(int)>& first,
                                                 const std::function<Status(int)>& second) {
  bench::Timer timer(stream, a.warmup, a.reps, a.sets);
  FORGE_ASSIGN_OR_RETURN(const auto us, timer.MedianPair(first, second));
  return std::pair<double, double>(us.first / 1000.0, us.second / 1000.0);
}

// n bf16 values at p as floats, once the device is idle (the bench's stream is non-blocking:
// cudaMemcpy alone would not wait for it).
StatusOr<std::vector<float>> Download(const void* p, size_t n) {
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());
  return bench::DownloadBf16(p, n);
}

// One (shape, kind) result.
struct KindResult {
  double first_ms = 0, best_ms = 0, tuned_ms = 0;
  bool have_tuned = false;
  Json line;
};

// Times every candidate engine of one graph through call(set); fills the JSON line.
StatusOr<KindResult> BenchKind(const Args& a, SdpaRunner& runner, const SdpaShape& s,
                               bool backward, cudaStream_t stream,
                               const std::function<Status(int)>& call,
                               const std::function<StatusOr<std::vector<float>>()>& output) {
  FORGE_ASSIGN_OR_RETURN(const std::vector<SdpaEngineCandidate> cands,
                         runner.EngineCandidates(s, backward));
  KindResult res;
  Json engines = Json::array();
  std::vector<double> times(cands.size(), INFINITY);
  for (size_t i = 0; i < cands.size(); ++i) {
    const SdpaEngineCandidate& c = cands[i];
    Json e{{"engine", c.engine},
           {"workspace_mb", Round(double(c.workspace_bytes) / (1 << 20), 1)},
           {"nondeterministic", c.nondeterministic},
           {"runtime_compiled", c.runtime_compiled}};
    Status st = runner.UseEngine(s, backward, c.engine);
    StatusOr<double> ms = st.ok() ? MedianMs(a, stream, call) : StatusOr<double>(st);
    if (ms.ok()) {
      times[i] = *ms;
      e["ms"] = Round(*ms, 4);
    } else {
      e["error"] = ms.status().ToString();
      (void)cudaGetLastError();
    }
    engines.push_back(e);
  }
  const size_t best = size_t(std::min_element(times.begin(), times.end()) - times.begin());
  if (!std::isfinite(times[best])) return Status::Internal("no engine config ran");
  res.first_ms = std::isfinite(times[0]) ? times[0] : 0.0;
  res.best_ms = times[best];

  // Same operands through the first and the best engine.
  double rel = 0.0;
  if (best != 0 && std::isfinite(times[0])) {
    FORGE_RETURN_IF_ERROR(runner.UseEngine(s, backward, cands[0].engine));
    FORGE_RETURN_IF_ERROR(call(0));
    FORGE_ASSIGN_OR_RETURN(const std::vector<float> ref, output());
    FORGE_RETURN_IF_ERROR(runner.UseEngine(s, backward, cands[best].engine));
    FORGE_RETURN_IF_ERROR(call(0));
    FORGE_ASSIGN_OR_RETURN(const std::vector<float> got, output());
    rel = bench::RelDiff(got, ref);
  }
  res.line = Json{{"candidates", cands.size()},
                  {"first_engine", cands[0].engine},
                  {"first_ms", Round(res.first_ms, 4)},
                  {"best_engine", cands[best].engine},
                  {"best_ms", Round(res.best_ms, 4)},
                  {"best_speedup", Round(res.first_ms / res.best_ms, 3)},
                  {"best_vs_first_rel_diff", rel},
                  {"engines", engines}};
  // Leave the best engine in place (the backward of this runner reads the forward's O/Stats).
  FORGE_RETURN_IF_ERROR(runner.UseEngine(s, backward, cands[best].engine));
  return res;
}

// What the runner's own tuning picks for fwd and bwd: a fresh runner on a private plan
// cache file, one forward and one backward on set 0. Returns the plan log.
StatusOr<std::vector<cuda::SdpaPlanInfo>> TunedChoices(const SdpaShape& s, bool det,
                                                       OperandSet& o, cudaStream_t stream) {
  const std::string path = "/tmp/forge_sdpa_bench_plans_" + std::to_string(getpid()) + ".json";
  std::remove(path.c_str());
  SdpaRunner runner;
  FORGE_RETURN_IF_ERROR(runner.Init(det, cuda::SdpaBackwardKernel::kCudnn));
  runner.set_plan_cache(cuda::PlanCache(path));
  Status st = Forward(runner, s, o, stream);
  if (st.ok()) st = Backward(runner, s, o, det, stream);
  if (st.ok()) st = [&]() -> Status {
    FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return Status::Ok();
  }();
  std::remove(path.c_str());
  std::remove((path + ".lock").c_str());
  FORGE_RETURN_IF_ERROR(st);
  return runner.plan_log();
}

// Adds "tuned" to a line: the runner's choice and the bench's time for that engine.
void AddTuned(const cuda::SdpaPlanInfo& info, KindResult* r) {
  r->line["tuned_engine"] = info.engine;
  r->line["tuned_source"] = info.source;
  r->line["tuned_own_ms"] = Round(info.chosen_ms, 4);
  for (const Json& e : r->line["engines"]) {
    if (e["engine"] == info.engine && e.contains("ms")) {
      r->tuned_ms = e["ms"].get<double>();
      r->have_tuned = true;
      r->line["tuned_ms"] = r->tuned_ms;
    }
  }
  if (!info.note.empty()) r->line["tuned_note"] = info.note;
}

Status BenchModel(const Args& a, const Model& m, cudaStream_t stream, Json* summary) {
  const SdpaShape s{a.batch, a.seq, m.heads, m.kv_heads, m.hd};
  std::vector<OperandSet> sets(size_t(a.sets));
  for (int i = 0; i < a.sets; ++i) {
    FORGE_RETURN_IF_ERROR(MakeSet(s, 1000 + 17 * uint64_t(i), &sets[size_t(i)]));
  }
  const size_t n_out = size_t(s.B) * s.T * s.H * s.hd;
  const size_t n_qkv = size_t(s.B) * s.T * (s.H + 2 * s.KV) * s.hd;
  auto base = [&](const std::string& kind) {
    return Json{{"model", m.name}, {"kind", kind}, {"B", s.B}, {"T", s.T}, {"H", s.H},
                {"hd", s.hd}, {"layers", m.layers}};
  };

  Json totals{{"layers", m.layers}};
  KindResult fwd;
  std::vector<float> det_out;  // cuDNN's deterministic backward of set 0 (best engine)
  // Each mode's runner, left on its best engines: our backward is timed beside them below.
  SdpaRunner cudnn[2];
  for (bool det : {false, true}) {
    SdpaRunner& runner = cudnn[det];
    FORGE_RETURN_IF_ERROR(runner.Init(det, cuda::SdpaBackwardKernel::kCudnn));
    runner.set_plan_cache(cuda::PlanCache());  // forced engines only; nothing recorded
    auto fwd_call = [&](int i) { return Forward(runner, s, sets[size_t(i)], stream); };
    if (!det) {
      FORGE_ASSIGN_OR_RETURN(
          fwd, BenchKind(a, runner, s, false, stream, fwd_call,
                         [&] { return Download(sets[0].out.p, n_out); }));
    }
    // O and Stats of every set for the backward (the runner's current forward engine).
    for (int i = 0; i < a.sets; ++i) FORGE_RETURN_IF_ERROR(fwd_call(i));
    auto bwd_call = [&](int i) { return Backward(runner, s, sets[size_t(i)], det, stream); };
    FORGE_ASSIGN_OR_RETURN(
        KindResult bwd, BenchKind(a, runner, s, true, stream, bwd_call,
                                  [&] { return Download(sets[0].dqkv.p, n_qkv); }));
    if (a.tune) {
      FORGE_ASSIGN_OR_RETURN(const std::vector<cuda::SdpaPlanInfo> log,
                             TunedChoices(s, det, sets[0], stream));
      if (log.size() == 2) {
        if (!det) AddTuned(log[0], &fwd);
        AddTuned(log[1], &bwd);
      }
    }
    if (det) {
      FORGE_RETURN_IF_ERROR(bwd_call(0));
      FORGE_ASSIGN_OR_RETURN(det_out, Download(sets[0].dqkv.p, n_qkv));
    }
    if (!det) {
      Json line = base("fwd");
      line.update(fwd.line);
      std::printf("%s\n", line.dump().c_str());
    }
    Json line = base(det ? "bwd-det" : "bwd");
    line.update(bwd.line);
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);

    const std::string mode = det ? "deterministic" : "default";
    Json t{{"first_ms", Round(m.layers * (fwd.first_ms + bwd.first_ms), 3)},
           {"best_ms", Round(m.layers * (fwd.best_ms + bwd.best_ms), 3)},
           {"fwd_first_ms", Round(m.layers * fwd.first_ms, 3)},
           {"fwd_best_ms", Round(m.layers * fwd.best_ms, 3)},
           {"bwd_first_ms", Round(m.layers * bwd.first_ms, 3)},
           {"bwd_best_ms", Round(m.layers * bwd.best_ms, 3)}};
    if (fwd.have_tuned && bwd.have_tuned) {
      t["tuned_ms"] = Round(m.layers * (fwd.tuned_ms + bwd.tuned_ms), 3);
    }
    t["gain_best_vs_first_ms"] =
        Round(m.layers * (fwd.first_ms + bwd.first_ms - fwd.best_ms - bwd.best_ms), 3);
    totals[mode] = t;
  }
  {  // our own backward (flash_backward.h) on the same O and Stats
    SdpaRunner runner;
    FORGE_RETURN_IF_ERROR(runner.Init(true, cuda::SdpaBackwardKernel::kFlash));
    if (!runner.flash_backward(s)) return Status::Invalid("FlashBackward does not take " + m.name);
    auto call = [&](int i) { return Backward(runner, s, sets[size_t(i)], true, stream); };
    // Beside cuDNN's best engine of each mode, interleaved: the engines' own times above ran
    // one after another, each in the power state the one before left.
    auto cudnn_call = [&](bool det) {
      return [&, det](int i) { return Backward(cudnn[det], s, sets[size_t(i)], det, stream); };
    };
    FORGE_ASSIGN_OR_RETURN(const auto vs_det, MedianPairMs(a, stream, call, cudnn_call(true)));
    FORGE_ASSIGN_OR_RETURN(const auto vs_default, MedianPairMs(a, stream, call, cudnn_call(false)));
    const double ms = vs_det.first;
    FORGE_RETURN_IF_ERROR(call(0));
    FORGE_ASSIGN_OR_RETURN(const std::vector<float> got, Download(sets[0].dqkv.p, n_qkv));
    Json line = base("bwd-flash");
    line.update(Json{{"ms", Round(ms, 4)},
                     {"bwd_det_best_paired_ms", Round(vs_det.second, 4)},
                     {"vs_bwd_det_best", Round(vs_det.second / vs_det.first, 3)},
                     {"ms_beside_bwd_best", Round(vs_default.first, 4)},
                     {"bwd_best_paired_ms", Round(vs_default.second, 4)},
                     {"vs_bwd_best", Round(vs_default.second / vs_default.first, 3)},
                     {"rel_diff_vs_bwd_det", bench::RelDiff(got, det_out)}});
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
    // The same with FP8 outputs (FlashBackwardFp8Out: RoPE's inverse and the E5M2 casts of an
    // FP8 step's QKV gradient; the kernel and the Q columns' cast), into one buffer set.
    DevBuf f8_out, f8_out_t, table, slots;
    FORGE_RETURN_IF_ERROR(Alloc(&f8_out, n_qkv));
    FORGE_RETURN_IF_ERROR(Alloc(&f8_out_t, n_qkv));
    FORGE_RETURN_IF_ERROR(Alloc(&table, size_t(s.T) * (s.hd / 2) * sizeof(float2)));
    FORGE_RETURN_IF_ERROR(Alloc(&slots, 16 * sizeof(float)));
    {
      std::vector<float2> t(size_t(s.T) * (s.hd / 2));
      for (size_t k = 0; k < t.size(); ++k)
        t[k] = make_float2(std::sin(0.01f * float(k)), std::cos(0.01f * float(k)));
      const float ones[16] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
      FORGE_CUDA_CHECK(
          cudaMemcpy(table.p, t.data(), t.size() * sizeof(float2), cudaMemcpyHostToDevice));
      FORGE_CUDA_CHECK(cudaMemcpy(slots.p, ones, sizeof(ones), cudaMemcpyHostToDevice));
    }
    cuda::FlashBackwardFp8Out f8;
    f8.out = f8_out.p, f8.out_t = f8_out_t.p, f8.rope_sin_cos = table.As<float2>();
    f8.scale = slots.As<float>(), f8.amax = slots.As<float>() + 4;
    f8.scale_inv = slots.As<float>() + 8;
    auto call8 = [&](int i) {
      OperandSet& o = sets[size_t(i)];
      return runner.Backward(s, o.qkv.As<bf16>(), o.out.As<bf16>(), o.dout.As<bf16>(),
                             o.stats.As<float>(), o.dqkv.As<bf16>(), nullptr, nullptr, stream, &f8);
    };
    // What it replaces: the bf16 backward, then RoPE's inverse and the casts of all columns.
    auto rope8 = [&](int i) {
      return cuda::RopeBackwardFp8(f8.out, f8.out_t, sets[size_t(i)].dqkv.As<bf16>(), s.B, s.T, s.H,
                                   s.KV, s.hd, f8.rope_sin_cos, cuda::DType::kE5M2, f8.scale,
                                   f8.amax, f8.scale_inv, stream);
    };
    auto separate8 = [&](int i) -> Status {
      FORGE_RETURN_IF_ERROR(call(i));
      return rope8(i);
    };
    FORGE_ASSIGN_OR_RETURN(const auto vs_separate, MedianPairMs(a, stream, call8, separate8));
    const double ms8 = vs_separate.first;
    FORGE_ASSIGN_OR_RETURN(const double rope_ms, MedianMs(a, stream, rope8));
    Json line8 = base("bwd-flash-fp8");
    line8.update(Json{{"ms", Round(ms8, 4)},
                      {"separate_ms", Round(vs_separate.second, 4)},
                      {"rope_cast_ms", Round(rope_ms, 4)},
                      {"vs_separate", Round(vs_separate.second / ms8, 3)}});
    std::printf("%s\n", line8.dump().c_str());
    std::fflush(stdout);
    totals["flash"] =
        Json{{"bwd_ms", Round(m.layers * ms, 3)},
             {"bwd_fp8_ms", Round(m.layers * ms8, 3)},
             {"best_ms", Round(m.layers * (fwd.best_ms + ms), 3)},
             {"gain_vs_deterministic_best_ms", Round(m.layers * (vs_det.second - ms), 3)}};
  }
  (*summary)[m.name] = totals;
  return Status::Ok();
}

int Fail(const std::string& msg) { return bench::FailJson(nullptr, msg); }

int Run(int argc, char** argv) {
  FlagParser flags = MakeFlags();
  if (int rc; bench::ParseFlagsOrExit(flags, "forge-sdpa-bench", argc, argv, &rc)) return rc;
  Args args;
  if (std::string err = ReadArgs(flags, &args); !err.empty()) return Fail(err);
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    return Fail("no CUDA device");
  }
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return Fail("cudaStreamCreate failed");
  }
  Json header{{"device", prop.name},
              {"cudnn_version", cudnnGetVersion()},
              {"reps", args.reps},
              {"warmup", args.warmup},
              {"sets", args.sets},
              {"max_candidates", SdpaRunner::kMaxCandidates},
              {"tune_margin", SdpaRunner::kTuneMargin}};
  std::printf("%s\n", header.dump().c_str());
  std::fflush(stdout);

  // The Llama 3 shapes (GQA, heads of 128 for 3B and 8B) run when --only names them, with
  // their --batch and --seq (e.g. 1 and 8192).
  const std::vector<Model> models = {{"gpt350m", 16, 16, 64, 24},
                                     {"gpt124m", 12, 12, 64, 12},
                                     {"llama3-1b", 32, 8, 64, 16, false},
                                     {"llama3-3b", 24, 8, 128, 28, false},
                                     {"llama3-8b", 32, 8, 128, 32, false}};
  Json summary{{"summary", "attention ms per step (layers x (fwd + bwd)), first vs best"}};
  int rc = 0;
  for (const Model& m : models) {
    if (args.only.empty() ? !m.by_default : m.name != args.only) continue;
    const Status st = BenchModel(args, m, stream, &summary);
    if (!st.ok()) {
      std::printf("%s\n", Json{{"model", m.name}, {"error", st.ToString()}}.dump().c_str());
      rc = 1;
    }
  }
  std::printf("%s\n", summary.dump().c_str());
  cudaStreamDestroy(stream);
  return rc;
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) { return forge::Run(argc, argv); }
