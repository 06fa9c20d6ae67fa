// forge-fp8-probe: which FP8 (E4M3 x E4M3) cuBLASLt matmul configurations run on this card.
//
//   forge-fp8-probe [--max-size N]   (skip sizes with M > N; default: all)
//
// Standalone (no Forge code) so a failure can be reproduced outside GemmRunner. For every
// variant in the grid below it prints one JSON line: the heuristic query's status, the
// number of algorithms returned, and for the first 3 of them the algorithm's id/tile/
// split-K/reduction and the status of cublasLtMatmul (plus any CUDA error after a sync);
// also cublasLtMatmul with a null algorithm (cuBLASLt's own choice). Grid:
//   size (M x N x K)       128x256x512, 1024^3, 8192^3
//   mapping                "forge": row-major D[M,N] = A[M,K] B[N,K]^T as GemmRunner maps it
//                          (cuBLASLt A = our B, K x N ld K, op T; cuBLASLt B = our A, K x M
//                          ld K, op N; D column-major N x M ld N); "direct": the plain
//                          column-major TN call D[M x N] = A^T B, A K x M, B K x N
//   reduction pref         REDUCTION_SCHEME_MASK = COMPUTE_TYPE set or not
//   alignment prefs        MIN_ALIGNMENT_{A,B,C,D} = 256 set or not
//   C                      "eq_d" (C == D), "separate", "null"; beta = 0 always
//   D/C types              bf16/bf16, fp32/fp32, fp32 D with bf16 C
//   scales                 A/B scale pointers (device 1.0f) set or not
//   fast_accum             CUBLASLT_MATMUL_DESC_FAST_ACCUM 0 or 1
// The last line is a summary: variants whose every tried matmul succeeded, per factor value.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/flags.h"

namespace {

constexpr size_t kWorkspaceBytes = size_t{64} << 20;
constexpr uint32_t kAlign = 256;
constexpr int kMaxAlgos = 3;
// Asked of the heuristic: more than kMaxAlgos so the count shows how many it has.
constexpr int kRequested = 16;

const char* StatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "LICENSE_ERROR";
    default: return "UNKNOWN";
  }
}

// Setup failures (allocation, descriptor creation) end the probe: they are not the question.
void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "forge-fp8-probe: %s: %s\n", what, detail.c_str());
  std::exit(1);
}
void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(what, cudaGetErrorString(e));
}
void CheckLt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) Die(what, StatusName(s));
}

struct Size {
  int64_t m, n, k;
};

struct Variant {
  bool forge_mapping;
  bool reduction_pref;
  bool align_pref;
  int c_mode;  // 0: C == D, 1: separate, 2: null
  int types;   // 0: bf16 D/C, 1: fp32 D/C, 2: fp32 D + bf16 C
  bool scales;
  bool fast_accum;
};

const char* CModeName(int c) { return c == 0 ? "eq_d" : c == 1 ? "separate" : "null"; }
const char* TypesName(int t) { return t == 0 ? "bf16" : t == 1 ? "fp32" : "fp32_d_bf16_c"; }

// Device buffers of one size, shared by all its variants.
struct Buffers {
  void* a = nullptr;  // our A, E4M3 [M, K] row-major
  void* b = nullptr;  // our B, E4M3 [N, K] row-major
  void* c = nullptr;  // M*N*4 bytes
  void* d = nullptr;  // M*N*4 bytes
  float* scale = nullptr;
};

// Finite E4M3 values of moderate magnitude (exponent field 4..10, never the NaN pattern).
std::vector<uint8_t> RandomE4M3(size_t count, uint64_t seed) {
  std::vector<uint8_t> out(count);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : out) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const uint8_t sign = (x >> 8) & 1;
    const uint8_t exp = 4 + (x >> 16) % 7;
    const uint8_t mant = (x >> 24) & 7;
    v = uint8_t(sign << 7 | exp << 3 | mant);
  }
  return out;
}

std::string AlgoJson(const cublasLtMatmulAlgo_t& algo) {
  int32_t id = -1, splitk = -1;
  uint32_t tile = 0, reduction = 0, stages = 0;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                       sizeof(stages), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                       sizeof(splitk), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction,
                                       sizeof(reduction), &w);
  return "\"id\":" + std::to_string(id) + ",\"tile\":" + std::to_string(tile) +
         ",\"stages\":" + std::to_string(stages) + ",\"splitk\":" + std::to_string(splitk) +
         ",\"reduction\":" + std::to_string(reduction);
}

// Runs one matmul and waits for it: the launch status, then any asynchronous CUDA error.
std::string RunOnce(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* lta_ptr,
                    cublasLtMatrixLayout_t lta, const void* ltb_ptr, cublasLtMatrixLayout_t ltb,
                    const void* c, cublasLtMatrixLayout_t ltc, void* d, cublasLtMatrixLayout_t ltd,
                    const cublasLtMatmulAlgo_t* algo, void* workspace, bool* ok) {
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(h, desc, &alpha, lta_ptr, lta, ltb_ptr, ltb, &beta, c,
                                           ltc, d, ltd, algo, workspace, kWorkspaceBytes, nullptr);
  std::string out = std::string("\"") + StatusName(st) + "\"";
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    out += ",\"cuda_error\":\"" + std::string(cudaGetErrorString(e)) + "\"";
    (void)cudaGetLastError();
  }
  *ok = st == CUBLAS_STATUS_SUCCESS && e == cudaSuccess;
  return out;
}

// One variant: prints its JSON line; true when the heuristic answered and every tried
// matmul (the returned algorithms and the null algorithm) succeeded.
bool Probe(cublasLtHandle_t h, const Size& s, const Variant& v, const Buffers& buf,
           void* workspace) {
  // cuBLASLt's m x n output and its operands, in its column-major terms.
  const int64_t lm = v.forge_mapping ? s.n : s.m;
  const int64_t ln = v.forge_mapping ? s.m : s.n;
  const void* lta_ptr = v.forge_mapping ? buf.b : buf.a;  // k x lm, ld k, op T
  const void* ltb_ptr = v.forge_mapping ? buf.a : buf.b;  // k x ln, ld k, op N

  cublasLtMatmulDesc_t desc = nullptr;
  CheckLt(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc create");
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  CheckLt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)),
          "TRANSA");
  CheckLt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)),
          "TRANSB");
  const int8_t fast = v.fast_accum ? 1 : 0;
  CheckLt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                         sizeof(fast)),
          "FAST_ACCUM");
  if (v.scales) {
    const float* p = buf.scale;
    CheckLt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p,
                                           sizeof(p)),
            "A_SCALE_POINTER");
    CheckLt(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p,
                                           sizeof(p)),
            "B_SCALE_POINTER");
  }

  const cudaDataType_t d_type = v.types == 0 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType_t c_type = v.types == 1 ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatrixLayout_t lta = nullptr, ltb = nullptr, ltc = nullptr, ltd = nullptr;
  CheckLt(cublasLtMatrixLayoutCreate(&lta, CUDA_R_8F_E4M3, s.k, lm, s.k), "layout A");
  CheckLt(cublasLtMatrixLayoutCreate(&ltb, CUDA_R_8F_E4M3, s.k, ln, s.k), "layout B");
  CheckLt(cublasLtMatrixLayoutCreate(&ltc, c_type, lm, ln, lm), "layout C");
  CheckLt(cublasLtMatrixLayoutCreate(&ltd, d_type, lm, ln, lm), "layout D");
  const void* c_ptr = v.c_mode == 0 ? buf.d : v.c_mode == 1 ? buf.c : nullptr;

  cublasLtMatmulPreference_t pref = nullptr;
  CheckLt(cublasLtMatmulPreferenceCreate(&pref), "pref create");
  const uint64_t ws = kWorkspaceBytes;
  CheckLt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &ws, sizeof(ws)),
          "pref workspace");
  if (v.reduction_pref) {
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    CheckLt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &mask, sizeof(mask)),
            "pref reduction");
  }
  if (v.align_pref) {
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      CheckLt(cublasLtMatmulPreferenceSetAttribute(pref, attr, &kAlign, sizeof(kAlign)),
              "pref alignment");
    }
  }

  std::vector<cublasLtMatmulHeuristicResult_t> results(kRequested);
  int found = 0;
  const cublasStatus_t hst = cublasLtMatmulAlgoGetHeuristic(h, desc, lta, ltb, ltc, ltd, pref,
                                                            kRequested, results.data(), &found);
  std::string line = "{\"M\":" + std::to_string(s.m) + ",\"N\":" + std::to_string(s.n) +
                     ",\"K\":" + std::to_string(s.k) + ",\"mapping\":\"" +
                     (v.forge_mapping ? "forge" : "direct") + "\",\"reduction_pref\":" +
                     std::to_string(v.reduction_pref) + ",\"align_pref\":" +
                     std::to_string(v.align_pref) + ",\"c\":\"" + CModeName(v.c_mode) +
                     "\",\"types\":\"" + TypesName(v.types) + "\",\"scales\":" +
                     std::to_string(v.scales) + ",\"fast_accum\":" +
                     std::to_string(v.fast_accum) + ",\"heuristic\":\"" + StatusName(hst) +
                     "\",\"found\":" + std::to_string(hst == CUBLAS_STATUS_SUCCESS ? found : 0) +
                     ",\"algos\":[";
  bool all_ok = hst == CUBLAS_STATUS_SUCCESS && found > 0;
  if (hst == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < found && i < kMaxAlgos; ++i) {
      const auto& r = results[size_t(i)];
      bool ok = false;
      const std::string run = RunOnce(h, desc, lta_ptr, lta, ltb_ptr, ltb, c_ptr, ltc, buf.d, ltd,
                                      &r.algo, workspace, &ok);
      all_ok = all_ok && ok;
      line += std::string(i ? "," : "") + "{" + AlgoJson(r.algo) + ",\"state\":\"" +
              StatusName(r.state) + "\",\"ws\":" + std::to_string(r.workspaceSize) +
              ",\"matmul\":" + run + "}";
    }
  }
  bool null_ok = false;
  const std::string null_run = RunOnce(h, desc, lta_ptr, lta, ltb_ptr, ltb, c_ptr, ltc, buf.d,
                                       ltd, nullptr, workspace, &null_ok);
  all_ok = all_ok && null_ok;
  line += "],\"null_algo_matmul\":" + null_run + ",\"all_ok\":" + std::to_string(all_ok) + "}";
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);

  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ltd);
  cublasLtMatrixLayoutDestroy(ltc);
  cublasLtMatrixLayoutDestroy(ltb);
  cublasLtMatrixLayoutDestroy(lta);
  cublasLtMatmulDescDestroy(desc);
  return all_ok;
}

}  // namespace

int main(int argc, char** argv) {
  forge::FlagParser flags("forge-fp8-probe", "",
                          "Checks which cuBLASLt FP8 GEMM layouts and sizes run on this GPU; "
                          "prints JSON lines.");
  flags.Value("--max-size", "N", "largest square size tried");
  if (int rc; flags.ParseOrExit(argc, argv, 1, &rc)) return rc;
  int64_t max_size = INT64_MAX;
  if (forge::Status s = flags.GetInt("--max-size", &max_size); !s.ok())
    return flags.UsageError(s);

  int device = 0, runtime = 0, driver = 0;
  cudaDeviceProp prop{};
  CheckCuda(cudaGetDevice(&device), "cudaGetDevice");
  CheckCuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  CheckCuda(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  CheckCuda(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  std::printf(
      "{\"device\":\"%s\",\"cc\":\"%d.%d\",\"cublasLt_version\":%zu,\"cublasLt_cudart_version\":"
      "%zu,\"cudart\":%d,\"driver\":%d,\"header_cublas_version\":%d}\n",
      prop.name, prop.major, prop.minor, cublasLtGetVersion(), cublasLtGetCudartVersion(), runtime,
      driver, CUBLAS_VERSION);

  cublasLtHandle_t h = nullptr;
  CheckLt(cublasLtCreate(&h), "cublasLtCreate");
  void* workspace = nullptr;
  CheckCuda(cudaMalloc(&workspace, kWorkspaceBytes), "workspace");

  const std::vector<Size> sizes = {{128, 256, 512}, {1024, 1024, 1024}, {8192, 8192, 8192}};
  // Per factor value: variants probed and variants all_ok.
  std::map<std::string, std::pair<int, int>> summary;
  for (const Size& s : sizes) {
    if (s.m > max_size) continue;
    Buffers buf;
    const size_t mn_bytes = size_t(s.m * s.n) * 4;
    CheckCuda(cudaMalloc(&buf.a, size_t(s.m * s.k)), "A");
    CheckCuda(cudaMalloc(&buf.b, size_t(s.n * s.k)), "B");
    CheckCuda(cudaMalloc(&buf.c, mn_bytes), "C");
    CheckCuda(cudaMalloc(&buf.d, mn_bytes), "D");
    CheckCuda(cudaMalloc(&buf.scale, sizeof(float)), "scale");
    const float one = 1.0f;
    CheckCuda(cudaMemcpy(buf.scale, &one, sizeof(one), cudaMemcpyHostToDevice), "scale copy");
    const std::vector<uint8_t> ha = RandomE4M3(size_t(s.m * s.k), 1);
    const std::vector<uint8_t> hb = RandomE4M3(size_t(s.n * s.k), 2);
    CheckCuda(cudaMemcpy(buf.a, ha.data(), ha.size(), cudaMemcpyHostToDevice), "A copy");
    CheckCuda(cudaMemcpy(buf.b, hb.data(), hb.size(), cudaMemcpyHostToDevice), "B copy");
    CheckCuda(cudaMemset(buf.c, 0, mn_bytes), "C clear");
    CheckCuda(cudaMemset(buf.d, 0, mn_bytes), "D clear");

    const std::string size_name =
        std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
    for (int mapping = 1; mapping >= 0; --mapping)
      for (int red = 1; red >= 0; --red)
        for (int align = 1; align >= 0; --align)
          for (int c_mode = 0; c_mode < 3; ++c_mode)
            for (int types = 0; types < 3; ++types)
              for (int scales = 1; scales >= 0; --scales)
                for (int fast = 0; fast < 2; ++fast) {
                  const Variant v{mapping == 1, red == 1, align == 1, c_mode,
                                  types,        scales == 1, fast == 1};
                  const bool ok = Probe(h, s, v, buf, workspace);
                  for (const std::string& key :
                       {"size=" + size_name, std::string("mapping=") + (mapping ? "forge" : "direct"),
                        "reduction_pref=" + std::to_string(red), "align_pref=" + std::to_string(align),
                        std::string("c=") + CModeName(c_mode), std::string("types=") + TypesName(types),
                        "scales=" + std::to_string(scales), "fast_accum=" + std::to_string(fast)}) {
                    summary[key].first += 1;
                    summary[key].second += ok ? 1 : 0;
                  }
                }
    cudaFree(buf.scale);
    cudaFree(buf.d);
    cudaFree(buf.c);
    cudaFree(buf.b);
    cudaFree(buf.a);
  }

  std::string line = "{\"summary_all_ok_of_probed\":{";
  bool first = true;
  for (const auto& [key, counts] : summary) {
    line += std::string(first ? "" : ",") + "\"" + key + "\":\"" + std::to_string(counts.second) +
            "/" + std::to_string(counts.first) + "\"";
    first = false;
  }
  std::printf("%s}}\n", line.c_str());
  cudaFree(workspace);
  cublasLtDestroy(h);
  return 0;
}
