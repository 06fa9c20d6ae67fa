// cuBLASLt matrix products for the transformer's linear layers. One GemmRunner per device
// owns the cuBLASLt handle, a workspace and a cache of (shape, types, epilogue) -> algorithm,
// so the heuristic query happens once per shape (and never during CUDA-graph capture after
// warm-up).
//
// Row-major convention (what the model uses): out[M, N] = A[M, K] * op(B), with B stored
// row-major either as [N, K] (trans_b = true, i.e. x W^T for a weight W[out, in]) or [K, N]
// (trans_b = false). Internally mapped onto column-major cuBLASLt by swapping operands.
//
// Precision is per call so FP8 slots in: inputs BF16 or FP8 (E4M3 / E5M2) with per-tensor
// scale pointers, output BF16 or FP32, optional amax-of-output pointer, accumulate (beta = 1)
// for residual adds and gradient accumulation.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

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
  bool accumulate = false;  // D += A*op(B) (beta = 1) instead of D = A*op(B)
  float alpha = 1.0f;
  // FP8 only: device pointers to per-tensor dequantisation scales, and optional amax(D).
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  float* d_amax = nullptr;
};

class GemmRunner {
 public:
  GemmRunner() = default;
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Creates the handle and a workspace of `workspace_bytes` on the current device.
  Status Init(size_t workspace_bytes = 64ull << 20);
  Status Run(const GemmArgs& args, cudaStream_t stream);

  // Number of cached plans (one heuristic query each); tests use it to check reuse.
  size_t plan_count() const { return plans_.size(); }

 private:
  struct Plan;  // layouts + chosen algorithm for one key
  // (M, N, K, a_type, b_type, d_type, trans_a, trans_b, fp8 pointer flags, pointer alignment,
  // accumulate): everything the heuristic's answer depends on.
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, int, int, int, int, bool>;
  StatusOr<Plan*> GetPlan(const GemmArgs& a, const Key& key, uint32_t align);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan*> plans_;
};

}  // namespace forge::cuda
