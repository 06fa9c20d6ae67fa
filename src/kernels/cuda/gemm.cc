// cuBLASLt GEMM runner: row-major products mapped onto column-major cuBLASLt, one heuristic
// query per shape/type key, cached with its descriptors.
#include "kernels/cuda/gemm.cuh"

#include <memory>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace forge::cuda {

// Column-major view: row-major D[M,N] is column-major D^T [N,M], and
// D^T = op(B)^T * A^T. So cuBLASLt's "A" is our B and its "B" is our A; names below with
// lt_ prefix are in cuBLASLt's terms.
struct GemmRunner::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr;  // our B
  cublasLtMatrixLayout_t lt_b = nullptr;  // our A
  cublasLtMatrixLayout_t lt_cd = nullptr;  // C and D share one layout (C = D when accumulating)
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (lt_cd) cublasLtMatrixLayoutDestroy(lt_cd);
    if (lt_b) cublasLtMatrixLayoutDestroy(lt_b);
    if (lt_a) cublasLtMatrixLayoutDestroy(lt_a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

bool IsFp8(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }

cudaDataType_t ToCuda(DType t) {
  switch (t) {
    case DType::kBf16: return CUDA_R_16BF;
    case DType::kFp32: return CUDA_R_32F;
    case DType::kE4M3: return CUDA_R_8F_E4M3;
    case DType::kE5M2: return CUDA_R_8F_E5M2;
  }
  return CUDA_R_16BF;
}

const char* Name(DType t) {
  switch (t) {
    case DType::kBf16: return "bf16";
    case DType::kFp32: return "fp32";
    case DType::kE4M3: return "e4m3";
    case DType::kE5M2: return "e5m2";
  }
  return "?";
}

std::string Describe(const GemmArgs& a) {
  return "gemm M=" + std::to_string(a.M) + " N=" + std::to_string(a.N) +
         " K=" + std::to_string(a.K) + " trans_a=" + std::to_string(a.trans_a) +
         " trans_b=" + std::to_string(a.trans_b) + " " + Name(a.a_type) + "x" + Name(a.b_type) +
         "->" + Name(a.d_type) + (a.accumulate ? " accumulate" : "");
}

// Largest power of two (<= 256, cuBLASLt's default assumption) dividing every pointer: the
// heuristic must only return kernels that tolerate the buffers' real alignment.
uint32_t PointerAlignment(const GemmArgs& a) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a.A) | reinterpret_cast<uintptr_t>(a.B) |
                         reinterpret_cast<uintptr_t>(a.D) | uintptr_t{256};
  return static_cast<uint32_t>(bits & (~bits + 1));
}

Status Validate(const GemmArgs& a) {
  const std::string what = Describe(a);
  if (a.M <= 0 || a.N <= 0 || a.K <= 0) return Status::Invalid(what + ": empty shape");
  if (!a.A || !a.B || !a.D) return Status::Invalid(what + ": null operand pointer");
  if (a.d_type != DType::kBf16 && a.d_type != DType::kFp32) {
    return Status::Invalid(what + ": output must be bf16 or fp32");
  }
  const bool fp8 = IsFp8(a.a_type);
  if (fp8 != IsFp8(a.b_type)) {
    return Status::Invalid(what + ": inputs must be both bf16 or both fp8");
  }
  if (!fp8) {
    if (a.a_type != DType::kBf16 || a.b_type != DType::kBf16) {
      return Status::Invalid(what + ": inputs must be bf16 or fp8");
    }
    if (a.a_scale || a.b_scale || a.d_amax) {
      return Status::Invalid(what + ": scale/amax pointers are for fp8 inputs only");
    }
    return Status::Ok();
  }
  // cuBLASLt FP8 kernels need TN in column-major terms (its A transposed, its B not): here
  // that is B stored [N, K] (trans_b) and A stored [M, K] (!trans_a), K contiguous in both.
  if (a.trans_a || !a.trans_b) {
    return Status::Invalid(what +
                           ": fp8 needs A [M,K] and B [N,K] (trans_a=false, trans_b=true); "
                           "transpose the operand into an fp8 copy first");
  }
  if (a.a_type == DType::kE5M2 && a.b_type == DType::kE5M2) {
    return Status::Invalid(what + ": cuBLASLt has no e5m2 x e5m2 kernel");
  }
  if (a.M % 16 != 0 || a.N % 16 != 0 || a.K % 16 != 0) {
    return Status::Invalid(what + ": fp8 needs M, N and K multiples of 16");
  }
  return Status::Ok();
}

}  // namespace

GemmRunner::~GemmRunner() {
  for (auto& [key, plan] : plans_) delete plan;
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

Status GemmRunner::Init(size_t workspace_bytes) {
  if (handle_) return Status::Precondition("GemmRunner::Init called twice");
  FORGE_CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (workspace_bytes > 0) FORGE_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes));
  workspace_bytes_ = workspace_bytes;
  return Status::Ok();
}

StatusOr<GemmRunner::Plan*> GemmRunner::GetPlan(const GemmArgs& a, const Key& key,
                                                uint32_t align) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;

  auto plan = std::make_unique<Plan>();
  FORGE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // applied to our B
  const cublasOperation_t op_b = a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // applied to our A
  FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                    &op_a, sizeof(op_a)));
  FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                    &op_b, sizeof(op_b)));
  // Our B: [N, K] row-major (= column-major K x N, ld K) when trans_b, else [K, N] (= N x K).
  if (a.trans_b) {
    FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lt_a, ToCuda(a.b_type), a.K, a.N, a.K));
  } else {
    FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lt_a, ToCuda(a.b_type), a.N, a.K, a.N));
  }
  // Our A: [M, K] row-major (= column-major K x M, ld K), or [K, M] (= M x K) when trans_a.
  if (a.trans_a) {
    FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lt_b, ToCuda(a.a_type), a.M, a.K, a.M));
  } else {
    FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lt_b, ToCuda(a.a_type), a.K, a.M, a.K));
  }
  FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lt_cd, ToCuda(a.d_type), a.N, a.M, a.N));
  // The heuristic must see the fp8 pointers that will be set (amax selects other kernels);
  // Run sets the actual values on every call.
  if (a.b_scale) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.b_scale, sizeof(a.b_scale)));
  }
  if (a.a_scale) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a.a_scale, sizeof(a.a_scale)));
  }
  if (a.d_amax) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &a.d_amax, sizeof(a.d_amax)));
  }

  cublasLtMatmulPreference_t pref = nullptr;
  FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  // Split-K partial sums only in fp32 (the compute type): reductions in the output type would
  // add bf16-rounded partials.
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                              &reduction, sizeof(reduction));
  }
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    }
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->lt_a, plan->lt_b,
                                        plan->lt_cd, plan->lt_cd, pref, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  FORGE_CUBLAS_CHECK(st);
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    return Status::Invalid(Describe(a) + ": cuBLASLt heuristic found no algorithm (alignment " +
                           std::to_string(align) + " bytes)");
  }
  plan->algo = result.algo;
  Plan* raw = plan.release();
  plans_.emplace(key, raw);
  return raw;
}

Status GemmRunner::Run(const GemmArgs& a, cudaStream_t stream) {
  if (!handle_) return Status::Precondition("GemmRunner::Run before Init");
  FORGE_RETURN_IF_ERROR(Validate(a));
  const uint32_t align = PointerAlignment(a);
  const int fp8_flags = (a.a_scale ? 1 : 0) | (a.b_scale ? 2 : 0) | (a.d_amax ? 4 : 0);
  const Key key{a.M,
                a.N,
                a.K,
                static_cast<int>(a.a_type),
                static_cast<int>(a.b_type),
                static_cast<int>(a.d_type),
                a.trans_a ? 1 : 0,
                a.trans_b ? 1 : 0,
                fp8_flags,
                static_cast<int>(align),
                a.accumulate};
  FORGE_ASSIGN_OR_RETURN(Plan * plan, GetPlan(a, key, align));

  // The pointers differ between calls with the same key (each layer has its own scales).
  if (a.b_scale) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.b_scale, sizeof(a.b_scale)));
  }
  if (a.a_scale) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a.a_scale, sizeof(a.a_scale)));
  }
  if (a.d_amax) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &a.d_amax, sizeof(a.d_amax)));
  }
  const float alpha = a.alpha;
  const float beta = a.accumulate ? 1.0f : 0.0f;
  // C = D: with beta = 1 the product is added to D in place.
  FORGE_CUBLAS_CHECK(cublasLtMatmul(handle_, plan->desc, &alpha, a.B, plan->lt_a, a.A,
                                    plan->lt_b, &beta, a.D, plan->lt_cd, a.D, plan->lt_cd,
                                    &plan->algo, workspace_, workspace_bytes_, stream));
  return Status::Ok();
}

}  // namespace forge::cuda
