// cuBLASLt GEMM runner: row-major products mapped onto column-major cuBLASLt, one plan per
// shape/type key (descriptors + an algorithm chosen by the heuristic, the split-K rule, then
// optionally by timing).
#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "common/named_values.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/plan_cache.h"

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
  // While `algo` is the split-K rule's variant that has not run yet: the unsplit first
  // choice to fall back to should cublasLtMatmul refuse it (AlgoCheck passing does not
  // guarantee that it runs), and the plan's record in tune_log_.
  bool has_fallback = false;
  cublasLtMatmulAlgo_t fallback{};
  size_t log_index = 0;

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
  if (a.fast_accum) s += " fast_accum";
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
  if (a.sm_count < 0 || a.sm_count > 4096) return Status::Invalid(what + ": bad sm_count");
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
    if (a.a_scale || a.b_scale || a.d_scale || a.d_amax || a.fast_accum) {
      return Status::Invalid(what + ": scale/amax pointers and fast_accum are for fp8 GEMMs only");
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
  // Measured on H100 and H200 (cuBLASLt 13.1): with a scale pointer 4 bytes into an
  // allocation every FP8 algorithm returned CUBLAS_STATUS_NOT_SUPPORTED at cublasLtMatmul,
  // while the same call with separately allocated scales ran. Ask for 16-byte alignment.
  for (const void* p : {static_cast<const void*>(a.a_scale), static_cast<const void*>(a.b_scale),
                        static_cast<const void*>(a.d_scale), static_cast<const void*>(a.d_amax)}) {
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return Status::Invalid(what + ": fp8 scale/amax pointers must be 16-byte aligned "
                                    "(cuBLASLt refuses others with NOT_SUPPORTED)");
    }
  }
  return Status::Ok();
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

// Tiles, stages and cluster shapes by name. Tiles: the shapes a bf16 Hopper kernel plausibly
// uses (the enum has ~630); others print as "#<id>".
#define FORGE_GEMM_TILES(X)                                                                   \
  X(64, 64) X(64, 96) X(64, 128) X(64, 160) X(64, 192) X(64, 224) X(64, 256) X(64, 512)       \
  X(96, 64) X(96, 128) X(96, 192) X(96, 256) X(96, 512)                                       \
  X(128, 64) X(128, 96) X(128, 128) X(128, 160) X(128, 192) X(128, 224) X(128, 256)           \
  X(128, 512) X(160, 64) X(160, 128) X(160, 192) X(160, 256)                                  \
  X(192, 64) X(192, 96) X(192, 128) X(192, 160) X(192, 192) X(192, 224) X(192, 256)           \
  X(224, 64) X(224, 128) X(224, 192)                                                          \
  X(256, 64) X(256, 96) X(256, 128) X(256, 160) X(256, 192) X(256, 224) X(256, 256)           \
  X(256, 512) X(512, 64) X(512, 96) X(512, 128) X(512, 512)
#define FORGE_GEMM_STAGES(X)                                                                  \
  X(16x1) X(16x2) X(16x3) X(16x4) X(16x5) X(16x6) X(32x1) X(32x2) X(32x3) X(32x4) X(32x5)     \
  X(32x6) X(64x1) X(64x2) X(64x3) X(64x4) X(64x5) X(64x6) X(128x1) X(128x2) X(128x3)          \
  X(128x4) X(128x5) X(128x6) X(32x10) X(8x4) X(16x10) X(8x5) X(8x3) X(8xAUTO) X(16xAUTO)      \
  X(32xAUTO) X(64xAUTO) X(128xAUTO) X(256xAUTO) X(768xAUTO)
#define FORGE_GEMM_CLUSTERS(X)                                                                \
  X(1x1x1) X(2x1x1) X(4x1x1) X(1x2x1) X(2x2x1) X(4x2x1) X(1x4x1) X(2x4x1) X(4x4x1) X(8x1x1)   \
  X(1x8x1) X(8x2x1) X(2x8x1) X(16x1x1) X(1x16x1) X(3x1x1) X(5x1x1) X(6x1x1) X(7x1x1)          \
  X(9x1x1) X(10x1x1) X(11x1x1) X(12x1x1) X(13x1x1) X(14x1x1) X(15x1x1) X(3x2x1) X(5x2x1)      \
  X(6x2x1) X(7x2x1) X(1x3x1) X(2x3x1) X(3x3x1) X(4x3x1) X(5x3x1) X(3x4x1) X(1x5x1) X(2x5x1)   \
  X(3x5x1) X(1x6x1) X(2x6x1) X(1x7x1) X(2x7x1) X(1x9x1) X(1x10x1) X(1x11x1) X(1x12x1)        \
  X(1x13x1) X(1x14x1) X(1x15x1)

#define FORGE_X(n) NamedValue<uint32_t>{#n, CUBLASLT_MATMUL_STAGES_##n},
constexpr std::array kStageNames = {
    NamedValue<uint32_t>{"undefined", CUBLASLT_MATMUL_STAGES_UNDEFINED},
    FORGE_GEMM_STAGES(FORGE_X)};
#undef FORGE_X
#define FORGE_X(n) NamedValue<uint16_t>{#n, CUBLASLT_CLUSTER_SHAPE_##n},
constexpr std::array kClusterNames = {NamedValue<uint16_t>{"auto", CUBLASLT_CLUSTER_SHAPE_AUTO},
                                      FORGE_GEMM_CLUSTERS(FORGE_X)};
#undef FORGE_X
constexpr std::array<NamedValue<uint32_t>, 4> kReductionNames{
    {{"none", CUBLASLT_REDUCTION_SCHEME_NONE},
     {"inplace", CUBLASLT_REDUCTION_SCHEME_INPLACE},
     {"compute_type", CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE},
     {"output_type", CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE}}};

// The name of a cuBLASLt value, or "#<value>" for one the table lacks.
template <typename E, size_t N>
std::string NameOrNumber(const std::array<NamedValue<E>, N>& table, E value) {
  const char* name = FindName(table, value);
  return name != nullptr ? std::string(name) : "#" + std::to_string(value);
}

// Rows x cols of a tile in the table; false for others.
bool TileDims(uint32_t tile, int* rows, int* cols) {
  switch (tile) {
#define FORGE_X(r, c)                  \
  case CUBLASLT_MATMUL_TILE_##r##x##c: \
    *rows = r, *cols = c;              \
    return true;
    FORGE_GEMM_TILES(FORGE_X)
#undef FORGE_X
    default: return false;
  }
}

// The wave model's device constants: the rate of a full wave of bf16 tiles (cuBLASLt reaches
// 650-760 TFLOP/s on the gpt350m shapes, H100 and H200), memory bandwidth for the fp32
// partials (conservative for H200's 4.8 TB/s), a prologue + epilogue per wave of tiles, and
// the reduction kernel's launch.
constexpr double kModelFlopsPerS = 660e12;
constexpr double kModelBytesPerS = 3.0e12;
constexpr double kModelWaveOverheadUs = 2.0;
constexpr double kModelReduceLaunchUs = 2.0;

}  // namespace

GemmAlgoInfo ReadAlgoInfo(const cublasLtMatmulAlgo_t& algo) {
  GemmAlgoInfo info;
  size_t written = 0;
  // Each attribute is read on its own; one an algorithm does not report keeps its default.
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto* value) {
    (void)cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, value, sizeof(*value), &written);
  };
  get(CUBLASLT_ALGO_CONFIG_ID, &info.id);
  get(CUBLASLT_ALGO_CONFIG_TILE_ID, &info.tile);
  get(CUBLASLT_ALGO_CONFIG_STAGES_ID, &info.stages);
  get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &info.splitk);
  get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &info.reduction);
  get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &info.swizzle);
  get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &info.custom);
  get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &info.inner_shape);
  get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &info.cluster);
  return info;
}

std::string TileName(uint32_t tile) {
  if (tile == CUBLASLT_MATMUL_TILE_UNDEFINED) return "undefined";
  int r = 0, c = 0;
  if (TileDims(tile, &r, &c)) return std::to_string(r) + "x" + std::to_string(c);
  return "#" + std::to_string(tile);
}

std::string StagesName(uint32_t stages) { return NameOrNumber(kStageNames, stages); }
std::string ClusterName(uint16_t cluster) { return NameOrNumber(kClusterNames, cluster); }
std::string ReductionName(uint32_t reduction) { return NameOrNumber(kReductionNames, reduction); }

std::string Describe(const GemmAlgoInfo& i) {
  char waves[32];
  std::snprintf(waves, sizeof(waves), "%.3f", double(i.waves));
  return "algo " + std::to_string(i.id) + " tile " + TileName(i.tile) + " stages " +
         StagesName(i.stages) + " splitk " + std::to_string(i.splitk) + " reduction " +
         ReductionName(i.reduction) + " swizzle " + std::to_string(i.swizzle) + " custom " +
         std::to_string(i.custom) + " inner " + std::to_string(i.inner_shape) + " cluster " +
         ClusterName(i.cluster) + " waves " + waves + " workspace " +
         std::to_string(i.workspace);
}

Status SetSplitK(cublasLtMatmulAlgo_t* algo, int splitk) {
  if (splitk < 1) return Status::Invalid("split-K " + std::to_string(splitk) + " < 1");
  const int32_t num = splitk;
  const uint32_t scheme =
      splitk > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
  FORGE_CUBLAS_CHECK(
      cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &num, sizeof(num)));
  FORGE_CUBLAS_CHECK(cublasLtMatmulAlgoConfigSetAttribute(
      algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme)));
  return Status::Ok();
}

bool SupportsSplitK(const cublasLtMatmulAlgo_t& algo) {
  int32_t support = 0;
  uint32_t mask = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support,
                                        sizeof(support), &written) != CUBLAS_STATUS_SUCCESS ||
      support == 0) {
    return false;
  }
  if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &mask,
                                        sizeof(mask), &written) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  return (mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) != 0;
}

double PredictSplitKUs(const SplitKProblem& p, int splitk) {
  if (p.waves <= 0.0 || splitk < 1) return std::numeric_limits<double>::infinity();
  const double flops = 2.0 * double(p.M) * double(p.N) * double(p.K);
  // A full wave of unsplit tiles does flops / waves of the work at the full-GPU rate.
  const double wave_us = flops / (p.waves * kModelFlopsPerS) * 1e6;
  // The last wave counts whole (the tolerance keeps an exact fill such as 3 x 176 / 132 = 4
  // from rounding up).
  const double waves = std::max(1.0, std::ceil(p.waves * splitk * (1.0 - 1e-5)));
  double us = waves * (wave_us / splitk + kModelWaveOverheadUs);
  if (splitk > 1) {
    // fp32 partials written by the split kernel and read back by the reduction; D and C are
    // touched once either way.
    const double bytes = 2.0 * splitk * double(p.M) * double(p.N) * sizeof(float);
    us += bytes / kModelBytesPerS * 1e6 + kModelReduceLaunchUs;
  }
  return us;
}

int ChooseSplitK(const SplitKProblem& p, const std::vector<int>& allowed, double baseline_us) {
  if (p.waves <= 0.0 || p.waves >= kSplitKMaxWaves) return 1;
  std::vector<int> splits(allowed);
  std::sort(splits.begin(), splits.end());
  const double unsplit = baseline_us > 0.0 ? baseline_us : PredictSplitKUs(p, 1);
  int best = 1;
  double best_us = unsplit;
  for (int s : splits) {
    if (s < 2 || p.K / s < kSplitKMinK) continue;
    const double us = PredictSplitKUs(p, s);
    if (us < best_us) best = s, best_us = us;  // strict: ties keep the smaller split
  }
  return best_us < (1.0 - kSplitKMinGain) * unsplit ? best : 1;
}

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
  int device = 0;
  FORGE_CUDA_CHECK(cudaGetDevice(&device));
  FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  return Status::Ok();
}

Status GemmRunner::SetPointers(const Plan& plan, const GemmArgs& a) {
  // Our b_scale scales cuBLASLt's A, our a_scale its B. Null pointers stay unset.
  const std::pair<cublasLtMatmulDescAttributes_t, const void*> pointers[] = {
      {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.b_scale},
      {CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a.a_scale},
      {CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, a.d_scale},
      {CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, a.d_amax}};
  for (const auto& [attr, pointer] : pointers) {
    if (pointer != nullptr)
      FORGE_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, attr, &pointer, sizeof(pointer)));
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
  if (a.sm_count > 0) {
    const int32_t sms = a.sm_count;
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof(sms)));
  }
  if (a.fast_accum) {
    const int8_t fast = 1;
    FORGE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  }
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

  FORGE_ASSIGN_OR_RETURN(const std::vector<cublasLtMatmulHeuristicResult_t> results,
                         Query(*plan, a, align, kMaxCandidates));
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (const auto& r : results) algos.push_back(r.algo);

  GemmTuneRecord rec;
  rec.gemm = Describe(a);
  // The split-K rule first: its choice leads the candidates (autotuning, when on, can still
  // prefer the unsplit first choice right behind it, or any other).
  if (!splitk_) {
    rec.splitk_note = "split-K rule off";
  } else {
    cublasLtMatmulAlgo_t split{};
    rec.splitk = ApplySplitKRule(*plan, a, results, &split, &rec.splitk_note);
    if (rec.splitk > 1) {
      algos.insert(algos.begin(), split);
      if (algos.size() > size_t(kMaxCandidates)) algos.pop_back();
    }
  }
  rec.candidates = static_cast<int>(algos.size());
  int chosen = 0;
  if (!autotune_) {
    rec.note = "autotune off";
  } else if (StreamCapturing(stream)) {
    rec.note = "stream capturing: first candidate, untimed";
  } else if (ProfilerAttached()) {
    rec.note = "profiler attached: first candidate, untimed";
  } else if (algos.size() == 1) {
    rec.note = "single candidate";
  } else {
    FORGE_ASSIGN_OR_RETURN(chosen, Autotune(*plan, algos, a, stream, &rec));
  }
  rec.chosen = chosen;
  plan->algo = algos[size_t(chosen)];
  if (rec.splitk > 1 && chosen == 0) {
    plan->has_fallback = true;
    plan->fallback = results[0].algo;
  }
  plan->log_index = tune_log_.size();
  rec.algo = ReadAlgoInfo(plan->algo);
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(handle_, plan->desc, plan->lt_a, plan->lt_b, plan->lt_c,
                              plan->lt_d, &plan->algo, &check) == CUBLAS_STATUS_SUCCESS) {
    rec.algo.waves = check.wavesCount;
    rec.algo.workspace = check.workspaceSize;
  }
  tune_log_.push_back(rec);
  Plan* raw = plan.release();
  plans_.emplace(key, raw);
  return raw;
}

StatusOr<std::vector<cublasLtMatmulHeuristicResult_t>> GemmRunner::Query(const Plan& plan,
                                                                         const GemmArgs& a,
                                                                         uint32_t align,
                                                                         int max_count) {
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
  std::vector<cublasLtMatmulHeuristicResult_t> results(size_t(std::max(max_count, 1)));
  int found = 0;
  auto query = [&] {
    return cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.lt_a, plan.lt_b, plan.lt_c,
                                          plan.lt_d, pref, static_cast<int>(results.size()),
                                          results.data(), &found);
  };
  const cublasStatus_t st = query();
  if (st != CUBLAS_STATUS_SUCCESS) {
    return Status::Internal("cublasLtMatmulAlgoGetHeuristic: " + std::string(StatusName(st)) +
                            " (" + std::to_string(static_cast<int>(st)) + ") for " +
                            DescribeLt(a, align, workspace_bytes_) + " | " + LtLogOf(query));
  }
  const bool out_of_place = a.accumulate && a.C != nullptr && a.C != a.D;
  std::vector<cublasLtMatmulHeuristicResult_t> usable;
  for (int i = 0; i < found; ++i) {
    if (results[size_t(i)].state != CUBLAS_STATUS_SUCCESS || results[size_t(i)].workspaceSize > ws) {
      continue;
    }
    if (Usable(results[size_t(i)].algo, out_of_place)) usable.push_back(results[size_t(i)]);
  }
  if (usable.empty()) {
    return Status::Invalid("cuBLASLt heuristic found no usable algorithm (" +
                           std::to_string(found) + " offered" +
                           (out_of_place ? ", out-of-place C required" : "") + ") for " +
                           DescribeLt(a, align, workspace_bytes_));
  }
  return usable;
}

double GemmRunner::Waves(const cublasLtMatmulHeuristicResult_t& r, const GemmArgs& a) const {
  if (r.wavesCount > 0.0f) return r.wavesCount;
  // Not reported: one CTA per SM per tile of the table (cuBLASLt's D is N x M).
  int rows = 0, cols = 0;
  if (!TileDims(ReadAlgoInfo(r.algo).tile, &rows, &cols) || sm_count_ <= 0) return 0.0;
  const int64_t tiles = ((a.N + rows - 1) / rows) * ((a.M + cols - 1) / cols);
  return double(tiles) / sm_count_;
}

int GemmRunner::ApplySplitKRule(const Plan& plan, const GemmArgs& a,
                                const std::vector<cublasLtMatmulHeuristicResult_t>& results,
                                cublasLtMatmulAlgo_t* out, std::string* note) const {
  const GemmAlgoInfo first = ReadAlgoInfo(results[0].algo);
  if (first.splitk > 1) {
    *note = "heuristic's first already splits K " + std::to_string(first.splitk) + " ways";
    return 1;
  }
  const double waves = Waves(results[0], a);
  if (waves <= 0.0) {
    *note = "waves unknown (tile " + TileName(first.tile) + ")";
    return 1;
  }
  const double unsplit = PredictSplitKUs({a.M, a.N, a.K, waves}, 1);
  char buf[128];
  std::snprintf(buf, sizeof(buf), "first: algo %d, %.3f waves, %.1f us", first.id, waves,
                unsplit);
  *note = buf;
  if (waves >= kSplitKMaxWaves) {
    *note += "; enough waves";
    return 1;
  }
  // The first candidate that can split (usually the heuristic's first itself).
  size_t ci = 0;
  while (ci < results.size() &&
         (ReadAlgoInfo(results[ci].algo).splitk != 1 || !SupportsSplitK(results[ci].algo))) {
    ++ci;
  }
  if (ci == results.size()) {
    *note += "; no candidate splits K with an fp32 reduction";
    return 1;
  }
  const SplitKProblem p{a.M, a.N, a.K, Waves(results[ci], a)};
  if (ci > 0) {
    std::snprintf(buf, sizeof(buf), "; candidate %zu (algo %d, %.3f waves) splits", ci,
                  ReadAlgoInfo(results[ci].algo).id, p.waves);
    *note += buf;
  }
  std::vector<int> allowed;
  for (int s : kSplitKValues) {
    if (a.K / s < kSplitKMinK) continue;
    cublasLtMatmulAlgo_t cand = results[ci].algo;
    if (!SetSplitK(&cand, s).ok()) continue;
    cublasLtMatmulHeuristicResult_t check{};
    const cublasStatus_t st = cublasLtMatmulAlgoCheck(handle_, plan.desc, plan.lt_a, plan.lt_b,
                                                      plan.lt_c, plan.lt_d, &cand, &check);
    if (st != CUBLAS_STATUS_SUCCESS) {
      *note += "; s=" + std::to_string(s) + " " + StatusName(st);
      continue;
    }
    if (check.workspaceSize > workspace_bytes_) {
      *note += "; s=" + std::to_string(s) + " needs " + std::to_string(check.workspaceSize) +
               " B workspace";
      continue;
    }
    std::snprintf(buf, sizeof(buf), "; s=%d %.1f us", s, PredictSplitKUs(p, s));
    *note += buf;
    allowed.push_back(s);
  }
  const int splitk = ChooseSplitK(p, allowed, unsplit);
  *note += "; chose " + std::to_string(splitk);
  if (splitk > 1) {
    *out = results[ci].algo;
    if (!SetSplitK(out, splitk).ok()) return 1;  // it was set above for the check already
  }
  return splitk;
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

StatusOr<GemmRunner::Plan*> GemmRunner::GetPlan(const GemmArgs& a, cudaStream_t stream) {
  if (!handle_) return Status::Precondition("GemmRunner used before Init");
  FORGE_RETURN_IF_ERROR(Validate(a));
  const uint32_t align = PointerAlignment(a);
  const bool separate_c = a.accumulate && a.C != nullptr && a.C != a.D;
  const int flags = (a.a_scale ? 1 : 0) | (a.b_scale ? 2 : 0) | (a.d_amax ? 4 : 0) |
                    (a.d_scale ? 8 : 0) | (separate_c ? 16 : 0) | (a.fast_accum ? 32 : 0) |
                    (a.sm_count << 8);
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
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  return MakePlan(a, key, align, stream);
}

Status GemmRunner::Run(const GemmArgs& args, cudaStream_t stream) {
  GemmArgs a = args;
  if (a.sm_count == 0) a.sm_count = default_sm_count_;
  FORGE_ASSIGN_OR_RETURN(Plan * plan, GetPlan(a, stream));
  if (plan->has_fallback) {
    FORGE_RETURN_IF_ERROR(SetPointers(*plan, a));
    const cublasStatus_t st = Launch(*plan, plan->algo, a, CPointer(a), a.D, stream);
    plan->has_fallback = false;
    if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
    // Refused before launching anything: run the unsplit first choice from now on (the
    // same in every process, as the refusal is).
    plan->algo = plan->fallback;
    GemmTuneRecord& rec = tune_log_[plan->log_index];
    rec.splitk_note += std::string("; split refused by cublasLtMatmul (") + StatusName(st) +
                       "): unsplit";
    rec.splitk = 1;
    rec.algo = ReadAlgoInfo(plan->algo);
  }
  return RunWithAlgo(a, plan->algo, stream);
}

Status GemmRunner::RunWithAlgo(const GemmArgs& a, const cublasLtMatmulAlgo_t& algo,
                               cudaStream_t stream) {
  FORGE_ASSIGN_OR_RETURN(Plan * plan, GetPlan(a, stream));
  // The pointers differ between calls with the same key (each layer has its own scales).
  FORGE_RETURN_IF_ERROR(SetPointers(*plan, a));
  const cublasStatus_t st = Launch(*plan, algo, a, CPointer(a), a.D, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    // Re-running only to capture the log is safe: the failed call launched nothing.
    return Status::Internal(
        "cublasLtMatmul: " + std::string(StatusName(st)) + " for " +
        DescribeLt(a, PointerAlignment(a), workspace_bytes_) + " with " +
        Describe(ReadAlgoInfo(algo)) + " | " +
        LtLogOf([&] { return Launch(*plan, algo, a, CPointer(a), a.D, stream); }));
  }
  return Status::Ok();
}

StatusOr<GemmTuneRecord> GemmRunner::PlanRecord(const GemmArgs& a, cudaStream_t stream) {
  FORGE_ASSIGN_OR_RETURN(Plan * plan, GetPlan(a, stream));
  return tune_log_[plan->log_index];
}

StatusOr<std::vector<GemmCandidate>> GemmRunner::Candidates(const GemmArgs& a, int max_count,
                                                            cudaStream_t stream) {
  FORGE_ASSIGN_OR_RETURN(Plan * plan, GetPlan(a, stream));
  FORGE_ASSIGN_OR_RETURN(const std::vector<cublasLtMatmulHeuristicResult_t> results,
                         Query(*plan, a, PointerAlignment(a), max_count));
  std::vector<GemmCandidate> out;
  for (const auto& r : results) {
    GemmCandidate c;
    c.algo = r.algo;
    c.info = ReadAlgoInfo(r.algo);
    c.info.waves = r.wavesCount;
    c.info.workspace = r.workspaceSize;
    out.push_back(c);
  }
  return out;
}

StatusOr<GemmAlgoInfo> GemmRunner::CheckAlgo(const GemmArgs& a, const cublasLtMatmulAlgo_t& algo,
                                             cudaStream_t stream) {
  FORGE_ASSIGN_OR_RETURN(Plan * plan, GetPlan(a, stream));
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t st = cublasLtMatmulAlgoCheck(handle_, plan->desc, plan->lt_a, plan->lt_b,
                                                    plan->lt_c, plan->lt_d, &algo, &check);
  GemmAlgoInfo info = ReadAlgoInfo(algo);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return Status::Invalid("cublasLtMatmulAlgoCheck: " + std::string(StatusName(st)) + " for " +
                           Describe(info));
  }
  info.waves = check.wavesCount;
  info.workspace = check.workspaceSize;
  if (check.workspaceSize > workspace_bytes_) {
    return Status::Invalid(Describe(info) + ": needs more than the runner's " +
                           std::to_string(workspace_bytes_) + " B workspace");
  }
  return info;
}

}  // namespace forge::cuda
