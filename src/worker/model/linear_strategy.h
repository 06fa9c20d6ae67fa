// How each linear layer of the CUDA model computes: which GEMM runs its forward, its input
// gradient (dgrad) and its weight gradient (wgrad), and in FP8 what writes the FP8 copies of
// its input and of its output gradient. Chosen once when the model is built
// (ChooseLinearStrategies), from the options and from what the kernels accept at the model's
// shapes on this GPU (LinearKernelSupport, which CudaModel asks the kernels for once); the
// forward and backward passes then switch on the choice and check nothing themselves. Host
// code only, so the choice is tested without a GPU.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace forge {

// The four linear layers of a transformer block.
enum class LinearKind { kQkv = 0, kOut = 1, kGateUp = 2, kDown = 3 };
inline constexpr int kLinearKinds = 4;

enum class GemmPath : uint8_t {
  kCublasLt,     // BF16 cuBLASLt
  kEpilogue,     // BF16, our Hopper GEMM (kernels/cuda/gemm_wgmma.h) with the neighbouring op
                 // in its epilogue: RoPE after the QKV projection, SwiGLU after gate/up,
                 // SwiGLU's backward after the down projection's dgrad
  kFp8CublasLt,  // FP8 cuBLASLt on the cast operands (Fp8Linears)
  kFp8Epilogue,  // FP8, our Hopper GEMM or fused kernel with that epilogue
};

// What writes the FP8 copy of a linear's input (forward) or output gradient (backward).
enum class CastBy : uint8_t {
  kNone,          // BF16: nothing is cast
  kCastPass,      // a cast pass of its own (Fp8Linears::CastInput / CastGrad)
  kNorm,          // the RMSNorm before it (forward) or the RMSNorm backward after it
  kSwiGlu,        // the SwiGLU kernel (down's input) or its backward (gate/up's gradient)
  kGemmEpilogue,  // the neighbouring GEMM's epilogue: the gate/up GEMM writes down's input, the
                  // down projection's dgrad kernel writes gate/up's gradient
  kRope,          // RoPE's backward (the QKV gradient)
  kAttention,     // the attention backward, RoPE's inverse applied (the QKV gradient)
  kCrossEntropy,  // the cross-entropy kernel (the LM head's dlogits)
};

struct LinearStrategy {
  GemmPath forward = GemmPath::kCublasLt;
  GemmPath dgrad = GemmPath::kCublasLt;
  GemmPath wgrad = GemmPath::kCublasLt;
  CastBy input = CastBy::kNone;
  CastBy grad = CastBy::kNone;
  bool operator==(const LinearStrategy&) const = default;
};

// Every linear of one pass.
struct LinearPlan {
  std::array<LinearStrategy, kLinearKinds> blocks{};  // by LinearKind, the same in every layer
  // The LM head (the tied or untied output projection), over chunks of token rows: `wgrad` is
  // that of full chunks, lm_head_tail_wgrad that of a shorter last chunk.
  LinearStrategy lm_head;
  GemmPath lm_head_tail_wgrad = GemmPath::kCublasLt;
  const LinearStrategy& operator[](LinearKind k) const { return blocks[size_t(k)]; }
  bool operator==(const LinearPlan&) const = default;
};

// What the kernels accept at the model's shapes on this GPU (CudaModel asks them at build).
// Status: OK, or why not (the reason a fallback is logged with).
struct LinearKernelSupport {
  bool sm90 = false;  // our Hopper GEMMs and fused FP8 kernels run on this GPU
  // BF16: our GEMM with the RoPE / SwiGLU / SwiGLU-backward epilogue at these shapes.
  Status rope_gemm, swiglu_gemm, swiglu_bwd_gemm;
  Status flash_backward;  // our attention backward at this attention shape and GPU
  // FP8: the same GEMMs in FP8 (the SwiGLU backward is its own fused kernel), and the kernels
  // that write an FP8 cast as they compute: SwiGLU (forward and backward), RMSNorm forward,
  // RMSNorm backward (the Out and Down gradients), RoPE's backward.
  Status fp8_rope_gemm, fp8_swiglu_gemm, fp8_swiglu_bwd_gemm;
  bool fp8_swiglu_cast = false, fp8_norm_cast = false, fp8_norm_grad_cast = false,
       fp8_rope_grad_cast = false;
};

// The options and shapes the choice depends on (CudaModelOptions and ModelConfig's part).
struct LinearStrategyOptions {
  bool fp8 = false;  // precision.compute fp8
  Fp8FastAccum fast_accum = Fp8FastAccum::kFprop;
  bool fp8_lm_head = false, fp8_lm_head_wgrad = true;
  bool rope_gemm = true, swiglu_gemm = true, swiglu_bwd_gemm = true;
  bool fp8_attention_rope = true, fp8_norm_casts = true;
  bool cudnn_attention_backward = false;
  bool qk_norm = false;  // QK-norm runs between the QKV projection and RoPE
  // The LM head: padded vocabulary, model width, tokens per micro-batch, rows per chunk.
  int64_t vocab = 0, d_model = 0, tokens = 0, lm_head_chunk_rows = 0;
};

struct LinearStrategies {
  // The plan of BF16 passes, and of FP8 passes whose casts measure their tensor first (current
  // scaling, and the first step of delayed scaling): a fused cast needs a scale known before.
  LinearPlan measuring;
  // FP8 passes with delayed scaling after the first step (the casts fused where they can be);
  // BF16: the same as `measuring`.
  LinearPlan delayed;
  // The faster paths the options asked for that this model's shapes or GPU leave out, one line
  // each naming the path taken instead and why (the backend logs them once).
  std::vector<std::string> fallbacks;

  const LinearPlan& For(bool delayed_step) const { return delayed_step ? delayed : measuring; }
  // Whether an FP8 pass runs the fused FP8 kernels that need RoPE's (sin, cos) table, our
  // SwiGLU GEMM's own scratch for down's input (Fp8Linears allocates what they read).
  bool fp8_rope_table() const;
  bool fp8_swiglu_gemm() const;
};

LinearStrategies ChooseLinearStrategies(const LinearStrategyOptions& o,
                                        const LinearKernelSupport& k);

// Whether our BF16 GEMMs with SwiGLU's forward (the gate/up projection) and its backward (the
// down projection's input gradient) in the epilogue are the faster path at this model width
// (ChooseLinearStrategies takes them only there).
bool SwiGluGemmsAreFaster(int64_t d_model);

// One line: every linear kind's paths, e.g. "qkv fwd ours+RoPE, dgrad cuBLASLt, ...".
std::string DescribeLinearPlan(const LinearPlan& p);

}  // namespace forge
