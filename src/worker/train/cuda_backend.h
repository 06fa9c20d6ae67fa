// The CUDA BF16 training backend beyond the TrainBackend interface: construction options (CUDA
// graph on/off, deterministic attention) and introspection for benchmarks, metrics and tests
// (peak memory, whether the step runs as a graph, a per-phase timing breakdown).
// Only defined in CUDA builds (src/worker/train/cuda_backend.cu); no CUDA types here so plain
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
#include "worker/train/backend.h"

namespace forge {

struct CudaBackendOptions {
  // Capture the step's device work (zero grads, forward, backward, loss, optimizer) in a CUDA
  // graph after one eager warm-up step and replay it; the token/lr copies stay ordinary stream
  // operations before it. FORGE_CUDA_GRAPH=0 turns it off (to isolate faults).
  bool use_graph = true;
  // Bitwise-reproducible attention backward (DESIGN.md: same seed and data give the same
  // weights). FORGE_CUDA_DETERMINISTIC=0 trades that for ~13% faster attention backward.
  bool deterministic_attention = true;
  // Token rows per LM-head chunk (bounds the [chunk, V] bf16 logits buffer). Fewer chunks
  // re-read and re-write the fp32 tied-embedding gradient fewer times (206 MB each for
  // gpt350m). FORGE_CUDA_LM_HEAD_CHUNK=<rows> overrides.
  int lm_head_chunk_rows = 4096;
  // Run the backward's weight-gradient GEMMs on a second stream, concurrent with the
  // activation-gradient chain (bitwise the same gradients; +1 logits chunk buffer and +1 GEMM
  // workspace). FORGE_CUDA_WGRAD_STREAM=0 turns it off. ProfileStep always runs single-stream.
  bool wgrad_stream = true;
  // CudaModelOptions::norm_dw_on_wgrad; FORGE_CUDA_NORM_DW_WGRAD=0 turns it off.
  bool norm_dw_on_wgrad = true;
  // Priority of that stream relative to the compute stream: -1 lower (the activation-gradient
  // chain is scheduled first; dW GEMMs fill its gaps), 0 the same, +1 higher.
  // FORGE_CUDA_WGRAD_PRIORITY=low|same|high overrides.
  int wgrad_priority = -1;
  // One GPU and ddp: the step's AdamW runs during the next step's forward, unit by unit on a
  // low-priority stream just ahead of the forward's reads (bitwise the same weights;
  // GetParams/GetMoments apply a pending update first). FORGE_CUDA_DEFER_UPDATE=0 turns it
  // off (the update then ends the step).
  bool defer_update = true;
  // Data parallelism: SMs the blocks' backward GEMMs leave to the overlapping NCCL kernels
  // (CudaModelOptions::gemm_sm_margin); matches NcclCommOptions::max_ctas.
  // FORGE_GEMM_SM_MARGIN=<n> overrides.
  int gemm_sm_margin = 0;
  // SMs the weight-gradient GEMMs leave to the kernels beside them (CudaModelOptions::
  // wgrad_sm_margin; -1: a quarter of the SMs, three eighths in FP8). FORGE_WGRAD_SM_MARGIN=<n>
  // overrides (0: off).
  int wgrad_sm_margin = -1;
  // BF16 steps on Hopper: our own GEMM with RoPE / SwiGLU in its epilogue for the QKV / gate-up
  // projections (CudaModelOptions::rope_gemm / swiglu_gemm; bitwise the same results), and
  // the same two in FP8 where fast accumulation covers the forward.
  // FORGE_CUDA_ROPE_GEMM=0 and FORGE_CUDA_SWIGLU_GEMM=0 turn them off.
  bool rope_gemm = true;
  bool swiglu_gemm = true;
  // SwiGLU's backward in the down projection's input-gradient GEMM (CudaModelOptions::
  // swiglu_bwd_gemm), one GPU and the sharded modes (ddp leaves it off: it delays the
  // overlapped all-reduces); FORGE_CUDA_SWIGLU_BWD_GEMM=0 turns it off.
  bool swiglu_bwd_gemm = true;
  // precision.fp8.lm_head: the LM head's weight gradient in FP8 as well (CudaModelOptions::
  // fp8_lm_head_wgrad). FORGE_CUDA_FP8_LM_WGRAD=0 keeps it BF16.
  bool fp8_lm_head_wgrad = true;
  // FP8: the attention backward writes the QKV gradient's casts with RoPE's inverse
  // (CudaModelOptions::fp8_attention_rope). FORGE_CUDA_FP8_ATTN_ROPE=0 turns it off.
  bool fp8_attention_rope = true;
};

// Defaults with the environment overrides above applied.
CudaBackendOptions CudaBackendOptionsFromEnv();

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
  // The stream the step runs on (a cudaStream_t), for timing with events.
  virtual void* compute_stream() const = 0;
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
