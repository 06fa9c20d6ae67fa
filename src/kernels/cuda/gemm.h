// cuBLASLt matrix products for the transformer's linear layers. One GemmRunner per device
// owns the cuBLASLt handle, a workspace and a cache of (shape, types, epilogue) -> algorithm,
// so the algorithm choice happens once per shape (during the eager warm-up step, never
// during CUDA-graph capture).
//
// Row-major convention (what the model uses): out[M, N] = A[M, K] * op(B), with B stored
// row-major either as [N, K] (trans_b = true, i.e. x W^T for a weight W[out, in]) or [K, N]
// (trans_b = false). Internally mapped onto column-major cuBLASLt by swapping operands.
//
// Precision is per call so FP8 slots in: inputs BF16 or FP8 (E4M3 / E5M2) with per-tensor
// scale pointers, output BF16, FP32 or (FP8 inputs only) FP8 with a quantisation scale and
// an optional amax-of-output, accumulate (beta = 1) for residual adds and gradient
// accumulation, in place (C = D) or from a separate C.
//
// Autotuning (default off; set_autotune, engine.gemm_autotune in a run): when a plan is made
// for a new key outside stream capture, up to kMaxCandidates algorithms from the heuristic
// are timed on the call's own operands (an accumulating call is timed into a scratch copy,
// so the caller's D is never touched twice) and the fastest is kept, but only if it beats
// the heuristic's first choice by more than kTuneMargin. A plan made while the stream is
// capturing takes the first candidate (the heuristic's first, or its split-K variant)
// untimed (timing needs synchronisation).
//
// Determinism: a given plan gives bitwise identical results on every call (candidates are
// restricted to algorithms without split-K or with a workspace reduction in fp32, no
// in-place/atomic reductions). But the choice depends on timing, so two processes can pick
// different algorithms for a shape and then differ in the last bits; the margin makes that
// rare (only near-ties flip, and near-ties stay on the heuristic's deterministic first
// choice). Hence off by default: the heuristic's first choice is the same in every process.
//
// Split-K rule (default on, set_splitk; no timing, so the same choice in every process
// on the same GPU model): a GEMM whose output tiles fill few waves of the SMs while K is long
// (the weight gradients: small [out, in] output, K = tokens) leaves SMs idle in its last
// wave. When the heuristic's first algorithm has no split of its own and fills fewer than
// kSplitKMaxWaves waves (cuBLASLt's own wavesCount), the first candidate in the heuristic's
// order that can split K with an fp32 workspace reduction (usually the first itself) is
// tried at each s in kSplitKValues that leaves K / s >= kSplitKMinK and passes
// cublasLtMatmulAlgoCheck within the workspace; PredictSplitKUs prices each (whole waves of
// tiles each 1/s as long, plus the fp32 partials written and read back) and the cheapest is
// taken when it beats the heuristic's first, unsplit, by kSplitKMinGain. The reduction sums
// the partials in a fixed order, so results stay bitwise reproducible.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/status.h"

namespace forge::cuda {

enum class DType { kBf16, kFp32, kE4M3, kE5M2 };

struct GemmArgs {
  int64_t M = 0, N = 0, K = 0;
  const void* A = nullptr;  // [M, K] row-major (or [K, M] if trans_a)
  const void* B = nullptr;  // [N, K] row-major if trans_b else [K, N]
  void* D = nullptr;        // [M, N] row-major output
  bool trans_a = false;
  bool trans_b = true;
  DType a_type = DType::kBf16, b_type = DType::kBf16, d_type = DType::kBf16;
  bool accumulate = false;  // D = alpha*A*op(B) + C (beta = 1) instead of D = alpha*A*op(B)
  float alpha = 1.0f;
  // FP8 only: device pointers to per-tensor dequantisation scales of the inputs.
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  // FP8 output only: amax of the unscaled result (set, not folded in).
  float* d_amax = nullptr;
  // With accumulate: the addend, same type and [M, N] layout as D; may differ from D (then
  // it is only read). nullptr: C = D (in-place accumulation). Must be null without
  // accumulate, and is unsupported for an FP8 output.
  const void* C = nullptr;
  // FP8 output only: device pointer to the quantisation scale, D = d_scale * result
  // (nullptr: 1).
  const float* d_scale = nullptr;
  // SMs the kernel should plan for (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET; 0: all of them).
  // Fewer leave SMs to a concurrent NCCL kernel without a GEMM's last wave spilling over:
  // data-parallel backward GEMMs (CudaModelOptions::gemm_sm_margin).
  int sm_count = 0;
  // FP8 only: CUBLASLT_MATMUL_DESC_FAST_ACCUM. Hopper's FP8 tensor cores keep their partial
  // sums in less than FP32; by default cuBLASLt promotes them to FP32 every few K steps (slower,
  // exact to FP32 accumulation); fast accumulation skips that. Transformer Engine uses it for
  // the forward GEMMs (K = the layer's input width) and not for the gradients (K = tokens).
  bool fast_accum = false;
};

// An algorithm's configuration as cuBLASLt reports it (cublasLtMatmulAlgoConfigGetAttribute),
// plus what the heuristic or cublasLtMatmulAlgoCheck said about it for one shape.
struct GemmAlgoInfo {
  int32_t id = -1;             // CUBLASLT_ALGO_CONFIG_ID
  uint32_t tile = 0;           // cublasLtMatmulTile_t (rows x cols of cuBLASLt's D = our N x M)
  uint32_t stages = 0;         // cublasLtMatmulStages_t
  int32_t splitk = 1;          // CUBLASLT_ALGO_CONFIG_SPLITK_NUM
  uint32_t reduction = 0;      // cublasLtReductionScheme_t
  uint32_t swizzle = 0;        // CTA swizzling
  uint32_t custom = 0;         // custom option
  uint16_t inner_shape = 0;    // cublasLtMatmulInnerShape_t
  uint16_t cluster = 0;        // cublasLtClusterShape_t (0: auto)
  float waves = 0.0f;          // wavesCount for the shape (0: unknown)
  size_t workspace = 0;        // bytes the configuration needs for the shape
};

// Reads the configuration attributes of `algo` (waves and workspace stay 0).
GemmAlgoInfo ReadAlgoInfo(const cublasLtMatmulAlgo_t& algo);
// Readable names: "128x256", "64x4", "2x1x1", "compute_type"; "#<id>" for ids not in the
// short tables (tiles and clusters a bf16 Hopper kernel plausibly uses), "auto"/"undefined"
// for 0.
std::string TileName(uint32_t tile);
std::string StagesName(uint32_t stages);
std::string ClusterName(uint16_t cluster);
std::string ReductionName(uint32_t reduction);
// One line, e.g. "algo 66 tile 128x256 stages 64x4 splitk 1 ... waves 0.73".
std::string Describe(const GemmAlgoInfo& info);
// Configures `algo` for `splitk` partial products (>= 1) summed in an fp32 workspace
// (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE; splitk 1: no reduction). Validity for a shape is
// cublasLtMatmulAlgoCheck's call (GemmRunner::CheckAlgo).
Status SetSplitK(cublasLtMatmulAlgo_t* algo, int splitk);
// Whether `algo` can split K with an fp32 workspace reduction at all.
bool SupportsSplitK(const cublasLtMatmulAlgo_t& algo);

// The split-K wave model (pure; see the header comment).
struct SplitKProblem {
  int64_t M = 0, N = 0, K = 0;  // our row-major shape
  double waves = 0.0;           // output tiles of the unsplit kernel / concurrent CTAs
};
// Predicted microseconds of the GEMM split `splitk` ways (1: unsplit).
double PredictSplitKUs(const SplitKProblem& p, int splitk);
// 1 or the element of `allowed` with the lowest prediction (ties: the smaller), if it beats
// `baseline_us` (0: p's unsplit prediction) by more than kSplitKMinGain; only considered
// below kSplitKMaxWaves and for K / splitk >= kSplitKMinK.
int ChooseSplitK(const SplitKProblem& p, const std::vector<int>& allowed,
                 double baseline_us = 0.0);

inline constexpr int kSplitKValues[] = {2, 3, 4, 6, 8};
inline constexpr double kSplitKMaxWaves = 4.0;
inline constexpr int64_t kSplitKMinK = 1024;
inline constexpr double kSplitKMinGain = 0.10;

// An algorithm with what cuBLASLt reports about it for one shape.
struct GemmCandidate {
  cublasLtMatmulAlgo_t algo{};
  GemmAlgoInfo info;
};

// One plan made by a runner: what the split-K rule and autotuning did for it (the bench
// prints these).
struct GemmTuneRecord {
  std::string gemm;       // shape and types
  int candidates = 0;     // algorithms considered (at most kMaxCandidates); with a split-K
                          // choice, index 0 is that split variant
  int chosen = 0;         // index in that order; 0 = the heuristic's first (or its split)
  float first_us = 0.0f;  // per-call time of candidate 0 (0: not timed)
  float best_us = 0.0f;   // fastest candidate
  float chosen_us = 0.0f;
  std::string note;  // why it was not timed, if it was not
  int splitk = 1;    // what the split-K rule chose (1: no split)
  std::string splitk_note;  // why (waves, predictions, or why the rule did not apply)
  GemmAlgoInfo algo;        // the algorithm the plan runs
};

// Index to keep, given per-candidate times with index 0 the heuristic's first choice
// (non-finite = failed to run): the fastest, but only if it is faster than index 0 by more
// than `margin` (a fraction); otherwise 0 (or, if 0 failed, the fastest that ran). -1 if
// none ran.
int ChooseAlgorithm(const std::vector<float>& times, float margin);

class GemmRunner {
 public:
  static constexpr int kMaxCandidates = 8;
  static constexpr float kTuneMargin = 0.03f;

  GemmRunner() = default;
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Creates the handle and a workspace of `workspace_bytes` on the current device (autotuning
  // off, the split-K rule on).
  Status Init(size_t workspace_bytes = 64ull << 20);
  Status Run(const GemmArgs& args, cudaStream_t stream);
  // GemmArgs::sm_count for calls that leave it 0 (0: all SMs), e.g. for a stretch of a step
  // that overlaps NCCL.
  void set_default_sm_count(int sms) { default_sm_count_ = sms; }

  // Autotune: time the heuristic's candidates once per shape and keep the fastest (off by
  // default: no step-time gain measured at gpt350m, and the choice would depend on timing).
  // Split-K (on by default, deterministic): the weight-gradient GEMMs' partial last waves split
  // along K. Both affect plans made afterwards only.
  void set_autotune(bool on) { autotune_ = on; }
  bool autotune() const { return autotune_; }
  void set_splitk(bool on) { splitk_ = on; }
  bool splitk() const { return splitk_; }

  // For benchmarks and tests, on the descriptors Run would use for `args` (the plan is made
  // first if needed):
  // - the heuristic's usable algorithms, up to `max_count`, in its order (same preferences
  //   and filters as plan-making; waves and workspace filled in);
  // - whether `algo` can run `args` (cublasLtMatmulAlgoCheck; workspace within this runner's);
  // - `args` run with `algo` instead of the plan's.
  StatusOr<std::vector<GemmCandidate>> Candidates(const GemmArgs& args, int max_count,
                                                  cudaStream_t stream);
  StatusOr<GemmAlgoInfo> CheckAlgo(const GemmArgs& args, const cublasLtMatmulAlgo_t& algo,
                                   cudaStream_t stream);
  Status RunWithAlgo(const GemmArgs& args, const cublasLtMatmulAlgo_t& algo,
                     cudaStream_t stream);
  // - the record of the plan Run uses for `args`.
  StatusOr<GemmTuneRecord> PlanRecord(const GemmArgs& args, cudaStream_t stream);

  // Number of cached plans (one heuristic query each); tests use it to check reuse.
  size_t plan_count() const { return plans_.size(); }
  // Wall time spent timing candidates, over all plans so far.
  double autotune_ms_total() const { return autotune_ms_total_; }
  // One record per plan, in creation order.
  const std::vector<GemmTuneRecord>& autotune_log() const { return tune_log_; }

 private:
  int default_sm_count_ = 0;
  struct Plan;  // descriptors + chosen algorithm for one key
  // Everything the heuristic's answer depends on: M, N, K, a/b/d types, trans_a, trans_b,
  // pointer flags (scales, amax, separate C), pointer alignment, accumulate.
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, int, int, int, uint32_t, int>;

  // Validates `a` and returns its plan, made on first use.
  StatusOr<Plan*> GetPlan(const GemmArgs& a, cudaStream_t stream);
  StatusOr<Plan*> MakePlan(const GemmArgs& a, const Key& key, uint32_t align,
                           cudaStream_t stream);
  // The heuristic's usable results for the plan's descriptors, at most `max_count`.
  StatusOr<std::vector<cublasLtMatmulHeuristicResult_t>> Query(const Plan& plan,
                                                               const GemmArgs& a,
                                                               uint32_t align, int max_count);
  // The split-K rule over the heuristic's usable results (in its order): the chosen split
  // variant in *out and the split, or 1 (then *out is untouched); `note` says why.
  int ApplySplitKRule(const Plan& plan, const GemmArgs& a,
                      const std::vector<cublasLtMatmulHeuristicResult_t>& results,
                      cublasLtMatmulAlgo_t* out, std::string* note) const;
  // cuBLASLt's wavesCount for `r`, else tiles of its tile shape per SM; 0 if unknown.
  double Waves(const cublasLtMatmulHeuristicResult_t& r, const GemmArgs& a) const;
  // Times `algos` on the call's operands (never writing the caller's D when accumulating)
  // and fills `rec`; returns the index to keep.
  StatusOr<int> Autotune(const Plan& plan, const std::vector<cublasLtMatmulAlgo_t>& algos,
                         const GemmArgs& a, cudaStream_t stream, GemmTuneRecord* rec);
  Status SetPointers(const Plan& plan, const GemmArgs& a);
  cublasStatus_t Launch(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const GemmArgs& a,
                        const void* c, void* d, cudaStream_t stream) const;

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool autotune_ = false;
  bool splitk_ = true;
  int sm_count_ = 0;
  double autotune_ms_total_ = 0.0;
  std::vector<GemmTuneRecord> tune_log_;
  std::map<Key, Plan*> plans_;
};

}  // namespace forge::cuda
