// forge-calibrate: measures the rates `forge plan` predicts with (plan/plan_calibration.h) on
// the GPUs of this machine and writes them as a calibration file.
//
//   forge-calibrate --config CONFIG [--out FILE] [--base h200|h100] [--as-link nvlink|ib400|eth100]
//                   [--reps N]
//
// Measures, on GPU 0 unless said otherwise:
//   - GEMMs: the forward, input-gradient and weight-gradient GEMMs of one block (QKV, output,
//     gate/up and down projections; bf16 in, the weight gradients fp32 out, as the step runs
//     them) through the project's GemmRunner, at the config's width and at 768, 1024, 2048
//     and 4096 (the others with the config's QKV and FFN ratios), 16,384 token rows. 1/rate
//     against 1/d by least squares gives the alone rate R * d / (d + h); the file gets
//     gemm_tflops_max = R * kGemmInStep and gemm_half_width = h.
//   - attention: SdpaRunner's forward and backward (the step's: deterministic, our backward
//     where the shape allows) at T = 1024, 2048, 4096, 8192 with 16,384 tokens, the config's
//     heads; the model-FLOP rate 12 H hd T a token against 1/T gives attention_tflops_max and
//     attention_half_seq.
//   - HBM: a 1 GiB device-to-device copy (bytes read + written over the time), times
//     kHbmInStep for hbm_gb_s.
//   - memory: the GPU's free memory at the start (capacity_gib).
//   - with 2 or more GPUs: NCCL all-reduce, reduce-scatter and all-gather (bf16) among all of
//     them in this process (ncclCommInitAll), 8 KiB to 256 MiB: the bus bandwidth of the
//     largest sizes and the latency of the smallest; with 4 or more GPUs the all-reduce
//     latency of 2 GPUs too, which splits it into a per-collective and a per-ring-step part
//     (else the base calibration's step latency is kept). They go to links.nvlink, or with
//     --as-link to that link: run with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 to force NCCL's
//     network transport between the GPUs and record it as ib400 or eth100.
// What it cannot measure keeps the --base calibration's value: the elementwise and optimizer
// byte counts, FP8's speedup, the memory overhead, the overlap fractions (those come from
// forge-dist-bench runs: exposed / alone) and links it did not measure.
// The file (stdout without --out) is the calibration JSON, with every raw measurement under
// "measured".
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "common/peak_flops.h"
#include "common/status.h"
#include "common/config.h"
#include "cuda_bench_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/sdpa.h"
#include "plan/plan_calibration.h"

namespace forge {
namespace {

using bench::Alloc;
using bench::DevBuf;
using bench::RandomPool;
using bench::Timer;
using cuda::bf16;
using cuda::DType;
using cuda::GemmArgs;
using cuda::GemmRunner;
using cuda::SdpaRunner;
using cuda::SdpaShape;
using Json = nlohmann::ordered_json;

// GEMMs timed alone run faster than inside the power-limited two-stream step: the built-in
// H200 in-step rate at gpt350m's width (634 TFLOP/s, plan_calibration.cc) over what this
// program measures for that width alone on an H200 (734.5 TFLOP/s: the "gemm" entry of d 1024
// in its output).
constexpr double kGemmInStep = 634.0 / 734.5;
// The step's bandwidth-bound kernels against a plain copy: AdamW's 2.7 TB/s against the
// copy's ~3.0 on an H100 (docs/performance.md).
constexpr double kHbmInStep = 0.9;
constexpr int64_t kTokens = 16384;

struct Args {
  std::string config, out, base, as_link = "nvlink";
  int reps = 20;
};

int Fail(const std::string& msg) { return bench::FailJson("forge-calibrate", msg); }

FlagParser MakeFlags() {
  FlagParser f("forge-calibrate", "",
               "Measures GEMM, attention, HBM and NCCL rates on this machine's GPUs and writes "
               "the\ncalibration file `forge plan --calibration` reads.");
  f.Value("--config", "CONFIG", "the run config whose shapes to measure (required)");
  f.Value("--out", "FILE", "where to write the calibration (default: standard output)");
  f.Value("--base", "h200|h100", "what is not measured comes from (default: by device name)");
  f.Value("--as-link", "nvlink|ib400|eth100", "the link the NCCL figures describe (default nvlink)");
  f.Value("--reps", "N", "timed calls per measurement (default 20)");
  return f;
}

// Least squares of y = a + b x; returns {a, b}.
std::pair<double, double> Fit(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = double(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
  const double den = n * sxx - sx * sx;
  if (den == 0) return {sy / n, 0};
  const double b = (n * sxy - sx * sy) / den;
  return {(sy - b * sx) / n, b};
}

// One block's GEMMs at width d: TFLOP/s over their summed median times.
StatusOr<double> BlockGemmTflops(GemmRunner& runner, const RandomPool& pool, int64_t d,
                                 int64_t qkv, int64_t ffn, int reps, cudaStream_t stream) {
  struct Linear {
    int64_t in, out;
  };
  const Linear linears[] = {{d, qkv}, {d, d}, {d, 2 * ffn}, {ffn, d}};
  const int64_t widest = std::max({qkv, 2 * ffn, d});
  DevBuf x, w, y, dw;
  FORGE_RETURN_IF_ERROR(Alloc(&x, size_t(kTokens) * widest * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&w, size_t(widest) * widest * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&y, size_t(kTokens) * widest * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&dw, size_t(widest) * widest * 4));
  FORGE_RETURN_IF_ERROR(pool.Fill(x.p, size_t(kTokens) * widest, 1));
  FORGE_RETURN_IF_ERROR(pool.Fill(w.p, size_t(widest) * widest, 2));
  double flops = 0, ms = 0;
  for (const Linear& l : linears) {
    GemmArgs fwd;  // y[T, out] = x[T, in] W[out, in]^T
    fwd.M = kTokens, fwd.N = l.out, fwd.K = l.in, fwd.A = x.p, fwd.B = w.p, fwd.D = y.p;
    GemmArgs dx;  // dx[T, in] = dy[T, out] W[out, in]
    dx.M = kTokens, dx.N = l.in, dx.K = l.out, dx.A = y.p, dx.B = w.p, dx.D = x.p;
    dx.trans_b = false;
    GemmArgs wg;  // dW[out, in] = dy[T, out]^T x[T, in], fp32
    wg.M = l.out, wg.N = l.in, wg.K = kTokens, wg.A = y.p, wg.B = x.p, wg.D = dw.p;
    wg.trans_a = true, wg.trans_b = false, wg.d_type = DType::kFp32;
    for (const GemmArgs& g : {fwd, dx, wg}) {
      Timer t(stream, 3, reps, 1);
      FORGE_ASSIGN_OR_RETURN(const float m,
                             t.MedianMs([&](int) { return runner.Run(g, stream); }));
      ms += m;
      flops += 2.0 * double(g.M) * double(g.N) * double(g.K);
    }
  }
  return flops / (ms * 1e-3) / 1e12;
}

struct AttentionPoint {
  int T = 0, B = 0;
  double fwd_ms = 0, bwd_ms = 0, tflops = 0;
};

StatusOr<AttentionPoint> TimeAttention(SdpaRunner& r, bool deterministic, const ModelConfig& m,
                                       int T, int reps, const RandomPool& pool,
                                       cudaStream_t stream) {
  SdpaShape s;
  s.B = int(std::max<int64_t>(1, kTokens / T));
  s.T = T, s.H = m.n_head, s.KV = m.n_kv_head, s.hd = m.head_dim();
  const size_t tokens = size_t(s.B) * s.T, rows = size_t(s.B) * s.H * s.T;
  const size_t n_qkv = tokens * (s.H + 2 * s.KV) * s.hd, n_out = tokens * s.H * s.hd;
  DevBuf qkv, out, dout, dqkv, stats, scratch;
  FORGE_RETURN_IF_ERROR(Alloc(&qkv, n_qkv * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&out, n_out * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&dout, n_out * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&dqkv, n_qkv * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&stats, rows * 4));
  // softmax_sum at offset 0, dq_accum (non-deterministic backward only) at the next 256 bytes.
  const size_t scratch_bytes = SdpaRunner::BackwardScratchBytes(s, deterministic);
  FORGE_RETURN_IF_ERROR(Alloc(&scratch, std::max<size_t>(scratch_bytes, 256)));
  FORGE_RETURN_IF_ERROR(pool.Fill(qkv.p, n_qkv, 3));
  FORGE_RETURN_IF_ERROR(pool.Fill(dout.p, n_out, 4));
  auto* softmax_sum = scratch.As<float>();
  float* dq_accum =
      deterministic ? nullptr
                    : reinterpret_cast<float*>(scratch.As<char>() + (rows * 4 + 255) / 256 * 256);
  Timer tf(stream, 3, reps, 1), tb(stream, 3, reps, 1);
  AttentionPoint p;
  p.T = T, p.B = s.B;
  FORGE_ASSIGN_OR_RETURN(const float f, tf.MedianMs([&](int) {
    return r.Forward(s, qkv.As<bf16>(), out.As<bf16>(), stats.As<float>(), stream);
  }));
  FORGE_ASSIGN_OR_RETURN(const float b, tb.MedianMs([&](int) {
    return r.Backward(s, qkv.As<bf16>(), out.As<bf16>(), dout.As<bf16>(), stats.As<float>(),
                      dqkv.As<bf16>(), softmax_sum, dq_accum, stream);
  }));
  p.fwd_ms = f, p.bwd_ms = b;
  p.tflops = 12.0 * s.H * s.hd * double(T) * double(tokens) / ((f + b) * 1e-3) / 1e12;
  return p;
}

#define FORGE_NCCL_CHECK(expr)                                                            \
  do {                                                                                    \
    const ncclResult_t r_ = (expr);                                                       \
    if (r_ != ncclSuccess)                                                                \
      return Status::Internal(std::string(#expr) + ": " + ncclGetErrorString(r_));        \
  } while (0)

enum class Op { kAllReduce, kReduceScatter, kAllGather };
const char* OpName(Op o) {
  return o == Op::kAllReduce ? "all_reduce" : o == Op::kReduceScatter ? "reduce_scatter"
                                                                       : "all_gather";
}

// NCCL among the first n GPUs, one communicator each, in this process.
class Nccl {
 public:
  ~Nccl() {
    for (ncclComm_t c : comms_) ncclCommDestroy(c);
    for (size_t i = 0; i < streams_.size(); ++i) {
      cudaSetDevice(int(i));
      cudaStreamDestroy(streams_[i]);
      cudaFree(buf_[i]);
    }
    cudaSetDevice(0);
  }
  Status Init(int n, size_t max_bytes) {
    std::vector<int> devs(static_cast<size_t>(n), 0);
    for (int i = 0; i < n; ++i) devs[size_t(i)] = i;
    comms_.resize(size_t(n));
    FORGE_NCCL_CHECK(ncclCommInitAll(comms_.data(), n, devs.data()));
    for (int i = 0; i < n; ++i) {
      FORGE_CUDA_CHECK(cudaSetDevice(i));
      cudaStream_t s;
      FORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams_.push_back(s);
      void* b = nullptr;
      FORGE_CUDA_CHECK(cudaMalloc(&b, max_bytes * 2));  // in and out
      FORGE_CUDA_CHECK(cudaMemset(b, 0, max_bytes * 2));
      buf_.push_back(b);
    }
    FORGE_CUDA_CHECK(cudaSetDevice(0));
    max_bytes_ = max_bytes;
    return Status::Ok();
  }
  int world() const { return int(comms_.size()); }

  // Median milliseconds of one collective of `bytes` (the whole buffer: the all-reduce's
  // size, the reduce-scatter's input, the all-gather's output), all ranks at once.
  StatusOr<double> Time(Op op, size_t bytes, int reps) {
    const size_t n = comms_.size();
    const size_t count = bytes / 2;  // bf16
    auto launch = [&]() -> Status {
      FORGE_NCCL_CHECK(ncclGroupStart());
      for (size_t i = 0; i < n; ++i) {
        char* in = static_cast<char*>(buf_[i]);
        char* out = in + max_bytes_;
        if (op == Op::kAllReduce) {
          FORGE_NCCL_CHECK(ncclAllReduce(in, out, count, ncclBfloat16, ncclSum, comms_[i],
                                         streams_[i]));
        } else if (op == Op::kReduceScatter) {
          FORGE_NCCL_CHECK(ncclReduceScatter(in, out, count / n, ncclBfloat16, ncclSum,
                                             comms_[i], streams_[i]));
        } else {
          FORGE_NCCL_CHECK(ncclAllGather(in, out, count / n, ncclBfloat16, comms_[i],
                                         streams_[i]));
        }
      }
      FORGE_NCCL_CHECK(ncclGroupEnd());
      return Status::Ok();
    };
    auto sync = [&]() -> Status {
      for (size_t i = 0; i < n; ++i) {
        FORGE_CUDA_CHECK(cudaSetDevice(int(i)));
        FORGE_CUDA_CHECK(cudaStreamSynchronize(streams_[i]));
      }
      FORGE_CUDA_CHECK(cudaSetDevice(0));
      return Status::Ok();
    };
    for (int w = 0; w < 3; ++w) FORGE_RETURN_IF_ERROR(launch());
    FORGE_RETURN_IF_ERROR(sync());
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      FORGE_RETURN_IF_ERROR(launch());
      FORGE_RETURN_IF_ERROR(sync());
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                       .count());
    }
    std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
    return ms[size_t(reps / 2)];
  }

 private:
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
  std::vector<void*> buf_;
  size_t max_bytes_ = 0;
};

double BusFactor(Op op, int n) {
  return op == Op::kAllReduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
}

Status Calibrate(const Args& a, const RunConfig& cfg, Json* out) {
  const ModelConfig& m = cfg.model;
  FORGE_CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  FORGE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const std::string name = prop.name;
  std::string base = a.base;
  if (base.empty()) base = name.find("H100") != std::string::npos ? "h100" : "h200";
  FORGE_ASSIGN_OR_RETURN(plan::PlanCalibration cal, plan::BuiltinCalibration(base));
  cal.device = name;
  if (const double peak = DenseBf16PeakTflops(name); peak > 0) cal.peak_bf16_tflops = peak;
  Json measured;
  measured["device"] = name;
  measured["base"] = base;
  measured["config"] = a.config;

  size_t free_b = 0, total_b = 0;
  FORGE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  cal.capacity_gib = double(free_b) / (1024.0 * 1024 * 1024);
  measured["free_gib"] = cal.capacity_gib;
  measured["total_gib"] = double(total_b) / (1024.0 * 1024 * 1024);

  cudaStream_t stream;
  FORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RandomPool pool;
  FORGE_RETURN_IF_ERROR(pool.Init());

  {  // HBM: a 1 GiB copy
    const size_t bytes = size_t(1) << 30;
    DevBuf src, dst;
    FORGE_RETURN_IF_ERROR(Alloc(&src, bytes));
    FORGE_RETURN_IF_ERROR(Alloc(&dst, bytes));
    Timer t(stream, 2, a.reps, 1);
    FORGE_ASSIGN_OR_RETURN(const float ms, t.MedianMs([&](int) -> Status {
      FORGE_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, stream));
      return Status::Ok();
    }));
    const double gbs = 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
    measured["copy_gb_s"] = gbs;
    cal.hbm_gb_s = gbs * kHbmInStep;
  }

  {  // GEMMs of a block at several widths
    GemmRunner runner;
    FORGE_RETURN_IF_ERROR(runner.Init());
    const double qkv_ratio = double((m.n_head + 2 * m.n_kv_head) * m.head_dim()) / m.d_model;
    const double ffn_ratio = double(m.ffn) / m.d_model;
    std::vector<int64_t> widths = {768, 1024, 2048, 4096};
    if (std::find(widths.begin(), widths.end(), int64_t(m.d_model)) == widths.end())
      widths.push_back(m.d_model);
    std::vector<double> inv_d, inv_rate;
    Json rows = Json::array();
    for (int64_t d : widths) {
      const bool own = d == m.d_model;
      const int64_t qkv = own ? (m.n_head + 2 * m.n_kv_head) * int64_t(m.head_dim())
                              : (int64_t(qkv_ratio * d) + 127) / 128 * 128;
      const int64_t ffn = own ? m.ffn : (int64_t(ffn_ratio * d) + 127) / 128 * 128;
      FORGE_ASSIGN_OR_RETURN(const double tf,
                             BlockGemmTflops(runner, pool, d, qkv, ffn, a.reps, stream));
      rows.push_back(Json{{"d", d}, {"qkv", qkv}, {"ffn", ffn}, {"tflops_alone", tf}});
      inv_d.push_back(1.0 / double(d));
      inv_rate.push_back(1.0 / tf);
    }
    measured["gemm"] = rows;
    const auto [ia, ib] = Fit(inv_d, inv_rate);  // 1/rate = 1/R + (h/R) / d
    if (ia > 0) {
      cal.gemm_tflops_max = kGemmInStep / ia;
      cal.gemm_half_width = std::max(0.0, ib / ia);
    }
    measured["gemm_fit_alone"] = Json{{"tflops_max", 1.0 / ia}, {"half_width", ib / ia}};
  }

  {  // attention at several sequence lengths
    SdpaRunner runner;
    const bool det = cfg.engine.deterministic_attention;
    FORGE_RETURN_IF_ERROR(runner.Init(det,
                                      cfg.engine.attention_backward == AttentionBackward::kFlash
                                          ? cuda::SdpaBackwardKernel::kFlash
                                          : cuda::SdpaBackwardKernel::kCudnn));
    std::vector<double> inv_t, inv_rate;
    Json rows = Json::array();
    for (int T : {1024, 2048, 4096, 8192}) {
      FORGE_ASSIGN_OR_RETURN(const AttentionPoint p,
                             TimeAttention(runner, det, m, T, a.reps, pool, stream));
      rows.push_back(Json{{"T", p.T}, {"B", p.B}, {"fwd_ms", p.fwd_ms}, {"bwd_ms", p.bwd_ms},
                          {"model_tflops", p.tflops}});
      inv_t.push_back(1.0 / T);
      inv_rate.push_back(1.0 / p.tflops);
    }
    measured["attention"] = rows;
    const auto [ia, ib] = Fit(inv_t, inv_rate);
    if (ia > 0) {
      cal.attention_tflops_max = 1.0 / ia;
      cal.attention_half_seq = std::max(0.0, ib / ia);
    }
  }
  cudaStreamDestroy(stream);

  int gpus = 0;
  FORGE_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  measured["gpus"] = gpus;
  if (gpus >= 2) {
    plan::LinkCalibration* link = a.as_link == "ib400"    ? &cal.ib400
                                  : a.as_link == "eth100" ? &cal.eth100
                                                          : &cal.nvlink;
    const std::vector<size_t> sizes = {size_t(8) << 10,  size_t(1) << 20,  size_t(16) << 20,
                                       size_t(64) << 20, size_t(256) << 20};
    Nccl nccl;
    FORGE_RETURN_IF_ERROR(nccl.Init(gpus, sizes.back()));
    Json rows = Json::array();
    double bw[3] = {0, 0, 0}, small_ar = 0;
    for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather}) {
      for (size_t bytes : sizes) {
        FORGE_ASSIGN_OR_RETURN(const double ms, nccl.Time(op, bytes, a.reps));
        const double busbw = BusFactor(op, gpus) * double(bytes) / (ms * 1e-3) / 1e9;
        rows.push_back(Json{{"op", OpName(op)}, {"gpus", gpus}, {"bytes", bytes}, {"ms", ms},
                            {"busbw_gb_s", busbw}});
        if (bytes == sizes.back()) bw[int(op)] = busbw;
        if (bytes == sizes.front() && op == Op::kAllReduce) small_ar = ms * 1e3;  // us
      }
    }
    link->allreduce_gb_s = bw[0];
    link->reduce_scatter_gb_s = 0.5 * (bw[1] + bw[2]);
    // Latency: t(8 KiB) = base + hops * hop. Two world sizes give both; one keeps the step's.
    const double hops_n = std::min(2.0 * (gpus - 1), 2.0 * std::ceil(std::log2(double(gpus))));
    double hop = link->hop_latency_us;
    if (gpus >= 4) {
      Nccl two;
      FORGE_RETURN_IF_ERROR(two.Init(2, sizes.front()));
      FORGE_ASSIGN_OR_RETURN(const double ms2, two.Time(Op::kAllReduce, sizes.front(), a.reps));
      rows.push_back(Json{{"op", "all_reduce"}, {"gpus", 2}, {"bytes", sizes.front()},
                          {"ms", ms2}});
      if (hops_n > 2) hop = std::max(0.0, (small_ar - ms2 * 1e3) / (hops_n - 2));
    }
    link->hop_latency_us = hop;
    link->base_latency_us = std::max(0.0, small_ar - hops_n * hop);
    measured["nccl"] = rows;
    measured["nccl_link"] = a.as_link;
  }

  Json j = Json::parse(plan::CalibrationToJson(cal));
  j["measured"] = measured;
  *out = j;
  return Status::Ok();
}

int Run(int argc, char** argv) {
  FlagParser flags = MakeFlags();
  if (int rc; bench::ParseFlagsOrExit(flags, "forge-calibrate", argc, argv, &rc)) return rc;
  Args a;
  a.config = flags.Get("--config");
  a.out = flags.Get("--out");
  a.base = flags.Get("--base");
  a.as_link = flags.Get("--as-link", "nvlink");
  if (!bench::FlagInt(flags, "--reps", &a.reps) || a.reps < 1 || a.reps > 10000)
    return Fail(bench::BadValue(flags, "--reps"));
  if (a.config.empty()) return Fail("--config CONFIG is required");
  if (a.as_link != "nvlink" && a.as_link != "ib400" && a.as_link != "eth100")
    return Fail(bench::BadValue(flags, "--as-link"));
  auto cfg = LoadRunConfig(a.config);
  if (!cfg.ok()) return Fail(cfg.status().ToString());
  Json out;
  if (Status s = Calibrate(a, *cfg, &out); !s.ok()) return Fail(s.ToString());
  const std::string text = out.dump(2) + "\n";
  if (a.out.empty()) {
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  std::ofstream f(a.out);
  f << text;
  if (!f.good()) return Fail("cannot write " + a.out);
  std::fprintf(stderr, "forge-calibrate: wrote %s\n", a.out.c_str());
  return 0;
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) { return forge::Run(argc, argv); }
