// The BF16 transformer step on one GPU: device parameter buffers (fp32 master, bf16 compute
// copy, fp32 gradients and AdamW moments), saved activations, and the stream-ordered pieces
// of a training step (zero grads, forward+backward of one micro-batch, optimizer). Every piece
// only enqueues work on the caller's stream and never synchronises, so the backend can capture
// a whole step in a CUDA graph. With wgrad_stream the backward forks its weight-gradient
// GEMMs onto a second, model-owned stream and joins it back into the caller's stream before
// ForwardBackward returns (fork/join through events, so a capture pulls that stream in and
// gets it back before EndCapture). Semantics match CpuModel (worker/model/cpu_model.h) up to BF16
// rounding: same layout and model knobs (head_dim, GQA, tied or untied LM head over the padded
// vocabulary, RoPE theta and scaling, QK-norm), mean token loss.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/rmsnorm.h"
#include "worker/model/linear_strategy.h"
#include "worker/model/param_layout.h"
#include "worker/model/param_store.h"
#include "worker/model/step_observer.h"
#include "worker/model/unit_buffers.h"

namespace forge {

namespace cuda {
struct GemmArgs;
struct WgmmaGemmArgs;
}
class Fp8Linears;

struct CudaModelOptions {
  int micro_batch = 1;                 // sequences per micro-batch: activations are sized for it
  // train.activation_recompute (common/config.h). full: keep only block inputs and run each
  // block forward again in backward; selective: keep the GEMM and attention outputs, recompute
  // the norms' and SwiGLU's outputs (the dW GEMMs' inputs) into two shared sets (FP8 keeps
  // only its casts of those already, so selective is none there). Bitwise the same gradients.
  Recompute recompute = Recompute::kNone;
  bool deterministic_attention = true; // bitwise-reproducible SDPA backward (slightly slower)
  bool cudnn_attention_backward = false;  // cuDNN's attention backward even where ours runs
  bool gemm_autotune = false;          // GemmRunner::set_autotune for the model's GEMMs
  int lm_head_chunk_rows = 4096;       // token rows per LM-head chunk (bounds the logits buffer)
  // Weight-gradient GEMMs (dW += dy^T x, dWte) on a second stream, concurrent with the
  // activation-gradient chain; same GEMMs, same sums, bitwise the same gradients. Costs a
  // second GEMM workspace and a second logits chunk buffer.
  bool wgrad_stream = true;
  // With wgrad_stream: each RMSNorm backward's dw reduction (its second, latency-bound
  // kernel) runs on the wgrad stream, off the activation-gradient chain. Same kernel and
  // order: bitwise the same gradients. -0.2 to -0.4 ms a step at gpt350m B 16, -0.4 to -0.8
  // at B 24 on an H100 (docs/performance.md).
  bool norm_dw_on_wgrad = true;
  int wgrad_stream_priority = 0;       // CUDA priority of that stream (lower = more urgent)
  // OptimizerStep / ClipAndUpdate only take the norm and defer AdamW, which then runs unit by
  // unit on a low-priority stream just ahead of its reads (worker/model/deferred_update.h):
  // during the next forward on one GPU and under ddp; sharded (shard_optimizer), from
  // BeginUpdate on, ahead of each unit's gather. Bitwise the same weights. FlushUpdate applies
  // it now.
  bool defer_update = true;
  // ddp with bf16 gradient collectives (parallel.grad_reduce bf16): the summed gradient lives
  // in a bf16 copy of the gradient buffer (CudaParamBuffers::grads16), which the collectives
  // sum in place and the norm and AdamW read, so no pass widens it back to fp32; the BF16
  // weight-gradient GEMMs of a one-micro-step pass write it directly (no cast either).
  bool grads16 = false;
  // ParamStoreOptions::collective_alloc.
  std::function<StatusOr<void*>(size_t)> collective_alloc;
  // Data parallelism (worker/train/cuda_data_parallel.h). Every parameter-shaped buffer stores
  // unit u padded to PaddedSize(numel, shard_world) (shard_layout.h), zero in the padding, so
  // NCCL reduce-scatter / all-gather run in place on a unit. With shard_optimizer the fp32
  // master weights and AdamW moments hold only rank shard_rank's slot of each unit, and the
  // optimizer reads the summed gradient slot from grad_shard (filled by a reduce-scatter):
  // ZeRO. The bf16 compute copy and the gradient buffer stay full size.
  int shard_world = 1;
  int shard_rank = 0;
  bool shard_optimizer = false;
  // fsdp (needs shard_optimizer): no bf16 copy or full-size gradient buffer either. AdamW
  // updates the fp32 slots only; the data-parallel layer casts a slot to bf16 as it gathers
  // the unit, and binds each unit's gathered parameters and gradient buffer
  // (BindUnit) from its hooks before the model touches the unit.
  bool shard_params = false;
  // SMs the blocks' backward GEMMs leave free (0: none), for the NCCL kernels of the
  // gradient collectives that overlap them (cuda::GemmArgs::sm_count).
  int gemm_sm_margin = 0;
  // SMs the weight-gradient GEMMs (wgrad stream) leave to the chain's bandwidth-bound kernels
  // that run beside them (SwiGLU / RMSNorm / RoPE backward, the cross-entropy), on top of
  // gemm_sm_margin. cuBLASLt's Hopper GEMMs otherwise take every SM, so those kernels wait.
  // -1: a quarter of the SMs, rounded down to a multiple of 8 (32 on H100/H200: the best of
  // 0/16/32/48/64/80 measured), three eighths (48) in FP8, whose weight-gradient GEMMs take
  // half the time beside the same kernels (40-56 measured best, -0.3 ms a step against 32;
  // BF16 loses 1.5 ms at 48; docs/performance.md); 0: none. Applied with or without the wgrad
  // stream, so both orders compute the same bits.
  int wgrad_sm_margin = -1;
  // precision.compute fp8: the blocks' four linear layers run FP8 GEMMs with per-tensor
  // scaling (worker/model/fp8_linears.h); everything else stays BF16/FP32.
  bool fp8 = false;
  Fp8Config fp8_config;
  // BF16 steps on Hopper: the QKV projection runs our own GEMM (kernels/cuda/gemm_wgmma.cu)
  // with RoPE in its epilogue, and the gate/up projection with SwiGLU in its epilogue, instead
  // of cuBLASLt + a separate pass. Bitwise the same results; used only where the shapes fit
  // (head width 64, 128-row token blocks, ...), else the separate path runs. Both on by default
  // (RoPE -0.6 ms, SwiGLU -1.0 to -1.4 ms a step at gpt350m B 16/24: docs/performance.md).
  // FP8 steps take the same two in FP8 where precision.fp8.fast_accum covers the forward:
  // rope_gemm the QKV GEMM with RoPE, swiglu_gemm the gate/up GEMM with SwiGLU and the down
  // projection's input casts in its epilogue (delayed steps). linear_strategy.h decides.
  bool rope_gemm = true;
  bool swiglu_gemm = true;
  // precision.fp8.lm_head: dWte in FP8 too, where the chunk shapes allow (LinearPlan::
  // lm_head); off: the logits and dhf GEMMs in FP8, dWte in BF16.
  bool fp8_lm_head_wgrad = true;
  // BF16 steps on Hopper: SwiGLU's backward rides on the down projection's input-gradient GEMM
  // (ours, N-major weight): dh is never stored, dgu comes out of it. Bitwise the same. FP8
  // steps with precision.fp8.fast_accum fprop_dgrad take the FP8 form (Fp8Linears::
  // SwiGluBackwardGemm: SwiGLU's backward on warpgroups of its own beside the MMAs), bitwise
  // our FP8 GEMM followed by the separate SwiGLU backward.
  bool swiglu_bwd_gemm = true;
  // FP8 steps with delayed scaling: our attention backward writes the QKV projection's E5M2
  // gradient casts itself, RoPE's inverse applied (FlashBackwardFp8Out), instead of a bf16
  // dqkv and a separate RoPE + cast pass. Bitwise the same; where our backward runs.
  bool fp8_attention_rope = true;
  // FP8 steps with delayed scaling: the RMSNorms write the FP8 copies of their outputs (the
  // QKV and gate/up projections' inputs) and of the residual gradient (the output and down
  // projections' output gradients) themselves (rmsnorm_fp8.h), where the shape allows,
  // instead of a cast pass after each. Bitwise the same.
  bool fp8_norm_casts = true;
};

// Per-unit callbacks for a data-parallel layer, called on the host while the model enqueues a
// pass (so they only enqueue work too).
struct CudaModelHooks {
  // Before the forward pass reads unit u's bf16 parameters: may make `stream` wait for them
  // (ZeRO's all-gather of the updated parameters).
  std::function<Status(int unit, cudaStream_t stream)> before_forward;
  // Before a block's backward (and its recompute) reads its parameters or writes its gradient,
  // and before the embedding backward writes the embedding's.
  std::function<Status(int unit, cudaStream_t stream)> before_backward;
  // Unit u's gradient for this ForwardBackward is complete: every write to it comes before
  // `compute_done` (recorded on the compute stream) or `wgrad_done` (recorded on the
  // weight-gradient stream; null when that stream has nothing pending). Units complete in
  // backward order: final norm, blocks L-1..0, embedding.
  std::function<Status(int unit, cudaEvent_t compute_done, cudaEvent_t wgrad_done)> grad_ready;
  // Block `unit`'s backward is about to run its attention backward and the elementwise
  // kernels after it: kernels of many short CTAs, which share SMs with a collective's kernels
  // gracefully, where the GEMMs (persistent, one CTA per SM) slow down by far more than the
  // SMs they lose. A moment to start the gradient collectives (enqueued on `stream`).
  std::function<Status(int unit, cudaStream_t stream)> comm_window;
  // Block `unit`'s forward (not a recompute) is about to run its attention forward: the same
  // kind of moment in the forward pass (fsdp starts the next block's all-gather there).
  std::function<Status(int unit, cudaStream_t stream)> forward_window;
  // FP8 with shard_params: where the model would cast block `unit`'s linear weights (before
  // each of its passes), the weights already in E4M3 at their offsets in the unit (one byte
  // an element, cast with the weights' scales: fsdp's FP8 all-gather), or null: the model
  // casts them from the unit's bf16 parameters as usual.
  std::function<const uint8_t*(int unit)> fp8_weights;
  // With CudaModelOptions::grads16, on a pass that overwrites the gradient (one micro-step):
  // the BF16 weight-gradient GEMMs write the blocks' matrices straight into grads16.
  bool grads_to_bf16 = false;
  // The lookup's part of the embedding's gradient goes here instead of into the unit's
  // gradient (dx0 [n, d], the gradient at the embedding's output for the n tokens of `tokens`,
  // on `stream`). Tied, the unit's grad_ready comes right after the final norm's, when the LM
  // head's part is complete: ddp sums that part during the backward and adds every rank's
  // lookup rows after it. Untied, the lookup is the whole gradient and the unit has no
  // grad_ready: fsdp adds every rank's rows into its slot (worker/train/cuda_data_parallel.h).
  std::function<Status(const cuda::bf16* dx0, const int32_t* tokens, int64_t n,
                       cudaStream_t stream)>
      lookup_grad;
  // Untied embedding: the embedding's output for the n tokens of `tokens` (out [n, d], bf16, on
  // `stream`) comes from here instead of the model's lookup in the unit's parameters, which the
  // model then never reads (fsdp looks the rows up in the ranks' slots).
  std::function<Status(const int32_t* tokens, int64_t n, cuda::bf16* out, cudaStream_t stream)>
      lookup_rows;
};

class CudaModel {
 public:
  // Validates the shape (head_dim a multiple of 8 and <= 128, and 32, 64 or 128 with qk_norm;
  // d_model and ffn multiples of 8), allocates everything once and uploads nothing: call
  // UploadParams before the first step.
  static StatusOr<std::unique_ptr<CudaModel>> Create(const ModelConfig& m,
                                                     const OptimizerConfig& opt,
                                                     const CudaModelOptions& options);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const { return m_; }
  const ParamLayout& layout() const { return layout_; }
  int64_t tokens_per_micro() const { return N_; }  // B*T
  // Bytes this model allocated (buffers and library workspaces it asked for).
  size_t allocated_bytes() const { return allocated_bytes_; }
  // How each linear layer computes (GEMM paths, FP8 casts), chosen at Create from the options,
  // the shapes and the GPU; a pass follows `measuring` or, on an FP8 delayed-scaling step after
  // the first, `delayed`.
  const LinearStrategies& linear_strategies() const { return linears_; }
  // Where this model's shapes keep a faster kernel its options asked for from running, one
  // line each naming the path taken instead and why (e.g. head width 128: cuDNN's attention
  // backward). The backend logs them at start-up.
  const std::vector<std::string>& fallbacks() const { return linears_.fallbacks; }

  // The parameter-shaped buffers (param_store.h); read them (Download*) there. What replaces
  // weights or moments goes through the three below, which apply a deferred update first.
  ParamStore& param_store() { return store_; }
  Status UploadParams(const UnitBuffers& master, cudaStream_t stream);
  Status UploadMoments(const UnitBuffers& m, const UnitBuffers& v, cudaStream_t stream);
  Status ZeroMoments(cudaStream_t stream);

  // ---- stream-ordered step pieces (capturable) ----
  // Not needed before a step (its first micro-step overwrites every gradient); kept for
  // callers that want zero gradients without running a micro-batch.
  Status ZeroGrads(cudaStream_t stream);
  // One micro-batch (device tokens [B*T]): forward, per-token losses into losses[B*T], and
  // backward of dloss * sum(losses) (dloss = 1/(B*T*micro_steps) gives the mean over the
  // step). accumulate_grads=false overwrites every gradient element (the first micro-step of
  // a step: no zeroing pass, and the weight-gradient GEMMs skip reading the old values);
  // true adds to them.
  Status ForwardBackward(const int32_t* inputs, const int32_t* targets, float dloss,
                         bool accumulate_grads, float* losses, cudaStream_t stream);
  // Forward and per-token losses only.
  Status ForwardLoss(const int32_t* inputs, const int32_t* targets, float* losses,
                     cudaStream_t stream);
  // Global grad norm (sum of squares into *sumsq_out, device) + clipping + AdamW on every
  // tensor; hyper is a device pointer the caller refreshes before each step. With
  // defer_update the AdamW part runs during the next forward (or FlushUpdate); the norm, the
  // skipped-step count and the FP8 scale update are done here either way.
  Status OptimizerStep(const cuda::AdamWHyper* hyper, float* sumsq_out, cudaStream_t stream);
  // Applies a deferred update now, ordered on `stream` (the stream the steps run on). Call it
  // before reading the weights or moments between steps (ParamStore's downloads do
  // not: they may run on another stream); the uploads and ZeroMoments call it themselves.
  Status FlushUpdate(cudaStream_t stream);
  // Sharded (the data-parallel layer, right after ClipAndUpdate): the deferred update starts
  // now on its stream, so the next step's gathers can wait for it unit by unit (WaitUpdated
  // on the NCCL stream). No-op without defer_update; under a profiler it runs on `stream`.
  Status BeginUpdate(cudaStream_t stream);
  Status WaitUpdated(int unit, cudaStream_t stream);
  // The same in two halves, for data parallelism: the sum of squares of the gradient this
  // rank's optimizer applies (its slots with shard_optimizer) into *sumsq_out; then, once the
  // caller summed it over the ranks where needed, clipping by the global norm and AdamW.
  Status GradSumSquares(float* sumsq_out, cudaStream_t stream);
  // The same sum in pieces, for ddp: SumUnitSquares takes unit u's share on `stream` once its
  // gradient is final there (e.g. after its all-reduce, on the NCCL stream); after every unit
  // had its share taken in this step, GradSumSquaresFromUnits adds them up (fixed order).
  Status SumUnitSquares(int unit, cudaStream_t stream);
  // grads16: unit u's gradient into grads16, except what this pass's GEMMs wrote there
  // (CudaModelHooks::grads_to_bf16); the data-parallel layer then sums it there in bf16.
  Status CastUnitGradsToBf16(int unit, cudaStream_t stream);
  Status GradSumSquaresFromUnits(float* sumsq_out, cudaStream_t stream);
  // (With defer_update the AdamW part is deferred as in OptimizerStep.)
  Status ClipAndUpdate(const cuda::AdamWHyper* hyper, const float* sumsq, cudaStream_t stream);
  // Device counter of optimizer steps skipped because the gradients were not finite (an
  // overflowed step: AdamW leaves every weight and moment as it was). Read it with a copy
  // ordered after the step.
  const int64_t* skipped_steps() const;
  // FP8 only (null otherwise): the linear layers' scaling state, for tests and reports.
  const Fp8Linears* fp8() const;
  Fp8Linears* fp8();

  // Data-parallel plumbing (see CudaModelHooks). Null: no hooks. The pointee must outlive
  // the passes that use it.
  void set_hooks(const CudaModelHooks* hooks) { hooks_ = hooks; }
  const CudaParamBuffers& param_buffers() const { return store_.buffers(); }
  // Where unit u's bf16 parameters and fp32 gradient are for the passes that follow (padded
  // unit layout). Defaults: the full buffers (null with shard_params).
  void BindUnit(int unit, cuda::bf16* params, float* grads) {
    store_.BindUnit(unit, params, grads);
  }

  // Loss-spike skipping (kernels/cuda/spike_gate.h): from now on every update first checks
  // the step's loss (stats[0] / loss_divisor) and gradient norm (sqrt(stats[1])) against
  // limits[0..1] and skips a step above either as it skips a non-finite one. All three are
  // device pointers the caller keeps valid and current: stats as OptimizerStep / ClipAndUpdate
  // see them (global values by then), limits refreshed before each step.
  void set_spike_gate(const float* stats, float loss_divisor, const float* limits) {
    spike_stats_ = stats;
    spike_divisor_ = loss_divisor;
    spike_limits_ = limits;
  }
  bool spike_gated() const { return spike_limits_ != nullptr; }

  // Profiling: when set, the observer hears of every phase boundary (never set while
  // capturing), and the step runs single-stream (phases on two streams would overlap and be
  // mis-timed). Null: no calls.
  void set_observer(StepObserver* observer) { observer_ = observer; }

 private:
  struct BlockActs;  // what one block keeps for backward
  struct Buffers;    // every device allocation
  // Buffers a weight-gradient GEMM on the wgrad stream reads (or, for dWte, writes) that the
  // compute stream rewrites later in the same backward: one event each, recorded on the wgrad
  // stream after the GEMM, waited on by the compute stream before the rewrite.
  enum class WgradHazard {
    kDres,
    kDgu,
    kDqkv,
    kLogits0,
    kLogits1,
    kDwte,
    kNormWs0,
    kNormWs1,
    kCount
  };
  CudaModel();

  Status Init(const ModelConfig& m, const OptimizerConfig& opt, const CudaModelOptions& o);
  // Init's parts after the parameter store, in its order: AdamW's descriptors, the per-unit
  // events and the deferred update; the step's activations and scratch (and, within it,
  // SetUpFp8's Fp8Linears).
  Status SetUpOptimizer();
  Status AllocateStepBuffers();
  Status SetUpFp8();
  // One zero-filled device buffer of n T's, freed with the model (cuda_model_state.h).
  template <typename T>
  Status Alloc(T** p, size_t n);
  Status Forward(const int32_t* inputs, const int32_t* targets, float dloss, bool backward,
                 bool accumulate_grads, float* losses, cudaStream_t stream);
  Status ForwardImpl(const int32_t* inputs, const int32_t* targets, float dloss, bool backward,
                     bool accumulate_grads, float* losses, cudaStream_t stream);
  // `set`: the index of `a` among the activation sets (layer, or 0 with recompute).
  Status BlockForward(int layer, int set, const BlockActs& a, const cuda::bf16* x_in,
                      cuda::bf16* x_out, cudaStream_t stream);
  Status BlockBackward(int layer, int set, const BlockActs& a, const cuda::bf16* x_in,
                       cuda::bf16* dres, bool accumulate_grads, cudaStream_t stream);
  // RMSNorm backward into dres, with the FP8 casts of linear k of block cast_layer when fused.
  Status NormBackward(int cast_layer, LinearKind k, cuda::bf16* dres, float* dw,
                      const cuda::bf16* dout, const cuda::bf16* x, const cuda::bf16* w,
                      const float* rstd, bool accumulate_dx, bool accumulate_dw,
                      cudaStream_t stream);
  // The linears' strategy (linear_strategy_setup.cc): what the kernels accept here, the choice
  // into linears_ (Init, before the buffers it sizes), and the BF16 RoPE GEMM's table.
  LinearKernelSupport ProbeLinearKernels() const;
  void ChooseLinears();
  Status SetUpEpilogueGemms();
  Status RecomputeNormAndSwiGlu(int layer, const BlockActs& a, const cuda::bf16* x_in,
                                cudaStream_t s);
  // Our GEMM's arguments for the QKV projection + RoPE and gate/up + SwiGLU, all but the
  // per-layer pointers: what ProbeLinearKernels checks is what the passes run.
  cuda::WgmmaGemmArgs QkvRopeGemm() const;
  cuda::WgmmaGemmArgs GateUpSwiGluGemm() const;
  cuda::WgmmaGemmArgs DownSwiGluBackwardGemm() const;
  // FP8: layer l's weights into their FP8 copies (the first forward of a step or an eval).
  Status CastLayerWeights(int layer, bool backward, cudaStream_t stream);
  // AdamW by the clip scale just written (NaN for a spike, set_spike_gate), now or
  // (defer_update) in the next forward; then EndStep.
  Status UpdateOrDefer(const cuda::AdamWHyper* hyper, cudaStream_t stream);
  // After AdamW: the FP8 scale update (no-op in BF16).
  Status EndStep(cudaStream_t stream);
  Status LmHead(const int32_t* targets, float dloss, bool backward, bool accumulate_grads,
                float* losses, cudaStream_t stream);
  // Dual-stream plumbing (each a plain call on `stream` when single-stream):
  // WgradGemm forks (the wgrad stream waits for everything enqueued on `stream` so far), runs
  // the GEMM there and records `reads`; WaitWgrad makes `stream` wait for the last recorded
  // `h` of this call; JoinWgrad makes `stream` wait for all wgrad work so far.
  Status WgradGemm(const cuda::GemmArgs& g, WgradHazard reads, cudaStream_t stream);
  Status RecordWgrad(WgradHazard h);
  Status WaitWgrad(WgradHazard h, cudaStream_t stream);
  Status JoinWgrad(cudaStream_t stream);
  // The phase boundary hook: work enqueued on `stream` from here on belongs to `p`.
  Status Phase(StepPhase p, cudaStream_t stream) {
    return observer_ ? observer_->OnPhase(p, stream) : Status::Ok();
  }
  // The deferred update of the unit (if one is running) and the hook.
  Status BeforeForward(int unit, cudaStream_t stream);
  Status BeforeBackward(int unit, cudaStream_t stream) {
    return hooks_ && hooks_->before_backward ? hooks_->before_backward(unit, stream)
                                             : Status::Ok();
  }
  const cuda::bf16* UnitParams(int unit) const { return store_.unit_params(unit); }
  float* UnitGrads(int unit) const { return store_.unit_grads(unit); }
  cuda::bf16* UnitGrads16(int unit) const { return store_.unit_grads16(unit); }
  Status GradReady(int unit, cudaStream_t stream);
  Status UnitSumSquares(int unit, cudaStream_t stream);

  ModelConfig m_;
  OptimizerConfig opt_;
  CudaModelOptions o_;
  ParamLayout layout_;
  int64_t N_ = 0;               // tokens per micro-batch
  int d_ = 0, H_ = 0, KV_ = 0, hd_ = 0, ffn_ = 0, V_ = 0, T_ = 0, qkv_dim_ = 0;
  size_t allocated_bytes_ = 0;
  LinearStrategies linears_;
  // Before buf_, so it is freed after Buffers' destructor has waited for the wgrad stream.
  ParamStore store_;
  std::unique_ptr<Buffers> buf_;
  StepObserver* observer_ = nullptr;  // set_observer
  const CudaModelHooks* hooks_ = nullptr;
  const float* spike_stats_ = nullptr;   // set_spike_gate
  float spike_divisor_ = 1.0f;
  const float* spike_limits_ = nullptr;
  int bwd_sm_count_ = 0;                  // from gemm_sm_margin (0: all SMs)
  int wgrad_sm_count_ = 0;                // from gemm_sm_margin + wgrad_sm_margin
  // Per Forward call: whether this call uses the wgrad stream, whether anything was forked
  // onto it since the last join, and which hazard events were recorded in this call (only
  // those may be waited on: a capture cannot wait on an event recorded outside it).
  bool dual_ = false;
  const LinearPlan* plan_ = &linears_.measuring;  // this pass's (linears_.For)
  bool wgrad_pending_ = false;
  bool grads16_direct_ = false;  // this pass's BF16 dW GEMMs write grads16 (CastUnitGradsToBf16)
  // The last backward summed every unit's gradient squares (no hooks: world 1), so
  // OptimizerStep finishes the norm from those partials instead of reading every gradient.
  bool unit_sumsq_ready_ = false;
  std::array<bool, static_cast<int>(WgradHazard::kCount)> hazard_recorded_{};
};

}  // namespace forge
