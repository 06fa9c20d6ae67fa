// ChooseLinearStrategies (worker/model/linear_strategy.h): the paths the CUDA model's linears
// take for the shipped configs' shapes, BF16 and FP8, on a Hopper GPU whose kernels accept the
// shapes, on one whose kernels refuse some, and on a GPU without our kernels; the fallbacks
// logged with their reasons; and the one-line description the backend logs.
#include "worker/model/linear_strategy.h"

#include <gtest/gtest.h>

#include <string>

#include "common/config.h"

namespace forge {
namespace {

constexpr LinearKind kQkv = LinearKind::kQkv, kOut = LinearKind::kOut,
                     kGateUp = LinearKind::kGateUp, kDown = LinearKind::kDown;
using G = GemmPath;
using C = CastBy;

RunConfig Load(const std::string& name) {
  StatusOr<RunConfig> c = LoadRunConfig(std::string(FORGE_SOURCE_DIR) + "/configs/" + name);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? c.value() : RunConfig{};
}

// What CudaModel derives from a run's config (CudaBackendOptionsFromConfig, CudaModelOptions).
LinearStrategyOptions OptionsOf(const RunConfig& c) {
  LinearStrategyOptions o;
  o.fp8 = c.precision.compute == Precision::kFp8;
  o.fast_accum = c.precision.fp8.fast_accum;
  o.fp8_lm_head = c.precision.fp8.lm_head;
  o.rope_gemm = o.swiglu_gemm = o.swiglu_bwd_gemm = c.engine.fused_epilogues;
  o.cudnn_attention_backward = c.engine.attention_backward == AttentionBackward::kCudnn;
  o.qk_norm = c.model.qk_norm;
  o.vocab = c.model.padded_vocab();
  o.d_model = c.model.d_model;
  o.tokens = int64_t{c.batch.micro_batch} * c.model.seq_len;
  o.lm_head_chunk_rows = c.engine.lm_head_chunk;
  return o;
}

RunConfig Fp8(RunConfig c) {
  c.precision.compute = Precision::kFp8;
  return c;
}

// An sm_90 GPU whose kernels take every shape.
LinearKernelSupport Hopper() {
  LinearKernelSupport k;
  k.sm90 = true;
  k.fp8_swiglu_cast = k.fp8_norm_cast = k.fp8_norm_grad_cast = k.fp8_rope_grad_cast = true;
  return k;
}

// The same GPU at head width 128 (llama3-8b): our GEMM's RoPE epilogue and our attention
// backward take head width 64 only.
LinearKernelSupport HopperHeadWidth128() {
  LinearKernelSupport k = Hopper();
  k.rope_gemm = k.fp8_rope_gemm = Status::Invalid("RoPE needs head width 64");
  k.flash_backward = Status::Invalid("FlashBackward: head width must be 64");
  return k;
}

// A GPU without our Hopper kernels (shapes accepted, nothing runs).
LinearKernelSupport NotHopper() {
  LinearKernelSupport k;
  k.flash_backward = Status::Precondition("FlashBackward: needs an sm_90 GPU");
  k.fp8_swiglu_cast = k.fp8_norm_cast = k.fp8_norm_grad_cast = k.fp8_rope_grad_cast = true;
  return k;
}

LinearStrategy S(G fwd, G dgrad, G wgrad, C input = C::kNone, C grad = C::kNone) {
  return {fwd, dgrad, wgrad, input, grad};
}

const LinearStrategy kBf16 = S(G::kCublasLt, G::kCublasLt, G::kCublasLt);
const LinearStrategy kFp8Pass =
    S(G::kFp8CublasLt, G::kFp8CublasLt, G::kFp8CublasLt, C::kCastPass, C::kCastPass);

TEST(LinearStrategy, Bf16OnHopperRunsTheThreeEpilogueGemms) {
  for (const char* name : {"gpt350m.yaml", "tiny.yaml"}) {
    SCOPED_TRACE(name);
    const LinearStrategies st = ChooseLinearStrategies(OptionsOf(Load(name)), Hopper());
    const LinearPlan& p = st.measuring;
    EXPECT_EQ(p[kQkv], S(G::kEpilogue, G::kCublasLt, G::kCublasLt));
    EXPECT_EQ(p[kOut], kBf16);
    EXPECT_EQ(p[kGateUp], S(G::kEpilogue, G::kCublasLt, G::kCublasLt));
    EXPECT_EQ(p[kDown], S(G::kCublasLt, G::kEpilogue, G::kCublasLt));
    EXPECT_EQ(p.lm_head, kBf16);
    EXPECT_EQ(p.lm_head_tail_wgrad, G::kCublasLt);
    EXPECT_EQ(st.delayed, st.measuring);
    EXPECT_TRUE(st.fallbacks.empty()) << st.fallbacks[0];
    EXPECT_FALSE(st.fp8_rope_table());
    EXPECT_FALSE(st.fp8_swiglu_gemm());
  }
}

// llama3-1b's d_model 2048: SwiGLU's forward and backward stay in our GEMMs, RoPE in the QKV
// GEMM, nothing falls back. At llama3-3b's 3072 both SwiGLU GEMMs give way (said so).
TEST(LinearStrategy, Bf16WiderModelsRunSwiGluApartWhereCublasLtIsFaster) {
  const LinearStrategies st = ChooseLinearStrategies(OptionsOf(Load("llama3-1b.yaml")), Hopper());
  const LinearPlan& p = st.measuring;
  EXPECT_EQ(p[kQkv], S(G::kEpilogue, G::kCublasLt, G::kCublasLt));
  EXPECT_EQ(p[kGateUp], S(G::kEpilogue, G::kCublasLt, G::kCublasLt));
  EXPECT_EQ(p[kDown], S(G::kCublasLt, G::kEpilogue, G::kCublasLt));
  EXPECT_TRUE(st.fallbacks.empty()) << st.fallbacks[0];

  const LinearStrategies three =
      ChooseLinearStrategies(OptionsOf(Load("llama3-3b.yaml")), Hopper());
  EXPECT_EQ(three.measuring[kGateUp], kBf16);
  EXPECT_EQ(three.measuring[kDown], kBf16);
  ASSERT_EQ(three.fallbacks.size(), 2u);
  EXPECT_EQ(three.fallbacks[0],
            "gate/up projection: cuBLASLt, then SwiGLU apart (d_model 3072 > 2048: cuBLASLt and "
            "the separate pass are faster)");
}

TEST(LinearStrategy, Bf16WithoutOurKernelsIsCublasLtAndReportsOnlyAttention) {
  const LinearStrategies st = ChooseLinearStrategies(OptionsOf(Load("gpt350m.yaml")), NotHopper());
  for (const LinearStrategy& s : st.measuring.blocks) EXPECT_EQ(s, kBf16);
  ASSERT_EQ(st.fallbacks.size(), 1u);
  EXPECT_EQ(st.fallbacks[0],
            "attention backward: cuDNN's instead of ours (FlashBackward: needs an sm_90 GPU)");
}

TEST(LinearStrategy, HeadWidth128FallsBackWithTheKernelsReasons) {
  const RunConfig c = Load("llama3-8b.yaml");
  ASSERT_EQ(c.model.head_dim(), 128);
  const LinearStrategies st = ChooseLinearStrategies(OptionsOf(c), HopperHeadWidth128());
  EXPECT_EQ(st.measuring[kQkv], kBf16);
  EXPECT_EQ(st.measuring[kGateUp], kBf16);  // d_model 4096: SwiGLU apart (above)
  ASSERT_EQ(st.fallbacks.size(), 4u);
  EXPECT_EQ(st.fallbacks[0],
            "attention backward: cuDNN's instead of ours (FlashBackward: head width must be 64)");
  EXPECT_EQ(st.fallbacks[1], "QKV projection: cuBLASLt, then RoPE apart (RoPE needs head width 64)");

  // FP8: the same fallback; RoPE's backward writes the QKV gradient's casts (not the attention
  // backward, which is cuDNN's).
  const LinearStrategies f8 = ChooseLinearStrategies(OptionsOf(Fp8(c)), HopperHeadWidth128());
  EXPECT_EQ(f8.delayed[kQkv].forward, G::kFp8CublasLt);
  EXPECT_EQ(f8.delayed[kQkv].grad, C::kRope);
  EXPECT_TRUE(f8.fp8_rope_table());
  ASSERT_EQ(f8.fallbacks.size(), 2u);
  EXPECT_EQ(f8.fallbacks[1],
            "QKV projection (fp8): cuBLASLt, then RoPE apart (RoPE needs head width 64)");
}

// Where the fused RMSNorm casts refuse the shape (d_model past 2048: llama3-3b and llama3-8b),
// the norms write bf16 and a cast pass follows, and the log says so.
TEST(LinearStrategy, Fp8NormsTheFusedCastRefusesTakeACastPassAndSaySo) {
  LinearKernelSupport k = Hopper();
  k.fp8_norm_cast = k.fp8_norm_grad_cast = false;
  const LinearStrategies st = ChooseLinearStrategies(OptionsOf(Fp8(Load("llama3-8b.yaml"))), k);
  EXPECT_EQ(st.delayed[kQkv].input, C::kCastPass);
  EXPECT_EQ(st.delayed[kGateUp].input, C::kCastPass);
  EXPECT_EQ(st.delayed[kOut].grad, C::kCastPass);
  EXPECT_EQ(st.delayed[kDown].grad, C::kCastPass);
  ASSERT_EQ(st.fallbacks.size(), 2u);
  EXPECT_EQ(st.fallbacks[0],
            "RMSNorm into the QKV and gate/up projections (fp8): a cast pass after it (the fused "
            "cast needs tokens and d_model multiples of 64, d_model <= 2048)");
  EXPECT_EQ(st.fallbacks[1],
            "RMSNorm's backward into the output and down projections' gradients (fp8): a cast "
            "pass after it (the fused cast needs tokens and d_model multiples of 64, d_model <= "
            "2048)");
}

TEST(LinearStrategy, QkNormKeepsRopeApart) {
  RunConfig c = Load("tiny.yaml");
  c.model.qk_norm = true;
  const LinearStrategies st = ChooseLinearStrategies(OptionsOf(c), Hopper());
  EXPECT_EQ(st.measuring[kQkv], kBf16);
  ASSERT_EQ(st.fallbacks.size(), 1u);
  EXPECT_EQ(st.fallbacks[0], "QKV projection: cuBLASLt, then RoPE apart (QK-norm runs between them)");

  const LinearStrategies f8 = ChooseLinearStrategies(OptionsOf(Fp8(c)), Hopper());
  EXPECT_EQ(f8.delayed[kQkv], S(G::kFp8CublasLt, G::kFp8CublasLt, G::kFp8CublasLt, C::kNorm,
                                C::kCastPass));
  EXPECT_FALSE(f8.fp8_rope_table());
  EXPECT_TRUE(f8.fallbacks.empty());  // QK-norm is the model's, not a shape's refusal
}

TEST(LinearStrategy, Fp8DefaultFusesEveryCastOnDelayedSteps) {
  for (const char* name : {"gpt350m.yaml", "llama3-1b.yaml"}) {
    SCOPED_TRACE(name);
    const RunConfig c = Fp8(Load(name));
    ASSERT_EQ(c.precision.fp8.fast_accum, Fp8FastAccum::kFpropDgrad);
    const LinearStrategies st = ChooseLinearStrategies(OptionsOf(c), Hopper());
    // The first step measures: a cast pass before every FP8 GEMM; the QKV GEMM with RoPE casts
    // nothing, so it runs from the first step.
    const LinearPlan& m = st.measuring;
    EXPECT_EQ(m[kQkv], S(G::kFp8Epilogue, G::kFp8CublasLt, G::kFp8CublasLt, C::kCastPass,
                         C::kCastPass));
    EXPECT_EQ(m[kOut], kFp8Pass);
    EXPECT_EQ(m[kGateUp], kFp8Pass);
    EXPECT_EQ(m[kDown], kFp8Pass);
    EXPECT_EQ(m.lm_head, kBf16);  // precision.fp8.lm_head is off in these configs
    const LinearPlan& d = st.delayed;
    EXPECT_EQ(d[kQkv], S(G::kFp8Epilogue, G::kFp8CublasLt, G::kFp8CublasLt, C::kNorm,
                         C::kAttention));
    EXPECT_EQ(d[kOut], S(G::kFp8CublasLt, G::kFp8CublasLt, G::kFp8CublasLt, C::kCastPass,
                         C::kNorm));
    EXPECT_EQ(d[kGateUp], S(G::kFp8Epilogue, G::kFp8CublasLt, G::kFp8CublasLt, C::kNorm,
                            C::kGemmEpilogue));
    EXPECT_EQ(d[kDown], S(G::kFp8CublasLt, G::kFp8Epilogue, G::kFp8CublasLt, C::kGemmEpilogue,
                          C::kNorm));
    EXPECT_EQ(d.lm_head, kBf16);
    EXPECT_TRUE(st.fp8_rope_table());
    EXPECT_TRUE(st.fp8_swiglu_gemm());
    EXPECT_TRUE(st.fallbacks.empty());
  }
}

// Our GEMMs sum as fast accumulation does: each takes a GEMM only where precision.fp8.
// fast_accum skips the promotion there. What the option leaves out is not a fallback.
TEST(LinearStrategy, Fp8FastAccumDecidesOurGemms) {
  RunConfig c = Fp8(Load("gpt350m.yaml"));
  c.precision.fp8.fast_accum = Fp8FastAccum::kFprop;
  LinearStrategies st = ChooseLinearStrategies(OptionsOf(c), Hopper());
  EXPECT_EQ(st.delayed[kGateUp].forward, G::kFp8Epilogue);
  EXPECT_EQ(st.delayed[kGateUp].grad, C::kSwiGlu);
  EXPECT_EQ(st.delayed[kDown].dgrad, G::kFp8CublasLt);
  EXPECT_TRUE(st.fallbacks.empty());

  c.precision.fp8.fast_accum = Fp8FastAccum::kNone;
  st = ChooseLinearStrategies(OptionsOf(c), Hopper());
  EXPECT_EQ(st.measuring[kQkv], kFp8Pass);
  EXPECT_EQ(st.delayed[kQkv].forward, G::kFp8CublasLt);
  EXPECT_EQ(st.delayed[kGateUp].forward, G::kFp8CublasLt);
  EXPECT_EQ(st.delayed[kDown].input, C::kSwiGlu);
  EXPECT_EQ(st.delayed[kDown].dgrad, G::kFp8CublasLt);
  EXPECT_TRUE(st.fp8_rope_table());  // RoPE's backward still writes the QKV gradient's casts
  EXPECT_FALSE(st.fp8_swiglu_gemm());
  EXPECT_TRUE(st.fallbacks.empty());
}

TEST(LinearStrategy, Fp8ShapesOurKernelsRefuse) {
  const RunConfig c = Fp8(Load("tiny.yaml"));
  LinearKernelSupport k = Hopper();
  k.fp8_swiglu_bwd_gemm = Status::Invalid("K and ffn of 128");
  k.fp8_norm_grad_cast = false;
  LinearStrategies st = ChooseLinearStrategies(OptionsOf(c), k);
  EXPECT_EQ(st.delayed[kDown], S(G::kFp8CublasLt, G::kFp8CublasLt, G::kFp8CublasLt,
                                 C::kGemmEpilogue, C::kCastPass));
  EXPECT_EQ(st.delayed[kOut].grad, C::kCastPass);
  EXPECT_EQ(st.delayed[kGateUp].grad, C::kSwiGlu);
  ASSERT_EQ(st.fallbacks.size(), 2u);
  EXPECT_NE(st.fallbacks[0].find("RMSNorm's backward"), std::string::npos) << st.fallbacks[0];
  EXPECT_EQ(st.fallbacks[1],
            "down projection's input gradient (fp8): cuBLASLt, then SwiGLU's backward apart (K "
            "and ffn of 128)");

  // Without the fused SwiGLU casts neither SwiGLU GEMM runs, and SwiGLU writes bf16.
  k = Hopper();
  k.fp8_swiglu_cast = false;
  st = ChooseLinearStrategies(OptionsOf(c), k);
  EXPECT_EQ(st.delayed[kGateUp], S(G::kFp8CublasLt, G::kFp8CublasLt, G::kFp8CublasLt, C::kNorm,
                                   C::kCastPass));
  EXPECT_EQ(st.delayed[kDown].input, C::kCastPass);
  EXPECT_EQ(st.delayed[kDown].dgrad, G::kFp8CublasLt);
  ASSERT_EQ(st.fallbacks.size(), 1u);
  EXPECT_NE(st.fallbacks[0].find("gate/up projection (fp8)"), std::string::npos);
}

TEST(LinearStrategy, Fp8WithoutOurKernelsFusesOnlyTheCasts) {
  const LinearStrategies st =
      ChooseLinearStrategies(OptionsOf(Fp8(Load("gpt350m.yaml"))), NotHopper());
  EXPECT_EQ(st.measuring[kQkv], kFp8Pass);
  EXPECT_EQ(st.delayed[kQkv], S(G::kFp8CublasLt, G::kFp8CublasLt, G::kFp8CublasLt, C::kNorm,
                                C::kRope));
  EXPECT_EQ(st.delayed[kGateUp].forward, G::kFp8CublasLt);
  EXPECT_EQ(st.delayed[kDown].input, C::kSwiGlu);
  EXPECT_EQ(st.delayed[kDown].dgrad, G::kFp8CublasLt);
  EXPECT_EQ(st.fallbacks.size(), 1u);  // the attention backward only
}

TEST(LinearStrategy, FusedEpiloguesOffAndAttentionRopeOff) {
  RunConfig c = Fp8(Load("gpt350m.yaml"));
  c.engine.fused_epilogues = false;
  LinearStrategyOptions o = OptionsOf(c);
  o.fp8_attention_rope = false;
  const LinearStrategies st = ChooseLinearStrategies(o, Hopper());
  for (const LinearStrategy& s : st.delayed.blocks) {
    EXPECT_EQ(s.forward, G::kFp8CublasLt);
    EXPECT_EQ(s.dgrad, G::kFp8CublasLt);
  }
  EXPECT_EQ(st.delayed[kQkv].grad, C::kRope);
  EXPECT_FALSE(st.fp8_swiglu_gemm());
  EXPECT_TRUE(st.fallbacks.empty());

  c.precision.compute = Precision::kBf16;
  const LinearStrategies bf = ChooseLinearStrategies(OptionsOf(c), Hopper());
  for (const LinearStrategy& s : bf.measuring.blocks) EXPECT_EQ(s, kBf16);
  EXPECT_TRUE(bf.fallbacks.empty());
}

// precision.fp8.lm_head: logits and dhf in FP8; dWte too where the dlogits8 transpose takes
// the shapes (vocabulary, width and a chunk's rows multiples of 64), chunk by chunk.
TEST(LinearStrategy, Fp8LmHeadByChunk) {
  RunConfig c = Fp8(Load("llama3-1b.yaml"));
  c.precision.fp8.lm_head = true;
  LinearStrategyOptions o = OptionsOf(c);
  ASSERT_EQ(o.vocab % 64, 0);
  LinearStrategies st = ChooseLinearStrategies(o, Hopper());
  EXPECT_EQ(st.measuring.lm_head, kFp8Pass);
  EXPECT_EQ(st.delayed.lm_head, S(G::kFp8CublasLt, G::kFp8CublasLt, G::kFp8CublasLt,
                                  C::kCastPass, C::kCrossEntropy));
  EXPECT_EQ(st.delayed.lm_head_tail_wgrad, G::kFp8CublasLt);

  // 5000 rows in chunks of 4096: the last chunk's 904 rows keep dWte in BF16.
  o.tokens = 5000;
  o.lm_head_chunk_rows = 4096;
  st = ChooseLinearStrategies(o, Hopper());
  EXPECT_EQ(st.delayed.lm_head.wgrad, G::kFp8CublasLt);
  EXPECT_EQ(st.delayed.lm_head_tail_wgrad, G::kCublasLt);
  // Fewer rows than a chunk: one chunk of all of them.
  o.tokens = 1000;
  st = ChooseLinearStrategies(o, Hopper());
  EXPECT_EQ(st.delayed.lm_head.wgrad, G::kCublasLt);
  EXPECT_EQ(st.delayed.lm_head_tail_wgrad, G::kCublasLt);

  o.tokens = 8192;
  o.fp8_lm_head_wgrad = false;
  st = ChooseLinearStrategies(o, Hopper());
  EXPECT_EQ(st.delayed.lm_head.forward, G::kFp8CublasLt);
  EXPECT_EQ(st.delayed.lm_head.wgrad, G::kCublasLt);
  o.fp8_lm_head_wgrad = true;
  o.vocab = 50257 + 15;  // not a multiple of 64
  st = ChooseLinearStrategies(o, Hopper());
  EXPECT_EQ(st.delayed.lm_head.wgrad, G::kCublasLt);
}

TEST(LinearStrategy, DescribesEveryLinearOnOneLine) {
  const LinearStrategies bf = ChooseLinearStrategies(OptionsOf(Load("gpt350m.yaml")), Hopper());
  EXPECT_EQ(DescribeLinearPlan(bf.measuring),
            "qkv fwd ours+RoPE, dgrad cuBLASLt, wgrad cuBLASLt; out fwd cuBLASLt, dgrad "
            "cuBLASLt, wgrad cuBLASLt; gate/up fwd ours+SwiGLU, dgrad cuBLASLt, wgrad cuBLASLt; "
            "down fwd cuBLASLt, dgrad ours+SwiGLU-backward, wgrad cuBLASLt; lm_head fwd "
            "cuBLASLt, dgrad cuBLASLt, wgrad cuBLASLt");
  const LinearStrategies f8 =
      ChooseLinearStrategies(OptionsOf(Fp8(Load("gpt350m.yaml"))), Hopper());
  const std::string d = DescribeLinearPlan(f8.delayed);
  EXPECT_NE(d.find("qkv fwd fp8 ours+RoPE, dgrad fp8 cuBLASLt, wgrad fp8 cuBLASLt (casts: "
                   "input norm, grad attention)"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("down fwd fp8 cuBLASLt, dgrad fp8 ours+SwiGLU-backward, wgrad fp8 cuBLASLt "
                   "(casts: input GEMM epilogue, grad norm)"),
            std::string::npos)
      << d;
}

}  // namespace
}  // namespace forge
