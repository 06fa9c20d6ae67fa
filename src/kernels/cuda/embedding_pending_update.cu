// Why: at a step's start the deferred update must finish the embedding table (the largest
// unit: p, g, m, v read and p, m, v, bf16 written, ~30 bytes a parameter, 1.5 GB at gpt350m)
// before the first block can run, and nothing else is ready to overlap it. Only the N rows the
// batch looks up are needed that early; computing those here reads 16 bytes an element of N*d
// (268 MB at gpt350m B 16, fewer with repeated tokens) and the table's full update moves to
// the end of the update stream, where it overlaps the blocks' forward.
//
// One thread per 4 columns of a token (float4 loads of p, g, m, v; an 8-byte bf16 store), or
// per column where d or the pointers do not allow it. m and v are updated in registers only.
#include "kernels/cuda/embedding_pending_update.cuh"

#include <algorithm>
#include <string>

#include "kernels/cuda/adamw_math.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;

template <int VEC>
__global__ void __launch_bounds__(kThreads)
    EmbeddingPendingUpdateKernel(bf16* __restrict__ out, const int32_t* __restrict__ tokens,
                                 AdamWTensor T, int64_t N, int d,
                                 const AdamWHyper* __restrict__ hyper,
                                 const float* __restrict__ grad_scale,
                                 const int* __restrict__ gate) {
  const bool apply = *gate != 0 && isfinite(*grad_scale);
  AdamWConsts c{};
  if (apply) c = MakeAdamWConsts(*hyper, *grad_scale);
  const int64_t per_row = d / VEC;
  const int64_t total = N * per_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / per_row;
    const int64_t col = (i % per_row) * VEC;
    const int64_t src = int64_t{tokens[n]} * d + col;
    const int64_t dst = n * d + col;
    if constexpr (VEC == 4) {
      if (!apply) {
        *reinterpret_cast<uint2*>(out + dst) = *reinterpret_cast<const uint2*>(T.param_bf16 + src);
        continue;
      }
      float4 p = *reinterpret_cast<const float4*>(T.param + src);
      const float4 g = *reinterpret_cast<const float4*>(T.grad + src);
      float4 m = *reinterpret_cast<const float4*>(T.m + src);
      float4 v = *reinterpret_cast<const float4*>(T.v + src);
      AdamWElement(p.x, g.x, m.x, v.x, c, T.weight_decay);
      AdamWElement(p.y, g.y, m.y, v.y, c, T.weight_decay);
      AdamWElement(p.z, g.z, m.z, v.z, c, T.weight_decay);
      AdamWElement(p.w, g.w, m.w, v.w, c, T.weight_decay);
      *reinterpret_cast<uint2*>(out + dst) =
          make_uint2(PackBf16x2(p.x, p.y), PackBf16x2(p.z, p.w));
    } else {
      if (!apply) {
        out[dst] = T.param_bf16[src];
        continue;
      }
      float p = T.param[src], m = T.m[src], v = T.v[src];
      AdamWElement(p, T.grad[src], m, v, c, T.weight_decay);
      out[dst] = __float2bfloat16_rn(p);
    }
  }
}

}  // namespace

Status EmbeddingForwardPendingUpdate(bf16* out, const int32_t* tokens, const AdamWTensor& table,
                                     int64_t N, int d, const AdamWHyper* hyper,
                                     const float* grad_scale, const int* gate,
                                     cudaStream_t stream) {
  if (N < 0 || d <= 0 || table.n % d != 0) {
    return Status::Invalid("EmbeddingForwardPendingUpdate: bad shape N=" + std::to_string(N) +
                           " d=" + std::to_string(d) + " table elements " +
                           std::to_string(table.n));
  }
  if (out == nullptr || tokens == nullptr || table.param == nullptr ||
      table.param_bf16 == nullptr || table.grad == nullptr || table.m == nullptr ||
      table.v == nullptr || hyper == nullptr || grad_scale == nullptr || gate == nullptr) {
    return Status::Invalid("EmbeddingForwardPendingUpdate: null pointer");
  }
  if (N == 0) return Status::Ok();
  const bool vec = d % 4 == 0 && IsAligned(out, 8) && IsAligned(table.param_bf16, 8) &&
                   IsAligned(table.param, 16) && IsAligned(table.grad, 16) &&
                   IsAligned(table.m, 16) && IsAligned(table.v, 16);
  const int64_t items = vec ? N * (d / 4) : N * d;
  const int blocks = static_cast<int>(std::min<int64_t>(CeilDiv(items, kThreads), 65536));
  if (vec) {
    EmbeddingPendingUpdateKernel<4><<<blocks, kThreads, 0, stream>>>(out, tokens, table, N, d,
                                                                     hyper, grad_scale, gate);
  } else {
    EmbeddingPendingUpdateKernel<1><<<blocks, kThreads, 0, stream>>>(out, tokens, table, N, d,
                                                                     hyper, grad_scale, gate);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
