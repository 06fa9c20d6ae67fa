// forge-dist-bench: data-parallel throughput of the CUDA step on the GPUs of one machine, as
// one JSON line (printed by rank 0).
//
//   forge-dist-bench --config configs/gpt350m.yaml --world W
//                    [--mode ddp|zero1|zero2|fsdp|hsdp [--shard-group-size G]]
//                    [--emulate-nodes N]
//                    [--grad-reduce fp32|bf16] [--ddp-allreduce nccl|copy_engine]
//                    [--micro-batch B] [--steps N] [--warmup K]
//                    [--profile] [--distinct-batches [--accum-check]] [--no-single]
//                    [--fp8-gather on|off] [--no-comm-windows]
//                    [--precision bf16|fp8] [--recompute none|selective|full]
//
// Forks W processes, one per GPU (the way users run workers), which meet over NCCL through the
// TCP rendezvous on loopback. Each rank trains micro-batch B per step (global batch W*B, one
// micro-step: the PyTorch anchor's setting in ../shared/anchors/torch_dist.py), random tokens:
// by default the same micro-batch on every rank and in the single-GPU baseline, as torch_dist.py
// does, so the data-parallel step and the baseline train the same trajectory (the summed
// gradient is W times the baseline's). Why: the step is power-limited and its GEMMs' power
// depends on the values they multiply; a baseline memorising one batch while the ranks train
// on W different ones runs 0.7-1.4% slower than the ranks with their collectives skipped,
// which flatters the efficiency (docs/performance.md). --distinct-batches gives each rank its
// own (seed + rank).
// Per rank, in order:
//   1. the same model alone on its GPU (world 1), timed: the single-GPU baseline of the
//      scaling efficiency, measured on the same GPUs in the same run;
//   2. the gradient collectives alone (the mode's per-unit all-reduces or reduce-scatters and
//      parameter all-gathers on the real buffers' sizes; hsdp: those of fsdp over the shard
//      group plus each slot's all-reduce over the replica group, on its own stream; with
//      --grad-reduce bf16 in bf16: zero with the fp32 <-> bf16 casts it runs on the NCCL
//      stream around each, ddp without, as it keeps the gradient in bf16; fsdp in FP8 with
//      the E4M3 gather: a block's gathers at a byte a linear-weight element plus its norm
//      weights' small gather), timed: the communication a step has;
//   3. the data-parallel step, timed with CUDA events over N steps after K warm-up steps.
// (With --ddp-allreduce copy_engine, step 1 runs first, in a child process with the default
// hardware queues, before the rank asks for the copy engines' 32.)
// exposed communication = step - single-GPU step; hidden = communication alone - exposed
// (clamped at 0): how much of it the backward overlapped. The exposed part splits in two
// (comm_time_sink.h, over a few more steps, each synchronised): comm_wait_ms, the time the
// compute stream stood still at its waits for the collectives (what no overlap hid: the last
// units' reduction, a gather the forward needed first; comm_wait_by_op_ms splits it by the kind
// of collective waited for, where the wait before the optimizer counts as the last one issued,
// the step's tail), and comm_slowdown_ms = exposed - wait, what the compute lost to running
// beside the collectives (SMs and memory bandwidth shared); comm_in_step_ms is the collectives'
// own time in the step (against comm_ms alone). ranks_bitwise_equal: every rank's weights after
// the data-parallel steps have the same CRC-32C (they must, in every mode).
// MFU counts model FLOPs per GPU against the dense BF16 peak (common/peak_flops.h).
// --no-single: no single-GPU baseline, for a model that does not fit one GPU (fsdp's reason to
// be): the line then has no efficiency or exposed communication, only the step, tokens/s, MFU
// and memory. --fp8-gather off: fsdp in FP8 gathers the blocks' weights in bf16 and casts them
// per pass (CudaBackendOptions::fp8_gather), against the default E4M3 gather.
// --no-comm-windows: every collective starts at once (CudaBackendOptions::comm_windows).
// --emulate-nodes N: the W ranks pose as N nodes of W/N consecutive ranks: each sets
// NCCL_HOSTID to its emulated node before NCCL starts, so NCCL keeps NVLink / shared memory
// inside an emulated node and carries traffic between them over its network transport (by
// default sockets on loopback: NCCL_SOCKET_IFNAME=lo and NCCL_IB_DISABLE=1 unless already set),
// the slow-link regime hsdp is for (e.g. --world 4 --emulate-nodes 2 --mode hsdp
// --shard-group-size 2 against ddp and fsdp on the same topology).
// Knobs for measuring NCCL's SM use: --nccl-max-ctas, --nccl-cta-policy (NcclCommOptions),
// --gemm-sm-margin (the backward GEMMs leave that many SMs to NCCL). The config's `engine:`
// keys apply. --ddp-allreduce
// copy_engine: ddp's all-reduces on the copy engines, in the step and in the collectives-alone
// timing.
// After the run every rank evaluates its own batch (rank_eval_losses; the step's "loss" is the
// ranks' mean) and counts the positions whose input token is its target (rank_input_is_target,
// ~1/vocab for random tokens). --accum-check then trains one GPU on all W ranks' batches as W
// accumulated micro-batches, which the data-parallel step must equal to rounding (accum_loss,
// accum_eval_losses): with --distinct-batches, 4 ranks end near loss 2.2 where 2 ranks and
// one GPU end near 7; this says whether the data or the parallel step does that (the data:
// one GPU accumulating the same four batches ends at the same loss).
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_profile.h"
#include "bench_util.h"
#include "common/checksum.h"
#include "common/config.h"
#include "common/peak_flops.h"
#include "kernels/cuda/adamw.h"  // CastFloatToBf16, CastBf16ToFloat
#include "kernels/cuda/cuda_check.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/hybrid_groups.h"
#include "worker/parallel/host_staged_comm.h"
#include "worker/parallel/nccl_comm.h"
#include "worker/parallel/rendezvous.h"
#include "worker/model/shard_layout.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/fp8_gather_rule.h"

namespace forge {
namespace {

using Json = nlohmann::ordered_json;

struct Args {
  std::string config;
  std::string mode = "ddp";
  int shard_group_size = 0;  // --shard-group-size (hsdp)
  int emulate_nodes = 0;     // --emulate-nodes (0: the real topology)
  std::string grad_reduce = "fp32";
  std::string ddp_allreduce = "nccl";
  int world = 2;
  int micro_batch = 0;
  int steps = 20;
  int warmup = 3;
  bool profile = false;  // --profile: per-phase times of the single-GPU and the parallel step
  bool distinct_batches = false;  // --distinct-batches: rank r trains on seed + r's tokens
  // --accum-check (with --distinct-batches): rank 0 then trains one GPU on all W ranks' batches
  // as W accumulated micro-batches, the data-parallel step's exact job, and reports its losses.
  bool accum_check = false;
  int nccl_max_ctas = 0;     // --nccl-max-ctas; 0: NCCL's default
  int nccl_cta_policy = -1;  // --nccl-cta-policy; -1: NCCL's default
  int gemm_sm_margin = 0;    // --gemm-sm-margin
  bool single = true;        // off with --no-single
  bool fp8_gather = true;    // --fp8-gather on|off
  bool comm_windows = true;  // off with --no-comm-windows
  std::string precision;     // --precision; "": the config's
  std::string recompute;     // --recompute; "": the config's
};

int Fail(const std::string& msg) { return bench::FailJson("forge-dist-bench", msg); }

FlagParser MakeFlags() {
  FlagParser f("forge-dist-bench", "",
               "Times data-parallel training steps over W GPUs of this host (one thread per "
               "rank, NCCL) beside one GPU; prints JSON lines.");
  f.Value("--config", "PATH", "run config (required)");
  f.Value("--world", "W", "GPUs (default 2)");
  f.Value("--mode", "ddp|zero1|zero2|fsdp|hsdp", "parallel mode (default ddp)");
  f.Value("--shard-group-size", "G",
          "hsdp: GPUs per shard group (parallel.shard_group_size; must divide --world)");
  f.Value("--emulate-nodes", "N",
          "pose as N nodes (NCCL_HOSTID per rank; traffic between them over NCCL's network "
          "transport); must divide --world");
  f.Value("--grad-reduce", "fp32|bf16", "gradient collective element type (default fp32)");
  f.Value("--ddp-allreduce", "nccl|copy_engine", "what moves ddp's all-reduces (default nccl)");
  f.Value("--micro-batch", "B", "sequences per rank per step (default: the config's)");
  f.Value("--steps", "N", "timed steps (default 20)");
  f.Value("--warmup", "K", "untimed steps first, >= 1 (default 3)");
  f.Value("--nccl-max-ctas", "N", "cap on NCCL's CTAs per collective (default NCCL's)");
  f.Value("--nccl-cta-policy", "P", "NCCL's CTA policy (default NCCL's)");
  f.Value("--gemm-sm-margin", "N", "SMs the backward GEMMs leave to NCCL (default 0)");
  f.Bool("--profile", "per-phase times of the single-GPU and the parallel step");
  f.Bool("--no-single", "no single-GPU baseline (a model that does not fit one GPU)");
  f.Bool("--no-comm-windows", "collectives start at once, not in the comm windows");
  f.Value("--precision", "bf16|fp8", "compute precision (default: the config's)");
  f.Value("--recompute", "none|selective|full", "activation recompute (default: the config's)");
  f.Value("--fp8-gather", "on|off", "fsdp in FP8: gather the blocks' weights as E4M3 (default on)");
  f.Bool("--distinct-batches", "rank r trains on its own tokens (seed + r)");
  f.Bool("--accum-check", "with --distinct-batches: one GPU also trains all ranks' batches "
                          "accumulated and reports its losses");
  return f;
}

// Reads the parsed flags into *a; returns an error message, or "" when they are fine.
std::string ReadArgs(const FlagParser& f, Args* a) {
  a->config = f.Get("--config");
  a->mode = f.Get("--mode", a->mode);
  a->grad_reduce = f.Get("--grad-reduce", a->grad_reduce);
  a->ddp_allreduce = f.Get("--ddp-allreduce", a->ddp_allreduce);
  a->profile = f.Has("--profile");
  a->distinct_batches = f.Has("--distinct-batches");
  a->accum_check = f.Has("--accum-check");
  a->single = !f.Has("--no-single");
  a->comm_windows = !f.Has("--no-comm-windows");
  auto bad = [&](const char* flag) { return bench::BadValue(f, flag); };
  if (!bench::FlagPrecision(f, &a->precision)) return bad("--precision");
  if (!bench::FlagRecompute(f, &a->recompute)) return bad("--recompute");
  const std::string g8 = f.Get("--fp8-gather", "on");
  if (g8 != "on" && g8 != "off") return bad("--fp8-gather");
  a->fp8_gather = g8 == "on";
  if (!bench::FlagInt(f, "--world", &a->world) || a->world < 1) return bad("--world");
  if (!bench::FlagInt(f, "--shard-group-size", &a->shard_group_size) || a->shard_group_size < 0)
    return bad("--shard-group-size");
  if (!bench::FlagInt(f, "--emulate-nodes", &a->emulate_nodes) || a->emulate_nodes < 0 ||
      (a->emulate_nodes > 0 && a->world % a->emulate_nodes != 0))
    return bad("--emulate-nodes");
  if (!bench::FlagInt(f, "--micro-batch", &a->micro_batch) || (f.Has("--micro-batch") && a->micro_batch <= 0))
    return bad("--micro-batch");
  if (!bench::FlagInt(f, "--steps", &a->steps) || a->steps <= 0) return bad("--steps");
  if (!bench::FlagInt(f, "--warmup", &a->warmup) || a->warmup < 1) return bad("--warmup");
  if (!bench::FlagInt(f, "--nccl-max-ctas", &a->nccl_max_ctas) || a->nccl_max_ctas < 0)
    return bad("--nccl-max-ctas");
  if (!bench::FlagInt(f, "--nccl-cta-policy", &a->nccl_cta_policy)) return bad("--nccl-cta-policy");
  if (!bench::FlagInt(f, "--gemm-sm-margin", &a->gemm_sm_margin) || a->gemm_sm_margin < 0)
    return bad("--gemm-sm-margin");
  if (a->config.empty()) return "--config is required (see forge-dist-bench --help)";
  if (a->accum_check && !a->distinct_batches) return "--accum-check needs --distinct-batches";
  if (!a->single && (a->accum_check || a->ddp_allreduce == "copy_engine"))
    return "--no-single goes with neither --accum-check nor --ddp-allreduce copy_engine";
  return "";
}

// Milliseconds per call of `body` (which enqueues on `stream`), over `n` calls after `warm`.
template <typename Body>
StatusOr<double> TimeOnStream(cudaStream_t stream, int warm, int n, Body body) {
  for (int i = 0; i < warm; ++i) FORGE_RETURN_IF_ERROR(body());
  cudaEvent_t a, b;
  FORGE_CUDA_CHECK(cudaEventCreate(&a));
  FORGE_CUDA_CHECK(cudaEventCreate(&b));
  FORGE_CUDA_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < n; ++i) FORGE_RETURN_IF_ERROR(body());
  FORGE_CUDA_CHECK(cudaEventRecord(b, stream));
  FORGE_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0.0f;
  FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / n;
}

// CRC-32C over the bytes of every unit's fp32 master weights (common/checksum.h).
uint32_t ParamsCrc(const UnitBuffers& p) {
  uint32_t crc = 0;
  for (const std::vector<float>& u : p) crc = Crc32cExtend(crc, u.data(), u.size() * sizeof(float));
  return crc;
}

// What each rank trained on and how well it fits it after the timed steps (rank 0 reports
// every rank's): its own batch's loss without the other ranks' (the step's loss is their mean)
// and the fraction of positions whose input token equals the target (~1/vocab for random
// tokens). A diagnosis of runs whose mean loss falls far faster than one GPU's.
struct RankFit {
  std::vector<float> eval_losses;  // one per micro-batch trained on
  double input_is_target = 0;      // of the first
};

// Uniformly random (input, target) tokens of one micro-batch, from `seed`.
struct Tokens {
  std::vector<int32_t> inputs, targets;
};
Tokens RandomTokens(const RunConfig& cfg, uint64_t seed) {
  const int64_t n = int64_t{cfg.batch.micro_batch} * cfg.model.seq_len;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, std::min(50257, cfg.model.vocab) - 1);
  Tokens t{std::vector<int32_t>(size_t(n)), std::vector<int32_t>(size_t(n))};
  for (auto& x : t.inputs) x = tok(rng);
  for (auto& x : t.targets) x = tok(rng);
  return t;
}

// The tokens' seed of rank `rank`: one batch everywhere unless --distinct-batches.
uint64_t RankSeed(const RunConfig& cfg, const Args& a, int rank) {
  return cfg.seed + uint64_t(a.distinct_batches ? rank : 0);
}

// Sums what a communicator reports (comm_time_sink.h): the collectives' own seconds and the
// compute stream's stalls at its waits for them. Called from NCCL's watchdog thread too.
class StepCommTimes : public CommTimeSink {
 public:
  void AddCollectiveSeconds(CollectiveOp, double s) override { Add(&collective_, s); }
  void AddExposedWaitSeconds(CollectiveOp op, double s) override {
    Add(&wait_, s);
    Add(&wait_by_op_[size_t(op)], s);
  }
  double collective_s() const { return collective_.load(); }
  double wait_s() const { return wait_.load(); }
  double wait_s(CollectiveOp op) const { return wait_by_op_[size_t(op)].load(); }

 private:
  static void Add(std::atomic<double>* x, double s) {
    double v = x->load();
    while (!x->compare_exchange_weak(v, v + s)) {
    }
  }
  std::atomic<double> collective_{0}, wait_{0};
  std::array<std::atomic<double>, kCollectiveKinds> wait_by_op_{};
};

// What TimeSteps measured.
struct StepRun {
  double ms = 0;             // per step
  double gib = 0;            // peak GPU memory
  double host_ms = 0;        // wall time of the TrainStep calls themselves (enqueueing), per step
  float loss = 0;            // of the step after the timed ones
  bench::PhaseTimes phases;  // --profile only
  uint32_t params_crc = 0;   // kCrc: ParamsCrc of the weights after the run (collective)
  RankFit fit;               // kFit (its EvalLoss is collective under fsdp)
  double comm_wait_ms = 0;   // data parallel: the compute stream's stalls on collectives, per step
  std::array<double, kCollectiveKinds> comm_wait_by_op_ms{};  // that, by what it waited for
  double comm_in_step_ms = 0;  // data parallel: the collectives' own time, per step
};

// Steps TimeSteps adds, each synchronised, to split the exposed communication (comm_wait_ms).
constexpr int kWaitSteps = 5;
enum Extras : unsigned { kNoExtras = 0, kCrc = 1, kFit = 2 };

// Step time of `cfg` on a backend (world 1 when comm is null), and `extras` after the run.
// seeds: the micro-batches of a step (accumulated); empty: one, this rank's.
StatusOr<StepRun> TimeSteps(const RunConfig& cfg, Comm* comm, const Args& a,
                            unsigned extras = kNoExtras, std::vector<uint64_t> seeds = {}) {
  CudaBackendOptions options = CudaBackendOptionsFromConfig(cfg.engine);
  options.gemm_sm_margin = a.gemm_sm_margin;
  options.fp8_gather = a.fp8_gather;
  options.comm_windows = a.comm_windows;
  FORGE_ASSIGN_OR_RETURN(auto backend, MakeCudaTrainBackend(cfg, options, comm));
  if (seeds.empty()) seeds = {RankSeed(cfg, a, comm ? comm->rank() : 0)};
  std::vector<Tokens> data;
  std::vector<MicroBatch> micro;
  for (uint64_t sd : seeds) data.push_back(RandomTokens(cfg, sd));
  for (const Tokens& t : data) micro.push_back({t.inputs.data(), t.targets.data()});
  int64_t step = 0;
  auto stream = static_cast<cudaStream_t>(backend->compute_stream());
  double host_s = 0.0;
  StepRun run;
  FORGE_ASSIGN_OR_RETURN(run.ms, TimeOnStream(stream, a.warmup, a.steps, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = backend->TrainStep(micro, StepHyper{cfg.optimizer.lr, ++step}, false, nullptr);
    host_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
  }));
  run.host_ms = host_s * 1e3 / (a.warmup + a.steps);
  StepStats st;
  FORGE_RETURN_IF_ERROR(backend->TrainStep(micro, StepHyper{cfg.optimizer.lr, ++step}, true, &st));
  run.loss = st.loss;
  run.gib = double(backend->peak_bytes()) / double(1ull << 30);
  if (comm != nullptr && comm->world() > 1) {
    // Each step synchronised and its waits collected before the next (TrainStep with stats),
    // so the sums cover exactly these steps; the collectives' own times arrive from NCCL's
    // watchdog once their events completed, so the last ones are awaited. hsdp: the shard
    // and replica groups' too.
    StepCommTimes times;
    backend->SetCommTimeSink(&times);
    for (int i = 0; i < kWaitSteps; ++i) {
      FORGE_RETURN_IF_ERROR(
          backend->TrainStep(micro, StepHyper{cfg.optimizer.lr, ++step}, true, &st));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    backend->SetCommTimeSink(nullptr);
    run.comm_wait_ms = times.wait_s() * 1e3 / kWaitSteps;
    for (int op = 0; op < kCollectiveKinds; ++op) {
      run.comm_wait_by_op_ms[size_t(op)] = times.wait_s(CollectiveOp(op)) * 1e3 / kWaitSteps;
    }
    run.comm_in_step_ms = times.collective_s() * 1e3 / kWaitSteps;
  }
  if (extras & kCrc) {
    UnitBuffers p;
    FORGE_RETURN_IF_ERROR(backend->GetParams(&p));
    run.params_crc = ParamsCrc(p);
  }
  if (extras & kFit) {
    FORGE_RETURN_IF_ERROR(backend->BeginEval());
    for (const MicroBatch& m : micro) {
      FORGE_RETURN_IF_ERROR(backend->EvalLoss(m, &run.fit.eval_losses.emplace_back()));
    }
    const Tokens& t = data[0];
    int64_t same = 0;
    for (size_t i = 0; i < t.inputs.size(); ++i) same += t.inputs[i] == t.targets[i];
    run.fit.input_is_target = double(same) / double(t.inputs.size());
  }
  if (a.profile) {
    // Eager and single-stream (see ProfileStep); with a comm the collectives still overlap on
    // their own stream, so the phases that grow against the single GPU's are the ones the
    // collectives slow down.
    FORGE_ASSIGN_OR_RETURN(run.phases,
                           bench::ProfilePhases(*backend, micro, cfg.optimizer.lr, &step));
  }
  return run;
}

// The collectives of one step alone, on buffers of the real unit sizes.
StatusOr<double> TimeCollectives(const RunConfig& cfg, NcclComm* world_comm, const Args& a) {
  const ParamLayout layout = MakeParamLayout(cfg.model);
  // hsdp: fsdp's collectives over the shard group, each slot then all-reduced over the replica
  // group on that comm's stream (as CudaDataParallel does); group sizes 1 and W are ddp and
  // fsdp there, and here.
  NcclComm* comm = world_comm;
  std::unique_ptr<NcclComm> shard_comm, replica_comm;
  bool fsdp_like = a.mode == "fsdp";
  bool ddp_like = a.mode == "ddp";
  if (cfg.parallel.mode == ParallelMode::kHsdp) {
    const HybridGroups h =
        HybridGroupsOf(world_comm->rank(), world_comm->world(), cfg.parallel.shard_group_size);
    fsdp_like = h.shard_size > 1;
    ddp_like = h.shard_size == 1;
    if (h.shard_size > 1 && h.replicas > 1) {
      FORGE_ASSIGN_OR_RETURN(shard_comm, world_comm->SplitNccl(h.replica_rank, world_comm->rank(),
                                                               "bench shard group"));
      FORGE_ASSIGN_OR_RETURN(replica_comm, world_comm->SplitNccl(h.shard_rank, world_comm->rank(),
                                                                 "bench replica group"));
      comm = shard_comm.get();
    }
  }
  const int W = comm->world();
  int64_t padded = 0;
  for (const UnitLayout& u : layout.units) padded += PaddedSize(u.numel, W);
  float* grads = nullptr;
  FORGE_CUDA_CHECK(cudaMalloc(&grads, padded * sizeof(float) * 2));
  FORGE_CUDA_CHECK(cudaMemset(grads, 0, padded * sizeof(float) * 2));
  float* shard = grads + padded;
  const bool sharded = !ddp_like;
  const bool bf16 = cfg.parallel.grad_reduce == GradReduce::kBf16;
  cudaEvent_t shard_done = nullptr, replica_done = nullptr;
  cudaStream_t replica_stream = nullptr;
  if (replica_comm) {
    replica_stream = static_cast<cudaStream_t>(replica_comm->stream());
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&shard_done, cudaEventDisableTiming));
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&replica_done, cudaEventDisableTiming));
  }
  int64_t largest = 0;
  for (const UnitLayout& u : layout.units) largest = std::max(largest, PaddedSize(u.numel, W));
  cuda::bf16* comm16 = nullptr;  // the step's bf16 comm buffer (bf16 only)
  if (bf16) {
    FORGE_CUDA_CHECK(cudaMalloc(&comm16, largest * sizeof(cuda::bf16)));
    FORGE_CUDA_CHECK(cudaMemset(comm16, 0, largest * sizeof(cuda::bf16)));
  }
  if (cfg.parallel.ddp_allreduce == DdpAllReduce::kCopyEngine) {  // as the step's will be
    FORGE_RETURN_IF_ERROR(comm->EnableCopyEngineAllReduce(grads, padded, largest));
  }
  // fsdp in FP8 with the E4M3 gather (the step's rule: fp8_gather_rule.h): a block's gathers
  // move its linear weights a byte an element (as bf16 pairs) and its norm weights in a
  // second small bf16 gather, as the step's.
  const bool e4m3 = a.fp8_gather && ChooseFp8Gather(cfg, world_comm->world()).e4m3;
  const int64_t block_numel = layout.units[size_t(layout.block_unit(0))].numel;
  const int64_t norm_share = e4m3 ? MostNormElementsPerSlot(block_numel, layout.linears, W) : 0;
  auto stream = static_cast<cudaStream_t>(comm->stream());
  std::vector<int64_t> offset;  // of each unit in the padded buffers
  for (int64_t o = 0; const UnitLayout& u : layout.units) {
    offset.push_back(o);
    o += PaddedSize(u.numel, W);
  }
  // Backward order (last unit first), as the step issues them.
  auto one_step = [&]() -> Status {
    for (int u = int(layout.units.size()) - 1; u >= 0; --u) {
      const int64_t numel = layout.units[u].numel, slot = ShardSize(numel, W), o = offset[u];
      // bf16 as the step: zero casts to the bf16 comm buffer, reduce-scatters in place, widens
      // (CudaDataParallel::ReduceBf16); ddp sums its bf16 gradient twin in place (grads16: the
      // step casts only the units its weight-gradient GEMMs did not write in bf16).
      cuda::bf16* mine = sharded ? comm16 + comm->rank() * slot : comm16;
      if (bf16 && sharded) {
        FORGE_RETURN_IF_ERROR(cuda::CastFloatToBf16(comm16, grads + o, W * slot, stream));
      }
      StatusOr<CommWorkPtr> w =
          bf16 ? (sharded ? comm->ReduceScatterSum(comm16, mine, slot, DType::kBF16, "bench")
                          : comm->AllReduceSum(comm16, numel, DType::kBF16, "bench"))
          : sharded ? comm->ReduceScatterSum(grads + o, shard + o, slot, DType::kF32, "bench")
                    : comm->AllReduceSum(grads + o, numel, DType::kF32, "bench");
      if (!w.ok()) return w.status();
      if (bf16 && sharded) {
        FORGE_RETURN_IF_ERROR(cuda::CastBf16ToFloat(shard + o, mine, slot, stream));
      }
      if (replica_comm) {  // hsdp: the slot over the replicas, after its reduce-scatter
        FORGE_CUDA_CHECK(cudaEventRecord(shard_done, stream));
        FORGE_CUDA_CHECK(cudaStreamWaitEvent(replica_stream, shard_done, 0));
        w = replica_comm->AllReduceSum(shard + o, slot, DType::kF32, "bench replicas");
        if (!w.ok()) return w.status();
      }
      // The bf16 parameter all-gathers of the unit: once (zero), or before its forward and
      // again before its backward (fsdp, hsdp).
      for (int k = 0; k < (!sharded ? 0 : fsdp_like ? 2 : 1); ++k) {
        auto* p = reinterpret_cast<uint16_t*>(shard + o);
        if (e4m3 && layout.is_block_unit(u)) {
          w = comm->AllGather(p + comm->rank() * norm_share, p, norm_share, DType::kBF16, "bench");
          if (!w.ok()) return w.status();
          const int64_t pairs = slot / 2;  // even where the E4M3 gather runs
          w = comm->AllGather(p + comm->rank() * pairs, p, pairs, DType::kBF16, "bench");
        } else {
          w = comm->AllGather(p + comm->rank() * slot, p, slot, DType::kBF16, "bench");
        }
        if (!w.ok()) return w.status();
      }
    }
    if (replica_comm) {  // the step ends when the replica stream is done too
      FORGE_CUDA_CHECK(cudaEventRecord(replica_done, replica_stream));
      FORGE_CUDA_CHECK(cudaStreamWaitEvent(stream, replica_done, 0));
    }
    return Status::Ok();
  };
  auto ms = TimeOnStream(stream, 2, a.steps, one_step);
  if (shard_done) cudaEventDestroy(shard_done);
  if (replica_done) cudaEventDestroy(replica_done);
  cudaFree(grads);
  if (comm16) cudaFree(comm16);
  return ms;
}

// Hardware queues this process's CUDA gets (CUDA_DEVICE_MAX_CONNECTIONS, driver default 8).
int QueuesFromEnv() {
  const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return v ? std::atoi(v) : 8;
}

// The single-GPU baseline of one rank (TimeSteps on a world-1 backend) in a child process that
// starts CUDA with this process's environment, for a rank that is about to ask for more
// hardware queues (the copy engines ask for 32, which slow a graph-replayed single-GPU step by
// ~2%: measured in the rank's own process, the baseline would flatter the scaling efficiency).
// Call before this process touches CUDA (fork). The result travels as text over a pipe:
// "ms gib host_ms loss n" and n lines "phase ms".
StatusOr<StepRun> MeasureBaselineInChild(const RunConfig& cfg, const Args& a, int device) {
  int fds[2];
  if (pipe(fds) != 0) return Status::Internal("baseline: pipe failed");
  const pid_t pid = fork();
  if (pid < 0) return Status::Internal("baseline: fork failed");
  if (pid == 0) {
    close(fds[0]);
    cudaSetDevice(device);
    auto b = TimeSteps(cfg, nullptr, a);
    int code = 1;
    if (b.ok()) {
      std::string out = std::to_string(b->ms) + " " + std::to_string(b->gib) + " " +
                        std::to_string(b->host_ms) + " " + std::to_string(b->loss) + " " +
                        std::to_string(b->phases.size()) + "\n";
      for (const auto& [name, ms] : b->phases) out += name + " " + std::to_string(ms) + "\n";
      code = write(fds[1], out.data(), out.size()) == ssize_t(out.size()) ? 0 : 1;
    } else {
      std::fprintf(stderr, "forge-dist-bench: baseline: %s\n", b.status().ToString().c_str());
    }
    close(fds[1]);
    std::_Exit(code);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) text.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Internal("baseline: the child process failed (its stderr says why)");
  }
  std::istringstream in(text);
  StepRun b;
  size_t n = 0;
  if (!(in >> b.ms >> b.gib >> b.host_ms >> b.loss >> n)) {
    return Status::Internal("baseline: unreadable result '" + text + "'");
  }
  for (size_t i = 0; i < n; ++i) {
    std::pair<std::string, double> p;
    if (!(in >> p.first >> p.second)) return Status::Internal("baseline: unreadable phases");
    b.phases.push_back(p);
  }
  return b;
}

int RunRank(const Args& a, const RunConfig& cfg, int rank, int port) {
  if (a.emulate_nodes > 0) {  // before anything starts NCCL (it reads the host id once)
    const int node = rank / (a.world / a.emulate_nodes);
    setenv("NCCL_HOSTID", ("forge-emulated-node-" + std::to_string(node)).c_str(), 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    setenv("NCCL_IB_DISABLE", "1", 0);
  }
  // Copy engines: the baseline first, in a child with this process's queues, then 32 queues.
  const bool copy_engine = cfg.parallel.ddp_allreduce == DdpAllReduce::kCopyEngine;
  const int baseline_queues = QueuesFromEnv();
  StatusOr<StepRun> child_baseline = StepRun{};
  if (copy_engine) {
    child_baseline = MeasureBaselineInChild(cfg, a, rank);
    if (!child_baseline.ok()) {
      return Fail("single-GPU baseline: " + child_baseline.status().ToString());
    }
    ReserveCudaQueuesForCopyEngine();
  }
  cudaSetDevice(rank);
  TcpRendezvousOptions ro;
  ro.port = port;
  ro.timeout_s = 120;
  auto rdv = MakeTcpRendezvous(ro);
  NcclCommOptions no;
  no.device = rank;
  no.timeout_s = 600;
  if (a.nccl_max_ctas > 0) no.max_ctas = a.nccl_max_ctas;
  if (a.nccl_cta_policy >= 0) no.cta_policy = a.nccl_cta_policy;
  auto nccl = MakeNcclComm(rank, a.world, rdv.get(), no);
  if (!nccl.ok()) return Fail("rank " + std::to_string(rank) + ": " + nccl.status().ToString());
  auto host = MakeHostStagedComm(nccl->get());
  if (!host.ok()) return Fail(host.status().ToString());

  auto single = copy_engine  ? std::move(child_baseline)
                : !a.single ? StatusOr<StepRun>(StepRun{})
                            : TimeSteps(cfg, nullptr, a);
  if (!single.ok()) return Fail("single-GPU baseline: " + single.status().ToString());
  auto comm_ms = TimeCollectives(cfg, nccl->get(), a);
  if (!comm_ms.ok()) return Fail("collectives: " + comm_ms.status().ToString());
  auto dp = TimeSteps(cfg, nccl->get(), a, kCrc | kFit);
  if (!dp.ok()) return Fail("data-parallel step: " + dp.status().ToString());

  // Every rank's numbers to everyone (rank 0 reports the slowest step and the largest memory).
  // The weights' CRC travels exactly (a 32-bit integer is exact in a double).
  // clang-format off
  std::vector<double> mine = {single->ms, *comm_ms, dp->ms, dp->gib, double(dp->params_crc),
                              dp->fit.eval_losses[0], dp->fit.input_is_target,
                              dp->comm_wait_ms, dp->comm_in_step_ms};
  // clang-format on
  const size_t by_op = mine.size();
  mine.insert(mine.end(), dp->comm_wait_by_op_ms.begin(), dp->comm_wait_by_op_ms.end());
  const size_t k = mine.size();
  std::vector<double> all(k * a.world);
  auto g = (*host)->AllGather(mine.data(), all.data(), int64_t(k), DType::kF64, "results");
  if (!g.ok() || !(*g)->Wait().ok()) return Fail("gathering results failed");
  if (rank != 0) return 0;
  double single_ms = 0, comm = 0, step_ms = 0, peak = 0, wait = 0, in_step = 0;
  int slowest_wait = 0;  // the rank whose wait is reported (split by collective kind too)
  bool same_weights = true;
  for (int q = 0; q < a.world; ++q) {
    single_ms = std::max(single_ms, all[q * k + 0]);
    comm = std::max(comm, all[q * k + 1]);
    step_ms = std::max(step_ms, all[q * k + 2]);
    peak = std::max(peak, all[q * k + 3]);
    if (all[q * k + 7] > wait) slowest_wait = q;
    wait = std::max(wait, all[q * k + 7]);
    in_step = std::max(in_step, all[q * k + 8]);
    same_weights = same_weights && all[q * k + 4] == all[4];
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, rank);
  const double n = double(cfg.batch.micro_batch) * cfg.model.seq_len;
  const double per_gpu = n / (step_ms * 1e-3), single_tps = n / (single_ms * 1e-3);
  const double exposed = std::max(0.0, step_ms - single_ms);
  const double peak_tflops = DenseBf16PeakTflops(prop.name);
  Json out;
  out["model"] = cfg.model.preset.empty() ? cfg.name : cfg.model.preset;
  out["mode"] = a.mode;
  out["precision"] = PrecisionName(cfg.precision.compute);
  out["recompute"] = RecomputeName(cfg.train.activation_recompute);
  if (cfg.precision.compute == Precision::kFp8 && cfg.parallel.mode == ParallelMode::kFsdp)
    out["fp8_gather"] = a.fp8_gather;
  if (a.emulate_nodes > 0) out["emulated_nodes"] = a.emulate_nodes;
  if (cfg.parallel.mode == ParallelMode::kHsdp)
    out["shard_group_size"] = cfg.parallel.shard_group_size;
  out["grad_reduce"] = GradReduceName(cfg.parallel.grad_reduce);
  out["ddp_allreduce"] = DdpAllReduceName(cfg.parallel.ddp_allreduce);
  out["nccl_symmetric_memory"] = cfg.engine.nccl_symmetric_memory;
  out["world"] = a.world;
  out["B"] = cfg.batch.micro_batch;
  out["step_ms"] = step_ms;
  out["tokens_per_s"] = per_gpu * a.world;
  out["tokens_per_s_per_gpu"] = per_gpu;
  if (a.single) {
    out["single_gpu_tokens_per_s"] = single_tps;
    out["scaling_efficiency"] = per_gpu / single_tps;
  }
  out["mfu"] = ModelFlopsUtilization(per_gpu, TrainFlopsPerToken(cfg.model), peak_tflops);
  out["peak_mem_gib"] = peak;
  if (a.single) out["single_gpu_peak_mem_gib"] = single->gib;
  out["comm_ms"] = comm;
  if (a.single) {
    out["comm_exposed_ms"] = exposed;
    out["comm_hidden_ms"] = std::max(0.0, comm - exposed);
  }
  out["comm_wait_ms"] = wait;  // the slowest rank's; see the file comment
  Json wait_by_op = Json::object();
  for (int op = 0; op < kCollectiveKinds; ++op) {
    const double ms = all[size_t(slowest_wait) * k + by_op + size_t(op)];
    if (ms > 0) wait_by_op[CollectiveName(CollectiveOp(op))] = ms;
  }
  out["comm_wait_by_op_ms"] = wait_by_op;
  if (a.single) out["comm_slowdown_ms"] = std::max(0.0, exposed - wait);
  out["comm_in_step_ms"] = in_step;
  out["loss"] = dp->loss;
  // rank 0's baseline: with the same batch everywhere the two losses track each other (the
  // data-parallel step trains the baseline's trajectory), so the efficiency compares like runs.
  if (a.single) out["single_gpu_loss"] = single->loss;
  out["ranks_bitwise_equal"] = same_weights;  // every rank's weights after the timed steps
  Json fits = Json::array(), same_tokens = Json::array();
  for (int q = 0; q < a.world; ++q) {
    fits.push_back(all[q * k + 5]);
    same_tokens.push_back(all[q * k + 6]);
  }
  out["rank_eval_losses"] = fits;  // each rank's own batch after the run (RankFit)
  out["rank_input_is_target"] = same_tokens;
  if (a.accum_check) {  // one GPU, the ranks' batches accumulated: what the step should equal
    std::vector<uint64_t> seeds;
    for (int q = 0; q < a.world; ++q) seeds.push_back(RankSeed(cfg, a, q));
    auto acc = TimeSteps(cfg, nullptr, a, kFit, seeds);
    if (!acc.ok()) return Fail("--accum-check: " + acc.status().ToString());
    out["accum_loss"] = acc->loss;
    out["accum_eval_losses"] = acc->fit.eval_losses;
  }
  // Hardware queues of the data-parallel step and of the baseline (the copy engines ask for
  // 32, which slow a single-GPU step ~2%; their baseline runs in a child with the queues the
  // environment gives, the default 8 unless set).
  out["cuda_device_max_connections"] = QueuesFromEnv();
  out["baseline_cuda_device_max_connections"] = baseline_queues;
  out["host_ms_per_step"] = dp->host_ms;  // rank 0's enqueue time (incl. waiting for staging)
  out["gpu"] = prop.name;
  out["batches"] = a.distinct_batches ? "distinct per rank" : "same on every rank";
  if (a.profile) {  // rank 0's
    if (a.single) out["phases_single_ms"] = bench::PhasesJson<Json>(single->phases);
    out["phases_parallel_ms"] = bench::PhasesJson<Json>(dp->phases);
  }
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  return 0;
}

int Run(int argc, char** argv) {
  FlagParser flags = MakeFlags();
  if (int rc; bench::ParseFlagsOrExit(flags, "forge-dist-bench", argc, argv, &rc)) return rc;
  Args a;
  if (std::string err = ReadArgs(flags, &a); !err.empty()) return Fail(err);
  auto loaded = LoadRunConfig(a.config);
  if (!loaded.ok()) return Fail(loaded.status().ToString());
  RunConfig cfg = *loaded;
  if (a.micro_batch > 0) cfg.batch.micro_batch = a.micro_batch;
  bench::ApplyPrecisionAndRecompute(a.precision, a.recompute, &cfg);
  cfg.batch.global_batch = cfg.batch.micro_batch * a.world;
  for (const Status& st :
       {ParallelModeFromName(a.mode, "--mode", &cfg.parallel.mode),
        GradReduceFromName(a.grad_reduce, "--grad-reduce", &cfg.parallel.grad_reduce),
        DdpAllReduceFromName(a.ddp_allreduce, "--ddp-allreduce", &cfg.parallel.ddp_allreduce)}) {
    if (!st.ok()) return Fail(st.message());
  }
  cfg.parallel.shard_group_size = cfg.parallel.mode == ParallelMode::kHsdp ? a.shard_group_size : 0;
  if (Status g = CheckShardGroupSize(cfg.parallel, a.world); !g.ok()) return Fail(g.message());
  // fsdp + bf16, copy_engine outside ddp/fp32
  if (Status v = ValidateRunConfig(cfg); !v.ok()) return Fail(v.ToString());

  // Children only: the parent never touches CUDA, so forking is safe.
  const int port = 20000 + int(getpid() % 20000);
  std::vector<pid_t> kids;
  for (int r = 0; r < a.world; ++r) {
    const pid_t pid = fork();
    if (pid < 0) return Fail("fork failed");
    if (pid == 0) {
      const int code = RunRank(a, cfg, r, port);
      std::fflush(nullptr);
      std::_Exit(code);
    }
    kids.push_back(pid);
  }
  int rc = 0;
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) { return forge::Run(argc, argv); }
