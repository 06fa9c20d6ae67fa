// forge-wgmma-bench: our own warpgroup-MMA BF16 GEMM (kernels/cuda/gemm_wgmma.cu) beside
// cuBLASLt (GemmRunner, what the step runs) on the forward GEMMs of gpt350m, one JSON line each.
//
//   forge-wgmma-bench [--reps 30] [--sets 3] [--only SUBSTRING]
//
// For each shape: ||ours - cuBLASLt|| / ||cuBLASLt|| on random non-zero operands (our output is
// poisoned with NaN first, so an element we fail to write fails the check), then the median
// time of each over --reps calls rotating over --sets operand sets (L2 holds none of them).
// Then the fused epilogues against what they replace, on gpt350m B 16's shapes: the QKV GEMM
// with RoPE vs cuBLASLt + RopeApply, the gate/up GEMM with SwiGLU vs cuBLASLt + SwiGluForward:
// elements that differ (bitwise) and the times of both.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "common/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace forge {
namespace {

struct Shape {
  const char* name;
  int64_t M, N, K;
};

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

float FromBf16(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

Status FillRandom(void* dev, size_t n, uint64_t seed) {
  std::vector<uint16_t> h(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const float v = (float((x >> 40) & 0xFFFFFF) / float(1 << 24)) * 2.0f - 1.0f;
    h[i] = ToBf16(v == 0.0f ? 0.5f : v);
  }
  FORGE_CUDA_CHECK(cudaMemcpy(dev, h.data(), n * 2, cudaMemcpyHostToDevice));
  return Status::Ok();
}

StatusOr<float> MedianUs(cudaStream_t s, int reps, int sets, const std::function<Status(int)>& f) {
  for (int w = 0; w < 3; ++w) FORGE_RETURN_IF_ERROR(f(w % sets));
  std::vector<cudaEvent_t> ev(size_t(2 * reps));
  for (auto& e : ev) FORGE_CUDA_CHECK(cudaEventCreate(&e));
  for (int r = 0; r < reps; ++r) {
    FORGE_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r)], s));
    FORGE_RETURN_IF_ERROR(f(r % sets));
    FORGE_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * r + 1)], s));
  }
  FORGE_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> us(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    float ms = 0;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[size_t(2 * r)], ev[size_t(2 * r + 1)]));
    us[size_t(r)] = ms * 1000.0f;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::nth_element(us.begin(), us.begin() + reps / 2, us.end());
  return us[size_t(reps / 2)];
}

StatusOr<std::vector<float>> Download(const void* dev, size_t n) {
  std::vector<uint16_t> h(n);
  FORGE_CUDA_CHECK(cudaMemcpy(h.data(), dev, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = FromBf16(h[i]);
  return f;
}

Status RunShape(const Shape& sh, int reps, int sets, cuda::GemmRunner& lt, cudaStream_t stream) {
  const size_t nsets = static_cast<size_t>(sets);
  std::vector<void*> a(nsets), b(nsets), d(nsets);
  for (int i = 0; i < sets; ++i) {
    FORGE_CUDA_CHECK(cudaMalloc(&a[size_t(i)], size_t(sh.M * sh.K) * 2));
    FORGE_CUDA_CHECK(cudaMalloc(&b[size_t(i)], size_t(sh.N * sh.K) * 2));
    FORGE_CUDA_CHECK(cudaMalloc(&d[size_t(i)], size_t(sh.M * sh.N) * 2));
    FORGE_RETURN_IF_ERROR(FillRandom(a[size_t(i)], size_t(sh.M * sh.K), uint64_t(2 * i + 1)));
    FORGE_RETURN_IF_ERROR(FillRandom(b[size_t(i)], size_t(sh.N * sh.K), uint64_t(2 * i + 2)));
  }
  auto ours = [&](int i) {
    cuda::WgmmaGemmArgs g;
    g.M = sh.M, g.N = sh.N, g.K = sh.K;
    g.A = a[size_t(i)], g.B = b[size_t(i)], g.D = d[size_t(i)];
    return cuda::WgmmaGemmBf16(g, stream);
  };
  auto cublas = [&](int i) {
    cuda::GemmArgs g;
    g.M = sh.M, g.N = sh.N, g.K = sh.K;
    g.A = a[size_t(i)], g.B = b[size_t(i)], g.D = d[size_t(i)];
    return lt.Run(g, stream);
  };
  const size_t n = size_t(sh.M * sh.N);
  FORGE_RETURN_IF_ERROR(cublas(0));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  FORGE_ASSIGN_OR_RETURN(const std::vector<float> ref, Download(d[0], n));
  FORGE_CUDA_CHECK(cudaMemset(d[0], 0xFF, n * 2));  // NaN poison
  FORGE_RETURN_IF_ERROR(ours(0));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  FORGE_ASSIGN_OR_RETURN(const std::vector<float> got, Download(d[0], n));
  double num = 0, den = 0;
  int64_t nonfinite = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) ++nonfinite;
    const double e = double(got[i]) - double(ref[i]);
    num += e * e;
    den += double(ref[i]) * double(ref[i]);
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  FORGE_ASSIGN_OR_RETURN(const float us_lt, MedianUs(stream, reps, sets, cublas));
  FORGE_ASSIGN_OR_RETURN(const float us_ours, MedianUs(stream, reps, sets, ours));
  const double flop = 2.0 * double(sh.M) * double(sh.N) * double(sh.K);
  nlohmann::ordered_json j;
  j["gemm"] = sh.name;
  j["M"] = sh.M, j["N"] = sh.N, j["K"] = sh.K;
  j["rel_diff_vs_cublaslt"] = rel;
  j["nonfinite"] = nonfinite;
  j["cublaslt_us"] = us_lt;
  j["wgmma_us"] = us_ours;
  j["cublaslt_tflops"] = flop / (double(us_lt) * 1e6);
  j["wgmma_tflops"] = flop / (double(us_ours) * 1e6);
  j["ok"] = nonfinite == 0 && rel < 1e-2;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  for (int i = 0; i < sets; ++i) {
    cudaFree(a[size_t(i)]), cudaFree(b[size_t(i)]), cudaFree(d[size_t(i)]);
  }
  return Status::Ok();
}


int64_t Mismatches(const void* x, const void* y, size_t n) {
  std::vector<uint16_t> a(n), b(n);
  if (cudaMemcpy(a.data(), x, n * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(b.data(), y, n * 2, cudaMemcpyDeviceToHost) != cudaSuccess)
    return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += a[i] != b[i];
  return bad;
}

// gpt350m B 16: 16384 tokens, d 1024, 16 heads of 64 (Q, K, V), ffn 2816, T 1024.
Status RunFused(int reps, int sets, cuda::GemmRunner& lt, cudaStream_t stream) {
  const int64_t M = 16384, d = 1024, qkv = 3072, ffn = 2816;
  const int T = 1024, H = 16, hd = 64;
  const size_t nsets = static_cast<size_t>(sets);
  std::vector<void*> x(nsets), wq(nsets), wgu(nsets);
  void *y_ref, *y, *gu_ref, *gu, *h_ref, *h;
  float2* table;
  for (size_t i = 0; i < nsets; ++i) {
    FORGE_CUDA_CHECK(cudaMalloc(&x[i], size_t(M * d) * 2));
    FORGE_CUDA_CHECK(cudaMalloc(&wq[i], size_t(qkv * d) * 2));
    FORGE_CUDA_CHECK(cudaMalloc(&wgu[i], size_t(2 * ffn * d) * 2));
    FORGE_RETURN_IF_ERROR(FillRandom(x[i], size_t(M * d), 100 + 3 * i));
    FORGE_RETURN_IF_ERROR(FillRandom(wq[i], size_t(qkv * d), 101 + 3 * i));
    FORGE_RETURN_IF_ERROR(FillRandom(wgu[i], size_t(2 * ffn * d), 102 + 3 * i));
  }
  FORGE_CUDA_CHECK(cudaMalloc(&y_ref, size_t(M * qkv) * 2));
  FORGE_CUDA_CHECK(cudaMalloc(&y, size_t(M * qkv) * 2));
  FORGE_CUDA_CHECK(cudaMalloc(&gu_ref, size_t(M * 2 * ffn) * 2));
  FORGE_CUDA_CHECK(cudaMalloc(&gu, size_t(M * 2 * ffn) * 2));
  FORGE_CUDA_CHECK(cudaMalloc(&h_ref, size_t(M * ffn) * 2));
  FORGE_CUDA_CHECK(cudaMalloc(&h, size_t(M * ffn) * 2));
  FORGE_CUDA_CHECK(cudaMalloc(&table, size_t(T * hd / 2) * sizeof(float2)));
  FORGE_RETURN_IF_ERROR(cuda::RopeSinCosTable(table, T, hd, 10000.0f, stream));

  auto qkv_ref = [&](int i) -> Status {
    cuda::GemmArgs g;
    g.M = M, g.N = qkv, g.K = d, g.A = x[size_t(i)], g.B = wq[size_t(i)], g.D = y_ref;
    FORGE_RETURN_IF_ERROR(lt.Run(g, stream));
    return cuda::RopeApply(static_cast<cuda::bf16*>(y_ref), int(M / T), T, H, H, hd, 10000.0f, false,
                           stream);
  };
  auto qkv_ours = [&](int i) {
    cuda::WgmmaGemmArgs g;
    g.M = M, g.N = qkv, g.K = d, g.A = x[size_t(i)], g.B = wq[size_t(i)], g.D = y;
    g.epilogue = cuda::WgmmaEpilogue::kRope;
    g.epi.rope_sin_cos = table, g.epi.T = T, g.epi.hd = hd, g.epi.rot_cols = 2 * H * hd;
    return cuda::WgmmaGemmBf16(g, stream);
  };
  auto gu_ref_run = [&](int i) -> Status {
    cuda::GemmArgs g;
    g.M = M, g.N = 2 * ffn, g.K = d, g.A = x[size_t(i)], g.B = wgu[size_t(i)], g.D = gu_ref;
    FORGE_RETURN_IF_ERROR(lt.Run(g, stream));
    return cuda::SwiGluForward(static_cast<cuda::bf16*>(h_ref), static_cast<const cuda::bf16*>(gu_ref), M,
                               int(ffn), stream);
  };
  auto gu_ours = [&](int i) {
    cuda::WgmmaGemmArgs g;
    g.M = M, g.N = 2 * ffn, g.K = d, g.A = x[size_t(i)], g.B = wgu[size_t(i)], g.D = h;
    g.epilogue = cuda::WgmmaEpilogue::kSwiGlu;
    g.epi.gu = static_cast<__nv_bfloat16*>(gu), g.epi.ffn = int(ffn);
    return cuda::WgmmaGemmBf16(g, stream);
  };
  FORGE_RETURN_IF_ERROR(qkv_ref(0));
  FORGE_CUDA_CHECK(cudaMemset(y, 0xFF, size_t(M * qkv) * 2));
  FORGE_RETURN_IF_ERROR(qkv_ours(0));
  FORGE_RETURN_IF_ERROR(gu_ref_run(0));
  FORGE_CUDA_CHECK(cudaMemset(gu, 0xFF, size_t(M * 2 * ffn) * 2));
  FORGE_CUDA_CHECK(cudaMemset(h, 0xFF, size_t(M * ffn) * 2));
  FORGE_RETURN_IF_ERROR(gu_ours(0));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t bad_qkv = Mismatches(y, y_ref, size_t(M * qkv));
  const int64_t bad_gu = Mismatches(gu, gu_ref, size_t(M * 2 * ffn));
  const int64_t bad_h = Mismatches(h, h_ref, size_t(M * ffn));
  FORGE_ASSIGN_OR_RETURN(const float us_qkv_ref, MedianUs(stream, reps, sets, qkv_ref));
  FORGE_ASSIGN_OR_RETURN(const float us_qkv, MedianUs(stream, reps, sets, qkv_ours));
  FORGE_ASSIGN_OR_RETURN(const float us_gu_ref, MedianUs(stream, reps, sets, gu_ref_run));
  FORGE_ASSIGN_OR_RETURN(const float us_gu, MedianUs(stream, reps, sets, gu_ours));
  nlohmann::ordered_json j;
  j["fused"] = "qkv_rope";
  j["mismatches"] = bad_qkv;
  j["cublaslt_plus_kernel_us"] = us_qkv_ref;
  j["wgmma_fused_us"] = us_qkv;
  j["ok"] = bad_qkv == 0;
  std::printf("%s\n", j.dump().c_str());
  j = nlohmann::ordered_json{};
  j["fused"] = "gate_up_swiglu";
  j["mismatches_gu"] = bad_gu;
  j["mismatches_h"] = bad_h;
  j["cublaslt_plus_kernel_us"] = us_gu_ref;
  j["wgmma_fused_us"] = us_gu;
  j["ok"] = bad_gu == 0 && bad_h == 0;
  std::printf("%s\n", j.dump().c_str());
  for (size_t i = 0; i < nsets; ++i) cudaFree(x[i]), cudaFree(wq[i]), cudaFree(wgu[i]);
  for (void* p : {y_ref, y, gu_ref, gu, h_ref, h, static_cast<void*>(table)}) cudaFree(p);
  return Status::Ok();
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) {
  using namespace forge;
  int reps = 30, sets = 3;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (f == "--reps" && v && bench::ParseInt(v, &reps) && reps > 0) ++i;
    else if (f == "--sets" && v && bench::ParseInt(v, &sets) && sets > 0) ++i;
    else if (f == "--only" && v) only = v, ++i;
    else return bench::FailJson("forge-wgmma-bench", "bad flag or value: " + f);
  }
  const Shape shapes[] = {{"small", 256, 512, 128},        {"qkv_fwd", 16384, 3072, 1024},
                          {"out_fwd", 16384, 1024, 1024},  {"gate_up_fwd", 16384, 5632, 1024},
                          {"down_fwd", 16384, 1024, 2816}, {"square8192", 8192, 8192, 8192}};
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) return bench::FailJson("forge-wgmma-bench", "no GPU");
  cuda::GemmRunner lt;
  if (Status s = lt.Init(); !s.ok()) return bench::FailJson("forge-wgmma-bench", s.ToString());
  int rc = 0;
  for (const Shape& sh : shapes) {
    if (!only.empty() && std::string(sh.name).find(only) == std::string::npos) continue;
    if (Status s = RunShape(sh, reps, sets, lt, stream); !s.ok()) {
      std::printf("%s\n", nlohmann::ordered_json{{"gemm", sh.name}, {"error", s.ToString()}}.dump().c_str());
      rc = 1;
    }
  }
  if (only.empty() || only == "fused") {
    if (Status s = RunFused(reps, sets, lt, stream); !s.ok()) {
      std::printf("%s\n", nlohmann::ordered_json{{"fused", "all"}, {"error", s.ToString()}}.dump().c_str());
      rc = 1;
    }
  }
  return rc;
}
