// The linear layers' strategy, chosen once at Init (linear_strategy.h): what our kernels accept
// at this model's shapes on this GPU, the choice from that and the options, the RoPE table the
// BF16 QKV GEMM with RoPE reads, and the arguments of the BF16 epilogue GEMMs.
#include "worker/model/cuda_model.h"

#include <algorithm>

#include "kernels/cuda/flash_backward.h"
#include "kernels/cuda/gemm_wgmma.h"
#include "kernels/cuda/rmsnorm_fp8.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/rope_fp8.h"
#include "kernels/cuda/swiglu_backward_gemm_fp8.h"
#include "kernels/cuda/swiglu_fp8.h"
#include "worker/model/cuda_model_state.h"

namespace forge {

// The kernels' own checks at this model's shapes. The FP8 kernels also check their buffers'
// alignment; every buffer is a cudaMalloc of its own (device_alloc.h, 256-byte aligned), so
// they are asked without buffers (null passes the alignment checks as those do).
LinearKernelSupport CudaModel::ProbeLinearKernels() const {
  cuda::SwiGluBackwardGemmFp8Args bwd;
  bwd.M = N_, bwd.K = d_, bwd.ffn = ffn_;
  return {
      .sm90 = cuda::WgmmaGemmRunsHere(),
      .rope_gemm = cuda::WgmmaGemmCheck(QkvRopeGemm()),
      .swiglu_gemm = cuda::WgmmaGemmCheck(GateUpSwiGluGemm()),
      .swiglu_bwd_gemm = cuda::WgmmaGemmCheck(DownSwiGluBackwardGemm()),
      .flash_backward = cuda::FlashBackwardSupports({o_.micro_batch, T_, H_, KV_, hd_}),
      // Fp8Linears' GEMMs with RoPE and SwiGLU have the BF16 ones' shapes and epilogues.
      .fp8_rope_gemm = cuda::WgmmaGemmCheck(QkvRopeGemm(), /*fp8=*/true),
      .fp8_swiglu_gemm = cuda::WgmmaGemmCheck(GateUpSwiGluGemm(), /*fp8=*/true),
      .fp8_swiglu_bwd_gemm = cuda::SwiGluBackwardGemmFp8Check(bwd),
      .fp8_swiglu_cast = cuda::SwiGluFp8Supported(N_, ffn_, nullptr, nullptr, nullptr, nullptr),
      .fp8_norm_cast = cuda::RmsNormFp8Supported(N_, d_, nullptr, nullptr, nullptr, nullptr),
      .fp8_norm_grad_cast = cuda::RmsNormBackwardFp8Supported(N_, d_, nullptr, nullptr),
      .fp8_rope_grad_cast = cuda::RopeFp8Supported(N_, H_, KV_, hd_, nullptr, nullptr, nullptr),
  };
}

void CudaModel::ChooseLinears() {
  const CudaModelOptions& o = o_;
  LinearStrategyOptions lo;
  lo.fp8 = o.fp8;
  lo.fast_accum = o.fp8_config.fast_accum;
  lo.fp8_lm_head = o.fp8_config.lm_head;
  lo.fp8_lm_head_wgrad = o.fp8_lm_head_wgrad;
  lo.rope_gemm = o.rope_gemm;
  lo.swiglu_gemm = o.swiglu_gemm;
  lo.swiglu_bwd_gemm = o.swiglu_bwd_gemm;
  lo.fp8_attention_rope = o.fp8_attention_rope;
  lo.fp8_norm_casts = o.fp8_norm_casts;
  lo.cudnn_attention_backward = o.cudnn_attention_backward;
  lo.qk_norm = m_.qk_norm;
  lo.vocab = V_, lo.d_model = d_, lo.tokens = N_, lo.lm_head_chunk_rows = o.lm_head_chunk_rows;
  linears_ = ChooseLinearStrategies(lo, ProbeLinearKernels());
}

// The RoPE (sin, cos) table of the BF16 QKV GEMM with RoPE (FP8's is Fp8Linears').
Status CudaModel::SetUpEpilogueGemms() {
  Buffers& b = *buf_;
  if (linears_.measuring[LinearKind::kQkv].forward != GemmPath::kEpilogue) return Status::Ok();
  FORGE_RETURN_IF_ERROR(DeviceAlloc("cuda model", &b.allocations, &allocated_bytes_,
                                    &b.rope_sin_cos, size_t(T_) * (hd_ / 2)));
  // On the legacy stream, finished by Init's closing device synchronisation.
  return cuda::RopeSinCosTable(b.rope_sin_cos, T_, hd_, b.rope_freq, nullptr);
}

// h Wqkv^T with RoPE, [N, qkv]; BlockForward sets A, B and D per layer.
cuda::WgmmaGemmArgs CudaModel::QkvRopeGemm() const {
  cuda::WgmmaGemmArgs g;
  g.M = N_, g.N = qkv_dim_, g.K = d_;
  g.epilogue = cuda::WgmmaEpilogue::kRope;
  g.epi.rope_sin_cos = buf_->rope_sin_cos, g.epi.T = T_, g.epi.hd = hd_;
  g.epi.rot_cols = (H_ + KV_) * hd_;
  return g;
}

// dgu from dres W_down (N-major [d, ffn]) and gu, [N, 2 ffn]; the backward sets A, B, D and gu
// per layer. Leaves the SMs the other backward GEMMs leave (gemm_sm_margin).
cuda::WgmmaGemmArgs CudaModel::DownSwiGluBackwardGemm() const {
  cuda::WgmmaGemmArgs g;
  g.M = N_, g.N = ffn_, g.K = d_;
  g.b_n_major = true;
  g.epilogue = cuda::WgmmaEpilogue::kSwiGluBackward;
  g.epi.ffn = ffn_;
  g.ctas = bwd_sm_count_;
  return g;
}

// h Wgu^T into gu and SwiGLU(gu) into D, [N, ffn]; BlockForward sets A, B, D and gu per layer.
cuda::WgmmaGemmArgs CudaModel::GateUpSwiGluGemm() const {
  cuda::WgmmaGemmArgs g;
  g.M = N_, g.N = 2 * int64_t{ffn_}, g.K = d_;
  g.epilogue = cuda::WgmmaEpilogue::kSwiGlu;
  g.epi.ffn = ffn_;
  return g;
}

}  // namespace forge
