// TrainBackend on one GPU: CudaModel (the step) plus host staging, the optimizer's device-side
// hyper-parameters and CUDA-graph capture/replay of the step's device work.
//
// A step never synchronises with the host unless stats are wanted: tokens are copied into
// fixed pinned buffers and sent with cudaMemcpyAsync, lr/step go through a pinned struct copied
// to device memory, loss and grad norm land in a pinned pair read only after a sync.
// The H2D copies are ordinary stream operations enqueued before the (graph or eager) compute,
// which only reads fixed device buffers. The copies read the pinned staging when the GPU gets
// to them, so the host waits on `staging_free_` (recorded right after them) before writing the
// staging again: the host runs at most one step ahead, and the GPU always has the next step
// queued before the current one ends.
//
// Checkpoint snapshots (GetParams/GetMoments) copy on their own `snapshot_stream_`, fenced by an
// event recorded on the compute stream at the call (the step boundary: everything enqueued so
// far, the wgrad stream joined in), and wait for that stream only. Into host buffers pinned
// with PinHostRange the copies run at PCIe speed (~4.3 GB, gpt350m's fp32 state, in ~0.2 s).
#include "worker/train/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "worker/model/cuda_model.h"
#include "worker/model/fp8_linears.h"
#include "worker/model/init.h"
#include "worker/model/phase_timeline.h"
#include "worker/parallel/hybrid_groups.h"
#include "worker/parallel/nccl_comm.h"
#include "worker/train/cuda_data_parallel.h"

namespace forge {
namespace {

class CudaBackend final : public CudaTrainBackend {
 public:
  CudaBackend() = default;
  ~CudaBackend() override;
  Status Init(const RunConfig& cfg, const CudaBackendOptions& options, NcclComm* comm);

  const char* name() const override { return "cuda"; }
  Status SetParams(const UnitBuffers& master) override;
  Status GetParams(UnitBuffers* master) override;
  Status GetMoments(UnitBuffers* m, UnitBuffers* v) override;
  Status SetMoments(const UnitBuffers& m, const UnitBuffers& v) override;
  Status GetExtraState(std::map<std::string, std::string>* blobs) override;
  Status SetExtraState(const std::map<std::string, std::string>& blobs) override;
  Status TrainStep(const std::vector<MicroBatch>& micro, const StepHyper& hyper, bool want_stats,
                   StepStats* stats) override;
  Status EvalLoss(const MicroBatch& batch, float* loss) override;
  bool EvalIsCollective() const override { return dp_ && dp_->fsdp(); }
  Status ComputeGradients(const std::vector<MicroBatch>& micro, UnitBuffers* grads,
                          float* loss) override;
  // With train.spike_sigma on, the step's own loss and norm gate its update on the device.
  bool SkipsAboveLimits() const override { return dev_limits_ != nullptr; }

  int64_t peak_bytes() override;
  int64_t allocated_bytes() const override {
    return static_cast<int64_t>(model_ ? model_->allocated_bytes() : 0) + own_bytes_;
  }
  bool graph_active() const override { return graph_exec_ != nullptr; }
  int64_t fp8_block_gathers() const override { return dp_ ? dp_->fp8_block_gathers() : 0; }
  void* compute_stream() const override { return compute_stream_; }
  void SetCommTimeSink(CommTimeSink* sink) override {
    for (NcclComm* c : {world_comm_, hsdp_shard_.get(), hsdp_replica_.get()}) {
      if (c != nullptr) c->SetTimeSink(sink);
    }
  }
  Status ProfileStep(const std::vector<MicroBatch>& micro, const StepHyper& hyper,
                     std::vector<std::pair<std::string, double>>* phase_ms) override;
  std::unique_ptr<PinnedHostRange> PinHostRange(void* p, size_t bytes) override;

 private:
  Status Prepare(const std::vector<MicroBatch>& micro);
  Status EnsureTokenCapacity(int micro_steps);
  Status StageTokens(const std::vector<MicroBatch>& micro);
  void SetHyper(const StepHyper& hyper);
  Status EnqueueInputs(int micro_steps, bool optimizer);
  Status EnqueueCompute(int micro_steps, bool optimizer);
  Status CaptureAndLaunch(int micro_steps);
  void DestroyGraph();
  void FreeTokenBuffers();
  void SamplePeak();
  Status FenceSnapshot();
  Status Sync() {
    FORGE_CUDA_CHECK(cudaStreamSynchronize(compute_stream_));
    return Status::Ok();
  }

  RunConfig cfg_;
  CudaBackendOptions options_;
  int device_ = 0;
  std::unique_ptr<CudaModel> model_;
  int64_t N_ = 0;  // tokens per micro-batch
  NcclComm* world_comm_ = nullptr;  // data parallel only
  // hsdp's shard and replica groups, split from the world comm (before dp_: it uses them).
  std::unique_ptr<NcclComm> hsdp_shard_, hsdp_replica_;
  std::unique_ptr<CudaDataParallel> dp_;  // null in a single-GPU run
  int world_ = 1;

  cudaStream_t compute_stream_ = nullptr;  // every step's work, in order
  cudaEvent_t staging_free_ = nullptr;     // the last step's H2D copies have read the staging
  cudaStream_t snapshot_stream_ = nullptr;  // GetParams/GetMoments copies
  cudaEvent_t snapshot_from_ = nullptr;     // compute-stream point the snapshot copies wait for

  // Token staging, [inputs: capacity*N][targets: capacity*N], pinned on the host and on device.
  int token_capacity_ = 0;  // micro-batches the buffers hold
  int32_t* host_tokens_ = nullptr;
  int32_t* dev_tokens_ = nullptr;
  float* dev_losses_ = nullptr;  // per-token losses of every micro-batch [capacity*N]

  cuda::AdamWHyper* host_hyper_ = nullptr;  // pinned; copied into dev_hyper_ by the step
  cuda::AdamWHyper* dev_hyper_ = nullptr;
  float* dev_stats_ = nullptr;   // [mean loss, grad sum of squares]
  float* host_stats_ = nullptr;  // pinned copy, valid after a sync
  int64_t* host_skipped_ = nullptr;  // pinned copy of the model's skipped-step counter
  // Loss-spike limits [loss, grad norm] (StepHyper::skip_above), pinned and on the device,
  // copied with the hyper-parameters; null when train.spike_sigma is off.
  float* host_limits_ = nullptr;
  float* dev_limits_ = nullptr;

  bool use_graph_ = true;
  int warm_micro_ = 0;   // micro-step count of the last eager step (plans exist for it)
  int graph_micro_ = 0;  // micro-step count the graph was captured for
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t graph_exec_ = nullptr;

  PhaseTimeline timeline_;
  int64_t own_bytes_ = 0;
  size_t baseline_used_ = 0;  // device memory in use before this backend allocated anything
  int64_t peak_ = 0;
};

CudaBackend::~CudaBackend() {
  if (compute_stream_) cudaStreamSynchronize(compute_stream_);
  DestroyGraph();
  model_.reset();
  FreeTokenBuffers();
  if (host_hyper_) cudaFreeHost(host_hyper_);
  if (host_stats_) cudaFreeHost(host_stats_);
  if (host_skipped_) cudaFreeHost(host_skipped_);
  if (host_limits_) cudaFreeHost(host_limits_);
  if (dev_limits_) cudaFree(dev_limits_);
  if (dev_hyper_) cudaFree(dev_hyper_);
  if (dev_stats_) cudaFree(dev_stats_);
  if (staging_free_) cudaEventDestroy(staging_free_);
  if (snapshot_from_) cudaEventDestroy(snapshot_from_);
  if (snapshot_stream_) cudaStreamDestroy(snapshot_stream_);
  if (compute_stream_) cudaStreamDestroy(compute_stream_);
}

Status CudaBackend::Init(const RunConfig& cfg, const CudaBackendOptions& options,
                         NcclComm* comm) {
  cfg_ = cfg;
  options_ = options;
  use_graph_ = options.use_graph;
  world_ = comm != nullptr ? comm->world() : 1;
  if (world_ > 1) world_comm_ = comm;
  // Data-parallel steps run eagerly: the comm watchdog tracks each collective it issues, which
  // a replayed graph's collectives would bypass.
  if (world_ > 1) use_graph_ = false;
  FORGE_CUDA_CHECK(cudaGetDevice(&device_));
  FORGE_CUDA_CHECK(cudaFree(nullptr));  // create the context before the memory baseline
  size_t free_b = 0, total_b = 0;
  FORGE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  baseline_used_ = total_b - free_b;

  // Stream priorities: numerically lower is more urgent; `least` is the default (0).
  int least = 0, greatest = 0;
  FORGE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  int compute_priority = least, wgrad_priority = least;
  if (options.wgrad_stream && options.wgrad_priority < 0) compute_priority = greatest;
  if (options.wgrad_stream && options.wgrad_priority > 0) wgrad_priority = greatest;

  CudaModelOptions mo;
  mo.micro_batch = cfg.batch.micro_batch;
  mo.recompute = cfg.train.activation_recompute;
  mo.deterministic_attention = options.deterministic_attention;
  mo.cudnn_attention_backward = options.cudnn_attention_backward;
  mo.gemm_autotune = options.gemm_autotune;
  mo.lm_head_chunk_rows = options.lm_head_chunk_rows;
  mo.wgrad_stream = options.wgrad_stream;
  mo.norm_dw_on_wgrad = options.norm_dw_on_wgrad;
  mo.rope_gemm = options.rope_gemm;
  mo.swiglu_gemm = options.swiglu_gemm;
  mo.fp8_lm_head_wgrad = options.fp8_lm_head_wgrad;
  mo.swiglu_bwd_gemm = options.swiglu_bwd_gemm;
  mo.fp8_attention_rope = options.fp8_attention_rope;
  mo.fp8_norm_casts = options.fp8_norm_casts;
  mo.wgrad_stream_priority = wgrad_priority;
  mo.defer_update = options.defer_update;
  mo.fp8 = cfg.precision.compute == Precision::kFp8;
  mo.fp8_config = cfg.precision.fp8;
  // What the mode keeps and moves (worker/parallel/mode_rules.h); hsdp shards the model over
  // its shard group (worker/parallel/hybrid_groups.h).
  if (world_ > 1) FORGE_RETURN_IF_ERROR(CheckShardGroupSize(cfg.parallel, world_));
  const ModeRules rules = ModeRulesFor(cfg.parallel, world_);
  NcclComm* shard_comm = comm;
  if (rules.reduce_over_replicas) {
    const HybridGroups h = HybridGroupsOf(comm->rank(), world_, cfg.parallel.shard_group_size);
    // Collective over comm, in the same order on every rank.
    FORGE_ASSIGN_OR_RETURN(hsdp_shard_,
                           comm->SplitNccl(h.replica_rank, comm->rank(), "hsdp shard group"));
    FORGE_ASSIGN_OR_RETURN(hsdp_replica_,
                           comm->SplitNccl(h.shard_rank, comm->rank(), "hsdp replica group"));
    shard_comm = hsdp_shard_.get();
  }
  // The copy-engine all-reduce maps its peers' gradient buffers with CUDA IPC, which takes
  // cudaMalloc memory only.
  const bool symmetric = world_ > 1 && options.nccl_symmetric_memory &&
                         shard_comm->SupportsSymmetricMemory() &&
                         cfg.parallel.ddp_allreduce != DdpAllReduce::kCopyEngine;
  if (world_ > 1) {
    const bool ddp = !rules.sharded();
    mo.shard_world = shard_comm->world();
    mo.shard_rank = shard_comm->rank();
    mo.shard_optimizer = rules.shard_optimizer;
    mo.shard_params = rules.shard_params;
    mo.grads16 = ddp && cfg.parallel.grad_reduce == GradReduce::kBf16;
    mo.gemm_sm_margin = options.gemm_sm_margin;
    // ddp leaves the SwiGLU-backward GEMM off: its persistent CTAs hold every SM for ~0.2 ms a
    // layer, and the all-reduces overlapping the backward wait for them (4x H200, gpt350m B 16,
    // bf16 gradients: 96.6% -> 97.1% of one GPU, 203.9k -> 205.5k tokens/s per GPU without it;
    // docs/performance.md). Bitwise the same gradients either way.
    if (ddp) mo.swiglu_bwd_gemm = false;
    if (symmetric) {
      mo.collective_alloc = [shard_comm](size_t bytes) {
        return shard_comm->AllocSymmetric(bytes);
      };
    }
  }
  mo.wgrad_sm_margin = options.wgrad_sm_margin;
  FORGE_ASSIGN_OR_RETURN(model_, CudaModel::Create(cfg.model, cfg.optimizer, mo));
  if (comm == nullptr || comm->rank() == 0) {
    for (const std::string& f : model_->fallbacks()) {
      std::fprintf(stderr, "forge: cuda backend: %s\n", f.c_str());
    }
    // The linears' strategy, once: FP8 delayed scaling runs the first step's plan, then the
    // delayed plan (its casts fused); BF16 and current scaling run one plan throughout.
    const LinearStrategies& ls = model_->linear_strategies();
    const bool two = mo.fp8 && cfg.precision.fp8.recipe == Fp8Recipe::kDelayed &&
                     ls.delayed != ls.measuring;
    std::fprintf(stderr, "forge: cuda backend: linears%s: %s\n", two ? " (first step)" : "",
                 DescribeLinearPlan(ls.measuring).c_str());
    if (two) {
      std::fprintf(stderr, "forge: cuda backend: linears (later steps): %s\n",
                   DescribeLinearPlan(ls.delayed).c_str());
    }
  }
  N_ = model_->tokens_per_micro();
  if (world_ > 1) {
    FORGE_ASSIGN_OR_RETURN(
        dp_, CudaDataParallel::Create(shard_comm, rules, model_.get(), cfg.parallel.grad_reduce,
                                      cfg.parallel.ddp_allreduce, options.comm_windows,
                                      hsdp_replica_.get(), options.fp8_gather, symmetric));
    model_->set_hooks(dp_->read_hooks());
    if (comm->rank() == 0 && !dp_->fp8_gather_note().empty()) {
      std::fprintf(stderr, "forge: cuda backend: %s\n", dp_->fp8_gather_note().c_str());
    }
  }

  FORGE_CUDA_CHECK(
      cudaStreamCreateWithPriority(&compute_stream_, cudaStreamNonBlocking, compute_priority));
  // Blocking sync: the host waits up to a whole step here; yield the core instead of spinning.
  FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&staging_free_,
                                            cudaEventDisableTiming | cudaEventBlockingSync));
  FORGE_CUDA_CHECK(cudaStreamCreateWithFlags(&snapshot_stream_, cudaStreamNonBlocking));
  FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&snapshot_from_, cudaEventDisableTiming));
  FORGE_CUDA_CHECK(cudaMallocHost(&host_hyper_, sizeof(cuda::AdamWHyper)));
  FORGE_CUDA_CHECK(cudaMallocHost(&host_stats_, 2 * sizeof(float)));
  FORGE_CUDA_CHECK(cudaMallocHost(&host_skipped_, sizeof(int64_t)));
  *host_skipped_ = 0;
  FORGE_CUDA_CHECK(cudaMalloc(&dev_hyper_, sizeof(cuda::AdamWHyper)));
  FORGE_CUDA_CHECK(cudaMalloc(&dev_stats_, 2 * sizeof(float)));
  own_bytes_ += 512;
  host_stats_[0] = host_stats_[1] = 0.0f;
  FORGE_CUDA_CHECK(cudaMemsetAsync(dev_stats_, 0, 2 * sizeof(float), compute_stream_));
  if (cfg.train.spike_sigma > 0) {
    // The step's update is skipped on the device when its global loss or norm is above the
    // limits the trainer passes (infinite until its window fills): dev_stats_ holds the loss
    // (summed over ranks by then) and the sum of squares when the model's update reads them.
    FORGE_CUDA_CHECK(cudaMallocHost(&host_limits_, 2 * sizeof(float)));
    FORGE_CUDA_CHECK(cudaMalloc(&dev_limits_, 2 * sizeof(float)));
    own_bytes_ += 2 * sizeof(float);
    host_limits_[0] = host_limits_[1] = INFINITY;
    FORGE_CUDA_CHECK(cudaMemcpyAsync(dev_limits_, host_limits_, 2 * sizeof(float),
                                     cudaMemcpyHostToDevice, compute_stream_));
    model_->set_spike_gate(dev_stats_, static_cast<float>(world_), dev_limits_);
  }

  // Room for the accumulation steps of one rank (more is allocated on demand).
  const int64_t accum =
      cfg.batch.micro_batch > 0 ? cfg.batch.global_batch / cfg.batch.micro_batch : 1;
  FORGE_RETURN_IF_ERROR(EnsureTokenCapacity(static_cast<int>(std::clamp<int64_t>(accum, 1, 64))));

  UnitBuffers params;
  InitParams(cfg.model, model_->layout(), cfg.seed, &params);
  FORGE_RETURN_IF_ERROR(model_->UploadParams(params, compute_stream_));
  FORGE_RETURN_IF_ERROR(model_->ZeroMoments(compute_stream_));
  SamplePeak();
  return Status::Ok();
}

// ---- buffers -------------------------------------------------------------------------------

void CudaBackend::FreeTokenBuffers() {
  if (host_tokens_) cudaFreeHost(host_tokens_);
  if (dev_tokens_) cudaFree(dev_tokens_);
  if (dev_losses_) cudaFree(dev_losses_);
  host_tokens_ = nullptr;
  dev_tokens_ = nullptr;
  dev_losses_ = nullptr;
  token_capacity_ = 0;
}

Status CudaBackend::EnsureTokenCapacity(int micro_steps) {
  if (micro_steps <= token_capacity_) return Status::Ok();
  // The graph holds the old pointers: drop it, and warm up again for the new buffers.
  FORGE_RETURN_IF_ERROR(Sync());
  DestroyGraph();
  warm_micro_ = 0;
  const int64_t old_bytes = int64_t{token_capacity_} * N_ * (2 * sizeof(int32_t) + sizeof(float));
  FreeTokenBuffers();
  own_bytes_ -= old_bytes;
  const size_t n = size_t(micro_steps) * N_;
  FORGE_CUDA_CHECK(cudaMallocHost(&host_tokens_, 2 * n * sizeof(int32_t)));
  FORGE_CUDA_CHECK(cudaMalloc(&dev_tokens_, 2 * n * sizeof(int32_t)));
  FORGE_CUDA_CHECK(cudaMalloc(&dev_losses_, n * sizeof(float)));
  FORGE_CUDA_CHECK(cudaMemset(dev_losses_, 0, n * sizeof(float)));
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy-stream memset vs compute_stream_
  token_capacity_ = micro_steps;
  own_bytes_ += int64_t(n) * (2 * sizeof(int32_t) + sizeof(float));
  return Status::Ok();
}

void CudaBackend::SamplePeak() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return;
  const size_t used = total_b - free_b;
  if (used > baseline_used_) peak_ = std::max<int64_t>(peak_, used - baseline_used_);
}

int64_t CudaBackend::peak_bytes() {
  SamplePeak();
  return std::max(peak_, allocated_bytes());
}

// ---- staging -------------------------------------------------------------------------------

Status CudaBackend::Prepare(const std::vector<MicroBatch>& micro) {
  if (micro.empty()) return Status::Invalid("cuda backend: a step needs at least one micro-batch");
  for (size_t i = 0; i < micro.size(); ++i) {
    if (micro[i].inputs == nullptr || micro[i].targets == nullptr) {
      return Status::Invalid("cuda backend: micro-batch " + std::to_string(i) +
                             " has null token pointers");
    }
  }
  FORGE_CUDA_CHECK(cudaSetDevice(device_));
  FORGE_RETURN_IF_ERROR(EnsureTokenCapacity(static_cast<int>(micro.size())));
  return StageTokens(micro);
}

// Copies (and range-checks: an out-of-range id would read outside the embedding) the tokens
// into the pinned staging, once the previous step's H2D copies are done with it.
Status CudaBackend::StageTokens(const std::vector<MicroBatch>& micro) {
  FORGE_CUDA_CHECK(cudaEventSynchronize(staging_free_));
  const int32_t V = cfg_.model.padded_vocab();
  const size_t cap = size_t(token_capacity_) * N_;
  for (size_t i = 0; i < micro.size(); ++i) {
    int32_t* in = host_tokens_ + i * N_;
    int32_t* tg = host_tokens_ + cap + i * N_;
    for (int64_t k = 0; k < N_; ++k) {
      const int32_t a = micro[i].inputs[k], b = micro[i].targets[k];
      if (a < 0 || a >= V || b < 0 || b >= V) {
        return Status::Invalid("cuda backend: micro-batch " + std::to_string(i) + " position " +
                               std::to_string(k) + ": token " + std::to_string(a < 0 || a >= V ? a : b) +
                               " outside [0, " + std::to_string(V) + ")");
      }
      in[k] = a;
      tg[k] = b;
    }
  }
  return Status::Ok();
}

void CudaBackend::SetHyper(const StepHyper& hyper) {
  const OptimizerConfig& o = cfg_.optimizer;
  *host_hyper_ = cuda::AdamWHyper{hyper.lr, o.beta1, o.beta2, o.eps, hyper.step};
  if (host_limits_ != nullptr) {
    host_limits_[0] = hyper.skip_above.loss;
    host_limits_[1] = hyper.skip_above.grad_norm;
  }
}

// Tokens (and lr/step) from the pinned staging into the fixed device buffers; never captured.
Status CudaBackend::EnqueueInputs(int micro_steps, bool optimizer) {
  cudaStream_t s = compute_stream_;
  const size_t cap = size_t(token_capacity_) * N_;
  const size_t n = size_t(micro_steps) * N_;
  FORGE_CUDA_CHECK(cudaMemcpyAsync(dev_tokens_, host_tokens_, n * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, s));
  FORGE_CUDA_CHECK(cudaMemcpyAsync(dev_tokens_ + cap, host_tokens_ + cap, n * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, s));
  if (optimizer) {
    FORGE_CUDA_CHECK(cudaMemcpyAsync(dev_hyper_, host_hyper_, sizeof(cuda::AdamWHyper),
                                     cudaMemcpyHostToDevice, s));
    if (host_limits_ != nullptr) {
      FORGE_CUDA_CHECK(cudaMemcpyAsync(dev_limits_, host_limits_, 2 * sizeof(float),
                                       cudaMemcpyHostToDevice, s));
    }
  }
  FORGE_CUDA_CHECK(cudaEventRecord(staging_free_, s));
  return Status::Ok();
}

// The step's device work on compute_stream_: capturable (fixed pointers; what changes per step
// is read from device memory when the work runs).
Status CudaBackend::EnqueueCompute(int micro_steps, bool optimizer) {
  cudaStream_t s = compute_stream_;
  const size_t cap = size_t(token_capacity_) * N_;
  const size_t n = size_t(micro_steps) * N_;
  const int32_t* inputs = dev_tokens_;
  const int32_t* targets = dev_tokens_ + cap;
  // The mean over every token of the step on every rank (the ranks' gradients are summed).
  const float dloss = 1.0f / (static_cast<float>(n) * static_cast<float>(world_));
  const bool every_micro = dp_ && dp_->fsdp();
  for (int i = 0; i < micro_steps; ++i) {
    // Gradient collectives start on the last micro-step only (accumulation stays local), or
    // on every one with fsdp (accumulated in the gradient slots). ComputeGradients (no
    // optimizer) all-reduces where gradients are full-size: callers want the whole sum.
    if (dp_) {
      dp_->BeginMicroStep(i == 0, i + 1 == micro_steps);
      const bool sync = every_micro || i + 1 == micro_steps;
      model_->set_hooks(sync ? dp_->grad_hooks(!optimizer) : dp_->read_hooks());
    }
    // The first micro-step overwrites every gradient element: no zeroing pass.
    const Status st = model_->ForwardBackward(inputs + i * N_, targets + i * N_, dloss,
                                              /*accumulate_grads=*/i > 0 && !every_micro,
                                              dev_losses_ + i * N_, s);
    if (dp_) model_->set_hooks(dp_->read_hooks());
    FORGE_RETURN_IF_ERROR(st);
  }
  FORGE_RETURN_IF_ERROR(cuda::MeanReduce(dev_stats_, dev_losses_, static_cast<int64_t>(n), s));
  if (dp_) {
    FORGE_RETURN_IF_ERROR(dp_->JoinComm(s));
    if (optimizer) {
      FORGE_RETURN_IF_ERROR(dp_->Optimize(dev_hyper_, dev_stats_, s));
    } else {
      FORGE_RETURN_IF_ERROR(dp_->SumLoss(dev_stats_, s));
    }
  } else if (optimizer) {
    FORGE_RETURN_IF_ERROR(model_->OptimizerStep(dev_hyper_, dev_stats_ + 1, s));
  }
  FORGE_CUDA_CHECK(
      cudaMemcpyAsync(host_stats_, dev_stats_, 2 * sizeof(float), cudaMemcpyDeviceToHost, s));
  FORGE_CUDA_CHECK(cudaMemcpyAsync(host_skipped_, model_->skipped_steps(), sizeof(int64_t),
                                   cudaMemcpyDeviceToHost, s));
  return Status::Ok();
}

// ---- CUDA graph ----------------------------------------------------------------------------

void CudaBackend::DestroyGraph() {
  if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
  if (graph_) cudaGraphDestroy(graph_);
  graph_exec_ = nullptr;
  graph_ = nullptr;
  graph_micro_ = 0;
}

// Captures EnqueueCompute (the warm-up already built every GEMM/cuDNN plan and workspace, so
// nothing allocates during capture) and launches it. A failed capture is not fatal: the step
// runs eagerly and graphs stay off for this backend. The model's wgrad stream joins the
// capture through its fork events and is joined back inside each ForwardBackward. Kernel nodes
// carry the priority of the stream they were captured from, but a graph uses them only when
// instantiated with UseNodePriority (otherwise every node gets the launch stream's).
Status CudaBackend::CaptureAndLaunch(int micro_steps) {
  DestroyGraph();
  cudaStream_t s = compute_stream_;
  FORGE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status st = EnqueueCompute(micro_steps, /*optimizer=*/true);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  cudaError_t inst = cudaErrorUnknown;
  if (st.ok() && end == cudaSuccess) {
    inst = cudaGraphInstantiate(&graph_exec_, graph, cudaGraphInstantiateFlagUseNodePriority);
  }
  if (!st.ok() || end != cudaSuccess || inst != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    graph_exec_ = nullptr;
    (void)cudaGetLastError();  // capture errors are not sticky; clear the last-error slot
    std::fprintf(stderr,
                 "forge: cuda backend: CUDA graph capture failed (%s%s%s); running without "
                 "graphs\n",
                 st.ok() ? "" : st.ToString().c_str(), st.ok() ? "" : "; ",
                 cudaGetErrorString(end != cudaSuccess ? end : inst));
    use_graph_ = false;
    return EnqueueCompute(micro_steps, /*optimizer=*/true);
  }
  graph_ = graph;
  graph_micro_ = micro_steps;
  FORGE_CUDA_CHECK(cudaGraphLaunch(graph_exec_, s));
  SamplePeak();
  return Status::Ok();
}

// ---- TrainBackend --------------------------------------------------------------------------

Status CudaBackend::TrainStep(const std::vector<MicroBatch>& micro, const StepHyper& hyper,
                              bool want_stats, StepStats* stats) {
  FORGE_RETURN_IF_ERROR(Prepare(micro));
  SetHyper(hyper);
  // Collective times of earlier steps whose events completed (data parallel; never blocks).
  if (dp_) dp_->CountCommTimes();
  const int M = static_cast<int>(micro.size());
  FORGE_RETURN_IF_ERROR(EnqueueInputs(M, /*optimizer=*/true));
  if (graph_exec_ != nullptr && graph_micro_ == M) {
    FORGE_CUDA_CHECK(cudaGraphLaunch(graph_exec_, compute_stream_));
  } else if (use_graph_ && warm_micro_ == M) {
    FORGE_RETURN_IF_ERROR(CaptureAndLaunch(M));
  } else {
    FORGE_RETURN_IF_ERROR(EnqueueCompute(M, /*optimizer=*/true));
    if (warm_micro_ != M) SamplePeak();
    warm_micro_ = M;
  }
  if (stats == nullptr) return Status::Ok();
  *stats = StepStats{};
  if (!want_stats) return Status::Ok();
  FORGE_RETURN_IF_ERROR(Sync());
  SamplePeak();
  if (dp_) dp_->CountCommTimes();  // this step's waits, before the caller's step record
  stats->loss = host_stats_[0] / static_cast<float>(world_);  // summed over ranks
  stats->grad_norm = std::sqrt(host_stats_[1]);
  stats->skipped_steps = *host_skipped_;
  stats->valid = true;
  return Status::Ok();
}

Status CudaBackend::ComputeGradients(const std::vector<MicroBatch>& micro, UnitBuffers* grads,
                                     float* loss) {
  FORGE_RETURN_IF_ERROR(Prepare(micro));
  const int M = static_cast<int>(micro.size());
  FORGE_RETURN_IF_ERROR(EnqueueInputs(M, /*optimizer=*/false));
  FORGE_RETURN_IF_ERROR(EnqueueCompute(M, /*optimizer=*/false));
  FORGE_RETURN_IF_ERROR(Sync());
  if (loss) *loss = host_stats_[0] / static_cast<float>(world_);
  if (dp_ && dp_->fsdp()) {
    return dp_->GatherSlots(CudaDataParallel::State::kGrad, grads, compute_stream_);
  }
  return model_->param_store().DownloadGrads(grads, compute_stream_);
}

Status CudaBackend::EvalLoss(const MicroBatch& batch, float* loss) {
  FORGE_RETURN_IF_ERROR(Prepare({batch}));
  FORGE_RETURN_IF_ERROR(EnqueueInputs(1, /*optimizer=*/false));
  cudaStream_t s = compute_stream_;
  const size_t cap = size_t(token_capacity_) * N_;
  FORGE_RETURN_IF_ERROR(model_->ForwardLoss(dev_tokens_, dev_tokens_ + cap, dev_losses_, s));
  FORGE_RETURN_IF_ERROR(cuda::MeanReduce(dev_stats_, dev_losses_, N_, s));
  FORGE_CUDA_CHECK(
      cudaMemcpyAsync(host_stats_, dev_stats_, sizeof(float), cudaMemcpyDeviceToHost, s));
  FORGE_RETURN_IF_ERROR(Sync());
  *loss = host_stats_[0];
  return Status::Ok();
}

Status CudaBackend::SetParams(const UnitBuffers& master) {
  FORGE_CUDA_CHECK(cudaSetDevice(device_));
  FORGE_RETURN_IF_ERROR(Sync());
  FORGE_RETURN_IF_ERROR(model_->UploadParams(master, compute_stream_));
  if (dp_) dp_->ParamsChanged();
  return model_->ZeroMoments(compute_stream_);
}

// The snapshot stream waits for all work enqueued on the compute stream so far (the step in
// flight included); the copies then run there and the host waits for that stream only.
Status CudaBackend::FenceSnapshot() {
  FORGE_CUDA_CHECK(cudaSetDevice(device_));
  // A deferred AdamW (CudaModel::FlushUpdate) is applied first, on the compute stream.
  FORGE_RETURN_IF_ERROR(model_->FlushUpdate(compute_stream_));
  FORGE_CUDA_CHECK(cudaEventRecord(snapshot_from_, compute_stream_));
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(snapshot_stream_, snapshot_from_, 0));
  return Status::Ok();
}

// Sharded (zero): collective, on the compute stream, synchronous.
Status CudaBackend::GetParams(UnitBuffers* master) {
  if (dp_ && dp_->sharded()) {
    FORGE_CUDA_CHECK(cudaSetDevice(device_));
    return dp_->GatherSlots(CudaDataParallel::State::kMaster, master, compute_stream_);
  }
  FORGE_RETURN_IF_ERROR(FenceSnapshot());
  return model_->param_store().DownloadParams(master, snapshot_stream_);
}

Status CudaBackend::GetMoments(UnitBuffers* m, UnitBuffers* v) {
  if (dp_ && dp_->sharded()) {
    FORGE_CUDA_CHECK(cudaSetDevice(device_));
    FORGE_RETURN_IF_ERROR(dp_->GatherSlots(CudaDataParallel::State::kM, m, compute_stream_));
    return dp_->GatherSlots(CudaDataParallel::State::kV, v, compute_stream_);
  }
  FORGE_RETURN_IF_ERROR(FenceSnapshot());
  return model_->param_store().DownloadMoments(m, v, snapshot_stream_);
}

class RegisteredHostRange final : public PinnedHostRange {
 public:
  explicit RegisteredHostRange(void* p) : p_(p) {}
  ~RegisteredHostRange() override {
    if (cudaHostUnregister(p_) != cudaSuccess) cudaGetLastError();  // nothing left to undo
  }

 private:
  void* p_;
};

std::unique_ptr<PinnedHostRange> CudaBackend::PinHostRange(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0 || cudaSetDevice(device_) != cudaSuccess) return nullptr;
  // Portable: pinned for every context, so the registration does not depend on this backend.
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it so a later FORGE_CUDA_CHECK does not report it
    return nullptr;
  }
  return std::make_unique<RegisteredHostRange>(p);
}

Status CudaBackend::SetMoments(const UnitBuffers& m, const UnitBuffers& v) {
  FORGE_CUDA_CHECK(cudaSetDevice(device_));
  FORGE_RETURN_IF_ERROR(Sync());
  return model_->UploadMoments(m, v, compute_stream_);
}

// FP8: the scaling state under "fp8". Under data parallelism it is the same on every rank
// (CudaDataParallel::ShareFp8Amax), so rank 0's, which a resume loads everywhere, is exact.
Status CudaBackend::GetExtraState(std::map<std::string, std::string>* blobs) {
  if (model_->fp8() == nullptr) return Status::Ok();
  FORGE_CUDA_CHECK(cudaSetDevice(device_));
  FORGE_RETURN_IF_ERROR(Sync());
  FORGE_ASSIGN_OR_RETURN((*blobs)["fp8"], model_->fp8()->SaveState(compute_stream_));
  return Status::Ok();
}

Status CudaBackend::SetExtraState(const std::map<std::string, std::string>& blobs) {
  const auto it = blobs.find("fp8");
  if (model_->fp8() == nullptr || it == blobs.end()) return Status::Ok();
  FORGE_CUDA_CHECK(cudaSetDevice(device_));
  FORGE_RETURN_IF_ERROR(Sync());
  FORGE_RETURN_IF_ERROR(model_->fp8()->LoadState(it->second, compute_stream_));
  if (dp_) dp_->ParamsChanged();  // fsdp's FP8 slot casts used the old scales
  return Status::Ok();
}

Status CudaBackend::ProfileStep(const std::vector<MicroBatch>& micro, const StepHyper& hyper,
                                std::vector<std::pair<std::string, double>>* phase_ms) {
  FORGE_RETURN_IF_ERROR(Prepare(micro));
  SetHyper(hyper);
  timeline_.Reset();
  // Observed, the model runs single-stream: the events bracket phases on one stream.
  model_->set_observer(&timeline_);
  const int M = static_cast<int>(micro.size());
  const Status st = [&]() -> Status {
    FORGE_RETURN_IF_ERROR(timeline_.OnPhase(StepPhase::kCopy, compute_stream_));
    FORGE_RETURN_IF_ERROR(EnqueueInputs(M, /*optimizer=*/true));
    return EnqueueCompute(M, /*optimizer=*/true);
  }();
  model_->set_observer(nullptr);
  FORGE_RETURN_IF_ERROR(st);
  FORGE_RETURN_IF_ERROR(timeline_.End(compute_stream_));
  std::array<double, static_cast<int>(StepPhase::kCount)> ms;
  FORGE_RETURN_IF_ERROR(timeline_.Totals(&ms));
  phase_ms->clear();
  double total = 0.0;
  for (int p = 0; p < static_cast<int>(StepPhase::kCount); ++p) {
    phase_ms->emplace_back(StepPhaseName(static_cast<StepPhase>(p)), ms[p]);
    total += ms[p];
  }
  phase_ms->emplace_back("total", total);
  return Status::Ok();
}

}  // namespace

CudaBackendOptions CudaBackendOptionsFromConfig(const EngineConfig& engine) {
  CudaBackendOptions o;
  o.use_graph = engine.cuda_graph;
  o.deterministic_attention = engine.deterministic_attention;
  o.cudnn_attention_backward = engine.attention_backward == AttentionBackward::kCudnn;
  o.lm_head_chunk_rows = engine.lm_head_chunk;
  o.wgrad_stream = engine.wgrad_stream;
  o.wgrad_sm_margin = engine.wgrad_sm_margin;
  o.rope_gemm = o.swiglu_gemm = o.swiglu_bwd_gemm = engine.fused_epilogues;
  o.gemm_autotune = engine.gemm_autotune;
  o.nccl_symmetric_memory = engine.nccl_symmetric_memory;
  return o;
}

StatusOr<std::unique_ptr<CudaTrainBackend>> MakeCudaTrainBackend(
    const RunConfig& cfg, const CudaBackendOptions& options, Comm* comm) {
  if (!CudaDeviceAvailable()) return Status::Unavailable("cuda backend: no CUDA device visible");
  NcclComm* nccl = nullptr;
  if (comm != nullptr && comm->world() > 1) {
    nccl = dynamic_cast<NcclComm*>(comm);
    if (nccl == nullptr) {
      return Status::Invalid(std::string("cuda backend: data parallelism needs an NCCL comm, got ") +
                             comm->name());
    }
    FORGE_CUDA_CHECK(cudaSetDevice(nccl->device()));
  }
  auto backend = std::make_unique<CudaBackend>();
  FORGE_RETURN_IF_ERROR(backend->Init(cfg, options, nccl).Annotate("cuda backend"));
  return std::unique_ptr<CudaTrainBackend>(std::move(backend));
}

StatusOr<std::unique_ptr<TrainBackend>> MakeCudaBackend(const RunConfig& cfg, Comm* comm) {
  auto made = MakeCudaTrainBackend(cfg, CudaBackendOptionsFromConfig(cfg.engine), comm);
  if (!made.ok()) return made.status();
  return std::unique_ptr<TrainBackend>(std::move(made).value());
}

bool CudaDeviceAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

double CudaFreeDeviceMemoryBytes() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return -1;
  return double(free_b);
}

}  // namespace forge
