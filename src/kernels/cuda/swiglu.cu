// SwiGLU forward/backward over the fused [N, 2*ffn] gate_up buffer (bf16 in/out, fp32 math).
//
// Bytes moved and design (bandwidth-bound, elementwise): forward reads gate and up (4*N*ffn)
// and writes out (2*N*ffn); backward reads dout (2*N*ffn) and gate_up (4*N*ffn) and writes
// dgate_up (4*N*ffn). One thread per 8 columns (16-byte loads of gate, up and dout, 16-byte
// stores), grid-stride. The vector path needs ffn % 8 == 0 and 16-byte aligned buffers; any
// other shape takes a one-column-per-thread path.
#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grid_stride.cuh"
#include "kernels/cuda/swiglu.h"
#include "kernels/cuda/swiglu_math.cuh"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 16384;

template <int VEC>
__global__ void __launch_bounds__(kThreads)
    SwiGluForwardKernel(bf16* __restrict__ out, const bf16* __restrict__ gate_up, int64_t N,
                        int ffn) {
  ForEachRowGroup<VEC>(N, ffn, [&](int64_t n, int64_t c) {
    const bf16* gp = gate_up + n * 2 * ffn + c;
    float g[VEC], u[VEC], o[VEC];
    LoadVec<VEC>(gp, g);
    LoadVec<VEC>(gp + ffn, u);
#pragma unroll
    for (int k = 0; k < VEC; ++k) o[k] = SwiGluOut(g[k], u[k]);
    StoreVec<VEC>(out + n * ffn + c, o);
  });
}

template <int VEC>
__global__ void __launch_bounds__(kThreads)
    SwiGluBackwardKernel(bf16* __restrict__ dgate_up, const bf16* __restrict__ dout,
                         const bf16* __restrict__ gate_up, int64_t N, int ffn) {
  ForEachRowGroup<VEC>(N, ffn, [&](int64_t n, int64_t c) {
    const bf16* gp = gate_up + n * 2 * ffn + c;
    float g[VEC], u[VEC], dy[VEC], dg[VEC], du[VEC];
    LoadVec<VEC>(gp, g);
    LoadVec<VEC>(gp + ffn, u);
    LoadVec<VEC>(dout + n * ffn + c, dy);
#pragma unroll
    for (int k = 0; k < VEC; ++k) SwiGluGrads(g[k], u[k], dy[k], &dg[k], &du[k]);
    bf16* dp = dgate_up + n * 2 * ffn + c;
    StoreVec<VEC>(dp, dg);
    StoreVec<VEC>(dp + ffn, du);
  });
}

int Blocks(int64_t items) {
  return static_cast<int>(std::clamp<int64_t>(CeilDiv(items, kThreads), 1, kMaxBlocks));
}

}  // namespace

Status SwiGluForward(bf16* out, const bf16* gate_up, int64_t N, int ffn, cudaStream_t stream) {
  if (N < 0 || ffn <= 0) {
    return Status::Invalid("SwiGluForward: bad shape N=" + std::to_string(N) +
                           " ffn=" + std::to_string(ffn));
  }
  if (N == 0) return Status::Ok();
  if (ffn % 8 == 0 && IsAligned(out, 16) && IsAligned(gate_up, 16)) {
    SwiGluForwardKernel<8><<<Blocks(N * ffn / 8), kThreads, 0, stream>>>(out, gate_up, N, ffn);
  } else {
    SwiGluForwardKernel<1><<<Blocks(N * ffn), kThreads, 0, stream>>>(out, gate_up, N, ffn);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status SwiGluBackward(bf16* dgate_up, const bf16* dout, const bf16* gate_up, int64_t N, int ffn,
                      cudaStream_t stream) {
  if (N < 0 || ffn <= 0) {
    return Status::Invalid("SwiGluBackward: bad shape N=" + std::to_string(N) +
                           " ffn=" + std::to_string(ffn));
  }
  if (N == 0) return Status::Ok();
  if (ffn % 8 == 0 && IsAligned(dgate_up, 16) && IsAligned(dout, 16) &&
      IsAligned(gate_up, 16)) {
    SwiGluBackwardKernel<8>
        <<<Blocks(N * ffn / 8), kThreads, 0, stream>>>(dgate_up, dout, gate_up, N, ffn);
  } else {
    SwiGluBackwardKernel<1>
        <<<Blocks(N * ffn), kThreads, 0, stream>>>(dgate_up, dout, gate_up, N, ffn);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
