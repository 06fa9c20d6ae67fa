// One block per row: the row's cos/sin table (hd/2 pairs, computed once in double) in shared
// memory, then one warp per head; a lane owns whole rotation pairs, so the QK-norm's sum of
// squares (double, butterfly over the warp) is complete before any lane overwrites its pair.
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_qkv_to_cache.h"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHd = 512;

__global__ void __launch_bounds__(kThreads) DecodeQkvKernel(DecodeQkvArgs a) {
  __shared__ float s_cos[kMaxHd / 2], s_sin[kMaxHd / 2];
  const int64_t n = blockIdx.x;
  const int hd = a.hd, half = hd / 2;
  const int s = a.seq[n], t = a.pos[n];
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const double ang = double(t) * a.inv_freq[i];
    s_cos[i] = static_cast<float>(cos(ang));
    s_sin[i] = static_cast<float>(sin(ang));
  }
  __syncthreads();
  const int H = a.n_head, KV = a.n_kv_head;
  float* row = a.qkv + n * int64_t{H + 2 * KV} * hd;
  const int64_t cache_off = (int64_t{s} * a.max_len + t) * int64_t{KV} * hd;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = kThreads / 32;
  for (int h = warp; h < H + 2 * KV; h += warps) {
    float* x = row + int64_t{h} * hd;
    if (h >= H + KV) {  // V: straight into the cache
      bf16* dst = a.v_cache + cache_off + int64_t{h - H - KV} * hd;
      for (int i = lane; i < hd; i += 32) dst[i] = __float2bfloat16_rn(x[i]);
      continue;
    }
    const bf16* w = h < H ? a.q_norm : a.k_norm;
    float r = 1.0f;
    if (w != nullptr) {
      double ss = 0.0;
      for (int i = lane; i < half; i += 32) {
        const float x0 = x[2 * i], x1 = x[2 * i + 1];
        ss += double(x0) * double(x0) + double(x1) * double(x1);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      r = static_cast<float>(1.0 / sqrt(ss / hd + double(a.norm_eps)));
    }
    for (int i = lane; i < half; i += 32) {
      float x0 = x[2 * i], x1 = x[2 * i + 1];
      if (w != nullptr) {
        x0 = __fmul_rn(__fmul_rn(x0, r), __bfloat162float(w[2 * i]));
        x1 = __fmul_rn(__fmul_rn(x1, r), __bfloat162float(w[2 * i + 1]));
      }
      const float c = s_cos[i], sn = s_sin[i];
      // Products rounded apart, no FMA: the CPU reference's float arithmetic.
      const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
      const float y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
      if (h < H) {
        x[2 * i] = y0;
        x[2 * i + 1] = y1;
      } else {
        bf16* dst = a.k_cache + cache_off + int64_t{h - H} * hd;
        dst[2 * i] = __float2bfloat16_rn(y0);
        dst[2 * i + 1] = __float2bfloat16_rn(y1);
      }
    }
  }
}

}  // namespace

Status DecodeQkvToCache(const DecodeQkvArgs& a, cudaStream_t stream) {
  if (a.N < 0 || a.n_head <= 0 || a.n_kv_head <= 0 || a.hd <= 0 || a.hd % 2 != 0 ||
      a.hd > kMaxHd || a.max_len <= 0)
    return Status::Invalid("DecodeQkvToCache: unsupported shape H=" + std::to_string(a.n_head) +
                           " KV=" + std::to_string(a.n_kv_head) + " hd=" + std::to_string(a.hd) +
                           " (hd even and <= " + std::to_string(kMaxHd) + ")");
  if ((a.q_norm == nullptr) != (a.k_norm == nullptr))
    return Status::Invalid("DecodeQkvToCache: q_norm and k_norm must be given together");
  if (a.N == 0) return Status::Ok();
  DecodeQkvKernel<<<static_cast<unsigned>(a.N), kThreads, 0, stream>>>(a);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
