// A GEMM of our own on Hopper's warpgroup MMA (gemm_wgmma.cu): D = A * B^T with A K-major
// and B K-major ([N, K], a linear layer's forward) or N-major ([K, N]: a weight W [out, in] read
// as the backward's dX = dY W), FP32 accumulation, BF16 out, with the epilogues cuBLASLt does
// not have (RoPE on the QKV projection, SwiGLU on the gate/up projection), so those passes over
// the output go away. BF16 operands (WgmmaGemmBf16), or E4M3 ones (WgmmaGemmFp8: the FP8
// forward's QKV projection with RoPE, and its gate/up projection with SwiGLU writing the down
// projection's FP8 input).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"

namespace forge::cuda {

enum class WgmmaEpilogue : int { kPlain = 0, kRope = 1, kSwiGlu = 2, kSwiGluBackward = 3 };

struct WgmmaEpilogueArgs {
  // kRope: rotate the pairs of columns < rot_cols (whole heads of width hd) by the angle of
  // position row % T; rope_sin_cos is RopeSinCosTable's [T, hd/2] (sin, cos) (rope.h).
  const float2* rope_sin_cos = nullptr;
  int T = 0, hd = 0, rot_cols = 0;
  // kSwiGlu: B is [gate; up] ([2*ffn, K]), gu receives A B^T ([M, 2*ffn]) and D silu(g) * u.
  // kSwiGluBackward (N-major B, N = ffn): A B is the gradient of SwiGLU's output (dh, never
  // stored); gu is the forward's [M, 2*ffn] input (read) and D receives its gradient dgu
  // ([M, 2*ffn]), as SwiGluBackward(D, dh, gu) would write it.
  __nv_bfloat16* gu = nullptr;
  int ffn = 0;
  // WgmmaGemmFp8 only. A and B are E4M3, dequantised by *a_scale * *b_scale (the casts'
  // scale_inv slots, as cuBLASLt's a_scale / b_scale). kSwiGlu writes h in E4M3 instead of
  // bf16, as SwiGluForwardFp8 (swiglu_fp8.h) would from this gu: D [M, ffn] and h_t
  // [ffn, M] quantised with *h_scale, |h| max-accumulated into *h_amax, *h_scale_inv = 1 /
  // *h_scale (fp8_cast.h's slots).
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  void* h_t = nullptr;
  const float* h_scale = nullptr;
  float* h_amax = nullptr;
  float* h_scale_inv = nullptr;
};

struct WgmmaGemmArgs {
  int64_t M = 0, N = 0, K = 0;  // M % 128, N % 256 and K % 64 (FP8: 128) must be 0
  const void* A = nullptr;      // [M, K] bf16 row-major
  const void* B = nullptr;      // [N, K] bf16 row-major; [K, N] with b_n_major
  bool b_n_major = false;       // B's N contiguous (kPlain only): D = A * B
  void* D = nullptr;            // [M, N] bf16 row-major ([M, N/2] for kSwiGlu, [M, 2N] for
                                // kSwiGluBackward)
  WgmmaEpilogue epilogue = WgmmaEpilogue::kPlain;
  WgmmaEpilogueArgs epi;
  int ctas = 0;                 // persistent CTAs (0: one per SM, at most one per tile)
  int group_rows = 0;           // tile rows a band of the tile order (0: tile_order.h's rule)
};

Status WgmmaGemmBf16(const WgmmaGemmArgs& args, cudaStream_t stream);

// E4M3 A [M, K] and B [N, K] (both K-major: Hopper's FP8 MMA reads no other layout), the
// kPlain, kRope or kSwiGlu epilogue (see WgmmaEpilogueArgs' FP8 part). The MMAs accumulate the
// whole K in their FP32 registers, which is what cuBLASLt's fast accumulation does (no periodic
// promotion of partial sums): callers use it where that was asked for (precision.fp8.fast_accum).
Status WgmmaGemmFp8(const WgmmaGemmArgs& args, cudaStream_t stream);

// Whether the kernel can run on the current device (an sm_90 GPU: it is built for sm_90a).
bool WgmmaGemmRunsHere();

// Whether WgmmaGemmBf16 (WgmmaGemmFp8 with fp8) takes these shapes and epilogue parameters
// (the pointers aside): the rules callers choose between this GEMM and cuBLASLt by.
Status WgmmaGemmCheck(const WgmmaGemmArgs& args, bool fp8 = false);

}  // namespace forge::cuda
