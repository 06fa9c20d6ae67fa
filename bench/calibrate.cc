// forge-calibrate: measures the rates `forge plan` predicts with (plan/plan_calibration.h) on
// the GPUs of this machine and writes them as a calibration file.
//
//   forge-calibrate --config CONFIG [--out FILE] [--base h200|h100] [--as-link nvlink|ib400|eth100]
//                   [--reps N]
//
// Measures, on GPU 0 unless said otherwise:
//   - the config's own training step (BF16, no recompute, its micro-batch and engine settings;
//     with fewer blocks where the whole model does not fit the GPU: a block's rates are the
//     same), graph-replayed as forge-bench times it, and the eager profile of its phases: the
//     GEMM and attention rates are set (their half-widths kept from the base calibration) so
//     that the plan predicts that step, split between GEMMs and attention as the profile's
//     phases are (plan::FitComputeToStep). The step is what the plan predicts, and inside it
//     the GPU is power-limited: kernels timed alone run faster than they do there, and by a
//     share that varies with the shape. Then the same step in FP8 (the config's FP8 settings)
//     sets FP8's GEMM speedup over those rates (plan::FitFp8SpeedupToStep), where the GPU
//     runs one.
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
// byte counts, the memory overhead, the overlap fractions (those come from forge-dist-bench
// runs: exposed / alone) and links it did not measure.
// The file (stdout without --out) is the calibration JSON, with every raw measurement under
// "measured".
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_step.h"
#include "bench_util.h"
#include "common/config.h"
#include "common/peak_flops.h"
#include "common/status.h"
#include "cuda_bench_util.h"
#include "kernels/cuda/cuda_check.h"
#include "plan/plan_calibration.h"
#include "plan/plan_model.h"
#include "worker/train/memory_estimate.h"

namespace forge {
namespace {

using bench::Alloc;
using bench::DevBuf;
using bench::Timer;
using Json = nlohmann::ordered_json;

// The step's bandwidth-bound kernels against a plain copy: AdamW's 2.7 TB/s against the
// copy's ~3.0 on an H100 (docs/performance.md).
constexpr double kHbmInStep = 0.9;
// Timed steps of the config's step (after three untimed ones).
constexpr int kSteps = 10;

struct Args {
  std::string config, out, base, as_link = "nvlink";
  int reps = 20;
};

int Fail(const std::string& msg) { return bench::FailJson("forge-calibrate", msg); }

FlagParser MakeFlags() {
  FlagParser f("forge-calibrate", "",
               "Times the config's training step, HBM and NCCL on this machine's GPUs and "
               "writes the\ncalibration file `forge plan --calibration` reads.");
  f.Value("--config", "CONFIG", "the run config whose shapes to measure (required)");
  f.Value("--out", "FILE", "where to write the calibration (default: standard output)");
  f.Value("--base", "h200|h100", "what is not measured comes from (default: by device name)");
  f.Value("--as-link", "nvlink|ib400|eth100", "the link the NCCL figures describe (default nvlink)");
  f.Value("--reps", "N", "timed calls per HBM and NCCL measurement (default 20)");
  return f;
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

  {  // the config's step: the GEMM and attention rates inside it
    RunConfig sc = cfg;
    sc.precision.compute = Precision::kBf16;
    sc.train.activation_recompute = Recompute::kNone;
    sc.batch.global_batch = sc.batch.micro_batch;
    const double room = 0.9 * double(free_b);
    while (sc.model.n_layer > 1 &&
           EstimateTrainingMemory(sc, Backend::kCuda, 1).total() > room)
      --sc.model.n_layer;
    const CudaBackendOptions options = CudaBackendOptionsFromConfig(sc.engine);
    // Three untimed steps (the first captures the CUDA graph), then kSteps timed.
    auto timed_ms = [](bench::BenchStep& s) -> StatusOr<double> {
      for (int i = 0; i < 3; ++i) FORGE_RETURN_IF_ERROR(s.Train(false, nullptr));
      return s.MeanStepMs(kSteps);
    };
    FORGE_ASSIGN_OR_RETURN(std::unique_ptr<bench::BenchStep> step,
                           bench::BenchStep::Make(sc, options));
    FORGE_ASSIGN_OR_RETURN(const double step_ms, timed_ms(*step));
    FORGE_ASSIGN_OR_RETURN(const bench::PhaseTimes phases, step->Profile());
    double gemm_ms = 0, attention_ms = 0;
    for (const auto& [phase, ms] : phases) {
      if (phase == "fwd_gemm" || phase == "lm_head_gemm" || phase == "bwd_gemm") gemm_ms += ms;
      if (phase == "fwd_attention" || phase == "bwd_attention") attention_ms += ms;
    }
    measured["step"] = Json{{"n_layer", sc.model.n_layer},
                            {"micro_batch", sc.batch.micro_batch},
                            {"seq_len", sc.model.seq_len},
                            {"step_ms", step_ms},
                            {"phases_ms", bench::PhasesJson<Json>(phases)}};
    if (!(gemm_ms > 0 && attention_ms > 0))
      return Status::Internal("the step's profile has no GEMM or attention phases");
    FORGE_RETURN_IF_ERROR(
        plan::FitComputeToStep(sc, step_ms, gemm_ms / (gemm_ms + attention_ms), &cal));
    step.reset();

    // The same step in FP8 (the config's FP8 settings): FP8's GEMM speedup over those rates.
    // Where the GPU has no FP8 step (before Hopper) the base calibration's speedup stays.
    RunConfig s8 = sc;
    s8.precision.compute = Precision::kFp8;
    auto made8 = bench::BenchStep::Make(s8, options);
    if (!made8.ok()) {
      measured["fp8_step"] = Json{{"error", made8.status().ToString()}};
    } else {
      FORGE_ASSIGN_OR_RETURN(const double fp8_ms, timed_ms(**made8));
      measured["fp8_step"] = Json{{"step_ms", fp8_ms}, {"lm_head", s8.precision.fp8.lm_head}};
      FORGE_RETURN_IF_ERROR(plan::FitFp8SpeedupToStep(s8, fp8_ms, &cal));
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
