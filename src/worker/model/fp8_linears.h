// FP8 state of the transformer blocks' four linear layers (precision.compute: fp8), for
// CudaModel: E4M3 weights and inputs in the forward pass, E5M2 gradients in the backward pass,
// FP32 accumulation and BF16 (activations) or FP32 (weight gradients) outputs, through
// GemmRunner's FP8 path. The embedding, norms, attention and optimizer stay BF16/FP32; the LM
// head's logits GEMM joins with precision.fp8.lm_head (below).
//
// Hopper's FP8 GEMMs take both operands K-contiguous (cuBLASLt's TN), so each tensor has the
// copies its GEMMs read (see kernels/cuda/fp8_cast.h):
//   forward  y  = x W^T    x8 [N, in]  (scratch, read at once)   W8  [out, in]
//   dgrad    dx = dy W     dy8 [N, out]                          W8t [in, out]
//   wgrad    dW = dy^T x   dy8t [out, N]                         x8t [in, N] (saved for backward)
// One cast(+transpose) pass makes both copies of a tensor and max-accumulates its amax.
//
// Memory: the transposed inputs saved for backward are 1 byte an element where the BF16 step
// keeps 2 (the BF16 h1/h2/sw are then only forward scratch; CudaModel shares one set), W8 and
// W8t of every layer stay resident (2 bytes per weight), gradients use one set per linear kind.
//
// Scaling (worker/model/fp8_scaling.h, device-side in kernels/cuda/fp8_scale_update.h):
// - delayed: every cast uses the scale the last EndStep derived from the amax history, and
//   records its amax (max over the step's micro-batches and recomputes); EndStep folds the
//   step's amaxes into the histories, derives the next scales and resets the amaxes, all on
//   the device (capturable; the host never reads an amax).
// - current, and every tensor before its first recorded step (delayed with an empty history
//   would cast with scale 1, which flushes typical gradients to zero): each cast first
//   measures the tensor's amax (a read pass into a scratch slot), derives the scale from it
//   (the window-1 update) and then casts; the amax still enters the history at EndStep.
// Non-finite amaxes (an overflowed step) are refused by the update: the scale stays, the
// history does not see it, and the count is in nonfinite().
//
// LM head (precision.fp8.lm_head), per token chunk:
//   logits = hf Wte^T      hf8 [rows, d] (scratch)             Wte8  [V, d]
//   dhf    = dlogits Wte   dlogits8 [rows, V] (E5M2)            Wte8t [d, V]
//   dWte  += dlogits^T hf  dlogits8t [V, rows] (caller's)       hf8t [d, rows] (per slot)
// Wte8/Wte8t are cast once per step like the blocks' weights. dlogits8 is written by the
// cross-entropy kernel itself on a delayed step (CrossEntropyToGrad: no extra pass over the
// step's largest tensor), by a cast of the bf16 dlogits when the casts measure first. Its
// transposed copy for dWte comes from a byte transpose of dlogits8 (the kernel's one-row-a-
// block layout cannot write it) into the chunk's logits buffer, which is dead by then: in FP8
// the cross-entropy writes no bf16 dlogits (1 byte a value instead of 3), so the transpose
// costs what that store did, and dWte (the LM head's largest GEMM) runs in FP8. Chunks whose
// rows are not a multiple of 64 (the transpose's tile) keep dWte in BF16 on bf16 dlogits.
//
// Tensor indices: E4M3 (weights and inputs) 2*(4l+k) for W and 2*(4l+k)+1 for x, then the LM
// head's Wte at 8L and hf at 8L+1; E5M2 4l+k, then the LM head's dlogits at 4L.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/flash_backward.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/swiglu_backward_gemm_fp8.h"
#include "worker/model/linear_strategy.h"

namespace forge {

struct Fp8LinearShape {
  int64_t in = 0, out = 0;  // W is [out, in]
};

// The attention shape, for the RoPE backward that writes the QKV gradient's FP8 casts itself.
struct Fp8RopeShape {
  int B = 0, T = 0, n_head = 0, n_kv_head = 0, hd = 0;
  const float* inv_freq = nullptr;  // device, hd / 2 (rope.h); read while Create runs
};

// What the model's linear strategies (linear_strategy.h, chosen by CudaModel) run that reads
// buffers of Fp8Linears' own: RoPE's (sin, cos) table (the QKV GEMM with RoPE, and the RoPE or
// attention backward writing the QKV gradient's casts), and the down projection's input scratch
// that the gate/up GEMM with SwiGLU writes while it still reads x8.
struct Fp8FusedBuffers {
  bool rope_table = false;
  bool swiglu_gemm = false;
};

// The tied LM head's shape (vocab 0: the LM head stays BF16).
struct Fp8LmHeadShape {
  int64_t vocab = 0, d = 0, chunk_rows = 0;  // Wte [vocab, d]; hf chunks of <= chunk_rows
  // How many chunks' weight-gradient operands may be live at once (CudaModel's logits
  // buffers: the weight gradient of one chunk runs beside the next chunk's work).
  int slots = 1;
  // The weight gradient dWte in FP8 too, where the shapes allow (lm_head_wgrad).
  bool wgrad = true;
};

class Fp8Linears {
 public:
  // shapes by LinearKind; act_sets: how many sets of saved transposed inputs (n_layer, or 1
  // with activation recompute). Every in/out and `tokens` must be a multiple of 16 (FP8 GEMM
  // alignment). fused: the buffers the chosen fused kernels read. one_weight_set: every layer's
  // FP8 weights share one set of buffers, cast again before each of the layer's forward and
  // backward passes (its BF16 weights are gathered for each pass anyway: fsdp); else each
  // layer keeps its own, cast once per step. Allocates everything once.
  static StatusOr<std::unique_ptr<Fp8Linears>> Create(
      const Fp8Config& cfg, int n_layer, const std::array<Fp8LinearShape, kLinearKinds>& shapes,
      int64_t tokens, int act_sets, const Fp8RopeShape& rope, const Fp8LmHeadShape& lm_head = {},
      const Fp8FusedBuffers& fused = {}, bool one_weight_set = false);
  ~Fp8Linears();
  Fp8Linears(const Fp8Linears&) = delete;
  Fp8Linears& operator=(const Fp8Linears&) = delete;

  size_t allocated_bytes() const { return allocated_; }

  // W8 and W8t of (layer, kind) from the BF16 weight w [out, in] (the compute copy, or the
  // gathered unit under fsdp): once per step, before the layer's first forward; with
  // one_weight_set before each of its passes. Casts within a step use one scale, so every
  // cast of a weight writes the same bytes and amax.
  Status CastWeight(int layer, LinearKind k, const cuda::bf16* w, cudaStream_t s);
  // All four of a layer's weights (by LinearKind) at once: one launch on a delayed step
  // (CastTransposeGroupToFp8, bit for bit the four CastWeight calls), else CastWeight each.
  Status CastLayerWeights(int layer, const std::array<const cuda::bf16*, kLinearKinds>& w,
                          cudaStream_t s);
  // one_weight_set: the layer's weights given already cast (fsdp's FP8 all-gather, by
  // LinearKind, each [out, in] E4M3 with the layer's weight scale, 16-byte aligned): the GEMMs
  // read a 256-byte aligned w8 in place until the next cast (others are copied into the
  // set's own W8), and with `transposes` each W8t is made from it by a byte transpose (bit
  // for bit the cast's transposed copy; a forward pass reads no W8t). w8 must stay untouched
  // until the passes that read it ran. Only where TakesCastWeights().
  Status UseCastWeights(int layer, const std::array<const uint8_t*, kLinearKinds>& w8,
                        bool transposes, cudaStream_t s);
  // Whether UseCastWeights can serve: one_weight_set and every weight's rows and columns a
  // multiple of 64 (the byte transpose's tile).
  bool TakesCastWeights() const;
  // Linear k's weight shape and its scaling slot in layer `layer` (scale read by a cast;
  // amax and scale_inv written), for a caller that casts the weight itself.
  struct SlotPtrs {
    const float* scale;
    float* amax;
    float* scale_inv;
  };
  Fp8LinearShape shape(LinearKind k) const { return shape_[size_t(k)]; }
  SlotPtrs WeightScaling(int layer, LinearKind k) const {
    return SlotOf(e4m3_, WeightSlot(layer, int(k)));
  }
  // x [N, in] -> x8 (scratch for the forward GEMM) and x8t of act set `set`.
  Status CastInput(int layer, LinearKind k, int set, const cuda::bf16* x, cudaStream_t s);
  // dy [N, out] -> dy8 and dy8t of the kind.
  Status CastGrad(int layer, LinearKind k, const cuda::bf16* dy, cudaStream_t s);

  // The kernels that write a cast as they compute (the model's LinearStrategies say which run:
  // CastBy in linear_strategy.h). Each writes the same bytes, amax and scale_inv as the BF16
  // kernel followed by CastInput / CastGrad, so they only run where no cast measures first (a
  // delayed step), and where the kernel takes the shapes.
  //
  // SwiGLU(gate_up) straight into the down projection's input casts (x8, x8t of `set`;
  // kernels/cuda/swiglu_fp8.h).
  Status SwiGluForwardToInput(int layer, int set, const cuda::bf16* gate_up, cudaStream_t s);
  // The gate/up projection with SwiGLU and the down projection's input casts in its epilogue
  // (our Hopper GEMM, kernels/cuda/gemm_wgmma.h: gu and the same x8 / x8t bytes, amax and
  // scale_inv as the cuBLASLt GEMM followed by SwiGluForwardToInput, up to the GEMM's
  // summation): on sm_90, and only with fast accumulation in the forward (precision.fp8.
  // fast_accum fprop or fprop_dgrad), which is how its MMAs sum. x8 (the gate/up input, cast)
  // W8^T into gu (bf16, [N, 2 ffn], saved for backward) and SwiGLU(gu) into the down
  // projection's x8 and x8t of `set`. Needs Fp8FusedBuffers::swiglu_gemm.
  cuda::WgmmaGemmArgs GateUpSwiGluGemm(int layer, int set, cuda::bf16* gu) const;
  // The QKV projection with RoPE in the epilogue (our Hopper GEMM): qkv [N, qkv] = x8 W8^T
  // rotated, bit for bit the cuBLASLt GEMM followed by RopeApply up to the GEMM's summation.
  // On sm_90 with fast accumulation in the forward (as the SwiGLU GEMM) and shapes it takes
  // (head width 64, ...); unlike the fused casts it needs no delayed step (it casts nothing).
  // Needs Fp8FusedBuffers::rope_table.
  cuda::WgmmaGemmArgs QkvRopeGemm(int layer, cuda::bf16* qkv) const;
  // SwiGLU's backward straight into the gate/up projection's gradient casts (dy8, dy8t).
  Status SwiGluBackwardToGrad(int layer, const cuda::bf16* dout, const cuda::bf16* gate_up,
                              cudaStream_t s);
  // The down projection's input gradient (dy8 W8, never stored) and SwiGLU's backward in one
  // kernel straight into the gate/up projection's gradient casts: bit for bit our FP8 GEMM
  // followed by SwiGluBackwardToGrad. On a delayed step, on sm_90, and only with fast
  // accumulation in the input-gradient GEMMs (precision.fp8.fast_accum fprop_dgrad), which is
  // how its MMAs sum. Reads the Down projection's dy8.
  Status SwiGluBackwardGemm(int layer, const cuda::bf16* gate_up, cudaStream_t s);
  // RMSNorm straight into the input casts of the linear layer it feeds (kQkv or kGateUp;
  // kernels/cuda/rmsnorm_fp8.h); rstd is written as RmsNormForward writes it.
  Status RmsNormToInput(int layer, LinearKind k, int set, float* rstd, const cuda::bf16* x,
                        const cuda::bf16* w, float eps, cudaStream_t s);
  // The same for RoPE's backward (kernels/cuda/rope_fp8.h): the attention backward's qkv
  // gradient (Q and K still rotated) straight into the QKV projection's gradient casts.
  // Needs Fp8FusedBuffers::rope_table.
  // The RMSNorm backward whose output (the residual stream's gradient) is the Out or Down
  // projection's output gradient, straight into that projection's gradient casts (dy8, dy8t;
  // kernels/cuda/rmsnorm_fp8.h; bit for bit RmsNormBackward followed by CastGrad). `layer`
  // and `k` name the projection (for the Down of layer l - 1 it is layer l's attention norm).
  Status RmsNormBackwardToGrad(int layer, LinearKind k, cuda::bf16* dx, float* dw,
                               const cuda::bf16* dout, const cuda::bf16* x, const cuda::bf16* w,
                               const float* rstd, void* workspace, size_t workspace_bytes,
                               bool accumulate_dx, bool accumulate_dw, cudaStream_t s,
                               const cuda::RmsNormDwReduce& dw_reduce = {});
  Status RopeBackwardToGrad(int layer, const cuda::bf16* dqkv, cudaStream_t s);
  // The same outputs written by the attention backward itself (where our flash backward runs):
  // what SdpaRunner::Backward takes instead of a bf16 dqkv. Needs Fp8FusedBuffers::rope_table.
  cuda::FlashBackwardFp8Out QkvGradFromAttention(int layer) const;

  // The three GEMMs of a linear layer on the cast operands (shapes as in CudaModel).
  // y [N, out] = x8 W8^T (+ residual: C, only read).
  cuda::GemmArgs Forward(int layer, LinearKind k, cuda::bf16* y,
                         const cuda::bf16* residual = nullptr) const;
  // dx [N, in] = dy8 W8 (W8t as the K-contiguous operand).
  cuda::GemmArgs BackwardData(int layer, LinearKind k, cuda::bf16* dx) const;
  // dW [out, in] (+)= dy8t x8t^T, fp32.
  cuda::GemmArgs BackwardWeight(int layer, LinearKind k, int set, float* dw,
                                bool accumulate) const;

  // The FP8 LM head (see the header comment); only when lm_head().
  bool lm_head() const { return lm_.vocab > 0; }
  // Wte [vocab, d] (BF16 compute copy) -> its E4M3 copy: once per step, before the first chunk.
  Status CastLmHeadWeight(const cuda::bf16* wte, cudaStream_t s);
  // A chunk of hf [rows, d] (rows <= chunk_rows) -> its E4M3 copy (scratch for the GEMM), and
  // its transposed copy in slot `slot` when lm_head_wgrad(rows) (slot -1: none, a forward
  // without backward).
  Status CastLmHeadInput(const cuda::bf16* hf, int64_t rows, int slot, cudaStream_t s);
  // Whether a chunk of `rows` computes dWte in FP8 (LmHeadBackwardWeight): then no bf16
  // dlogits exist; else dWte is the BF16 GEMM on the bf16 dlogits.
  bool lm_head_wgrad(int64_t rows) const { return lm_wgrad_ && rows % 64 == 0; }
  // logits [rows, vocab] = hf8 Wte8^T (BF16 out).
  cuda::GemmArgs LmHeadForward(cuda::bf16* logits, int64_t rows) const;
  // The cross-entropy of a chunk (kernels/cuda/cross_entropy.h, write_grad) that also
  // writes dlogits8: only when no cast measures first (a delayed step).
  Status CrossEntropyToGrad(cuda::bf16* logits, float* losses, const int32_t* targets,
                            int64_t rows, float dloss, cudaStream_t s);
  // Otherwise: the bf16 dlogits [rows, vocab] (written by the plain cross-entropy) -> dlogits8.
  Status CastLmHeadGrad(const cuda::bf16* dlogits, int64_t rows, cudaStream_t s);
  // dhf [rows, d] = dlogits8 Wte8 (Wte8t as the K-contiguous operand), BF16 out.
  cuda::GemmArgs LmHeadBackwardData(cuda::bf16* dhf, int64_t rows) const;
  // dlogits8 -> dlogits8t [vocab, rows] (lm_head_wgrad chunks; 16-byte aligned, may be the
  // chunk's logits buffer once nothing reads the logits).
  Status TransposeLmHeadGrad(void* dlogits8t, int64_t rows, cudaStream_t s) const;
  // dWte [vocab, d] (+)= dlogits8t hf8t^T (fp32), hf8t of `slot`.
  cuda::GemmArgs LmHeadBackwardWeight(float* dwte, const void* dlogits8t, int slot, int64_t rows,
                                      bool accumulate) const;

  // After the step's last micro-batch: histories, next scales, amaxes reset (delayed update).
  Status EndStep(cudaStream_t s);
  // Drops the amaxes recorded since the last EndStep (an evaluation pass between steps must
  // not shape the next step's scales).
  Status ResetAmax(cudaStream_t s);
  // The amax slot arrays (E4M3 group, E5M2 group: n * 4 floats each, every 4th a tensor's
  // amax, the rest 0), for a data-parallel layer that makes them equal on every rank between
  // the last micro-batch and EndStep.
  struct AmaxSlots {
    float* data;
    int64_t count;
  };
  std::array<AmaxSlots, 2> amax_slots() {
    return {AmaxSlots{e4m3_.amax, e4m3_.n * 4}, AmaxSlots{e5m2_.amax, e5m2_.n * 4}};
  }
  // Whether casts measure their tensor first (current recipe, or no step recorded yet).
  bool measuring() const { return cfg_.recipe == Fp8Recipe::kCurrent || !have_history_; }
  Fp8Recipe recipe() const { return cfg_.recipe; }

  // Host copies (synchronise on `s`), for tests and logs: amax histories/scales are per
  // tensor index (see the header comment).
  struct Snapshot {
    std::vector<float> scale_e4m3, scale_e5m2;
    std::vector<int64_t> nonfinite_e4m3, nonfinite_e5m2;
  };
  StatusOr<Snapshot> Read(cudaStream_t s) const;

  // The scaling state an exact resume needs (scales, amax histories, their counters, whether a
  // step was recorded) as a versioned blob for checkpoints (TrainerState::extra "fp8"), and
  // back. Taken between steps (the step's amaxes are already folded in). LoadState checks the
  // blob against this model's tensor counts and amax_history and changes nothing on a mismatch.
  StatusOr<std::string> SaveState(cudaStream_t s) const;
  Status LoadState(const std::string& blob, cudaStream_t s);

 private:
  // Scaling state of one format's tensors: amax/scale/scale_inv in 16-byte slots (stride 4)
  // so each pointer can feed cuBLASLt directly.
  struct Group {
    int64_t n = 0;
    float fp8_max = 0.0f;
    float* amax = nullptr;
    float* scale = nullptr;
    float* scale_inv = nullptr;
    float* history = nullptr;       // [n, window]
    int64_t* recorded = nullptr;    // [n]
    int64_t* nonfinite = nullptr;   // [n]
    float* probe_amax = nullptr;    // measuring casts: the tensor's own amax, stride 4
    float* probe_history = nullptr; // [n] (window 1)
    int64_t* probe_recorded = nullptr;
  };
  struct Linear {
    uint8_t* w8 = nullptr;   // [out, in]
    uint8_t* w8t = nullptr;  // [in, out]
  };

  Fp8Linears() = default;
  // A block linear layer's scaling slots (see the header comment), t = kLinearKinds * layer +
  // kind: E4M3 weight 2t and input 2t + 1, E5M2 output gradient t.
  static int64_t LinearIndex(int layer, int ki) { return int64_t{kLinearKinds} * layer + ki; }
  // The FP8 weight buffers of (layer, kind): its own, or the one shared set.
  const Linear& WeightBuffers(int layer, int ki) const {
    return lin_[size_t(LinearIndex(one_weight_set_ ? 0 : layer, ki))];
  }
  // The W8 the forward GEMMs read: UseCastWeights' while it holds, else the buffer's own.
  const uint8_t* W8(int layer, int ki) const {
    return given_w8_[size_t(ki)] != nullptr ? given_w8_[size_t(ki)] : WeightBuffers(layer, ki).w8;
  }
  static int64_t WeightSlot(int layer, int ki) { return 2 * LinearIndex(layer, ki); }
  static int64_t InputSlot(int layer, int ki) { return WeightSlot(layer, ki) + 1; }
  static int64_t GradSlot(int layer, int ki) { return LinearIndex(layer, ki); }
  // The LM head's scaling slots, after the blocks' (see the header comment).
  int64_t LmWeightSlot() const { return int64_t{2 * kLinearKinds} * L_; }  // E4M3
  int64_t LmInputSlot() const { return LmWeightSlot() + 1; }                // E4M3
  int64_t LmGradSlot() const { return int64_t{kLinearKinds} * L_; }         // E5M2
  // What SaveState/LoadState move of a group, in blob order: (device pointer, bytes).
  static std::array<std::pair<void*, size_t>, 5> StateParts(const Group& g, int window);
  Status Init(const Fp8Config& cfg, int n_layer,
              const std::array<Fp8LinearShape, kLinearKinds>& shapes, int64_t tokens, int act_sets,
              const Fp8RopeShape& rope, const Fp8LmHeadShape& lm_head,
              const Fp8FusedBuffers& fused, bool one_weight_set);
  // Slot i of g: what a cast or a kernel writing FP8 takes.
  static SlotPtrs SlotOf(const Group& g, int64_t i);
  // Linear k's forward x8 W8^T into d on our Hopper GEMM (kPlain; the callers add their
  // epilogue): shapes, operands and dequantisation scales.
  cuda::WgmmaGemmArgs WgmmaForward(int layer, LinearKind k, void* d) const;
  cuda::SwiGluBackwardGemmFp8Args SwiGluBackwardGemmArgs(int layer,
                                                         const cuda::bf16* gate_up) const;
  Status AllocGroup(Group* g, int64_t n, float fp8_max);
  template <typename T>
  Status Alloc(T** p, size_t count);
  // Cast of tensor i of group g (measuring first when measuring()).
  Status Cast(Group& g, int64_t i, cuda::DType format, void* out, void* out_t,
              const cuda::bf16* x, int64_t rows, int64_t cols, cudaStream_t s);
  // The delayed update of g's tensors [first, first + n) from `amax` (stride 4 from there)
  // into their scale/scale_inv slots.
  Status Update(Group& g, int64_t first, int64_t n, float* amax, float* history,
                int64_t* recorded, int window, cudaStream_t s);

  Fp8Config cfg_;
  int L_ = 0;
  int64_t N_ = 0;
  std::array<Fp8LinearShape, kLinearKinds> shape_{};
  bool have_history_ = false;
  Fp8RopeShape rope_;
  // RoPE's (sin, cos) [T, hd / 2] (RopeSinCosTable) for QkvRopeGemm and RopeBackwardToGrad;
  // null when neither runs.
  float2* rope_sin_cos_ = nullptr;
  size_t allocated_ = 0;
  std::vector<void*> allocations_;
  Group e4m3_, e5m2_;
  std::vector<Linear> lin_;                    // [4l + k], or [k] with one_weight_set_
  bool one_weight_set_ = false;
  std::array<const uint8_t*, kLinearKinds> given_w8_{};  // UseCastWeights' (null: none)
  uint8_t* x8_ = nullptr;                      // [N, max in]
  // The down projection's forward input [N, ffn] with Fp8FusedBuffers::swiglu_gemm (the gate/up
  // GEMM writes it while still reading x8), else null and x8 serves: InputScratch.
  uint8_t* h8_ = nullptr;
  uint8_t* InputScratch(int ki) const {
    return ki == int(LinearKind::kDown) && h8_ != nullptr ? h8_ : x8_;
  }
  std::vector<uint8_t*> x8t_;                  // [set * 4 + k]: [in_k, N]
  std::array<uint8_t*, kLinearKinds> dy8_{};   // [N, out_k]
  std::array<uint8_t*, kLinearKinds> dy8t_{};  // [out_k, N]
  Fp8LmHeadShape lm_;
  uint8_t* lm_w8_ = nullptr;                   // [vocab, d]
  uint8_t* lm_w8t_ = nullptr;                  // [d, vocab]
  uint8_t* lm_x8_ = nullptr;                   // [chunk_rows, d]
  uint8_t* lm_dy8_ = nullptr;                  // [chunk_rows, vocab]
  bool lm_wgrad_ = false;
  std::vector<uint8_t*> lm_x8t_;  // [slot]: [d, chunk_rows] (lm_wgrad_)
};

}  // namespace forge
