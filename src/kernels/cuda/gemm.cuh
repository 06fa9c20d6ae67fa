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
// Autotuning (default off; FORGE_GEMM_AUTOTUNE=1 turns it on at Init): when a plan is made
// for a new key outside stream capture, up to kMaxCandidates algorithms from the heuristic
// are timed on the call's own operands (an accumulating call is timed into a scratch copy,
// so the caller's D is never touched twice) and the fastest is kept, but only if it beats
// the heuristic's first choice by more than kTuneMargin. A plan made while the stream is
// capturing takes the heuristic's first choice untimed (timing needs synchronisation).
//
// Determinism: a given plan gives bitwise identical results on every call (candidates are
// restricted to algorithms without split-K or with a workspace reduction in fp32, no
// in-place/atomic reductions). But the choice depends on timing, so two processes can pick
// different algorithms for a shape and then differ in the last bits; the margin makes that
// rare (only near-ties flip, and near-ties stay on the heuristic's deterministic first
// choice). Hence off by default: the heuristic's first choice is the same in every process.
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
};

// One plan made by a runner: what autotuning did for it (the bench prints these).
struct GemmTuneRecord {
  std::string gemm;       // shape and types
  int candidates = 0;     // usable algorithms the heuristic offered (at most kMaxCandidates)
  int chosen = 0;         // index in the heuristic's order; 0 = its first choice
  float first_us = 0.0f;  // per-call time of the heuristic's first choice (0: not timed)
  float best_us = 0.0f;   // fastest candidate
  float chosen_us = 0.0f;
  std::string note;  // why it was not timed, if it was not
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

  // Creates the handle and a workspace of `workspace_bytes` on the current device; reads
  // FORGE_GEMM_AUTOTUNE ("1" enables autotuning).
  Status Init(size_t workspace_bytes = 64ull << 20);
  Status Run(const GemmArgs& args, cudaStream_t stream);

  // Overrides the environment's choice (tests); affects plans made afterwards only.
  void set_autotune(bool on) { autotune_ = on; }
  bool autotune() const { return autotune_; }

  // Number of cached plans (one heuristic query each); tests use it to check reuse.
  size_t plan_count() const { return plans_.size(); }
  // Wall time spent timing candidates, over all plans so far.
  double autotune_ms_total() const { return autotune_ms_total_; }
  // One record per plan, in creation order.
  const std::vector<GemmTuneRecord>& autotune_log() const { return tune_log_; }

 private:
  struct Plan;  // descriptors + chosen algorithm for one key
  // Everything the heuristic's answer depends on: M, N, K, a/b/d types, trans_a, trans_b,
  // pointer flags (scales, amax, separate C), pointer alignment, accumulate.
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, int, int, int, uint32_t, int>;

  StatusOr<Plan*> MakePlan(const GemmArgs& a, const Key& key, uint32_t align,
                           cudaStream_t stream);
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
  bool autotune_ = true;
  double autotune_ms_total_ = 0.0;
  std::vector<GemmTuneRecord> tune_log_;
  std::map<Key, Plan*> plans_;
};

}  // namespace forge::cuda
