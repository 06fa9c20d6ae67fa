// forge-wgmma-bench: our own warpgroup-MMA BF16 GEMM (kernels/cuda/gemm_wgmma.cu) beside
// cuBLASLt (GemmRunner, what the step runs) on the forward GEMMs of gpt350m and the backward's
// input-gradient GEMMs (dX = dY W: B N-major), one JSON line each.
//
//   forge-wgmma-bench [--reps 30] [--sets 3] [--only SUBSTRING] [--group-rows N]
//
// For each shape: ||ours - cuBLASLt|| / ||cuBLASLt|| on random non-zero operands (our output is
// poisoned with NaN first, so an element we fail to write fails the check), then the median
// time of each over --reps calls rotating over --sets operand sets (L2 holds none of them),
// the two interleaved (Timer::MedianPair) so that both run in the same power state.
// Shapes are gpt350m B 16's and (names ending _1b) llama3-1b B 2's (16,384 tokens each).
// Then the fused epilogues against what they replace, on both models' shapes: the QKV GEMM
// with RoPE vs cuBLASLt + RopeApply, the gate/up GEMM with SwiGLU vs cuBLASLt + SwiGluForward,
// the down projection's input gradient with SwiGLU's backward vs cuBLASLt + SwiGluBackward:
// elements that differ (bitwise) and the times of both. --group-rows sets our GEMMs' tile
// order (tile_order.h; 1 is row-major, default the kernel's). `--only fp8`: the FP8 form (E4M3
// operands) beside cuBLASLt's FP8 GEMM with fast accumulation (how ours sums) on the QKV shape,
// plain and with RoPE (vs cuBLASLt + RopeApply), and on the gate/up shape, plain and with
// SwiGLU writing h's FP8 casts (vs cuBLASLt + SwiGluForwardFp8): the relative difference of
// the bf16 output each pair shares (qkv, gu), and both times.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "common/status.h"
#include "cuda_bench_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#include "kernels/cuda/swiglu_fp8.h"

namespace forge {
namespace {

using bench::Alloc;
using bench::DevBuf;
using bench::DownloadBf16;
using bench::RandomPool;
using bench::Timer;

struct Shape {
  const char* name;
  int64_t M, N, K;
  bool n_major = false;  // B is [K, N] (dX = dY W) instead of [N, K]
};

// `sets` random bf16 buffers of n elements each.
Status RandomSets(const RandomPool& pool, int sets, size_t n, uint64_t seed,
                  std::vector<DevBuf>* out) {
  for (int i = 0; i < sets; ++i) {
    out->emplace_back();
    FORGE_RETURN_IF_ERROR(Alloc(&out->back(), n * 2));
    FORGE_RETURN_IF_ERROR(pool.Fill(out->back().p, n, seed + 3 * uint64_t(i)));
  }
  return Status::Ok();
}

// `ref` (cuBLASLt) and `ours` once on operand set 0, ours into a NaN-poisoned output (which
// may be ref's buffer: ref's is read first), their bf16 outputs compared, then both timed.
struct PairResult {
  double rel = 0;         // ||ours - ref|| / ||ref||
  int64_t nonfinite = 0;  // elements of ours not written (or not finite)
  float us_ref = 0, us_ours = 0;
};
StatusOr<PairResult> RunPair(const std::function<Status(int)>& ref,
                             const std::function<Status(int)>& ours, const DevBuf& out_ref,
                             const DevBuf& out_ours, Timer& timer, cudaStream_t stream) {
  const size_t n = out_ref.bytes / 2;
  FORGE_RETURN_IF_ERROR(ref(0));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  FORGE_ASSIGN_OR_RETURN(const std::vector<float> want, DownloadBf16(out_ref.p, n));
  FORGE_CUDA_CHECK(cudaMemset(out_ours.p, 0xFF, out_ours.bytes));
  FORGE_RETURN_IF_ERROR(ours(0));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  FORGE_ASSIGN_OR_RETURN(const std::vector<float> got, DownloadBf16(out_ours.p, n));
  PairResult r;
  for (float v : got) r.nonfinite += !std::isfinite(v);
  r.rel = bench::RelDiff(got, want);
  FORGE_ASSIGN_OR_RETURN(const auto us, timer.MedianPair(ref, ours));
  r.us_ref = us.first, r.us_ours = us.second;
  return r;
}

Status RunShape(const Shape& sh, const RandomPool& pool, Timer& timer, int sets, int group_rows,
                cuda::GemmRunner& lt, cudaStream_t stream) {
  std::vector<DevBuf> a, b, d;
  FORGE_RETURN_IF_ERROR(RandomSets(pool, sets, size_t(sh.M * sh.K), 1, &a));
  FORGE_RETURN_IF_ERROR(RandomSets(pool, sets, size_t(sh.N * sh.K), 2, &b));
  d.resize(size_t(sets));
  for (DevBuf& out : d) FORGE_RETURN_IF_ERROR(Alloc(&out, size_t(sh.M * sh.N) * 2));
  auto ours = [&](int i) {
    cuda::WgmmaGemmArgs g;
    g.M = sh.M, g.N = sh.N, g.K = sh.K;
    g.A = a[size_t(i)].p, g.B = b[size_t(i)].p, g.D = d[size_t(i)].p;
    g.b_n_major = sh.n_major;
    g.group_rows = group_rows;
    return cuda::WgmmaGemmBf16(g, stream);
  };
  auto cublas = [&](int i) {
    cuda::GemmArgs g;
    g.M = sh.M, g.N = sh.N, g.K = sh.K;
    g.A = a[size_t(i)].p, g.B = b[size_t(i)].p, g.D = d[size_t(i)].p;
    g.trans_b = !sh.n_major;
    return lt.Run(g, stream);
  };
  FORGE_ASSIGN_OR_RETURN(const PairResult r, RunPair(cublas, ours, d[0], d[0], timer, stream));
  const double flop = 2.0 * double(sh.M) * double(sh.N) * double(sh.K);
  nlohmann::ordered_json j;
  j["gemm"] = sh.name;
  j["M"] = sh.M, j["N"] = sh.N, j["K"] = sh.K;
  j["b"] = sh.n_major ? "n_major" : "k_major";
  j["group_rows"] = group_rows;
  j["rel_diff_vs_cublaslt"] = r.rel;
  j["nonfinite"] = r.nonfinite;
  j["cublaslt_us"] = r.us_ref;
  j["wgmma_us"] = r.us_ours;
  j["cublaslt_tflops"] = flop / (double(r.us_ref) * 1e6);
  j["wgmma_tflops"] = flop / (double(r.us_ours) * 1e6);
  j["ok"] = r.nonfinite == 0 && r.rel < 1e-2;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return Status::Ok();
}

// Elements whose bf16 bits differ.
StatusOr<int64_t> Mismatches(const DevBuf& x, const DevBuf& y) {
  const size_t n = x.bytes / 2;
  std::vector<uint16_t> a(n), b(n);
  FORGE_CUDA_CHECK(cudaMemcpy(a.data(), x.p, n * 2, cudaMemcpyDeviceToHost));
  FORGE_CUDA_CHECK(cudaMemcpy(b.data(), y.p, n * 2, cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += a[i] != b[i];
  return bad;
}

// One fused GEMM (`ours`) beside cuBLASLt + the kernel it replaces (`ref`): both run once on
// operand set 0, ours into NaN-poisoned outputs, each output pair compared bit for bit (its
// mismatch count under `key`), then both timed; one JSON line.
struct Compared {
  const char* key;
  const DevBuf* ours;
  const DevBuf* ref;
};
Status CompareFused(const char* model, const char* fused, const std::function<Status(int)>& ref,
                    const std::function<Status(int)>& ours, const std::vector<Compared>& outputs,
                    Timer& timer, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(ref(0));
  for (const Compared& c : outputs) FORGE_CUDA_CHECK(cudaMemset(c.ours->p, 0xFF, c.ours->bytes));
  FORGE_RETURN_IF_ERROR(ours(0));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  nlohmann::ordered_json j;
  j["fused"] = fused;
  j["model"] = model;
  bool ok = true;
  for (const Compared& c : outputs) {
    FORGE_ASSIGN_OR_RETURN(const int64_t bad, Mismatches(*c.ours, *c.ref));
    j[c.key] = bad;
    ok = ok && bad == 0;
  }
  FORGE_ASSIGN_OR_RETURN(const auto us, timer.MedianPair(ref, ours));
  j["cublaslt_plus_kernel_us"] = us.first;
  j["wgmma_fused_us"] = us.second;
  j["ok"] = ok;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return Status::Ok();
}

// A model's shapes for the fused epilogues: tokens, width, query and KV heads of 64, ffn, T.
struct FusedModel {
  const char* name;
  int64_t M, d;
  int n_head, n_kv_head;
  int64_t ffn;
  int T;
};

Status RunFused(const FusedModel& fm, const RandomPool& pool, Timer& timer, int sets,
                int group_rows, cuda::GemmRunner& lt, cudaStream_t stream) {
  const int64_t M = fm.M, d = fm.d, ffn = fm.ffn;
  const int T = fm.T, H = fm.n_head, KvH = fm.n_kv_head, hd = 64;
  const int64_t qkv = int64_t(H + 2 * KvH) * hd;
  std::vector<DevBuf> x, wq, wgu;
  FORGE_RETURN_IF_ERROR(RandomSets(pool, sets, size_t(M * d), 100, &x));
  FORGE_RETURN_IF_ERROR(RandomSets(pool, sets, size_t(qkv * d), 101, &wq));
  FORGE_RETURN_IF_ERROR(RandomSets(pool, sets, size_t(2 * ffn * d), 102, &wgu));
  DevBuf y_ref, y, gu_ref, gu, h_ref, h, table, freq;
  FORGE_RETURN_IF_ERROR(Alloc(&y_ref, size_t(M * qkv) * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&y, size_t(M * qkv) * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&gu_ref, size_t(M * 2 * ffn) * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&gu, size_t(M * 2 * ffn) * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&h_ref, size_t(M * ffn) * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&h, size_t(M * ffn) * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&table, size_t(T * hd / 2) * sizeof(float2)));
  auto* sin_cos = static_cast<float2*>(table.p);
  FORGE_RETURN_IF_ERROR(Alloc(&freq, size_t(hd / 2) * sizeof(float)));
  const auto* inv_freq = static_cast<const float*>(freq.p);
  FORGE_RETURN_IF_ERROR(
      cuda::RopePlainInverseFrequencies(static_cast<float*>(freq.p), hd, 10000.0f, stream));
  FORGE_RETURN_IF_ERROR(cuda::RopeSinCosTable(sin_cos, T, hd, inv_freq, stream));

  auto qkv_ref = [&](int i) -> Status {
    cuda::GemmArgs g;
    g.M = M, g.N = qkv, g.K = d, g.A = x[size_t(i)].p, g.B = wq[size_t(i)].p, g.D = y_ref.p;
    FORGE_RETURN_IF_ERROR(lt.Run(g, stream));
    return cuda::RopeApply(static_cast<cuda::bf16*>(y_ref.p), int(M / T), T, H, KvH, hd, inv_freq,
                           false, stream);
  };
  auto qkv_ours = [&](int i) {
    cuda::WgmmaGemmArgs g;
    g.M = M, g.N = qkv, g.K = d, g.A = x[size_t(i)].p, g.B = wq[size_t(i)].p, g.D = y.p;
    g.epilogue = cuda::WgmmaEpilogue::kRope;
    g.epi.rope_sin_cos = sin_cos, g.epi.T = T, g.epi.hd = hd, g.epi.rot_cols = (H + KvH) * hd;
    g.group_rows = group_rows;
    return cuda::WgmmaGemmBf16(g, stream);
  };
  auto gu_ref_run = [&](int i) -> Status {
    cuda::GemmArgs g;
    g.M = M, g.N = 2 * ffn, g.K = d, g.A = x[size_t(i)].p, g.B = wgu[size_t(i)].p, g.D = gu_ref.p;
    FORGE_RETURN_IF_ERROR(lt.Run(g, stream));
    return cuda::SwiGluForward(static_cast<cuda::bf16*>(h_ref.p),
                               static_cast<const cuda::bf16*>(gu_ref.p), M, int(ffn), stream);
  };
  auto gu_ours = [&](int i) {
    cuda::WgmmaGemmArgs g;
    g.M = M, g.N = 2 * ffn, g.K = d, g.A = x[size_t(i)].p, g.B = wgu[size_t(i)].p, g.D = h.p;
    g.epilogue = cuda::WgmmaEpilogue::kSwiGlu;
    g.epi.gu = static_cast<__nv_bfloat16*>(gu.p), g.epi.ffn = int(ffn);
    g.group_rows = group_rows;
    return cuda::WgmmaGemmBf16(g, stream);
  };
  FORGE_RETURN_IF_ERROR(CompareFused(fm.name, "qkv_rope", qkv_ref, qkv_ours,
                                     {{"mismatches", &y, &y_ref}}, timer, stream));
  FORGE_RETURN_IF_ERROR(
      CompareFused(fm.name, "gate_up_swiglu", gu_ref_run, gu_ours,
                   {{"mismatches_gu", &gu, &gu_ref}, {"mismatches_h", &h, &h_ref}}, timer, stream));

  // SwiGLU's backward in the down projection's dgrad: dh = dy W_down (W_down [d, ffn], N-major),
  // then dgu from dh and gu; against cuBLASLt's dgrad + SwiGluBackward. gu_ref (the forward's
  // gate/up output above) is the input, x[i] stands in for dy.
  std::vector<DevBuf> wdown;
  FORGE_RETURN_IF_ERROR(RandomSets(pool, sets, size_t(d * ffn), 103, &wdown));
  DevBuf dh, dgu_ref, dgu;
  FORGE_RETURN_IF_ERROR(Alloc(&dh, size_t(M * ffn) * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&dgu_ref, size_t(M * 2 * ffn) * 2));
  FORGE_RETURN_IF_ERROR(Alloc(&dgu, size_t(M * 2 * ffn) * 2));
  const auto* gu_in = static_cast<const cuda::bf16*>(gu_ref.p);
  auto bwd_ref = [&](int i) -> Status {
    cuda::GemmArgs g;
    g.M = M, g.N = ffn, g.K = d, g.A = x[size_t(i)].p, g.B = wdown[size_t(i)].p, g.D = dh.p;
    g.trans_b = false;  // W_down [d, ffn] is [K, N]
    FORGE_RETURN_IF_ERROR(lt.Run(g, stream));
    return cuda::SwiGluBackward(static_cast<cuda::bf16*>(dgu_ref.p),
                                static_cast<const cuda::bf16*>(dh.p), gu_in, M, int(ffn), stream);
  };
  auto bwd_ours = [&](int i) {
    cuda::WgmmaGemmArgs g;
    g.M = M, g.N = ffn, g.K = d, g.A = x[size_t(i)].p, g.B = wdown[size_t(i)].p, g.D = dgu.p;
    g.b_n_major = true;
    g.epilogue = cuda::WgmmaEpilogue::kSwiGluBackward;
    g.epi.gu = const_cast<cuda::bf16*>(gu_in), g.epi.ffn = int(ffn);
    g.group_rows = group_rows;
    return cuda::WgmmaGemmBf16(g, stream);
  };
  return CompareFused(fm.name, "down_dgrad_swiglu_bwd", bwd_ref, bwd_ours,
                      {{"mismatches_dgu", &dgu, &dgu_ref}}, timer, stream);
}

// One FP8 row: RunPair's numbers as a JSON line.
Status ComparePair(const char* name, const std::function<Status(int)>& ref,
                   const std::function<Status(int)>& ours, const DevBuf& out_ref,
                   const DevBuf& out_ours, Timer& timer, cudaStream_t stream) {
  FORGE_ASSIGN_OR_RETURN(const PairResult r, RunPair(ref, ours, out_ref, out_ours, timer, stream));
  nlohmann::ordered_json j;
  j["fp8"] = name;
  j["rel_diff_vs_cublaslt"] = r.rel;
  j["nonfinite"] = r.nonfinite;
  j["cublaslt_us"] = r.us_ref;
  j["wgmma_us"] = r.us_ours;
  j["ok"] = r.nonfinite == 0 && r.rel < 2e-2;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return Status::Ok();
}

// The FP8 rows (see the header comment), gpt350m B 16.
Status RunFp8(const RandomPool& pool, Timer& timer, int sets, cuda::GemmRunner& lt,
              cudaStream_t stream) {
  const int64_t M = 16384, d = 1024, ffn = 2816;
  // Scale slots, 16 bytes apart: 1 (operands' dequantisation and D's quantisation), then
  // amax and scale_inv for ours and the reference.
  std::vector<float> slots(32, 0.0f);
  slots[0] = 1.0f;
  DevBuf slot_buf;
  FORGE_RETURN_IF_ERROR(Alloc(&slot_buf, slots.size() * 4));
  FORGE_CUDA_CHECK(cudaMemcpy(slot_buf.p, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice));
  float* one = static_cast<float*>(slot_buf.p);
  float* amax[2] = {one + 4, one + 8};
  float* scale_inv[2] = {one + 12, one + 16};
  // `sets` FP8 buffers of rows x cols: random bf16 cast with scale 1.
  DevBuf tmp;
  FORGE_RETURN_IF_ERROR(Alloc(&tmp, size_t(M * 2 * ffn) * 2));
  auto fp8_sets = [&](int64_t rows, int64_t cols, uint64_t seed,
                      std::vector<DevBuf>* out) -> Status {
    for (int i = 0; i < sets; ++i) {
      out->emplace_back();
      FORGE_RETURN_IF_ERROR(Alloc(&out->back(), size_t(rows * cols)));
      FORGE_RETURN_IF_ERROR(pool.Fill(tmp.p, size_t(rows * cols), seed + 3 * uint64_t(i)));
      FORGE_RETURN_IF_ERROR(cuda::CastToFp8(out->back().p, static_cast<const cuda::bf16*>(tmp.p),
                                            rows, cols, cuda::DType::kE4M3, one, nullptr, nullptr,
                                            stream));
    }
    return Status::Ok();
  };
  std::vector<DevBuf> x, wgu, wqkv;
  FORGE_RETURN_IF_ERROR(fp8_sets(M, d, 200, &x));
  FORGE_RETURN_IF_ERROR(fp8_sets(2 * ffn, d, 201, &wgu));
  FORGE_RETURN_IF_ERROR(fp8_sets(3 * d, d, 202, &wqkv));
  DevBuf qkv_ref, qkv, gu_ref, gu, q_ref, qt_ref, q, qt, sin_cos_buf, freq;
  for (DevBuf* b : {&qkv_ref, &qkv}) FORGE_RETURN_IF_ERROR(Alloc(b, size_t(M * 3 * d) * 2));
  for (DevBuf* b : {&gu_ref, &gu}) FORGE_RETURN_IF_ERROR(Alloc(b, size_t(M * 2 * ffn) * 2));
  for (DevBuf* b : {&q_ref, &qt_ref, &q, &qt}) FORGE_RETURN_IF_ERROR(Alloc(b, size_t(M * ffn)));
  const int T = 1024, H = 16, hd = 64;
  FORGE_RETURN_IF_ERROR(Alloc(&sin_cos_buf, size_t(T) * (hd / 2) * sizeof(float2)));
  const auto* sin_cos = static_cast<const float2*>(sin_cos_buf.p);
  FORGE_RETURN_IF_ERROR(Alloc(&freq, size_t(hd / 2) * sizeof(float)));
  const auto* inv_freq = static_cast<const float*>(freq.p);
  FORGE_RETURN_IF_ERROR(
      cuda::RopePlainInverseFrequencies(static_cast<float*>(freq.p), hd, 10000.0f, stream));
  FORGE_RETURN_IF_ERROR(
      cuda::RopeSinCosTable(static_cast<float2*>(sin_cos_buf.p), T, hd, inv_freq, stream));

  // x W^T for set i with W of `w`'s sets ([n, d]), into `out` (cuBLASLt) or as our GEMM's args.
  auto lt_gemm = [&](int i, const std::vector<DevBuf>& w, int64_t n, void* out) {
    cuda::GemmArgs g;
    g.M = M, g.N = n, g.K = d, g.A = x[size_t(i)].p, g.B = w[size_t(i)].p, g.D = out;
    g.trans_a = false, g.trans_b = true;
    g.a_type = cuda::DType::kE4M3, g.b_type = cuda::DType::kE4M3, g.d_type = cuda::DType::kBf16;
    g.a_scale = one, g.b_scale = one;
    g.fast_accum = true;
    return lt.Run(g, stream);
  };
  auto ours_gemm = [&](int i, const std::vector<DevBuf>& w, int64_t n, void* out) {
    cuda::WgmmaGemmArgs g;
    g.M = M, g.N = n, g.K = d, g.A = x[size_t(i)].p, g.B = w[size_t(i)].p, g.D = out;
    g.epi.a_scale = one, g.epi.b_scale = one;
    return g;
  };
  // The QKV projection (M 16384, N 3072, K 1024), plain and with RoPE (vs cuBLASLt +
  // RopeApply), then the gate/up projection (N 5632) plain and with SwiGLU.
  FORGE_RETURN_IF_ERROR(ComparePair(
      "qkv_fwd", [&](int i) { return lt_gemm(i, wqkv, 3 * d, qkv_ref.p); },
      [&](int i) { return cuda::WgmmaGemmFp8(ours_gemm(i, wqkv, 3 * d, qkv.p), stream); }, qkv_ref,
      qkv, timer, stream));
  FORGE_RETURN_IF_ERROR(ComparePair(
      "qkv_rope",
      [&](int i) -> Status {
        FORGE_RETURN_IF_ERROR(lt_gemm(i, wqkv, 3 * d, qkv_ref.p));
        return cuda::RopeApply(static_cast<cuda::bf16*>(qkv_ref.p), int(M / T), T, H, H, hd,
                               inv_freq, /*inverse=*/false, stream);
      },
      [&](int i) {
        cuda::WgmmaGemmArgs g = ours_gemm(i, wqkv, 3 * d, qkv.p);
        g.epilogue = cuda::WgmmaEpilogue::kRope;
        g.epi.rope_sin_cos = sin_cos, g.epi.T = T, g.epi.hd = hd, g.epi.rot_cols = 2 * H * hd;
        return cuda::WgmmaGemmFp8(g, stream);
      },
      qkv_ref, qkv, timer, stream));
  FORGE_RETURN_IF_ERROR(ComparePair(
      "gate_up_fwd", [&](int i) { return lt_gemm(i, wgu, 2 * ffn, gu_ref.p); },
      [&](int i) { return cuda::WgmmaGemmFp8(ours_gemm(i, wgu, 2 * ffn, gu.p), stream); }, gu_ref,
      gu, timer, stream));
  return ComparePair(
      "gate_up_swiglu",
      [&](int i) -> Status {
        FORGE_RETURN_IF_ERROR(lt_gemm(i, wgu, 2 * ffn, gu_ref.p));
        return cuda::SwiGluForwardFp8(q_ref.p, qt_ref.p, static_cast<const cuda::bf16*>(gu_ref.p),
                                      M, int(ffn), cuda::DType::kE4M3, one, amax[0], scale_inv[0],
                                      stream);
      },
      [&](int i) {
        cuda::WgmmaGemmArgs g = ours_gemm(i, wgu, 2 * ffn, q.p);
        g.epilogue = cuda::WgmmaEpilogue::kSwiGlu;
        g.epi.gu = static_cast<cuda::bf16*>(gu.p), g.epi.ffn = int(ffn);
        g.epi.h_t = qt.p, g.epi.h_scale = one, g.epi.h_amax = amax[1];
        g.epi.h_scale_inv = scale_inv[1];
        return cuda::WgmmaGemmFp8(g, stream);
      },
      gu_ref, gu, timer, stream);
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) {
  using namespace forge;
  FlagParser flags("forge-wgmma-bench", "",
                   "Times our Hopper wgmma GEMMs (BF16, FP8, fused epilogues) beside cuBLASLt; "
                   "prints JSON lines.");
  flags.Value("--reps", "N", "timed calls per set (default 30)");
  flags.Value("--sets", "N", "timed sets, the best kept (default 3)");
  flags.Value("--only", "NAME", "shapes whose name has it, or fp8 / fused / a model");
  flags.Value("--group-rows", "N", "our GEMMs' tile rows a band (default: the kernel's)");
  if (int rc; bench::ParseFlagsOrExit(flags, "forge-wgmma-bench", argc, argv, &rc)) return rc;
  int reps = 30, sets = 3;
  if (!bench::FlagInt(flags, "--reps", &reps) || reps < 1)
    return bench::FailJson("forge-wgmma-bench", bench::BadValue(flags, "--reps"));
  if (!bench::FlagInt(flags, "--sets", &sets) || sets < 1)
    return bench::FailJson("forge-wgmma-bench", bench::BadValue(flags, "--sets"));
  int group_rows = 0;
  if (!bench::FlagInt(flags, "--group-rows", &group_rows) || group_rows < 0)
    return bench::FailJson("forge-wgmma-bench", bench::BadValue(flags, "--group-rows"));
  const std::string only = flags.Get("--only");
  const Shape shapes[] = {{"small", 256, 512, 128},
                          {"qkv_fwd", 16384, 3072, 1024},
                          {"out_fwd", 16384, 1024, 1024},
                          {"gate_up_fwd", 16384, 5632, 1024},
                          {"down_fwd", 16384, 1024, 2816},
                          {"square8192", 8192, 8192, 8192},
                          {"qkv_dgrad", 16384, 1024, 3072, true},
                          {"out_dgrad", 16384, 1024, 1024, true},
                          {"gate_up_dgrad", 16384, 1024, 5632, true},
                          {"qkv_fwd_1b", 16384, 3072, 2048},
                          {"out_fwd_1b", 16384, 2048, 2048},
                          {"gate_up_fwd_1b", 16384, 16384, 2048},
                          {"down_fwd_1b", 16384, 2048, 8192},
                          {"qkv_dgrad_1b", 16384, 2048, 3072, true},
                          {"gate_up_dgrad_1b", 16384, 2048, 16384, true},
                          {"down_dgrad_1b", 16384, 8192, 2048, true}};
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) return bench::FailJson("forge-wgmma-bench", "no GPU");
  cuda::GemmRunner lt;
  if (Status s = lt.Init(); !s.ok()) return bench::FailJson("forge-wgmma-bench", s.ToString());
  bench::RandomPool pool;
  if (Status s = pool.Init(); !s.ok()) return bench::FailJson("forge-wgmma-bench", s.ToString());
  bench::Timer timer(stream, /*warmup=*/3, reps, sets);
  int rc = 0;
  for (const Shape& sh : shapes) {
    if (!only.empty() && std::string(sh.name).find(only) == std::string::npos) continue;
    if (Status s = RunShape(sh, pool, timer, sets, group_rows, lt, stream); !s.ok()) {
      std::printf("%s\n", nlohmann::ordered_json{{"gemm", sh.name}, {"error", s.ToString()}}.dump().c_str());
      rc = 1;
    }
  }
  if (only.empty() || only == "fp8") {
    if (Status s = RunFp8(pool, timer, sets, lt, stream); !s.ok()) {
      std::printf("%s\n",
                  nlohmann::ordered_json{{"fp8", "all"}, {"error", s.ToString()}}.dump().c_str());
      rc = 1;
    }
  }
  const FusedModel models[] = {{"gpt350m", 16384, 1024, 16, 16, 2816, 1024},
                               {"llama3-1b", 16384, 2048, 32, 8, 8192, 8192}};
  for (const FusedModel& fm : models) {
    if (!only.empty() && only != "fused" && only != fm.name) continue;
    if (Status s = RunFused(fm, pool, timer, sets, group_rows, lt, stream); !s.ok()) {
      std::printf(
          "%s\n",
          nlohmann::ordered_json{{"fused", fm.name}, {"error", s.ToString()}}.dump().c_str());
      rc = 1;
    }
  }
  return rc;
}
