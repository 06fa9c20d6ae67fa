// cuBLASLt GEMM runner: row-major products mapped onto column-major cuBLASLt, one plan per
// shape/type key (descriptors + an algorithm chosen by the heuristic, then by timing).
#include "kernels/cuda/gemm.cuh"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"

namespace forge::cuda {

// Column-major view: row-major D[M,N] is column-major D^T [N,M], and
// D^T = op(B)^T * A^T. So cuBLASLt's "A" is our B and its "B" is our A; names below with
// lt_ prefix are in cuBLASLt's terms.
struct GemmRunner::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr;  // our B
  cublasLtMatrixLayout_t lt_b = nullptr;  // our A
  cublasLtMatrixLayout_t lt_d = nullptr;
  // C shares D's layout object except for an fp8 D, where cuBLASLt wants a bf16 C layout.
  cublasLtMatrixLayout_t lt_c = nullptr;
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (lt_c && lt_c != lt_d) cublasLtMatrixLayoutDestroy(lt_c);
    if (lt_d) cublasLtMatrixLayoutDestroy(lt_d);
    if (lt_b) cublasLtMatrixLayoutDestroy(lt_b);
    if (lt_a) cublasLtMatrixLayoutDestroy(lt_a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

// Split-K partial sums only in fp32 (the compute type), reduced in a separate deterministic
// pass; no in-place reductions in the output type (bf16-rounded partials).
constexpr uint32_t kReductionMask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
// Timing: warm-up calls, then kRounds rounds of `reps` calls (reps sized so a round of the
// heuristic's first choice takes about kRoundTargetUs); a candidate's time is its best round.
constexpr int kWarmup = 2;
constexpr int kRounds = 3;
constexpr float kRoundTargetUs = 500.0f;
constexpr int kMaxReps = 16;

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

size_t ElemBytes(DType t) {
  switch (t) {
    case DType::kBf16: return 2;
    case DType::kFp32: return 4;
    case DType::kE4M3:
    case DType::kE5M2: return 1;
  }
  return 4;
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

const char* Name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_8F_E4M3: return "CUDA_R_8F_E4M3";
    case CUDA_R_8F_E5M2: return "CUDA_R_8F_E5M2";
    default: return "CUDA_R_?";
  }
}

// libcublasLt has no status-name function (that is in libcublas, which we do not link).
const char* StatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_?";
  }
}

std::string Describe(const GemmArgs& a) {
  std::string s = "gemm M=" + std::to_string(a.M) + " N=" + std::to_string(a.N) +
                  " K=" + std::to_string(a.K) + " trans_a=" + std::to_string(a.trans_a) +
                  " trans_b=" + std::to_string(a.trans_b) + " " + Name(a.a_type) + "x" +
                  Name(a.b_type) + "->" + Name(a.d_type);
  if (a.accumulate) s += (a.C && a.C != a.D) ? " accumulate(C separate)" : " accumulate(C=D)";
  if (a.a_scale) s += " a_scale";
  if (a.b_scale) s += " b_scale";
  if (a.d_scale) s += " d_scale";
  if (a.d_amax) s += " d_amax";
  return s;
}

// Type of the C layout: D's, except bf16 for an fp8 D (cuBLASLt's fp8 rule: C is the
// bias type, bf16 or fp16).
DType CType(const GemmArgs& a) { return IsFp8(a.d_type) ? DType::kBf16 : a.d_type; }

// What cuBLASLt is asked, in its own terms: enough to reproduce a failure from the message.
std::string DescribeLt(const GemmArgs& a, uint32_t align, size_t workspace) {
  auto layout = [](DType t, int64_t rows, int64_t cols, int64_t ld) {
    return std::string(Name(ToCuda(t))) + " " + std::to_string(rows) + "x" +
           std::to_string(cols) + " ld=" + std::to_string(ld);
  };
  std::string s = Describe(a) + " | cuBLASLt: COMPUTE_32F scale CUDA_R_32F, TRANSA=";
  s += a.trans_b ? "T" : "N";
  s += " TRANSB=";
  s += a.trans_a ? "T" : "N";
  s += ", A(our B)=" + (a.trans_b ? layout(a.b_type, a.K, a.N, a.K)
                                  : layout(a.b_type, a.N, a.K, a.N));
  s += ", B(our A)=" + (a.trans_a ? layout(a.a_type, a.M, a.K, a.M)
                                  : layout(a.a_type, a.K, a.M, a.K));
  s += ", C=" + layout(CType(a), a.N, a.M, a.N);
  s += a.accumulate ? ((a.C && a.C != a.D) ? " (separate buffer)" : " (= D)")
                    : (IsFp8(a.d_type) ? " (null)" : " (= D)");
  s += ", D=" + layout(a.d_type, a.N, a.M, a.N);
  s += ", alpha=" + std::to_string(a.alpha) + " beta=" + (a.accumulate ? "1" : "0");
  s += ", A_SCALE=" + std::string(a.b_scale ? "set" : "unset");
  s += " B_SCALE=" + std::string(a.a_scale ? "set" : "unset");
  s += " D_SCALE=" + std::string(a.d_scale ? "set" : "unset");
  s += " AMAX_D=" + std::string(a.d_amax ? "set" : "unset");
  s += ", prefs: min alignment " + std::to_string(align) + " B (A,B,C,D), workspace " +
       std::to_string(workspace) + " B, reduction mask " + std::to_string(kReductionMask);
  return s;
}

// cuBLASLt's own explanation of a failing call: re-run it with the logger routed into a
// string (errors, trace and heuristics trace), then switch logging off again. Left alone
// when the environment configures cuBLASLt logging itself.
std::mutex g_log_mu;
std::string* g_log_sink = nullptr;

void LogSink(int level, const char* function, const char* message) {
  if (!g_log_sink || g_log_sink->size() > 6000) return;
  std::string& out = *g_log_sink;
  out.append("[").append(std::to_string(level)).append(" ");
  out.append(function ? function : "").append("] ").append(message ? message : "").append("; ");
}

template <typename Call>
std::string LtLogOf(Call&& call) {
  if (std::getenv("CUBLASLT_LOG_LEVEL") || std::getenv("CUBLASLT_LOG_MASK")) {
    return "cuBLASLt log: configured by CUBLASLT_LOG_*, see there";
  }
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::string out;
  g_log_sink = &out;
  cublasLtLoggerSetCallback(LogSink);
  cublasLtLoggerSetMask(1 | 2 | 8);
  call();
  cublasLtLoggerSetMask(0);
  cublasLtLoggerSetCallback(nullptr);
  g_log_sink = nullptr;
  return "cuBLASLt log: " + (out.empty() ? std::string("(empty)") : out);
}

// Largest power of two (<= 256, cuBLASLt's default assumption) dividing every pointer: the
// heuristic must only return kernels that tolerate the buffers' real alignment.
uint32_t PointerAlignment(const GemmArgs& a) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(a.A) | reinterpret_cast<uintptr_t>(a.B) |
                   reinterpret_cast<uintptr_t>(a.D) | uintptr_t{256};
  if (a.accumulate && a.C) bits |= reinterpret_cast<uintptr_t>(a.C);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// The C pointer of the real call.
const void* CPointer(const GemmArgs& a) {
  if (a.accumulate) return a.C ? a.C : a.D;
  // beta = 0: C is not read. An fp8 D has a bf16 C layout, so C must not alias D there.
  return IsFp8(a.d_type) ? nullptr : a.D;
}

Status Validate(const GemmArgs& a) {
  const std::string what = Describe(a);
  if (a.M <= 0 || a.N <= 0 || a.K <= 0) return Status::Invalid(what + ": empty shape");
  if (!a.A || !a.B || !a.D) return Status::Invalid(what + ": null operand pointer");
  if (a.C && !a.accumulate) {
    return Status::Invalid(what + ": C is only read when accumulating (set accumulate)");
  }
  const bool fp8 = IsFp8(a.a_type);
  if (fp8 != IsFp8(a.b_type)) {
    return Status::Invalid(what + ": inputs must be both bf16 or both fp8");
  }
  if (!fp8) {
    if (a.a_type != DType::kBf16 || a.b_type != DType::kBf16) {
      return Status::Invalid(what + ": inputs must be bf16 or fp8");
    }
    if (a.d_type != DType::kBf16 && a.d_type != DType::kFp32) {
      return Status::Invalid(what + ": bf16 inputs give a bf16 or fp32 output");
    }
    if (a.a_scale || a.b_scale || a.d_scale || a.d_amax) {
      return Status::Invalid(what + ": scale/amax pointers are for fp8 GEMMs only");
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
  const bool fp8_out = IsFp8(a.d_type);
  if (a.d_type == DType::kE5M2 && a.a_type == DType::kE4M3 && a.b_type == DType::kE4M3) {
    return Status::Invalid(what + ": e4m3 x e4m3 gives e4m3, bf16 or fp32, not e5m2");
  }
  if (a.d_amax && !fp8_out) {
    // cuBLASLt computes amax(D) only for an fp8 D (cuBLAS's word in pytorch/pytorch#122821);
    // for a bf16 D the heuristic query answered CUBLAS_STATUS_INVALID_VALUE.
    return Status::Invalid(what +
                           ": cuBLASLt computes amax only for an fp8 output; reduce a "
                           "bf16/fp32 output's amax in a separate kernel");
  }
  if (a.d_scale && !fp8_out) {
    return Status::Invalid(what + ": d_scale is for an fp8 output only");
  }
  if (a.accumulate && fp8_out) {
    return Status::Invalid(what + ": no accumulation into an fp8 output (C would be bf16)");
  }
  return Status::Ok();
}

bool StreamCapturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    // E.g. the legacy stream while another stream captures: treat as capturing (no sync).
    (void)cudaGetLastError();
    return true;
  }
  return st != cudaStreamCaptureStatusNone;
}

// Algorithm filters the heuristic cannot express: a reduction other than none/fp32
// workspace (defensive: the preference mask should already exclude it), and for a separate
// C, kernels that can only accumulate in place.
bool Usable(const cublasLtMatmulAlgo_t& algo, bool out_of_place) {
  uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                           &reduction, sizeof(reduction),
                                           &written) == CUBLAS_STATUS_SUCCESS &&
      reduction != CUBLASLT_REDUCTION_SCHEME_NONE &&
      reduction != CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) {
    return false;
  }
  if (out_of_place) {
    int32_t supported = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT,
                                          &supported, sizeof(supported),
                                          &written) != CUBLAS_STATUS_SUCCESS ||
        supported == 0) {
      return false;
    }
  }
  return true;
}

// Events and the accumulate scratch of one autotune, released on every path.
struct TuneScope {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  void* scratch = nullptr;
  ~TuneScope() {
    if (scratch) cudaFreeAsync(scratch, stream);
    if (stop) cudaEventDestroy(stop);
    if (start) cudaEventDestroy(start);
  }
};

}  // namespace

int ChooseAlgorithm(const std::vector<float>& times, float margin) {
  int best = -1;
  for (size_t i = 0; i < times.size(); ++i) {
    if (!std::isfinite(times[i])) continue;
    if (best < 0 || times[i] < times[size_t(best)]) best = static_cast<int>(i);
  }
  if (best <= 0 || !std::isfinite(times[0])) return best;
  return times[size_t(best)] < (1.0f - margin) * times[0] ? best : 0;
}

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
  // Off by default: measured on an H200 (gpt350m B=16), tuning gave no step-time gain
  // (79.8 ms tuned vs 79.6 ms heuristic) and would make cross-process bitwise reproducibility
  // depend on timing. FORGE_GEMM_AUTOTUNE=1 turns it on.
  const char* env = std::getenv("FORGE_GEMM_AUTOTUNE");
  autotune_ = env && std::string(env) == "1";
  return Status::Ok();
}

Status GemmRunner::SetPointers(const Plan& plan, const GemmArgs& a) {
  // Our b_scale scales cuBLASLt's A, our a_scale its B.
  if (a.b_scale) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.b_scale, sizeof(a.b_scale)));
  }
  if (a.a_scale) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a.a_scale, sizeof(a.a_scale)));
  }
  if (a.d_scale) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &a.d_scale, sizeof(a.d_scale)));
  }
  if (a.d_amax) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &a.d_amax, sizeof(a.d_amax)));
  }
  return Status::Ok();
}

cublasStatus_t GemmRunner::Launch(const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                                  const GemmArgs& a, const void* c, void* d,
                                  cudaStream_t stream) const {
  const float alpha = a.alpha;
  const float beta = a.accumulate ? 1.0f : 0.0f;
  return cublasLtMatmul(handle_, plan.desc, &alpha, a.B, plan.lt_a, a.A, plan.lt_b, &beta, c,
                        plan.lt_c, d, plan.lt_d, &algo, workspace_, workspace_bytes_, stream);
}

StatusOr<GemmRunner::Plan*> GemmRunner::MakePlan(const GemmArgs& a, const Key& key,
                                                 uint32_t align, cudaStream_t stream) {
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
  FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lt_d, ToCuda(a.d_type), a.N, a.M, a.N));
  if (CType(a) == a.d_type) {
    plan->lt_c = plan->lt_d;
  } else {
    FORGE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lt_c, ToCuda(CType(a)), a.N, a.M, a.N));
  }
  // The heuristic must see the fp8 pointers that will be set (amax selects other kernels);
  // Run sets the actual values on every call.
  FORGE_RETURN_IF_ERROR(SetPointers(*plan, a));

  cublasLtMatmulPreference_t pref = nullptr;
  FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  cublasStatus_t (*)(cublasLtMatmulPreference_t)>
      pref_guard(pref, cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = workspace_bytes_;
  FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &kReductionMask, sizeof(kReductionMask)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    FORGE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  }
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
  int found = 0;
  auto query = [&] {
    return cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->lt_a, plan->lt_b,
                                          plan->lt_c, plan->lt_d, pref, kMaxCandidates, results,
                                          &found);
  };
  const cublasStatus_t st = query();
  if (st != CUBLAS_STATUS_SUCCESS) {
    return Status::Internal("cublasLtMatmulAlgoGetHeuristic: " + std::string(StatusName(st)) +
                            " (" + std::to_string(static_cast<int>(st)) + ") for " +
                            DescribeLt(a, align, workspace_bytes_) + " | " + LtLogOf(query));
  }
  const bool out_of_place = a.accumulate && a.C != nullptr && a.C != a.D;
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS || results[i].workspaceSize > ws) continue;
    if (Usable(results[i].algo, out_of_place)) algos.push_back(results[i].algo);
  }
  if (algos.empty()) {
    return Status::Invalid("cuBLASLt heuristic found no usable algorithm (" +
                           std::to_string(found) + " offered" +
                           (out_of_place ? ", out-of-place C required" : "") + ") for " +
                           DescribeLt(a, align, workspace_bytes_));
  }

  GemmTuneRecord rec;
  rec.gemm = Describe(a);
  rec.candidates = static_cast<int>(algos.size());
  int chosen = 0;
  if (!autotune_) {
    rec.note = "autotune off";
  } else if (StreamCapturing(stream)) {
    rec.note = "stream capturing: heuristic's first choice, untimed";
  } else if (algos.size() == 1) {
    rec.note = "single candidate";
  } else {
    FORGE_ASSIGN_OR_RETURN(chosen, Autotune(*plan, algos, a, stream, &rec));
  }
  rec.chosen = chosen;
  tune_log_.push_back(rec);
  plan->algo = algos[size_t(chosen)];
  Plan* raw = plan.release();
  plans_.emplace(key, raw);
  return raw;
}

StatusOr<int> GemmRunner::Autotune(const Plan& plan, const std::vector<cublasLtMatmulAlgo_t>& algos,
                                   const GemmArgs& a, cudaStream_t stream,
                                   GemmTuneRecord* rec) {
  const auto wall_start = std::chrono::steady_clock::now();
  TuneScope scope;
  scope.stream = stream;
  // Operands: A and B are only read. Without accumulation the real call overwrites D
  // afterwards, so timing writes it too. With accumulation D must change exactly once:
  // time into a zeroed scratch of D's size (in place on the scratch for C = D, else reading
  // the caller's C, which is never written).
  const void* c = CPointer(a);
  void* d = a.D;
  if (a.accumulate) {
    const size_t bytes = size_t(a.M) * size_t(a.N) * ElemBytes(a.d_type);
    if (cudaMallocAsync(&scope.scratch, bytes, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      scope.scratch = nullptr;
      rec->note = "no memory for a " + std::to_string(bytes) + "-byte timing scratch: untimed";
      return 0;
    }
    FORGE_CUDA_CHECK(cudaMemsetAsync(scope.scratch, 0, bytes, stream));
    d = scope.scratch;
    c = (a.C && a.C != a.D) ? a.C : scope.scratch;
  }
  FORGE_CUDA_CHECK(cudaEventCreate(&scope.start));
  FORGE_CUDA_CHECK(cudaEventCreate(&scope.stop));

  auto elapsed_us = [&]() -> StatusOr<float> {
    FORGE_CUDA_CHECK(cudaEventSynchronize(scope.stop));
    float ms = 0.0f;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, scope.start, scope.stop));
    return ms * 1000.0f;
  };
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> times(algos.size(), inf);
  std::vector<cublasStatus_t> failures(algos.size(), CUBLAS_STATUS_SUCCESS);
  int reps = 1;
  for (size_t i = 0; i < algos.size(); ++i) {
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    for (int w = 0; w < kWarmup && st == CUBLAS_STATUS_SUCCESS; ++w) {
      st = Launch(plan, algos[i], a, c, d, stream);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
      failures[i] = st;  // e.g. NOT_SUPPORTED: this candidate cannot run these operands
      continue;
    }
    if (i == 0) {  // size the rounds from one timed call of the heuristic's first choice
      FORGE_CUDA_CHECK(cudaEventRecord(scope.start, stream));
      st = Launch(plan, algos[i], a, c, d, stream);
      FORGE_CUDA_CHECK(cudaEventRecord(scope.stop, stream));
      FORGE_ASSIGN_OR_RETURN(const float one, elapsed_us());
      if (st != CUBLAS_STATUS_SUCCESS) {
        failures[i] = st;
        continue;
      }
      reps = std::clamp(static_cast<int>(kRoundTargetUs / std::max(one, 1.0f)), 1, kMaxReps);
    }
    float best = inf;
    for (int r = 0; r < kRounds && st == CUBLAS_STATUS_SUCCESS; ++r) {
      FORGE_CUDA_CHECK(cudaEventRecord(scope.start, stream));
      for (int k = 0; k < reps && st == CUBLAS_STATUS_SUCCESS; ++k) {
        st = Launch(plan, algos[i], a, c, d, stream);
      }
      FORGE_CUDA_CHECK(cudaEventRecord(scope.stop, stream));
      FORGE_ASSIGN_OR_RETURN(const float us, elapsed_us());
      best = std::min(best, us / float(reps));
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
      failures[i] = st;
      continue;
    }
    times[i] = best;
  }

  const int chosen = ChooseAlgorithm(times, kTuneMargin);
  autotune_ms_total_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall_start)
          .count();
  if (chosen < 0) {
    return Status::Internal("no cuBLASLt candidate ran (first: " +
                            std::string(StatusName(failures[0])) + ") for " +
                            DescribeLt(a, PointerAlignment(a), workspace_bytes_) + " | " +
                            LtLogOf([&] { return Launch(plan, algos[0], a, c, d, stream); }));
  }
  rec->first_us = std::isfinite(times[0]) ? times[0] : 0.0f;
  rec->best_us = *std::min_element(times.begin(), times.end());
  rec->chosen_us = times[size_t(chosen)];
  return chosen;
}

Status GemmRunner::Run(const GemmArgs& a, cudaStream_t stream) {
  if (!handle_) return Status::Precondition("GemmRunner::Run before Init");
  FORGE_RETURN_IF_ERROR(Validate(a));
  const uint32_t align = PointerAlignment(a);
  const bool separate_c = a.accumulate && a.C != nullptr && a.C != a.D;
  const int flags = (a.a_scale ? 1 : 0) | (a.b_scale ? 2 : 0) | (a.d_amax ? 4 : 0) |
                    (a.d_scale ? 8 : 0) | (separate_c ? 16 : 0);
  const Key key{a.M,
                a.N,
                a.K,
                static_cast<int>(a.a_type),
                static_cast<int>(a.b_type),
                static_cast<int>(a.d_type),
                a.trans_a ? 1 : 0,
                a.trans_b ? 1 : 0,
                flags,
                align,
                a.accumulate ? 1 : 0};
  Plan* plan = nullptr;
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    plan = it->second;
  } else {
    FORGE_ASSIGN_OR_RETURN(plan, MakePlan(a, key, align, stream));
  }
  // The pointers differ between calls with the same key (each layer has its own scales).
  FORGE_RETURN_IF_ERROR(SetPointers(*plan, a));
  const cublasStatus_t st = Launch(*plan, plan->algo, a, CPointer(a), a.D, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    // Re-running only to capture the log is safe: the failed call launched nothing.
    return Status::Internal(
        "cublasLtMatmul: " + std::string(StatusName(st)) + " for " +
        DescribeLt(a, align, workspace_bytes_) + " | " +
        LtLogOf([&] { return Launch(*plan, plan->algo, a, CPointer(a), a.D, stream); }));
  }
  return Status::Ok();
}

}  // namespace forge::cuda
