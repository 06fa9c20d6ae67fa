// precision.compute fp8 on the CUDA backend (worker/model/fp8_linears.h) against the float32
// CPU reference on the tiny model (tiny_gpu_config.h: every linear width and B*T are multiples
// of 16), plus the guarantees BF16 has (bitwise determinism, graph == eager, recompute ==
// saved) and the overflow rule shared by every precision: a step with non-finite gradients
// changes nothing and is counted.
//
// Tolerances (E4M3 forward operands carry 3 mantissa bits, E5M2 gradients 2, so each product
// term is off by up to ~6% / ~12%; the GEMMs' sums average much of it out): loss within 2%;
// each weight gradient within 0.15 relative Frobenius error of the CPU's (H100: 0.02-0.12,
// on the device; BF16's tolerance is 0.05); training losses within 5% at each of 50 steps.
// The same bounds hold with the LM head's logits and dhf GEMMs in FP8 too (precision.fp8.lm_head).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../common/skipped_step_check.h"
#include "gpu_test_util.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "model_test_util.h"
#include "tiny_gpu_config.h"
#include "worker/model/cuda_model.h"
#include "worker/model/fp8_linears.h"

namespace forge {
namespace {

using test::MakeBatches;
using test::MakeGpu;
using test::Views;

RunConfig Fp8Config(Fp8Recipe recipe = Fp8Recipe::kDelayed, bool lm_head = false,
                    Fp8FastAccum fast_accum = Fp8FastAccum::kNone) {
  RunConfig c = test::TinyGpuConfig("gpu-fp8-test");
  c.precision.compute = Precision::kFp8;
  c.precision.fp8.recipe = recipe;
  c.precision.fp8.amax_history = 4;
  c.precision.fp8.lm_head = lm_head;
  c.precision.fp8.fast_accum = fast_accum;
  return c;
}

struct Fp8Case {
  Fp8Recipe recipe;
  bool lm_head;
  Fp8FastAccum fast_accum = Fp8FastAccum::kNone;
};

class GpuFp8Model : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(GpuFp8Model, GradientsMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  // Chunked LM head (4 chunks of 64 rows): every chunk's hf cast feeds one amax.
  CudaBackendOptions o;
  o.lm_head_chunk_rows = 64;
  test::ExpectGradientsMatchCpu(
      Fp8Config(GetParam().recipe, GetParam().lm_head, GetParam().fast_accum), 2, o,
      /*loss_tol=*/2e-2, /*grad_tol=*/0.15);
}

TEST_P(GpuFp8Model, TrainingTracksCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const RunConfig c = Fp8Config(GetParam().recipe, GetParam().lm_head, GetParam().fast_accum);
  auto [cpu, gpu] = test::MakeCpuAndGpu(c);
  ASSERT_NE(gpu, nullptr);
  constexpr int kSteps = 50;
  const auto batches = MakeBatches(c, kSteps, 21);
  float first = 0.0f, last5 = 0.0f, worst = 0.0f;
  for (int step = 1; step <= kSteps; ++step) {
    const StepHyper hyper{c.optimizer.lr, step};
    StepStats s_cpu, s_gpu;
    ASSERT_STATUS_OK(cpu->TrainStep(Views(batches, step - 1, 1), hyper, true, &s_cpu));
    ASSERT_STATUS_OK(gpu->TrainStep(Views(batches, step - 1, 1), hyper, true, &s_gpu));
    ASSERT_TRUE(std::isfinite(s_gpu.loss)) << "step " << step;
    EXPECT_EQ(s_gpu.skipped_steps, 0) << "step " << step;
    const float rel = std::fabs(s_gpu.loss - s_cpu.loss) / std::fabs(s_cpu.loss);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 5e-2) << "step " << step << ": fp8 " << s_gpu.loss << " vs cpu " << s_cpu.loss;
    if (step == 1) first = s_gpu.loss;
    if (step > kSteps - 5) last5 += s_gpu.loss / 5.0f;
  }
  std::printf("  worst relative loss difference over %d steps: %.3e\n", kSteps, worst);
  EXPECT_LT(last5, first - 1.0f) << "the FP8 backend did not learn";
  EXPECT_TRUE(gpu->graph_active()) << "steps after the first should replay a CUDA graph";
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuFp8Model,
                         ::testing::Values(Fp8Case{Fp8Recipe::kDelayed, false},
                                           Fp8Case{Fp8Recipe::kCurrent, false},
                                           Fp8Case{Fp8Recipe::kDelayed, true},
                                           Fp8Case{Fp8Recipe::kCurrent, true},
                                           Fp8Case{Fp8Recipe::kDelayed, true, Fp8FastAccum::kFprop},
                                           Fp8Case{Fp8Recipe::kDelayed, false,
                                                   Fp8FastAccum::kFpropDgrad}),
                         [](const auto& info) {
                           return std::string(Fp8RecipeName(info.param.recipe)) +
                                  (info.param.lm_head ? "_lm_head" : "") +
                                  (info.param.fast_accum == Fp8FastAccum::kNone
                                       ? ""
                                       : std::string("_fast_") +
                                             Fp8FastAccumName(info.param.fast_accum));
                         });

// Ten steps of the same backend kind from the same seed: final weights of two runs, bitwise.
std::vector<UnitBuffers> TenSteps(const RunConfig& c, CudaBackendOptions o, bool* graph) {
  const auto batches = MakeBatches(c, 20, 31);
  auto gpu = MakeGpu(c, o);
  if (gpu == nullptr) return {};
  UnitBuffers p;
  for (int step = 1; step <= 10; ++step) {
    const int micro = step % 3 == 0 ? 2 : 1;  // micro-steps change: amax over micro-batches
    const Status st =
        gpu->TrainStep(Views(batches, step - 1, micro), {c.optimizer.lr, step}, false, nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  EXPECT_TRUE(gpu->GetParams(&p).ok());
  if (graph) *graph = gpu->graph_active();
  return {p};
}

void ExpectSameWeights(const std::vector<UnitBuffers>& a, const std::vector<UnitBuffers>& b) {
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  ASSERT_EQ(a[0].size(), b[0].size());
  for (size_t u = 0; u < a[0].size(); ++u)
    EXPECT_TRUE(test::BitwiseEqual(a[0][u], b[0][u])) << "weights of unit " << u;
}

TEST(GpuFp8Step, SameSeedIsBitwiseDeterministic) {
  FORGE_SKIP_WITHOUT_GPU();
  for (const bool lm_head : {false, true}) {
    SCOPED_TRACE(lm_head ? "fp8 lm head" : "bf16 lm head");
    RunConfig c = Fp8Config(Fp8Recipe::kDelayed, lm_head);
    c.batch.global_batch = 8;
    ExpectSameWeights(TenSteps(c, {}, nullptr), TenSteps(c, {}, nullptr));
  }
}

// The first step measures every tensor (no history yet) and later ones use the delayed scales:
// the graph captured at the second step must compute what eager launches do.
TEST(GpuFp8Step, GraphReplayMatchesEager) {
  FORGE_SKIP_WITHOUT_GPU();
  for (const bool lm_head : {false, true}) {
    SCOPED_TRACE(lm_head ? "fp8 lm head" : "bf16 lm head");
    RunConfig c = Fp8Config(Fp8Recipe::kDelayed, lm_head);
    c.batch.global_batch = 8;
    CudaBackendOptions on, off;
    on.use_graph = true;
    off.use_graph = false;
    on.lm_head_chunk_rows = off.lm_head_chunk_rows = 128;  // two chunks a micro-batch
    bool graph = false;
    const auto replayed = TenSteps(c, on, &graph);
    EXPECT_TRUE(graph);
    ExpectSameWeights(replayed, TenSteps(c, off, nullptr));
  }
}

// The default recipe (delayed scaling, fast accumulation in the forward) with the FP8 LM head,
// two micro-batches a step every third step (TenSteps).
RunConfig Fp8LmHeadSteps() {
  RunConfig c = Fp8Config(Fp8Recipe::kDelayed, true, Fp8FastAccum::kFprop);
  c.batch.global_batch = 8;
  return c;
}

// The wgrad stream (the dW GEMMs off the chain, the FP8 dWte included) changes no bit of an
// FP8 + FP8 LM head step: ten steps against single-stream steps, two LM-head chunks a
// micro-batch (vocab 512: the FP8 dWte path).
TEST(GpuFp8Step, WgradStreamChangesNoBit) {
  FORGE_SKIP_WITHOUT_GPU();
  RunConfig c = Fp8LmHeadSteps();
  c.model.vocab = 512;
  CudaBackendOptions dual, single;
  dual.lm_head_chunk_rows = single.lm_head_chunk_rows = 128;
  single.wgrad_stream = false;
  ExpectSameWeights(TenSteps(c, dual, nullptr), TenSteps(c, single, nullptr));
}

// The FP8 model of config c (nothing run) with options `mo` (its micro-batch and FP8 fields
// set from c): what it chose to run.
std::unique_ptr<CudaModel> Fp8ModelWith(const RunConfig& c, CudaModelOptions mo = {}) {
  mo.micro_batch = c.batch.micro_batch;
  mo.fp8 = true;
  mo.fp8_config = c.precision.fp8;
  auto model = CudaModel::Create(c.model, c.optimizer, mo);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? std::move(model).value() : nullptr;
}

// The same with precision.fp8.fast_accum `fast`.
std::unique_ptr<CudaModel> Fp8ModelWith(RunConfig c, Fp8FastAccum fast) {
  c.precision.fp8.fast_accum = fast;
  return Fp8ModelWith(c);
}

// Where our attention backward runs (head width 64, T 128, an sm_90 GPU), a delayed-scaling
// step has it write the QKV projection's E5M2 gradient casts with RoPE's inverse
// (CudaModelOptions::fp8_attention_rope) instead of a bf16 dqkv and RopeBackwardFp8: the same
// weights after ten steps, bit for bit, replayed from the graph and eager.
TEST(GpuFp8Step, RopeInTheAttentionBackwardChangesNoBit) {
  FORGE_SKIP_WITHOUT_GPU();
  RunConfig c = Fp8LmHeadSteps();
  c.model.d_model = 256;
  c.model.seq_len = 128;
  for (const bool on : {true, false}) {
    CudaModelOptions mo;
    mo.fp8_attention_rope = on;
    const auto model = Fp8ModelWith(c, mo);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->linear_strategies().delayed[LinearKind::kQkv].grad == CastBy::kAttention,
              on && cuda::WgmmaGemmRunsHere());
  }
  if (!cuda::WgmmaGemmRunsHere()) GTEST_SKIP() << "our attention backward needs an sm_90 GPU";
  CudaBackendOptions off, eager;
  off.fp8_attention_rope = false;
  eager.use_graph = false;
  bool graph = false;
  const std::vector<UnitBuffers> fused = TenSteps(c, {}, &graph);
  EXPECT_TRUE(graph);
  ExpectSameWeights(fused, TenSteps(c, off, nullptr));
  ExpectSameWeights(fused, TenSteps(c, eager, nullptr));
}

// Ten steps of c with options `fused` and `separate` from the same init and batches: every
// loss finite and within 1% of the other path's.
void ExpectLossesTrackWithinOnePercent(const RunConfig& c, const CudaBackendOptions& fused,
                                       const CudaBackendOptions& separate, uint64_t seed) {
  auto a = MakeGpu(c, fused), b = MakeGpu(c, separate);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const auto batches = MakeBatches(c, 10, seed);
  for (int step = 1; step <= 10; ++step) {
    StepStats sa, sb;
    ASSERT_STATUS_OK(a->TrainStep(Views(batches, step - 1, 1), {c.optimizer.lr, step}, true, &sa));
    ASSERT_STATUS_OK(b->TrainStep(Views(batches, step - 1, 1), {c.optimizer.lr, step}, true, &sb));
    ASSERT_TRUE(std::isfinite(sa.loss)) << "step " << step;
    EXPECT_LT(std::fabs(sa.loss - sb.loss), 1e-2 * std::fabs(sb.loss))
        << "step " << step << ": fused " << sa.loss << " vs separate " << sb.loss;
  }
}

// A delayed-scaling step's RMSNorms write the FP8 copies of their outputs (the QKV and gate/up
// projections' inputs) and of the residual gradient (the output and down projections' output
// gradients) themselves; with CudaModelOptions::fp8_norm_casts off a cast pass follows each
// norm instead. Ten steps give the same weights bit for bit.
TEST(GpuFp8Step, NormCastsChangeNoBit) {
  FORGE_SKIP_WITHOUT_GPU();
  const RunConfig c = Fp8Config();
  for (const bool on : {true, false}) {
    CudaModelOptions mo;
    mo.fp8_norm_casts = on;
    const auto model = Fp8ModelWith(c, mo);
    ASSERT_NE(model, nullptr);
    const LinearPlan& p = model->linear_strategies().delayed;
    const CastBy want = on ? CastBy::kNorm : CastBy::kCastPass;
    EXPECT_EQ(p[LinearKind::kQkv].input, want);
    EXPECT_EQ(p[LinearKind::kGateUp].input, want);
    EXPECT_EQ(p[LinearKind::kOut].grad, want);
    EXPECT_EQ(p[LinearKind::kDown].grad, want);
  }
  CudaBackendOptions off;
  off.fp8_norm_casts = false;
  ExpectSameWeights(TenSteps(c, {}, nullptr), TenSteps(c, off, nullptr));
}

// precision.fp8.fast_accum fprop on an sm_90 GPU, d 256 (4 heads of 64): the QKV projection
// runs our GEMM in FP8 with RoPE in its epilogue (GemmPath::kFp8Epilogue, every step) and
// the gate/up projection with SwiGLU and the down projection's input casts in its epilogue
// (from the second step: the first measures). Gradients against the CPU
// reference as every FP8 path; deterministic and captured in the graph like every other path;
// the GEMMs sum in another order than cuBLASLt's, so training tracks the separate path
// (rope_gemm and swiglu_gemm off) closely rather than bitwise.
TEST(GpuFp8Step, EpilogueGemmsTrainLikeTheSeparatePath) {
  FORGE_SKIP_WITHOUT_GPU();
  RunConfig c = Fp8Config(Fp8Recipe::kDelayed, false, Fp8FastAccum::kFprop);
  c.model.d_model = 256;
  for (const Fp8FastAccum fast : {Fp8FastAccum::kFprop, Fp8FastAccum::kNone}) {
    const auto model = Fp8ModelWith(c, fast);
    ASSERT_NE(model, nullptr);
    const bool on = fast != Fp8FastAccum::kNone && cuda::WgmmaGemmRunsHere();
    const GemmPath ours = on ? GemmPath::kFp8Epilogue : GemmPath::kFp8CublasLt;
    const LinearStrategies& st = model->linear_strategies();
    EXPECT_EQ(st.measuring[LinearKind::kQkv].forward, ours);
    EXPECT_EQ(st.delayed[LinearKind::kQkv].forward, ours);
    EXPECT_EQ(st.measuring[LinearKind::kGateUp].forward, GemmPath::kFp8CublasLt);
    EXPECT_EQ(st.delayed[LinearKind::kGateUp].forward, ours);
  }
  if (!cuda::WgmmaGemmRunsHere()) GTEST_SKIP() << "the FP8 epilogue GEMMs need an sm_90 GPU";
  test::ExpectGradientsMatchCpu(c, 2, {}, /*loss_tol=*/2e-2, /*grad_tol=*/0.15);

  CudaBackendOptions eager;
  eager.use_graph = false;
  bool graph = false;
  const std::vector<UnitBuffers> fused = TenSteps(c, {}, &graph);
  EXPECT_TRUE(graph);
  ExpectSameWeights(fused, TenSteps(c, {}, nullptr));
  ExpectSameWeights(fused, TenSteps(c, eager, nullptr));

  CudaBackendOptions separate;
  separate.rope_gemm = separate.swiglu_gemm = false;
  ExpectLossesTrackWithinOnePercent(c, {}, separate, 43);
}

// precision.fp8.fast_accum fprop_dgrad on an sm_90 GPU, d 256: the down projection's input
// gradient and SwiGLU's backward run as one FP8 kernel (Fp8Linears::SwiGluBackwardGemm, from
// the second step). Gradients against the CPU; graph and eager give the same bits; ten steps
// track the separate path (swiglu_bwd_gemm off; cuBLASLt's fast-accumulation GEMM may sum as
// our MMAs do, or not).
TEST(GpuFp8Step, SwiGluBackwardGemmTrainsLikeTheSeparatePath) {
  FORGE_SKIP_WITHOUT_GPU();
  RunConfig c = Fp8Config(Fp8Recipe::kDelayed, false, Fp8FastAccum::kFpropDgrad);
  c.model.d_model = 256;
  for (const Fp8FastAccum fast : {Fp8FastAccum::kFpropDgrad, Fp8FastAccum::kFprop}) {
    const auto model = Fp8ModelWith(c, fast);
    ASSERT_NE(model, nullptr);
    const LinearStrategies& st = model->linear_strategies();
    EXPECT_EQ(st.delayed[LinearKind::kDown].dgrad,
              fast == Fp8FastAccum::kFpropDgrad && cuda::WgmmaGemmRunsHere()
                  ? GemmPath::kFp8Epilogue
                  : GemmPath::kFp8CublasLt);
    // the first step measures
    EXPECT_EQ(st.measuring[LinearKind::kDown].dgrad, GemmPath::kFp8CublasLt);
  }
  if (!cuda::WgmmaGemmRunsHere()) GTEST_SKIP() << "the fused kernel needs an sm_90 GPU";
  test::ExpectGradientsMatchCpu(c, 2, {}, /*loss_tol=*/2e-2, /*grad_tol=*/0.15);
  CudaBackendOptions eager, separate;
  eager.use_graph = false;
  separate.swiglu_bwd_gemm = false;
  ExpectSameWeights(TenSteps(c, {}, nullptr), TenSteps(c, eager, nullptr));
  ExpectLossesTrackWithinOnePercent(c, {}, separate, 53);
}

// precision.fp8.lm_head computes dWte in FP8 as well (dlogits8 transposed into the chunk's
// logits buffer, hf8t per logits slot) on chunks of a multiple of 64 rows, in BF16 on the bf16
// dlogits otherwise: chunks of 64 (all FP8), 96 (96 + 96 FP8-less, then 64 in FP8: both kinds
// adding into one gradient) and the option off, each against the CPU's gradients.
TEST(GpuFp8Step, LmHeadWeightGradientInFp8MatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const RunConfig c = Fp8Config(Fp8Recipe::kDelayed, /*lm_head=*/true);
  for (const auto [chunk, fp8_wgrad] : {std::pair{64, true}, {96, true}, {64, false}}) {
    SCOPED_TRACE("chunk rows " + std::to_string(chunk) + (fp8_wgrad ? "" : ", BF16 dWte"));
    CudaBackendOptions o;
    o.lm_head_chunk_rows = chunk;
    o.fp8_lm_head_wgrad = fp8_wgrad;
    test::ExpectGradientsMatchCpu(c, 2, o, /*loss_tol=*/2e-2, /*grad_tol=*/0.15);
  }
}

// The Llama knobs in FP8: an attention width other than d_model (GQA 2:1, heads of 64), an
// untied LM head (its GEMMs in FP8 too), Llama 3.1's RoPE scaling, and QK-norm (which keeps
// RoPE out of the FP8 GEMM epilogue and casts), against the CPU's gradients and trajectory.
TEST(GpuFp8Step, LlamaKnobsMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  for (const bool qk_norm : {false, true}) {
    SCOPED_TRACE(qk_norm ? "qk_norm" : "no qk_norm");
    RunConfig c = Fp8Config(Fp8Recipe::kDelayed, /*lm_head=*/true, Fp8FastAccum::kFpropDgrad);
    c.model.explicit_head_dim = 64, c.model.n_kv_head = 2;
    c.model.tie_embeddings = false;
    c.model.rope_theta = 500000.0f;
    c.model.rope_scaling.type = RopeScalingType::kLlama3;
    c.model.rope_scaling.original_max_position_embeddings = 16;
    c.model.qk_norm = qk_norm;
    CudaBackendOptions o;
    o.lm_head_chunk_rows = 64;
    // With QK-norm the norm weights' gradients are the furthest from the CPU's: each is a
    // per-channel sum over every token and head of dq (or dk) times the normalised q, with
    // cancellation, downstream of the E5M2 rounding of dO (up to 2^-3 = 12.5% an element) and
    // softmax's backward subtraction dP - rowsum(dO O). On the same inputs they measured 0.139
    // and 0.151 (blocks.0.attn.q_norm) in two runs that differed only in the autotuned cuDNN
    // attention engines (bf16 roundings, which values then cross FP8 grid points differently).
    // The QK-norm run's bound is 0.2, 1.6 times E5M2's unit roundoff; without QK-norm every
    // tensor stays within 0.15.
    test::ExpectGradientsMatchCpu(c, 2, o, /*loss_tol=*/2e-2, /*grad_tol=*/qk_norm ? 0.2 : 0.15);
    auto [cpu, gpu] = test::MakeCpuAndGpu(c);
    ASSERT_NE(gpu, nullptr);
    const auto batches = MakeBatches(c, 30, 23);
    for (int step = 1; step <= 30; ++step) {
      const StepHyper hyper{c.optimizer.lr, step};
      StepStats s_cpu, s_gpu;
      ASSERT_STATUS_OK(cpu->TrainStep(Views(batches, step - 1, 1), hyper, true, &s_cpu));
      ASSERT_STATUS_OK(gpu->TrainStep(Views(batches, step - 1, 1), hyper, true, &s_gpu));
      EXPECT_NEAR(s_gpu.loss, s_cpu.loss, 5e-2 * std::fabs(s_cpu.loss)) << "step " << step;
    }
  }
}

// Recompute re-casts the same inputs with the same scales (delayed) or the same measured amax
// (current): the saved transposed casts are bitwise those of the first forward.
TEST_P(GpuFp8Model, RecomputeMatchesSavedActivations) {
  FORGE_SKIP_WITHOUT_GPU();
  RunConfig c = Fp8Config(GetParam().recipe, GetParam().lm_head, GetParam().fast_accum);
  c.batch.global_batch = 8;
  RunConfig r = c;
  r.train.activation_recompute = Recompute::kFull;
  ExpectSameWeights(TenSteps(c, {}, nullptr), TenSteps(r, {}, nullptr));
}

TEST(GpuFp8Step, RejectsWhatItCannotRun) {
  FORGE_SKIP_WITHOUT_GPU();
  RunConfig c = Fp8Config(Fp8Recipe::kDelayed, /*lm_head=*/true);
  CudaBackendOptions o;
  o.lm_head_chunk_rows = 72;  // the FP8 logits GEMM needs chunks of a multiple of 16 rows
  auto made = MakeCudaTrainBackend(c, o);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().ToString().find("precision.fp8.lm_head"), std::string::npos)
      << made.status().ToString();
  c = Fp8Config();
  c.model.ffn = 264;  // a multiple of 8 (BF16 runs it), not of 16
  made = MakeCudaTrainBackend(c, {});
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().ToString().find("multiple of 16"), std::string::npos)
      << made.status().ToString();
}

// The scaling state travels through GetExtraState/SetExtraState (the checkpoint's "fp8" blob):
// a backend that takes it trains on bitwise like the one that gave it; one with another amax
// window refuses it, naming the key, and keeps its own state.
TEST(GpuFp8Step, ScalingStateMovesBetweenBackends) {
  FORGE_SKIP_WITHOUT_GPU();
  const RunConfig c = Fp8Config();
  const auto batches = MakeBatches(c, 6, 61);
  auto a = MakeGpu(c);
  ASSERT_NE(a, nullptr);
  for (int step = 1; step <= 3; ++step)
    ASSERT_STATUS_OK(a->TrainStep(Views(batches, step - 1, 1), {c.optimizer.lr, step}, false, nullptr));
  std::map<std::string, std::string> blobs;
  ASSERT_STATUS_OK(a->GetExtraState(&blobs));
  ASSERT_EQ(blobs.count("fp8"), 1u);
  UnitBuffers p, m, v;
  ASSERT_STATUS_OK(a->GetParams(&p));
  ASSERT_STATUS_OK(a->GetMoments(&m, &v));

  RunConfig other = c;
  other.precision.fp8.amax_history = c.precision.fp8.amax_history + 1;
  auto refused = MakeGpu(other);
  ASSERT_NE(refused, nullptr);
  const Status st = refused->SetExtraState(blobs);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("precision.fp8.amax_history"), std::string::npos) << st.ToString();
  other = c;
  other.precision.fp8.lm_head = true;  // two more E4M3 tensors
  auto refused_lm = MakeGpu(other);
  ASSERT_NE(refused_lm, nullptr);
  const Status st_lm = refused_lm->SetExtraState(blobs);
  EXPECT_FALSE(st_lm.ok());
  EXPECT_NE(st_lm.ToString().find("precision.fp8.lm_head"), std::string::npos)
      << st_lm.ToString();

  auto b = MakeGpu(c);
  ASSERT_NE(b, nullptr);
  ASSERT_STATUS_OK(b->SetParams(p));
  ASSERT_STATUS_OK(b->SetMoments(m, v));
  ASSERT_STATUS_OK(b->SetExtraState(blobs));
  for (int step = 4; step <= 6; ++step) {
    ASSERT_STATUS_OK(a->TrainStep(Views(batches, step - 1, 1), {c.optimizer.lr, step}, false, nullptr));
    ASSERT_STATUS_OK(b->TrainStep(Views(batches, step - 1, 1), {c.optimizer.lr, step}, false, nullptr));
  }
  UnitBuffers pa, pb;
  ASSERT_STATUS_OK(a->GetParams(&pa));
  ASSERT_STATUS_OK(b->GetParams(&pb));
  for (size_t u = 0; u < pa.size(); ++u)
    EXPECT_TRUE(test::BitwiseEqual(pa[u], pb[u])) << "weights of unit " << u;
}

TEST_P(GpuFp8Model, NonFiniteStepIsSkipped) {
  FORGE_SKIP_WITHOUT_GPU();
  const RunConfig c = Fp8Config(GetParam().recipe, GetParam().lm_head, GetParam().fast_accum);
  auto gpu = MakeGpu(c);
  ASSERT_NE(gpu, nullptr);
  const auto batches = MakeBatches(c, 3, 51);
  test::ExpectNonFiniteStepSkipped(gpu.get(), c, Views(batches, 0, 3));
}

TEST(GpuModel, NonFiniteStepIsSkippedInBf16) {
  FORGE_SKIP_WITHOUT_GPU();
  const RunConfig c = test::TinyGpuConfig("gpu-skip-test");
  auto gpu = MakeGpu(c);
  ASSERT_NE(gpu, nullptr);
  const auto batches = MakeBatches(c, 3, 51);
  test::ExpectNonFiniteStepSkipped(gpu.get(), c, Views(batches, 0, 3));
}

}  // namespace
}  // namespace forge
