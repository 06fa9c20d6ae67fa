// CudaModel's private state, shared by the files that implement it (worker/model only): every
// device allocation (Buffers), what one block keeps for backward (BlockActs), and the small
// helpers those files have in common. Nothing outside worker/model includes this.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cuda/adamw.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/head_rmsnorm.h"
#include "kernels/cuda/sdpa.h"
#include "worker/model/cuda_model.h"
#include "worker/model/deferred_update.h"
#include "worker/model/device_alloc.h"
#include "worker/model/fp8_linears.h"

namespace forge {

// The LM head's [chunk, V] logits buffers: two with the wgrad stream (chunk c's dWte reads
// one while chunk c + 1 writes the other), else one.
inline int NumLogitsBuffers(const CudaModelOptions& o) { return o.wgrad_stream ? 2 : 1; }

// Device pointers of what one block keeps for backward. Without recompute every layer has its
// own set; with full recompute all layers share one set that backward refills by re-running
// the block's forward; with selective recompute every layer keeps its own set but h1, h2 and sw
// live in two sets (layer l uses l % 2) that backward refills from the kept rstd/x_mid/gu. The
// block input itself lives in the residual list xs[] (always saved).
struct CudaModel::BlockActs {
  cuda::bf16* h1 = nullptr;    // [N, d]  attn_norm output
  float* rstd1 = nullptr;      // [N]
  cuda::bf16* qkv = nullptr;   // [N, qkv] after RoPE: the attention input
  cuda::bf16* att = nullptr;   // [N, H*hd] attention output
  float* stats = nullptr;      // [B, H, T] softmax log-sum-exp
  cuda::bf16* x_mid = nullptr; // [N, d] residual after attention
  cuda::bf16* h2 = nullptr;    // [N, d] mlp_norm output
  float* rstd2 = nullptr;      // [N]
  cuda::bf16* gu = nullptr;    // [N, 2*ffn]
  cuda::bf16* sw = nullptr;    // [N, ffn] SwiGLU output
  // model.qk_norm: the Q and K heads before their RMSNorm [N, (H+KV)*hd], and its rstd
  // [N, H+KV].
  cuda::bf16* qk_raw = nullptr;
  float* rstd_qk = nullptr;
};

struct CudaModel::Buffers {
  std::vector<void*> allocations;  // freed in the destructor

  // Per unit, for CudaModelHooks::grad_ready.
  std::vector<cudaEvent_t> grad_ready_compute, grad_ready_wgrad;

  cuda::AdamWTensor* adam_tensors = nullptr;  // device array, one per tensor
  int num_tensors = 0;
  float* clip_scale = nullptr;                // device scalar
  int64_t* skipped_steps = nullptr;           // device counter (AdamWMultiTensor)
  std::unique_ptr<Fp8Linears> fp8;            // precision fp8 only
  float* rope_freq = nullptr;                 // [hd/2] inverse frequencies (rope.h)
  float2* rope_sin_cos = nullptr;             // [T, hd/2] for the BF16 RoPE epilogue
  std::unique_ptr<DeferredUpdate> update;     // defer_update: one GPU and ddp

  std::vector<cuda::bf16*> xs;                // residual stream: block inputs + final, [N, d]
  std::vector<BlockActs> acts;                // L sets, or 1 with recompute
  cuda::bf16* hf = nullptr;                   // [N, d] final norm output
  float* rstd_f = nullptr;                    // [N]
  // [chunk, V] bf16 each, overwritten by dlogits; chunk c uses logits[c % num_logits]. Two
  // with the wgrad stream, so chunk c+1's logits GEMM need not wait for chunk c's dWte. They
  // share one region with softmax_sum, dq_accum and the SDPA runner's workspace.
  std::array<cuda::bf16*, 2> logits{};
  int num_logits = 1;

  // Backward scratch.
  cuda::bf16* dres = nullptr;    // [N, d] residual-stream gradient
  cuda::bf16* dh = nullptr;      // [N, d] gradient at a norm output (also dL/dhf)
  cuda::bf16* dsw = nullptr;     // [N, ffn]; null where the BF16 SwiGLU-backward GEMM runs
  cuda::bf16* dgu = nullptr;     // [N, 2*ffn]
  cuda::bf16* datt = nullptr;    // [N, H*hd]
  cuda::bf16* dqkv = nullptr;    // [N, qkv]
  float* softmax_sum = nullptr;  // SDPA backward scratch [B, H, T] (in the logits' region)
  float* dq_accum = nullptr;     // [B, H, T, hd] (null when deterministic)

  // The RMSNorm backward's dw partials: two buffers, used by the MLP norms (0) and by the
  // attention and final norms (1), which alternate in backward, so a dw reduction on the
  // wgrad stream (CudaModelOptions::norm_dw_on_wgrad) has a whole norm's span to read its
  // buffer before the next writer waits for it (kNormWs0/1).
  std::array<char*, 2> norm_ws{};
  size_t norm_ws_bytes = 0;
  cuda::HeadNormShape qk_norm;  // model.qk_norm only (N 0 otherwise)
  char* qk_norm_ws = nullptr;   // its backward's dw partials
  size_t qk_norm_ws_bytes = 0;
  char* emb_ws = nullptr;
  size_t emb_ws_bytes = 0;
  char* gradnorm_ws = nullptr;
  size_t gradnorm_ws_bytes = 0;
  // Per unit, cuda::SumSquaresPartials() partial sums of its gradient's squares (world 1).
  float* unit_sumsq = nullptr;

  cuda::GemmRunner gemm;    // forward and activation-gradient GEMMs (compute stream)
  // Weight-gradient GEMMs, also when single-stream: its own cuBLASLt workspace, so it may run
  // on the wgrad stream while `gemm` runs on the compute stream.
  cuda::GemmRunner gemm_w;
  cuda::SdpaRunner sdpa;
  cuda::SdpaShape sdpa_shape;

  // Null when single-stream (CudaModelOptions::wgrad_stream off).
  cudaStream_t wgrad = nullptr;
  cudaEvent_t fork = nullptr;  // recorded on the compute stream, waited on by wgrad
  cudaEvent_t join = nullptr;  // recorded on wgrad, waited on by the compute stream
  std::array<cudaEvent_t, static_cast<int>(WgradHazard::kCount)> hazard{};

  ~Buffers() {
    // Work still queued on wgrad may use these buffers and gemm_w's workspace.
    if (wgrad) cudaStreamSynchronize(wgrad);
    for (void* p : allocations) cudaFree(p);
    for (cudaEvent_t e : hazard) {
      if (e) cudaEventDestroy(e);
    }
    for (cudaEvent_t e : grad_ready_compute) cudaEventDestroy(e);
    for (cudaEvent_t e : grad_ready_wgrad) cudaEventDestroy(e);
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    if (wgrad) cudaStreamDestroy(wgrad);
  }
};

template <typename T>
Status CudaModel::Alloc(T** p, size_t n) {
  return DeviceAlloc("cuda model", &buf_->allocations, &allocated_bytes_, p, n);
}

}  // namespace forge
