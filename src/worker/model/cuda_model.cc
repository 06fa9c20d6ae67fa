// CudaModel::Create: checks the shape, then builds the parameter store, the optimizer's
// descriptors, the step's buffers and the GEMM / attention runners and streams, in that order;
// and what replaces weights, moments or gradients: a deferred update first, then the store.
#include "worker/model/cuda_model.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/head_rmsnorm.h"
#include "worker/model/cuda_model_state.h"

namespace forge {

CudaModel::CudaModel() : buf_(std::make_unique<Buffers>()) {}
CudaModel::~CudaModel() = default;

StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const ModelConfig& m,
                                                       const OptimizerConfig& opt,
                                                       const CudaModelOptions& options) {
  std::unique_ptr<CudaModel> model(new CudaModel());
  FORGE_RETURN_IF_ERROR(model->Init(m, opt, options).Annotate("creating the cuda model"));
  return StatusOr<std::unique_ptr<CudaModel>>(std::move(model));
}

Status CudaModel::Init(const ModelConfig& m, const OptimizerConfig& opt,
                       const CudaModelOptions& o) {
  m_ = m;
  opt_ = opt;
  o_ = o;
  if (m.n_layer < 0 || m.d_model <= 0 || m.n_head <= 0 || m.n_kv_head <= 0 ||
      (m.explicit_head_dim == 0 && m.d_model % m.n_head != 0) || m.n_head % m.n_kv_head != 0) {
    return Status::Invalid(
        "model: n_kv_head must divide n_head, and n_head d_model unless head_dim is given");
  }
  if (m.head_dim() % 8 != 0 || m.head_dim() > 128) {
    return Status::Invalid("model: head_dim " + std::to_string(m.head_dim()) +
                           " unsupported on cuda (cuDNN flash attention needs a multiple of 8, "
                           "at most 128)");
  }
  if (m.qk_norm) {
    const Status st =
        cuda::HeadRmsNormSupports({1, m.n_head, m.n_kv_head, m.head_dim(), m.norm_eps});
    if (!st.ok()) return Status::Invalid("model.qk_norm: " + st.message());
  }
  if (m.d_model % 8 != 0 || m.ffn % 8 != 0) {
    // 16-byte aligned rows for cuBLASLt and the vectorised kernels.
    return Status::Invalid("model: d_model and ffn must be multiples of 8 on cuda");
  }
  if (o.micro_batch < 1) return Status::Invalid("batch.micro_batch must be >= 1");
  if (o.lm_head_chunk_rows < 1) return Status::Invalid("lm_head_chunk_rows must be >= 1");

  layout_ = MakeParamLayout(m);
  d_ = m.d_model;
  H_ = m.n_head;
  KV_ = m.n_kv_head;
  hd_ = m.head_dim();
  ffn_ = m.ffn;
  V_ = m.padded_vocab();
  T_ = m.seq_len;
  qkv_dim_ = (H_ + 2 * KV_) * hd_;
  N_ = int64_t{o.micro_batch} * T_;

  FORGE_RETURN_IF_ERROR(store_.Init(layout_, {o.shard_world, o.shard_rank, o.shard_optimizer,
                                              o.shard_params, o.grads16, o.collective_alloc}));
  allocated_bytes_ += store_.allocated_bytes();
  FORGE_RETURN_IF_ERROR(SetUpOptimizer());
  ChooseLinears();
  // Before the step buffers: attention's workspace lives in one of them (step_buffers.cc).
  FORGE_RETURN_IF_ERROR(buf_->sdpa.Init(o.deterministic_attention,
                                        o.cudnn_attention_backward
                                            ? cuda::SdpaBackwardKernel::kCudnn
                                            : cuda::SdpaBackwardKernel::kFlash));
  FORGE_RETURN_IF_ERROR(AllocateStepBuffers());

  Buffers& b = *buf_;
  constexpr size_t kGemmWorkspace = 64ull << 20;
  FORGE_RETURN_IF_ERROR(b.gemm.Init(kGemmWorkspace));
  FORGE_RETURN_IF_ERROR(b.gemm_w.Init(kGemmWorkspace));
  b.gemm.set_autotune(o.gemm_autotune);
  b.gemm_w.set_autotune(o.gemm_autotune);
  allocated_bytes_ += 2 * kGemmWorkspace;
  if (o.wgrad_stream) {
    FORGE_CUDA_CHECK(cudaStreamCreateWithPriority(&b.wgrad, cudaStreamNonBlocking,
                                                  o.wgrad_stream_priority));
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&b.fork, cudaEventDisableTiming));
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&b.join, cudaEventDisableTiming));
    for (cudaEvent_t& e : b.hazard) {
      FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
  {  // the backward GEMMs' SM counts (0: all SMs)
    int device = 0, sms = 0;
    FORGE_CUDA_CHECK(cudaGetDevice(&device));
    FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int gemm_margin = std::max(0, o.gemm_sm_margin);
    const int wgrad_margin = o.wgrad_sm_margin >= 0 ? o.wgrad_sm_margin
                             : o.fp8                ? (sms * 3 / 8) & ~7
                                                    : (sms / 4) & ~7;
    if (gemm_margin > 0) bwd_sm_count_ = std::max(1, sms - gemm_margin);
    if (gemm_margin + wgrad_margin > 0) {
      wgrad_sm_count_ = std::max(1, sms - gemm_margin - wgrad_margin);
    }
  }
  // The zero-fills and the descriptor upload above ran on the legacy stream, which does not
  // order with the caller's non-blocking stream: finish them here.
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

Status CudaModel::UploadParams(const UnitBuffers& master, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(FlushUpdate(stream));
  return store_.UploadParams(master, stream);
}

Status CudaModel::UploadMoments(const UnitBuffers& m, const UnitBuffers& v,
                                cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(FlushUpdate(stream));
  return store_.UploadMoments(m, v, stream);
}

Status CudaModel::ZeroMoments(cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(FlushUpdate(stream));
  return store_.ZeroMoments(stream);
}

Status CudaModel::ZeroGrads(cudaStream_t stream) {
  if (o_.shard_params) return Status::Precondition("cuda model: ZeroGrads with fsdp");
  FORGE_RETURN_IF_ERROR(Phase(StepPhase::kCopy, stream));
  return store_.ZeroGrads(stream);
}

const Fp8Linears* CudaModel::fp8() const { return buf_->fp8.get(); }
Fp8Linears* CudaModel::fp8() { return buf_->fp8.get(); }

}  // namespace forge
