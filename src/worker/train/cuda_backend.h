// The CUDA BF16 training backend beyond the TrainBackend interface: construction options (CUDA
// graph on/off, deterministic attention) and introspection for benchmarks, metrics and tests
// (peak memory, whether the step runs as a graph, a per-phase timing breakdown).
// Only defined in CUDA builds (src/worker/train/cuda_backend.cc); no CUDA types here so plain
// C++ callers can include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/parallel/comm_time_sink.h"
#include "worker/train/backend.h"

namespace forge {

// How the step runs. The config's `engine:` keys set the first group
// (CudaBackendOptionsFromConfig); the rest are scheduling choices that give bitwise the same
// results either way, settled by measurement (docs/performance.md), which tests and benchmarks
// turn off to prove that or to measure them.
struct CudaBackendOptions {
  // engine.cuda_graph: capture the step's device work (zero grads, forward, backward, loss,
  // optimizer) in a CUDA graph after one eager warm-up step and replay it; the token/lr copies
  // stay ordinary stream operations before it.
  bool use_graph = true;
  // engine.deterministic_attention: bitwise-reproducible attention backward (DESIGN.md: same
  // seed and data give the same weights).
  bool deterministic_attention = true;
  // engine.attention_backward cudnn: cuDNN's attention backward even where ours runs.
  bool cudnn_attention_backward = false;
  // engine.lm_head_chunk: token rows per LM-head chunk (bounds the [chunk, V] bf16 logits
  // buffer). Fewer chunks re-read and re-write the fp32 tied-embedding gradient fewer times
  // (206 MB each for gpt350m).
  int lm_head_chunk_rows = 4096;
  // engine.wgrad_stream: the backward's weight-gradient GEMMs on a second stream, concurrent
  // with the activation-gradient chain (bitwise the same gradients; +1 logits chunk buffer and
  // +1 GEMM workspace). ProfileStep always runs single-stream.
  bool wgrad_stream = true;
  // engine.wgrad_sm_margin: SMs the weight-gradient GEMMs leave to the kernels beside them
  // (CudaModelOptions::wgrad_sm_margin; -1: a quarter of the SMs, three eighths in FP8; 0: off).
  int wgrad_sm_margin = -1;
  // engine.fused_epilogues: on Hopper, our own GEMM with RoPE / SwiGLU in its epilogue for the
  // QKV / gate-up projections (CudaModelOptions::rope_gemm / swiglu_gemm; bitwise the same
  // results), the same two in FP8 where fast accumulation covers the forward, and SwiGLU's
  // backward in the down projection's input-gradient GEMM (swiglu_bwd_gemm: one GPU and the
  // sharded modes; ddp leaves it off, as it delays the overlapped all-reduces).
  bool rope_gemm = true;
  bool swiglu_gemm = true;
  bool swiglu_bwd_gemm = true;
  // engine.gemm_autotune (cuda::GemmRunner::set_autotune).
  bool gemm_autotune = false;

  // CudaModelOptions::norm_dw_on_wgrad.
  bool norm_dw_on_wgrad = true;
  // Priority of the weight-gradient stream relative to the compute stream: -1 lower (the
  // activation-gradient chain is scheduled first; dW GEMMs fill its gaps), 0 the same, +1 higher.
  int wgrad_priority = -1;
  // One GPU and ddp: the step's AdamW runs during the next step's forward, unit by unit on a
  // low-priority stream just ahead of the forward's reads (bitwise the same weights;
  // GetParams/GetMoments apply a pending update first); off, the update ends the step.
  bool defer_update = true;
  // Data parallelism: SMs the blocks' backward GEMMs leave to the overlapping NCCL kernels
  // (CudaModelOptions::gemm_sm_margin; pairs with NcclCommOptions::max_ctas).
  int gemm_sm_margin = 0;
  // precision.fp8.lm_head: the LM head's weight gradient in FP8 as well (CudaModelOptions::
  // fp8_lm_head_wgrad); off keeps it BF16.
  bool fp8_lm_head_wgrad = true;
  // FP8: the attention backward writes the QKV gradient's casts with RoPE's inverse
  // (CudaModelOptions::fp8_attention_rope).
  bool fp8_attention_rope = true;
  // FP8: the RMSNorms write their outputs' and input gradients' casts themselves
  // (CudaModelOptions::fp8_norm_casts); off, a cast pass follows each.
  bool fp8_norm_casts = true;
  // ddp / zero1 / zero2: gradient collectives start in the comm windows the backward opens
  // (worker/train/cuda_data_parallel.h); off, each starts as soon as its unit is reduced.
  bool comm_windows = true;
  // fsdp / hsdp in FP8: the blocks' linear weights all-gathered as E4M3 where it applies
  // (worker/train/cuda_data_parallel.h); off, gathered in bf16 and cast per pass.
  bool fp8_gather = true;
  // engine.nccl_symmetric_memory (NcclComm::AllocSymmetric): the model's collective buffers
  // and fsdp's gather / reduce-scatter buffers in symmetric NCCL windows.
  bool nccl_symmetric_memory = true;
};

// The defaults with the config's `engine:` keys applied.
CudaBackendOptions CudaBackendOptionsFromConfig(const EngineConfig& engine);

// A page-locked host range (cudaHostRegister), unregistered when this is destroyed. It must be
// destroyed before the memory it covers is freed (a registration outliving its memory would
// let later copies into a reused address go to the old pages). Independent of the backend's
// lifetime: it may outlive the backend that made it.
class PinnedHostRange {
 public:
  virtual ~PinnedHostRange() = default;
};

class CudaTrainBackend : public TrainBackend {
 public:
  // Device memory in use by this backend at its peak, in bytes: the growth of the device's
  // used memory since construction (cudaMemGetInfo), sampled after the warm-up, after graph
  // capture and whenever a step synchronises; never below allocated_bytes().
  virtual int64_t peak_bytes() = 0;
  // Bytes of the backend's own allocations (buffers and workspaces it asked for).
  virtual int64_t allocated_bytes() const = 0;
  // True once the step runs as a replayed CUDA graph.
  virtual bool graph_active() const = 0;
  // fsdp in FP8: block parameter gathers so far that moved the linear weights as E4M3 bytes.
  virtual int64_t fp8_block_gathers() const = 0;
  // The stream the step runs on (a cudaStream_t), for timing with events.
  virtual void* compute_stream() const = 0;
  // Collective times (comm_time_sink.h) of every communicator the step uses go to `sink`
  // from now on: the world comm's and, under hsdp, those of the shard and replica groups
  // split from it (a split starts with its parent's sink, so a sink set on the world comm
  // before the backend was made reaches them too). Null: not timed. No-op on one GPU.
  virtual void SetCommTimeSink(CommTimeSink* sink) = 0;
  // One eager training step (same effect on the weights as TrainStep) with every phase timed
  // by events; phase_ms gets (phase name, milliseconds) in step order of first appearance.
  virtual Status ProfileStep(const std::vector<MicroBatch>& micro, const StepHyper& hyper,
                             std::vector<std::pair<std::string, double>>* phase_ms) = 0;
  // Page-locks [p, p + bytes) so GetParams/GetMoments into it copy at full PCIe speed (into
  // pageable memory the driver stages through a small bounce buffer at a fraction of that).
  // nullptr when the driver refuses (e.g. the pages overlap a range registered already):
  // copies into the range then still work, only slower.
  virtual std::unique_ptr<PinnedHostRange> PinHostRange(void* p, size_t bytes) = 0;
};

// The backend for cfg on the current device, weights initialised from cfg.seed (InitParams),
// moments zero. Activations are sized for cfg.batch.micro_batch sequences of
// cfg.model.seq_len tokens; train.activation_recompute picks recompute. precision.compute
// bf16 and fp32 both compute in BF16 (fp32 is the CPU backend's); fp8 is not supported yet.
// With a Comm of world W > 1 (an NcclComm on this process's device; it must outlive the
// backend) it trains data-parallel in cfg.parallel.mode (ddp, zero1, zero2, fsdp;
// cuda_data_parallel.h), with the CPU backend's contract: TrainStep's micro-batches are this
// rank's slice, stats are global, and TrainStep, ComputeGradients and (zero) GetParams /
// GetMoments (zero, fsdp) are collective.
StatusOr<std::unique_ptr<CudaTrainBackend>> MakeCudaTrainBackend(
    const RunConfig& cfg, const CudaBackendOptions& options, Comm* comm = nullptr);

}  // namespace forge
