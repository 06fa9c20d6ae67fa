#include "worker/model/linear_strategy.h"

#include <algorithm>
#include <string>

namespace forge {

namespace {

constexpr LinearKind kQkv = LinearKind::kQkv, kOut = LinearKind::kOut,
                     kGateUp = LinearKind::kGateUp, kDown = LinearKind::kDown;

LinearStrategy& At(LinearPlan& p, LinearKind k) { return p.blocks[size_t(k)]; }

// The width (K = d_model) up to which our BF16 GEMMs with SwiGLU in the epilogue are the faster
// path, measured on H200s (forge-wgmma-bench with each pair interleaved, the step;
// docs/performance.md): at llama3-1b's 2048 the gate/up GEMM with SwiGLU's forward takes 0.92 of
// cuBLASLt and the pass's time, the down projection's input gradient with SwiGLU's backward
// 0.97-1.00, and the step 0.95 ms less with the latter; at llama3-3b's 3072 and llama3-8b's 4096
// the step with both is no faster (3072) or 1% slower (4096).
constexpr int64_t kSwiGluGemmMaxWidth = 2048;

std::string WideReason(int64_t d_model) {
  return "d_model " + std::to_string(d_model) + " > " + std::to_string(kSwiGluGemmMaxWidth) +
         ": cuBLASLt and the separate pass are faster";
}

// BF16: cuBLASLt everywhere except the epilogue GEMMs the options ask for where our GEMM runs,
// takes the shapes and is the faster path.
void ChooseBf16(const LinearStrategyOptions& o, const LinearKernelSupport& k,
                LinearStrategies* out) {
  LinearPlan p;
  const bool wide = !SwiGluGemmsAreFaster(o.d_model);
  const bool rope = o.rope_gemm && k.sm90 && !o.qk_norm && k.rope_gemm.ok();
  const bool swiglu = o.swiglu_gemm && k.sm90 && !wide && k.swiglu_gemm.ok();
  const bool swiglu_bwd = o.swiglu_bwd_gemm && k.sm90 && !wide && k.swiglu_bwd_gemm.ok();
  if (rope) At(p, kQkv).forward = GemmPath::kEpilogue;
  if (swiglu) At(p, kGateUp).forward = GemmPath::kEpilogue;
  if (swiglu_bwd) At(p, kDown).dgrad = GemmPath::kEpilogue;
  out->measuring = out->delayed = p;
  if (!k.sm90) return;  // our GEMM does not run on this GPU at all: nothing to report
  if (o.rope_gemm && !rope) {
    out->fallbacks.push_back(
        "QKV projection: cuBLASLt, then RoPE apart (" +
        (o.qk_norm ? std::string("QK-norm runs between them") : k.rope_gemm.message()) + ")");
  }
  if (o.swiglu_gemm && !swiglu) {
    out->fallbacks.push_back(
        "gate/up projection: cuBLASLt, then SwiGLU apart (" +
        (k.swiglu_gemm.ok() ? WideReason(o.d_model) : k.swiglu_gemm.message()) + ")");
  }
  if (o.swiglu_bwd_gemm && !swiglu_bwd) {
    out->fallbacks.push_back(
        "down projection's input gradient: cuBLASLt, then SwiGLU's backward apart (" +
        (k.swiglu_bwd_gemm.ok() ? WideReason(o.d_model) : k.swiglu_bwd_gemm.message()) + ")");
  }
}

// FP8: every block linear in FP8 (Fp8Linears). Our GEMMs sum as fast accumulation does, so
// they take a GEMM only where precision.fp8.fast_accum lets that GEMM skip the promotion.
// The fused casts need a scale known before the tensor is seen: delayed steps only.
void ChooseFp8(const LinearStrategyOptions& o, const LinearKernelSupport& k,
               LinearStrategies* out) {
  const bool fast_fwd = o.fast_accum != Fp8FastAccum::kNone;
  const bool fast_dgrad = o.fast_accum == Fp8FastAccum::kFpropDgrad;
  const bool rope_gemm = o.rope_gemm && !o.qk_norm && fast_fwd && k.sm90 && k.fp8_rope_gemm.ok();
  const bool swiglu_cast = k.fp8_swiglu_cast;
  const bool swiglu_gemm =
      o.swiglu_gemm && swiglu_cast && fast_fwd && k.sm90 && k.fp8_swiglu_gemm.ok();
  const bool swiglu_bwd =
      o.swiglu_bwd_gemm && swiglu_cast && fast_dgrad && k.sm90 && k.fp8_swiglu_bwd_gemm.ok();
  const bool rope_grad = !o.qk_norm && k.fp8_rope_grad_cast;
  const bool attention_rope =
      o.fp8_attention_rope && !o.cudnn_attention_backward && k.flash_backward.ok();

  LinearPlan m;  // casts that measure first: a cast pass before every FP8 GEMM operand
  for (LinearStrategy& s : m.blocks) {
    s = {GemmPath::kFp8CublasLt, GemmPath::kFp8CublasLt, GemmPath::kFp8CublasLt,
         CastBy::kCastPass, CastBy::kCastPass};
  }
  if (rope_gemm) At(m, kQkv).forward = GemmPath::kFp8Epilogue;  // casts nothing itself

  LinearPlan d = m;
  const CastBy norm_in = o.fp8_norm_casts && k.fp8_norm_cast ? CastBy::kNorm : CastBy::kCastPass;
  const CastBy norm_grad =
      o.fp8_norm_casts && k.fp8_norm_grad_cast ? CastBy::kNorm : CastBy::kCastPass;
  At(d, kQkv).input = norm_in;
  At(d, kQkv).grad = !rope_grad        ? CastBy::kCastPass
                     : attention_rope ? CastBy::kAttention
                                      : CastBy::kRope;
  At(d, kOut).grad = norm_grad;
  At(d, kGateUp).input = norm_in;
  if (swiglu_gemm) At(d, kGateUp).forward = GemmPath::kFp8Epilogue;
  At(d, kGateUp).grad = !swiglu_cast ? CastBy::kCastPass
                        : swiglu_bwd ? CastBy::kGemmEpilogue
                                     : CastBy::kSwiGlu;
  At(d, kDown).input = !swiglu_cast ? CastBy::kCastPass
                       : swiglu_gemm ? CastBy::kGemmEpilogue
                                     : CastBy::kSwiGlu;
  if (swiglu_bwd) At(d, kDown).dgrad = GemmPath::kFp8Epilogue;
  At(d, kDown).grad = norm_grad;
  out->measuring = m;
  out->delayed = d;

  // The fused RMSNorm casts (rmsnorm_fp8.h) run on any GPU; where the shape rules them out the
  // norm writes bf16 and a cast pass follows (past d_model 2048 fused forms measured no faster:
  // docs/performance.md).
  auto cast_pass_after = [&](bool fused, const char* norm) {
    if (o.fp8_norm_casts && !fused) {
      out->fallbacks.push_back(std::string(norm) +
                               " (fp8): a cast pass after it (the fused cast needs tokens and "
                               "d_model multiples of 64, d_model <= 2048)");
    }
  };
  cast_pass_after(k.fp8_norm_cast, "RMSNorm into the QKV and gate/up projections");
  cast_pass_after(k.fp8_norm_grad_cast,
                  "RMSNorm's backward into the output and down projections' gradients");
  if (!k.sm90) return;
  // What the options (fast accumulation included) asked for and the shapes leave out.
  if (o.rope_gemm && !o.qk_norm && fast_fwd && !rope_gemm) {
    out->fallbacks.push_back("QKV projection (fp8): cuBLASLt, then RoPE apart (" +
                             k.fp8_rope_gemm.message() + ")");
  }
  if (o.swiglu_gemm && fast_fwd && !swiglu_gemm) {
    out->fallbacks.push_back(
        "gate/up projection (fp8): cuBLASLt, then SwiGLU apart (" +
        (swiglu_cast ? k.fp8_swiglu_gemm.message()
                     : std::string("the fused SwiGLU cast needs tokens and ffn multiples of 64")) +
        ")");
  }
  if (o.swiglu_bwd_gemm && fast_dgrad && swiglu_cast && !swiglu_bwd) {
    out->fallbacks.push_back(
        "down projection's input gradient (fp8): cuBLASLt, then SwiGLU's backward apart (" +
        k.fp8_swiglu_bwd_gemm.message() + ")");
  }
}

// The LM head: BF16, or (precision.fp8.lm_head) its logits and dhf GEMMs in FP8 and dWte too
// where fp8_lm_head_wgrad asks and the byte transpose of dlogits8 takes the shapes (tiles of
// 64: vocabulary, width and the chunk's rows).
void ChooseLmHead(const LinearStrategyOptions& o, LinearStrategies* out) {
  if (!o.fp8 || !o.fp8_lm_head) return;  // BF16: the defaults
  const int64_t chunk = std::min(o.tokens, o.lm_head_chunk_rows);
  const int64_t tail = chunk > 0 ? o.tokens % chunk : 0;
  const bool wgrad = o.fp8_lm_head_wgrad && o.vocab % 64 == 0 && o.d_model % 64 == 0;
  auto wgrad_path = [&](int64_t rows) {
    return wgrad && rows % 64 == 0 ? GemmPath::kFp8CublasLt : GemmPath::kCublasLt;
  };
  for (LinearPlan* p : {&out->measuring, &out->delayed}) {
    p->lm_head = {GemmPath::kFp8CublasLt, GemmPath::kFp8CublasLt, wgrad_path(chunk),
                  CastBy::kCastPass, CastBy::kCastPass};
    p->lm_head_tail_wgrad = wgrad_path(tail == 0 ? chunk : tail);
  }
  out->delayed.lm_head.grad = CastBy::kCrossEntropy;
}

const char* GemmName(GemmPath g, LinearKind k, bool dgrad) {
  const bool epi = g == GemmPath::kEpilogue || g == GemmPath::kFp8Epilogue;
  const bool f8 = g == GemmPath::kFp8CublasLt || g == GemmPath::kFp8Epilogue;
  if (!epi) return f8 ? "fp8 cuBLASLt" : "cuBLASLt";
  if (dgrad) return f8 ? "fp8 ours+SwiGLU-backward" : "ours+SwiGLU-backward";
  if (k == kQkv) return f8 ? "fp8 ours+RoPE" : "ours+RoPE";
  return f8 ? "fp8 ours+SwiGLU" : "ours+SwiGLU";
}

const char* CastName(CastBy c) {
  switch (c) {
    case CastBy::kNone: return "none";
    case CastBy::kCastPass: return "pass";
    case CastBy::kNorm: return "norm";
    case CastBy::kSwiGlu: return "SwiGLU";
    case CastBy::kGemmEpilogue: return "GEMM epilogue";
    case CastBy::kRope: return "RoPE";
    case CastBy::kAttention: return "attention";
    case CastBy::kCrossEntropy: return "cross-entropy";
  }
  return "?";
}

std::string Describe(const char* name, const LinearStrategy& s, LinearKind k) {
  std::string r = std::string(name) + " fwd " + GemmName(s.forward, k, false) + ", dgrad " +
                  GemmName(s.dgrad, k, true) + ", wgrad " + GemmName(s.wgrad, k, false);
  if (s.input != CastBy::kNone || s.grad != CastBy::kNone) {
    r += std::string(" (casts: input ") + CastName(s.input) + ", grad " + CastName(s.grad) + ")";
  }
  return r;
}

}  // namespace

bool LinearStrategies::fp8_rope_table() const {
  const CastBy g = delayed[kQkv].grad;
  return delayed[kQkv].forward == GemmPath::kFp8Epilogue || g == CastBy::kRope ||
         g == CastBy::kAttention;
}

bool LinearStrategies::fp8_swiglu_gemm() const {
  return delayed[kGateUp].forward == GemmPath::kFp8Epilogue;
}

bool SwiGluGemmsAreFaster(int64_t d_model) { return d_model <= kSwiGluGemmMaxWidth; }

LinearStrategies ChooseLinearStrategies(const LinearStrategyOptions& o,
                                        const LinearKernelSupport& k) {
  LinearStrategies out;
  if (!o.cudnn_attention_backward && !k.flash_backward.ok()) {
    out.fallbacks.push_back("attention backward: cuDNN's instead of ours (" +
                            k.flash_backward.message() + ")");
  }
  if (o.fp8) {
    ChooseFp8(o, k, &out);
  } else {
    ChooseBf16(o, k, &out);
  }
  ChooseLmHead(o, &out);
  return out;
}

std::string DescribeLinearPlan(const LinearPlan& p) {
  std::string r = Describe("qkv", p[kQkv], kQkv) + "; " + Describe("out", p[kOut], kOut) + "; " +
                  Describe("gate/up", p[kGateUp], kGateUp) + "; " +
                  Describe("down", p[kDown], kDown) + "; " +
                  Describe("lm_head", p.lm_head, kOut);
  if (p.lm_head_tail_wgrad != p.lm_head.wgrad) {
    r += std::string(", last chunk's wgrad ") + GemmName(p.lm_head_tail_wgrad, kOut, false);
  }
  return r;
}

}  // namespace forge
