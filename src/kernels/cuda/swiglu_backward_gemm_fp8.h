// The FP8 step's down-projection input gradient with SwiGLU's backward fused (Hopper): dh =
// dy W_down (FP8 operands, FP32 accumulation, rounded to bf16 as a GEMM's output would be),
// then dgate/dup from dh and the forward's gate/up exactly as SwiGluBackwardFp8
// (swiglu_fp8.h) computes them, quantised to E5M2 with their transposed copy, amax and
// scale_inv. dh never reaches memory, and the SwiGLU backward's memory traffic runs beside the
// MMAs instead of after them (swiglu_backward_gemm_fp8.cu says how).
//
// Bit for bit our FP8 GEMM (WgmmaGemmFp8, the same MMAs in the same order) followed by
// SwiGluBackwardFp8; its MMAs sum the whole K at the tensor cores' own precision, so callers use
// it only where the input-gradient GEMMs may (precision.fp8.fast_accum fprop_dgrad).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.h"

namespace forge::cuda {

struct SwiGluBackwardGemmFp8Args {
  int64_t M = 0;             // tokens: a multiple of 64
  int64_t K = 0;             // the model width: a multiple of 128
  int ffn = 0;               // a multiple of 128
  const void* dy = nullptr;  // [M, K] E5M2 (E4M3 with dy_e4m3): the down projection's dy8
  bool dy_e4m3 = false;
  const void* w_t = nullptr;            // [ffn, K] E4M3: W_down [K, ffn] transposed (its W8t)
  const float* dy_scale_inv = nullptr;  // dequantisation of dy and w_t (their casts' slots)
  const float* w_scale_inv = nullptr;
  const bf16* gate_up = nullptr;  // [M, 2 ffn]: SwiGLU's input, saved by the forward
  void* dgate_up = nullptr;       // [M, 2 ffn] E5M2
  void* dgate_up_t = nullptr;     // [2 ffn, M] E5M2
  const float* scale = nullptr;   // fp8_cast.h's slots of dgate_up
  float* amax = nullptr;
  float* scale_inv = nullptr;
  int ctas = 0;        // persistent CTAs (0: one per SM, at most one per tile)
  int group_rows = 0;  // tile rows a band of the tile order (0: tile_order.h's rule)
};

// Whether the kernel takes these shapes and pointers (alignment included): the rule callers
// choose between it and the GEMM + SwiGluBackwardFp8 by.
Status SwiGluBackwardGemmFp8Check(const SwiGluBackwardGemmFp8Args& args);

Status SwiGluBackwardGemmFp8(const SwiGluBackwardGemmFp8Args& args, cudaStream_t stream);

}  // namespace forge::cuda
