#include "worker/model/cuda_model.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/cross_entropy.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/flash_backward.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/head_rmsnorm.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/sdpa.cuh"
#include "kernels/cuda/spike_gate.cuh"
#include "kernels/cuda/swiglu.cuh"
#include "worker/model/deferred_update.h"
#include "worker/model/device_alloc.h"
#include "worker/model/fp8_linears.h"
#include "worker/model/rope_frequencies.h"
#include "worker/parallel/shard_layout.h"

namespace forge {

using cuda::bf16;
using cuda::DType;
using cuda::GemmArgs;

namespace {

// Units start on 128-element boundaries: 256 bytes for bf16, 512 for fp32, so one offset table
// serves every parameter-shaped buffer and each unit (a DDP bucket / ZeRO shard) is aligned.
constexpr int64_t kUnitAlign = 128;

int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// The LM head's [chunk, V] logits buffers: two with the wgrad stream (chunk c's dWte reads
// one while chunk c + 1 writes the other), else one.
int NumLogitsBuffers(const CudaModelOptions& o) { return o.wgrad_stream ? 2 : 1; }

}  // namespace

// ---- phase timeline ------------------------------------------------------------------------

const char* StepPhaseName(StepPhase p) {
  switch (p) {
    case StepPhase::kCopy: return "copy";
    case StepPhase::kFwdGemm: return "fwd_gemm";
    case StepPhase::kFwdAttention: return "fwd_attention";
    case StepPhase::kFwdElementwise: return "fwd_elementwise";
    case StepPhase::kLmHeadGemm: return "lm_head_gemm";
    case StepPhase::kCrossEntropy: return "cross_entropy";
    case StepPhase::kBwdGemm: return "bwd_gemm";
    case StepPhase::kBwdAttention: return "bwd_attention";
    case StepPhase::kBwdElementwise: return "bwd_elementwise";
    case StepPhase::kOptimizer: return "optimizer";
    case StepPhase::kCount: break;
  }
  return "?";
}

PhaseTimeline::~PhaseTimeline() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

Status PhaseTimeline::Mark(StepPhase phase, cudaStream_t stream) {
  if (marks_ == events_.size()) {
    cudaEvent_t e;
    FORGE_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    phases_.push_back(-1);
  }
  phases_[marks_] = static_cast<int>(phase);
  FORGE_CUDA_CHECK(cudaEventRecord(events_[marks_], stream));
  ++marks_;
  return Status::Ok();
}

Status PhaseTimeline::End(cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kCount, stream));
  phases_[marks_ - 1] = -1;
  return Status::Ok();
}

Status PhaseTimeline::Totals(std::array<double, static_cast<int>(StepPhase::kCount)>* ms) const {
  ms->fill(0.0);
  if (marks_ == 0) return Status::Ok();
  FORGE_CUDA_CHECK(cudaEventSynchronize(events_[marks_ - 1]));
  for (size_t i = 0; i + 1 < marks_; ++i) {
    if (phases_[i] < 0) continue;
    float t = 0.0f;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&t, events_[i], events_[i + 1]));
    (*ms)[phases_[i]] += t;
  }
  return Status::Ok();
}

// ---- buffers -------------------------------------------------------------------------------

// Device pointers of what one block keeps for backward. Without recompute every layer has its
// own set; with full recompute all layers share one set that backward refills by re-running
// the block's forward; with selective recompute every layer keeps its own set but h1, h2 and sw
// live in two sets (layer l uses l % 2) that backward refills from the kept rstd/x_mid/gu. The
// block input itself lives in the residual list xs[] (always saved).
struct CudaModel::BlockActs {
  bf16* h1 = nullptr;     // [N, d]  attn_norm output
  float* rstd1 = nullptr; // [N]
  bf16* qkv = nullptr;    // [N, qkv] after RoPE: the attention input
  bf16* att = nullptr;    // [N, H*hd] attention output
  float* stats = nullptr; // [B, H, T] softmax log-sum-exp
  bf16* x_mid = nullptr;  // [N, d] residual after attention
  bf16* h2 = nullptr;     // [N, d] mlp_norm output
  float* rstd2 = nullptr; // [N]
  bf16* gu = nullptr;     // [N, 2*ffn]
  bf16* sw = nullptr;     // [N, ffn] SwiGLU output
  // model.qk_norm: the Q and K heads before their RMSNorm [N, (H+KV)*hd], and its rstd
  // [N, H+KV].
  bf16* qk_raw = nullptr;
  float* rstd_qk = nullptr;
};

struct CudaModel::Buffers {
  std::vector<void*> allocations;  // freed in the destructor

  // Parameter-shaped, one flat allocation each, units at pb_.unit_offset.
  float* master = nullptr;
  bf16* params = nullptr;  // compute copy, refreshed by AdamW
  float* grads = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float* grad_shard = nullptr;  // shard_optimizer: this rank's summed gradient slots
  bf16* grads16 = nullptr;      // CudaModelOptions::grads16: the summed gradient in bf16
  int64_t flat = 0;        // elements of params and grads (padded units)
  int64_t state_flat = 0;  // elements of master, m, v (== flat unless shard_optimizer)
  int64_t flat_shard = 0;  // elements of the slot buffers
  bf16* params_shard = nullptr;  // shard_params: bf16 values of this rank's slots
  // Per unit, for CudaModelHooks::grad_ready.
  std::vector<cudaEvent_t> grad_ready_compute, grad_ready_wgrad;

  cuda::AdamWTensor* adam_tensors = nullptr;  // device array, one per tensor
  int num_tensors = 0;
  float* clip_scale = nullptr;                // device scalar
  int64_t* skipped_steps = nullptr;           // device counter (AdamWMultiTensor)
  std::unique_ptr<Fp8Linears> fp8;            // precision fp8 only
  // CudaModelOptions::rope_gemm / swiglu_gemm / swiglu_bwd_gemm where the GPU and shapes allow.
  bool rope_gemm = false, swiglu_gemm = false, swiglu_bwd_gemm = false;
  // CudaModelOptions::fp8_attention_rope where the FP8 RoPE cast and our backward both run.
  bool fp8_attention_rope = false;
  float* rope_freq = nullptr;                 // [hd/2] inverse frequencies (rope.cuh)
  float2* rope_sin_cos = nullptr;             // [T, hd/2] for the RoPE epilogue
  std::unique_ptr<DeferredUpdate> update;     // defer_update: one GPU and ddp

  std::vector<bf16*> xs;                      // residual stream: block inputs + final, [N, d]
  std::vector<BlockActs> acts;                // L sets, or 1 with recompute
  bf16* hf = nullptr;                         // [N, d] final norm output
  float* rstd_f = nullptr;                    // [N]
  // [chunk, V] bf16 each, overwritten by dlogits; chunk c uses logits[c % num_logits]. Two
  // with the wgrad stream, so chunk c+1's logits GEMM need not wait for chunk c's dWte.
  std::array<bf16*, 2> logits{};
  int num_logits = 1;

  // Backward scratch.
  bf16* dres = nullptr;   // [N, d] residual-stream gradient
  bf16* dh = nullptr;     // [N, d] gradient at a norm output (also dL/dhf)
  bf16* dsw = nullptr;    // [N, ffn]; null with swiglu_bwd_gemm
  bf16* dgu = nullptr;    // [N, 2*ffn]
  bf16* datt = nullptr;   // [N, H*hd]
  bf16* dqkv = nullptr;   // [N, qkv]
  float* softmax_sum = nullptr;  // SDPA backward scratch [B, H, T]
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

// ---- construction --------------------------------------------------------------------------

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

  Buffers& b = *buf_;
  auto alloc = [&](auto** p, size_t n) {
    return DeviceAlloc("cuda model", &b.allocations, &allocated_bytes_, p, n);
  };

  // Parameters, gradients, moments. Units padded for the data-parallel world (zero padding),
  // so collectives work in place on a unit.
  const int W = o.shard_world;
  if (W < 1 || o.shard_rank < 0 || o.shard_rank >= W) {
    return Status::Invalid("cuda model: shard rank " + std::to_string(o.shard_rank) + " of " +
                           std::to_string(W));
  }
  const size_t U = layout_.units.size();
  pb_.unit_offset.clear();
  pb_.shard_offset.clear();
  pb_.slot.clear();
  int64_t flat = 0, flat_shard = 0;
  for (const UnitLayout& u : layout_.units) {
    pb_.unit_offset.push_back(flat);
    flat = AlignUp(flat + PaddedSize(u.numel, W), kUnitAlign);
    pb_.slot.push_back(ShardSize(u.numel, W));
    pb_.shard_offset.push_back(flat_shard);
    flat_shard = AlignUp(flat_shard + pb_.slot.back(), kUnitAlign);
  }
  b.flat = flat;
  const int64_t state = o.shard_optimizer ? flat_shard : flat;  // master, m, v
  if (o.shard_params && !o.shard_optimizer) {
    return Status::Invalid("cuda model: shard_params needs shard_optimizer");
  }
  FORGE_RETURN_IF_ERROR(alloc(&b.master, state));
  if (o.shard_params) {
    FORGE_RETURN_IF_ERROR(alloc(&b.params_shard, flat_shard));
  } else {
    FORGE_RETURN_IF_ERROR(alloc(&b.params, flat));
    FORGE_RETURN_IF_ERROR(alloc(&b.grads, flat));
  }
  if (o.grads16) {
    if (o.shard_optimizer || W < 2) {
      return Status::Invalid("cuda model: grads16 is for ddp (shard_world > 1, whole units)");
    }
    FORGE_RETURN_IF_ERROR(alloc(&b.grads16, flat));
    // Padding stays zero: collectives and norms read whole units only, but keep it defined.
    FORGE_CUDA_CHECK(cudaMemset(b.grads16, 0, size_t(flat) * sizeof(bf16)));
  }
  FORGE_RETURN_IF_ERROR(alloc(&b.m, state));
  FORGE_RETURN_IF_ERROR(alloc(&b.v, state));
  if (o.shard_optimizer) FORGE_RETURN_IF_ERROR(alloc(&b.grad_shard, flat_shard));
  b.state_flat = state;
  b.flat_shard = flat_shard;
  pb_.master = b.master;
  pb_.params = b.params;
  pb_.grads = b.grads;
  pb_.grads16 = b.grads16;
  pb_.params_shard = b.params_shard;
  unit_params_.assign(U, nullptr);
  unit_grads_.assign(U, nullptr);
  if (!o.shard_params) {
    for (size_t u = 0; u < U; ++u) {
      BindUnit(int(u), b.params + pb_.unit_offset[u], b.grads + pb_.unit_offset[u]);
    }
  }
  pb_.m = b.m;
  pb_.v = b.v;
  pb_.grad_shard = b.grad_shard;

  // Optimizer descriptors: one per tensor (not per unit) so weight decay follows the tensor;
  // sharded, one per piece of a tensor inside this rank's slot (bf16 output at its place in the
  // full compute copy, where the all-gather sends it from).
  std::vector<cuda::AdamWTensor> tensors;
  std::vector<int> first_tensor;  // unit u's descriptors start here
  for (size_t u = 0; u < U; ++u) {
    first_tensor.push_back(static_cast<int>(tensors.size()));
    const ShardRange own = o.shard_optimizer ? ShardOf(layout_.units[u].numel, o.shard_rank, W)
                                             : ShardRange{0, layout_.units[u].numel};
    const int64_t state_base = o.shard_optimizer ? pb_.shard_offset[u] - own.begin
                                                 : pb_.unit_offset[u];
    float* g = o.shard_optimizer ? b.grad_shard : b.grads;
    for (const TensorSlot& t : layout_.units[u].tensors) {
      const int64_t lo = std::max(own.begin, t.offset);
      const int64_t hi = std::min(own.end, t.offset + t.numel);
      if (lo >= hi) continue;
      const int64_t so = state_base + lo;
      bf16* out = o.shard_params ? b.params_shard + so : b.params + pb_.unit_offset[u] + lo;
      tensors.push_back({b.master + so, out, g + so, b.m + so, b.v + so, hi - lo,
                         t.weight_decay ? opt.weight_decay : 0.0f,
                         b.grads16 ? b.grads16 + pb_.unit_offset[u] + lo : nullptr});
    }
  }
  if (tensors.empty()) {
    // A rank whose slots are all empty (tiny models on many ranks) still runs the kernels.
    tensors.push_back({b.master, nullptr, o.shard_optimizer ? b.grad_shard : b.grads, b.m, b.v,
                       0, 0.0f});
  }
  for (size_t u = 0; u < U; ++u) {
    cudaEvent_t e[2];
    for (cudaEvent_t& x : e) FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&x, cudaEventDisableTiming));
    b.grad_ready_compute.push_back(e[0]);
    b.grad_ready_wgrad.push_back(e[1]);
  }
  b.num_tensors = static_cast<int>(tensors.size());
  FORGE_RETURN_IF_ERROR(alloc(&b.adam_tensors, tensors.size()));
  FORGE_CUDA_CHECK(cudaMemcpy(b.adam_tensors, tensors.data(),
                              tensors.size() * sizeof(cuda::AdamWTensor), cudaMemcpyHostToDevice));
  FORGE_RETURN_IF_ERROR(alloc(&b.clip_scale, 1));
  FORGE_RETURN_IF_ERROR(alloc(&b.skipped_steps, 1));
  // Deferred wherever every rank updates whole units (one GPU, ddp); zero/fsdp update their
  // slots and all-gather right after, which a deferral would only move into the forward.
  if (o.defer_update && !o.shard_optimizer) {
    first_tensor.push_back(static_cast<int>(tensors.size()));
    std::vector<int64_t> unit_elements;
    for (const UnitLayout& u : layout_.units) unit_elements.push_back(u.numel);
    int least = 0, greatest = 0;  // the update yields to everything else
    FORGE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    b.update = std::make_unique<DeferredUpdate>();
    FORGE_RETURN_IF_ERROR(b.update->Init(b.adam_tensors, std::move(first_tensor),
                                         std::move(unit_elements), b.clip_scale,
                                         b.skipped_steps, least));
  }

  {  // RoPE's inverse frequencies (model.rope_theta, model.rope_scaling), as the kernels read them
    const std::vector<double> f = RopeFrequencies(m);
    const std::vector<float> f32(f.begin(), f.end());
    FORGE_RETURN_IF_ERROR(alloc(&b.rope_freq, f32.size()));
    FORGE_CUDA_CHECK(cudaMemcpy(b.rope_freq, f32.data(), f32.size() * sizeof(float),
                                cudaMemcpyHostToDevice));
  }

  // Activations.
  const size_t N = N_, d = d_;
  const size_t stats_n = size_t(o.micro_batch) * H_ * T_;
  b.xs.assign(m.n_layer + 1, nullptr);
  for (bf16*& x : b.xs) FORGE_RETURN_IF_ERROR(alloc(&x, N * d));
  b.acts.assign(o.recompute == Recompute::kFull ? std::min(m.n_layer, 1) : m.n_layer,
                BlockActs{});
  // Sets of h1, h2 and sw: FP8's backward reads their FP8 transposed copies, so the BF16 ones
  // are forward scratch, one set shared by every layer; selective recompute alternates two.
  const size_t own_h = o.fp8                                 ? 1
                       : o.recompute == Recompute::kSelective ? 2
                                                              : b.acts.size();
  for (size_t i = 0; i < b.acts.size(); ++i) {
    BlockActs& a = b.acts[i];
    if (i >= own_h) {
      const BlockActs& shared = b.acts[i % own_h];
      a.h1 = shared.h1, a.h2 = shared.h2, a.sw = shared.sw;
    } else {
      FORGE_RETURN_IF_ERROR(alloc(&a.h1, N * d));
      FORGE_RETURN_IF_ERROR(alloc(&a.h2, N * d));
      FORGE_RETURN_IF_ERROR(alloc(&a.sw, N * ffn_));
    }
    FORGE_RETURN_IF_ERROR(alloc(&a.rstd1, N));
    FORGE_RETURN_IF_ERROR(alloc(&a.qkv, N * qkv_dim_));
    if (m.qk_norm) {
      FORGE_RETURN_IF_ERROR(alloc(&a.qk_raw, N * size_t(H_ + KV_) * hd_));
      FORGE_RETURN_IF_ERROR(alloc(&a.rstd_qk, N * size_t(H_ + KV_)));
    }
    FORGE_RETURN_IF_ERROR(alloc(&a.att, N * H_ * hd_));
    FORGE_RETURN_IF_ERROR(alloc(&a.stats, stats_n));
    FORGE_RETURN_IF_ERROR(alloc(&a.x_mid, N * d));
    FORGE_RETURN_IF_ERROR(alloc(&a.rstd2, N));
    FORGE_RETURN_IF_ERROR(alloc(&a.gu, N * 2 * ffn_));
  }
  if (o.fp8) {
    std::array<Fp8LinearShape, kLinearKinds> shapes{};
    shapes[int(LinearKind::kQkv)] = {d_, qkv_dim_};
    shapes[int(LinearKind::kOut)] = {int64_t{H_} * hd_, d_};
    shapes[int(LinearKind::kGateUp)] = {d_, 2 * int64_t{ffn_}};
    shapes[int(LinearKind::kDown)] = {ffn_, d_};
    const Fp8RopeShape rope{o.micro_batch, T_, H_, KV_, hd_, b.rope_freq, !m.qk_norm};
    Fp8LmHeadShape lm_head;
    if (o.fp8_config.lm_head) {
      lm_head = {V_, d_, std::min<int64_t>(N_, o.lm_head_chunk_rows), NumLogitsBuffers(o),
                 o.fp8_lm_head_wgrad};
    }
    FORGE_ASSIGN_OR_RETURN(
        b.fp8,
        Fp8Linears::Create(o.fp8_config, m.n_layer, shapes, N_, int(b.acts.size()), rope, lm_head,
                           Fp8EpilogueGemms{o.rope_gemm, o.swiglu_gemm, o.swiglu_bwd_gemm}));
    allocated_bytes_ += b.fp8->allocated_bytes();
  }
  FORGE_RETURN_IF_ERROR(alloc(&b.hf, N * d));
  FORGE_RETURN_IF_ERROR(alloc(&b.rstd_f, N));
  FORGE_RETURN_IF_ERROR(SetUpEpilogueGemms(o));
  const int64_t chunk = std::min<int64_t>(N_, o.lm_head_chunk_rows);
  b.num_logits = NumLogitsBuffers(o);
  for (int i = 0; i < b.num_logits; ++i) {
    FORGE_RETURN_IF_ERROR(alloc(&b.logits[i], size_t(chunk) * V_));
  }

  FORGE_RETURN_IF_ERROR(alloc(&b.dres, N * d));
  FORGE_RETURN_IF_ERROR(alloc(&b.dh, N * d));
  // dh of the MLP: never stored where SwiGLU's backward rides on its GEMM.
  if (!b.swiglu_bwd_gemm) FORGE_RETURN_IF_ERROR(alloc(&b.dsw, N * ffn_));
  FORGE_RETURN_IF_ERROR(alloc(&b.dgu, N * 2 * ffn_));
  FORGE_RETURN_IF_ERROR(alloc(&b.datt, N * H_ * hd_));
  FORGE_RETURN_IF_ERROR(alloc(&b.dqkv, N * qkv_dim_));

  b.sdpa_shape = cuda::SdpaShape{o.micro_batch, T_, H_, KV_, hd_};
  // SDPA backward scratch: softmax_sum [B,H,T] then (non-deterministic only) dq_accum
  // [B,H,T,hd]; sized by our own count or the runner's, whichever is larger.
  const size_t sum_bytes = AlignUp(int64_t(stats_n * sizeof(float)), 256);
  const size_t acc_bytes = o.deterministic_attention ? 0 : stats_n * hd_ * sizeof(float);
  const size_t sdpa_bytes = std::max(
      sum_bytes + acc_bytes,
      cuda::SdpaRunner::BackwardScratchBytes(b.sdpa_shape, o.deterministic_attention));
  char* sdpa_scratch = nullptr;
  FORGE_RETURN_IF_ERROR(alloc(&sdpa_scratch, sdpa_bytes));
  b.softmax_sum = reinterpret_cast<float*>(sdpa_scratch);
  b.dq_accum =
      o.deterministic_attention ? nullptr : reinterpret_cast<float*>(sdpa_scratch + sum_bytes);

  if (m.qk_norm) {
    b.qk_norm = cuda::HeadNormShape{N_, H_, KV_, hd_, m.norm_eps};
    b.qk_norm_ws_bytes = cuda::HeadRmsNormBackwardWorkspace(b.qk_norm);
    FORGE_RETURN_IF_ERROR(alloc(&b.qk_norm_ws, b.qk_norm_ws_bytes));
  }
  b.norm_ws_bytes = cuda::RmsNormBackwardWorkspace(N_, d_);
  for (char*& ws : b.norm_ws) FORGE_RETURN_IF_ERROR(alloc(&ws, b.norm_ws_bytes));
  b.emb_ws_bytes = cuda::EmbeddingBackwardWorkspace(N_, V_);
  FORGE_RETURN_IF_ERROR(alloc(&b.emb_ws, b.emb_ws_bytes));
  b.gradnorm_ws_bytes = cuda::GradNormWorkspace();
  FORGE_RETURN_IF_ERROR(alloc(&b.gradnorm_ws, b.gradnorm_ws_bytes));
  FORGE_RETURN_IF_ERROR(
      alloc(&b.unit_sumsq, layout_.units.size() * size_t(cuda::SumSquaresPartials())));

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
  FORGE_RETURN_IF_ERROR(b.sdpa.Init(o.deterministic_attention,
                                    o.cudnn_attention_backward ? cuda::SdpaBackwardKernel::kCudnn
                                                               : cuda::SdpaBackwardKernel::kFlash));
  b.fp8_attention_rope =
      b.fp8 != nullptr && o.fp8_attention_rope && b.sdpa.flash_backward(b.sdpa_shape);
  NoteFallbacks(o);
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

// The faster paths the options asked for that this model's shapes (or GPU) leave out, with the
// kernels' own reasons.
void CudaModel::NoteFallbacks(const CudaModelOptions& o) {
  const Buffers& b = *buf_;
  fallbacks_.clear();
  if (!o.cudnn_attention_backward && !b.sdpa.flash_backward(b.sdpa_shape)) {
    const Status why = cuda::FlashBackwardSupports(
        {b.sdpa_shape.B, b.sdpa_shape.T, b.sdpa_shape.H, b.sdpa_shape.KV, b.sdpa_shape.hd});
    fallbacks_.push_back("attention backward: cuDNN's instead of ours (" + why.message() + ")");
  }
  if (o.fp8 || !cuda::WgmmaGemmRunsHere()) return;
  if (o.rope_gemm && !b.rope_gemm) {
    fallbacks_.push_back("QKV projection: cuBLASLt, then RoPE apart (" +
                         (m_.qk_norm ? std::string("QK-norm runs between them")
                                     : cuda::WgmmaGemmCheck(QkvRopeGemm()).message()) +
                         ")");
  }
  if (o.swiglu_gemm && !b.swiglu_gemm) {
    fallbacks_.push_back("gate/up projection: cuBLASLt, then SwiGLU apart (" +
                         cuda::WgmmaGemmCheck(GateUpSwiGluGemm()).message() + ")");
  }
}

// ---- host <-> device -----------------------------------------------------------------------

namespace {

Status CheckUnitSizes(const ParamLayout& layout, const UnitBuffers& host) {
  if (host.size() != layout.units.size()) {
    return Status::Invalid("expected " + std::to_string(layout.units.size()) +
                           " unit buffers, got " + std::to_string(host.size()));
  }
  for (size_t u = 0; u < host.size(); ++u) {
    if (static_cast<int64_t>(host[u].size()) != layout.units[u].numel) {
      return Status::Invalid("unit " + layout.units[u].name + ": expected " +
                             std::to_string(layout.units[u].numel) + " floats, got " +
                             std::to_string(host[u].size()));
    }
  }
  return Status::Ok();
}

}  // namespace

Status CudaModel::CopyUnits(const UnitBuffers& host, float* device, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, host));
  for (size_t u = 0; u < host.size(); ++u) {
    FORGE_CUDA_CHECK(cudaMemcpyAsync(device + pb_.unit_offset[u], host[u].data(),
                                     host[u].size() * sizeof(float), cudaMemcpyHostToDevice,
                                     stream));
  }
  return Status::Ok();
}

Status CudaModel::ReadUnits(const float* device, UnitBuffers* host, cudaStream_t stream) {
  host->resize(layout_.units.size());
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    (*host)[u].resize(layout_.units[u].numel);
    FORGE_CUDA_CHECK(cudaMemcpyAsync((*host)[u].data(), device + pb_.unit_offset[u],
                                     (*host)[u].size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream));
  }
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status CudaModel::CopySlots(const UnitBuffers& host, float* device, cudaStream_t stream) {
  for (size_t u = 0; u < host.size(); ++u) {
    const ShardRange own = ShardOf(layout_.units[u].numel, o_.shard_rank, o_.shard_world);
    if (own.size() == 0) continue;
    FORGE_CUDA_CHECK(cudaMemcpyAsync(device + pb_.shard_offset[u], host[u].data() + own.begin,
                                     own.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  }
  return Status::Ok();
}

// Sharded: the full fp32 units go through the gradient buffer (scratch between steps; its
// padding is never written, so it stays zero) to make the full bf16 copy.
Status CudaModel::UploadParams(const UnitBuffers& master, cudaStream_t stream) {
  Buffers& b = *buf_;
  FORGE_RETURN_IF_ERROR(FlushUpdate(stream));
  if (o_.shard_params) {  // slots only: fp32 master, and its bf16 values (padding stays 0)
    FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, master).Annotate("SetParams"));
    FORGE_RETURN_IF_ERROR(CopySlots(master, b.master, stream));
    FORGE_RETURN_IF_ERROR(cuda::CastFloatToBf16(b.params_shard, b.master, b.flat_shard, stream));
    FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return Status::Ok();
  }
  float* full = o_.shard_optimizer ? b.grads : b.master;
  FORGE_RETURN_IF_ERROR(CopyUnits(master, full, stream).Annotate("SetParams"));
  FORGE_RETURN_IF_ERROR(cuda::CastFloatToBf16(b.params, full, b.flat, stream));
  if (o_.shard_optimizer) FORGE_RETURN_IF_ERROR(CopySlots(master, b.master, stream));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status CudaModel::DownloadParams(UnitBuffers* master, cudaStream_t stream) {
  if (o_.shard_optimizer) {
    return Status::Precondition("cuda model: sharded master weights are gathered by the "
                                "data-parallel layer");
  }
  return ReadUnits(buf_->master, master, stream);
}

Status CudaModel::DownloadGrads(UnitBuffers* grads, cudaStream_t stream) {
  if (o_.shard_params) {
    return Status::Precondition("cuda model: fsdp gradients are gathered by the data-parallel "
                                "layer");
  }
  if (buf_->grads16) {  // the summed gradient lives in bf16 (grads16); widening is exact
    FORGE_RETURN_IF_ERROR(cuda::CastBf16ToFloat(buf_->grads, buf_->grads16, buf_->flat, stream));
  }
  return ReadUnits(buf_->grads, grads, stream);
}

Status CudaModel::UploadMoments(const UnitBuffers& m, const UnitBuffers& v,
                                cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(FlushUpdate(stream));
  if (o_.shard_optimizer) {
    FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, m).Annotate("SetMoments (m)"));
    FORGE_RETURN_IF_ERROR(CheckUnitSizes(layout_, v).Annotate("SetMoments (v)"));
    FORGE_RETURN_IF_ERROR(CopySlots(m, buf_->m, stream));
    FORGE_RETURN_IF_ERROR(CopySlots(v, buf_->v, stream));
  } else {
    FORGE_RETURN_IF_ERROR(CopyUnits(m, buf_->m, stream).Annotate("SetMoments (m)"));
    FORGE_RETURN_IF_ERROR(CopyUnits(v, buf_->v, stream).Annotate("SetMoments (v)"));
  }
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

Status CudaModel::DownloadMoments(UnitBuffers* m, UnitBuffers* v, cudaStream_t stream) {
  if (o_.shard_optimizer) {
    return Status::Precondition("cuda model: sharded moments are gathered by the data-parallel "
                                "layer");
  }
  FORGE_RETURN_IF_ERROR(ReadUnits(buf_->m, m, stream));
  return ReadUnits(buf_->v, v, stream);
}

Status CudaModel::ZeroMoments(cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(FlushUpdate(stream));
  FORGE_CUDA_CHECK(cudaMemsetAsync(buf_->m, 0, buf_->state_flat * sizeof(float), stream));
  FORGE_CUDA_CHECK(cudaMemsetAsync(buf_->v, 0, buf_->state_flat * sizeof(float), stream));
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return Status::Ok();
}

// ---- GEMM shapes ---------------------------------------------------------------------------

namespace {

// y[M, out] = x[M, in] W[out, in]^T (+ residual[M, out] when given; residual is only read)
GemmArgs Linear(bf16* y, const bf16* x, const bf16* w, int64_t M, int64_t out, int64_t in,
                const bf16* residual = nullptr) {
  GemmArgs g;
  g.M = M, g.N = out, g.K = in;
  g.A = x, g.B = w, g.D = y;
  g.trans_a = false, g.trans_b = true;
  g.accumulate = residual != nullptr;
  g.C = residual;
  return g;
}

// dx[M, in] = dy[M, out] W[out, in]   (bf16 out, overwrites)
GemmArgs LinearBackwardData(bf16* dx, const bf16* dy, const bf16* w, int64_t M, int64_t out,
                            int64_t in) {
  GemmArgs g;
  g.M = M, g.N = in, g.K = out;
  g.A = dy, g.B = w, g.D = dx;
  g.trans_a = false, g.trans_b = false;  // W stored [K=out, N=in]
  return g;
}

// dW[out, in] (+)= dy[M, out]^T x[M, in]   (fp32; accumulate across micro-steps and for the
// tied wte sum; the first write of a step overwrites, so gradients need no zeroing pass)
GemmArgs LinearBackwardWeight(float* dw, const bf16* dy, const bf16* x, int64_t M, int64_t out,
                              int64_t in, bool accumulate) {
  GemmArgs g;
  g.M = out, g.N = in, g.K = M;
  g.A = dy, g.B = x, g.D = dw;
  g.trans_a = true;   // dy stored [K=M, out]
  g.trans_b = false;  // x stored [K=M, N=in]
  g.d_type = DType::kFp32;
  g.accumulate = accumulate;
  return g;
}

}  // namespace

// ---- step pieces ---------------------------------------------------------------------------

bool CudaModel::rope_gemm_active() const { return buf_->rope_gemm; }
bool CudaModel::fp8_attention_rope_active() const { return buf_->fp8_attention_rope; }
bool CudaModel::swiglu_gemm_active() const { return buf_->swiglu_gemm; }
bool CudaModel::swiglu_bwd_gemm_active() const { return buf_->swiglu_bwd_gemm; }

// Our own GEMM (sm_90 only) takes the QKV and gate/up projections and the down projection's
// input gradient of BF16 steps where it accepts the shapes (cuda::WgmmaGemmCheck); otherwise
// (or when the options are off, or the model computes in FP8, whose linears are Fp8Linears':
// its gate/up GEMM with SwiGLU is Fp8Linears::fuse_swiglu_gemm) cuBLASLt and the separate
// RoPE/SwiGLU kernels run, with the same results.
Status CudaModel::SetUpEpilogueGemms(const CudaModelOptions& o) {
  Buffers& b = *buf_;
  const bool here =
      !o.fp8 && (o.rope_gemm || o.swiglu_gemm || o.swiglu_bwd_gemm) && cuda::WgmmaGemmRunsHere();
  // QK-norm sits between the QKV projection and RoPE.
  b.rope_gemm =
      o.rope_gemm && here && !m_.qk_norm && cuda::WgmmaGemmCheck(QkvRopeGemm()).ok();
  b.swiglu_gemm = o.swiglu_gemm && here && cuda::WgmmaGemmCheck(GateUpSwiGluGemm()).ok();
  b.swiglu_bwd_gemm =
      o.swiglu_bwd_gemm && here && cuda::WgmmaGemmCheck(DownSwiGluBackwardGemm()).ok();
  if (!b.rope_gemm) return Status::Ok();
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

Status CudaModel::ZeroGrads(cudaStream_t stream) {
  if (o_.shard_params) return Status::Precondition("cuda model: ZeroGrads with fsdp");
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kCopy, stream));
  FORGE_CUDA_CHECK(cudaMemsetAsync(buf_->grads, 0, buf_->flat * sizeof(float), stream));
  return Status::Ok();
}

Status CudaModel::ForwardBackward(const int32_t* inputs, const int32_t* targets, float dloss,
                                  bool accumulate_grads, float* losses, cudaStream_t stream) {
  return Forward(inputs, targets, dloss, /*backward=*/true, accumulate_grads, losses, stream);
}

Status CudaModel::ForwardLoss(const int32_t* inputs, const int32_t* targets, float* losses,
                              cudaStream_t stream) {
  return Forward(inputs, targets, 0.0f, /*backward=*/false, /*accumulate_grads=*/true, losses,
                 stream);
}

Status CudaModel::BlockForward(int layer, int set, const BlockActs& a, const bf16* x_in,
                               bf16* x_out, cudaStream_t s) {
  Buffers& b = *buf_;
  const BlockOffsets& o = layout_.block;
  const bf16* w = UnitParams(layout_.block_unit(layer));
  const int Bm = o_.micro_batch;
  Fp8Linears* f8 = b.fp8.get();
  // One linear layer: y = x W^T (+ residual), in FP8 after casting x (which also saves its
  // transposed copy for the weight gradient), else BF16.
  auto linear = [&](LinearKind k, bf16* y, const bf16* x, int64_t weight_offset, int64_t out,
                    int64_t in, const bf16* residual) -> Status {
    if (f8 == nullptr) return b.gemm.Run(Linear(y, x, w + weight_offset, N_, out, in, residual), s);
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdElementwise, s));
    FORGE_RETURN_IF_ERROR(f8->CastInput(layer, k, set, x, s));
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdGemm, s));
    return b.gemm.Run(f8->Forward(layer, k, y, residual), s);
  };

  // FP8: RMSNorm of x into linear layer k's FP8 input; on a delayed step the norm writes it
  // itself (no bf16 h), else through h and the cast.
  auto norm_to_input = [&](LinearKind k, const bf16* x, int64_t norm_offset, bf16* h,
                           float* rstd) -> Status {
    if (f8->fuse_norm())
      return f8->RmsNormToInput(layer, k, set, rstd, x, w + norm_offset, m_.norm_eps, s);
    FORGE_RETURN_IF_ERROR(
        cuda::RmsNormForward(h, rstd, x, w + norm_offset, N_, d_, m_.norm_eps, s));
    return f8->CastInput(layer, k, set, h, s);
  };

  // RMSNorm of x into h (FP8: into the layer's input casts), then h's linear layer.
  auto norm_linear = [&](LinearKind k, const bf16* x, int64_t norm_offset, bf16* h, float* rstd,
                         bf16* y, int64_t weight_offset, int64_t out) -> Status {
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdElementwise, s));
    if (f8 != nullptr) {
      FORGE_RETURN_IF_ERROR(norm_to_input(k, x, norm_offset, h, rstd));
      FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdGemm, s));
      return b.gemm.Run(f8->Forward(layer, k, y), s);
    }
    FORGE_RETURN_IF_ERROR(
        cuda::RmsNormForward(h, rstd, x, w + norm_offset, N_, d_, m_.norm_eps, s));
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdGemm, s));
    return linear(k, y, h, weight_offset, out, d_, nullptr);
  };

  // RMSNorm of x, then our own GEMM with its epilogue (see rope_gemm): BF16 on h (A), FP8 on
  // linear layer k's input cast (which g, from Fp8Linears, already reads).
  auto norm_epilogue_gemm = [&](LinearKind k, cuda::WgmmaGemmArgs g, const bf16* x,
                                int64_t norm_offset, bf16* h, float* rstd) -> Status {
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdElementwise, s));
    if (f8 != nullptr) {
      FORGE_RETURN_IF_ERROR(norm_to_input(k, x, norm_offset, h, rstd));
      FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdGemm, s));
      return cuda::WgmmaGemmFp8(g, s);
    }
    FORGE_RETURN_IF_ERROR(
        cuda::RmsNormForward(h, rstd, x, w + norm_offset, N_, d_, m_.norm_eps, s));
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdGemm, s));
    g.A = h;
    return cuda::WgmmaGemmBf16(g, s);
  };

  if (b.rope_gemm) {
    cuda::WgmmaGemmArgs g = QkvRopeGemm();
    g.B = w + o.wqkv, g.D = a.qkv;
    FORGE_RETURN_IF_ERROR(
        norm_epilogue_gemm(LinearKind::kQkv, g, x_in, o.attn_norm, a.h1, a.rstd1));
  } else if (f8 != nullptr && f8->has_rope_gemm()) {  // FP8: RoPE in our GEMM
    FORGE_RETURN_IF_ERROR(norm_epilogue_gemm(LinearKind::kQkv, f8->QkvRopeGemm(layer, a.qkv), x_in,
                                             o.attn_norm, a.h1, a.rstd1));
  } else {
    FORGE_RETURN_IF_ERROR(norm_linear(LinearKind::kQkv, x_in, o.attn_norm, a.h1, a.rstd1, a.qkv,
                                      o.wqkv, qkv_dim_));
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdElementwise, s));
    if (m_.qk_norm) {
      FORGE_RETURN_IF_ERROR(cuda::HeadRmsNormForward(a.qkv, a.qk_raw, a.rstd_qk, w + o.q_norm,
                                                     w + o.k_norm, b.qk_norm, s));
    }
    FORGE_RETURN_IF_ERROR(
        cuda::RopeApply(a.qkv, Bm, T_, H_, KV_, hd_, b.rope_freq, /*inverse=*/false, s));
  }
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdAttention, s));
  FORGE_RETURN_IF_ERROR(b.sdpa.Forward(b.sdpa_shape, a.qkv, a.att, a.stats, s));
  // x_mid = x_in + att Wo^T: the residual add rides on the GEMM (C = x_in, beta = 1); x_in
  // stays intact because backward needs it for the attn_norm gradient.
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdGemm, s));
  FORGE_RETURN_IF_ERROR(
      linear(LinearKind::kOut, a.x_mid, a.att, o.wo, d_, H_ * hd_, /*residual=*/x_in));
  // FP8 on a delayed step: SwiGLU writes the down projection's FP8 input itself (no bf16 sw).
  const bool fused = f8 != nullptr && f8->fuse_swiglu();
  if (b.swiglu_gemm) {
    cuda::WgmmaGemmArgs g = GateUpSwiGluGemm();
    g.B = w + o.w_gate_up, g.D = a.sw, g.epi.gu = a.gu;
    FORGE_RETURN_IF_ERROR(
        norm_epilogue_gemm(LinearKind::kGateUp, g, a.x_mid, o.mlp_norm, a.h2, a.rstd2));
  } else if (fused && f8->fuse_swiglu_gemm()) {  // FP8: SwiGLU and its casts in our GEMM
    FORGE_RETURN_IF_ERROR(norm_epilogue_gemm(LinearKind::kGateUp,
                                             f8->GateUpSwiGluGemm(layer, set, a.gu), a.x_mid,
                                             o.mlp_norm, a.h2, a.rstd2));
  } else {
    FORGE_RETURN_IF_ERROR(norm_linear(LinearKind::kGateUp, a.x_mid, o.mlp_norm, a.h2, a.rstd2,
                                      a.gu, o.w_gate_up, 2 * ffn_));
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdElementwise, s));
    if (fused) {
      FORGE_RETURN_IF_ERROR(f8->SwiGluForwardToInput(layer, set, a.gu, s));
    } else {
      FORGE_RETURN_IF_ERROR(cuda::SwiGluForward(a.sw, a.gu, N_, ffn_, s));
    }
  }
  if (x_out == nullptr) {
    // Recompute in backward: the output is not needed, but FP8's dWdown reads sw's cast.
    return f8 == nullptr || fused ? Status::Ok()
                                  : f8->CastInput(layer, LinearKind::kDown, set, a.sw, s);
  }
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdGemm, s));
  if (fused) return b.gemm.Run(f8->Forward(layer, LinearKind::kDown, x_out, a.x_mid), s);
  return linear(LinearKind::kDown, x_out, a.sw, o.w_down, d_, ffn_, /*residual=*/a.x_mid);
}

// ---- the wgrad stream ----------------------------------------------------------------------
//
// Every weight-gradient GEMM runs on gemm_w; with the wgrad stream it runs there, forked right
// after its inputs were enqueued on the compute stream (the fork event orders it after
// everything enqueued so far, which also covers the previous step's optimizer reading the
// gradient it overwrites). Each GEMM is the same call as single-stream (same runner, shapes,
// alignment, so the same plan), and the GEMMs that add into one gradient (dWte chunks, then
// the embedding backward; micro-steps) stay in their order, so the gradients are bitwise the
// same. What the two streams must not race on is spelled out where each wait is issued; the
// general rules: the wgrad stream only reads activations and gradient scratch and only writes
// gradient tensors no chain kernel touches (except the tied dWte, see kDwte), and
// ForwardBackward joins the wgrad stream back before it returns, so the next micro-step's
// forward, the optimizer, host reads and EndCapture all come after every dW GEMM.

Status CudaModel::WgradGemm(const GemmArgs& g, WgradHazard reads, cudaStream_t s) {
  Buffers& b = *buf_;
  if (!dual_) return b.gemm_w.Run(g, s);
  FORGE_CUDA_CHECK(cudaEventRecord(b.fork, s));
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(b.wgrad, b.fork, 0));
  wgrad_pending_ = true;  // from here on the wgrad stream must be joined back
  FORGE_RETURN_IF_ERROR(b.gemm_w.Run(g, b.wgrad));
  return RecordWgrad(reads);
}

Status CudaModel::RecordWgrad(WgradHazard h) {
  if (!dual_) return Status::Ok();
  const int i = static_cast<int>(h);
  FORGE_CUDA_CHECK(cudaEventRecord(buf_->hazard[i], buf_->wgrad));
  hazard_recorded_[i] = true;
  return Status::Ok();
}

Status CudaModel::WaitWgrad(WgradHazard h, cudaStream_t s) {
  const int i = static_cast<int>(h);
  if (!dual_ || !hazard_recorded_[i]) return Status::Ok();
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(s, buf_->hazard[i], 0));
  return Status::Ok();
}

Status CudaModel::JoinWgrad(cudaStream_t s) {
  if (!dual_ || !wgrad_pending_) return Status::Ok();
  FORGE_CUDA_CHECK(cudaEventRecord(buf_->join, buf_->wgrad));
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(s, buf_->join, 0));
  wgrad_pending_ = false;
  return Status::Ok();
}

// dres holds dL/d(block output) on entry and dL/d(block input) on return: the residual path
// passes it through and each RmsNormBackward adds its branch's contribution. The block's
// weight gradients are added to (accumulate_grads) or overwritten, every element either way.
//
// Each dW GEMM is issued before the dx GEMM that shares its input, so the fork does not make
// it wait for that dx GEMM. Write-after-read hazards of the dW GEMMs (they read dres, dgu,
// dqkv and this block's activations, all rewritten later on the compute stream):
// - dres: dWdown and dWo read it; each RmsNormBackward rewrites it in place (accumulate_dx),
//   two chain kernels after dWdown and three after dWo. No double buffer: the kernel has no
//   out-of-place form; the chain waits (kDres) before each norm backward. dWdown's window is
//   SwiGLU backward + the dh GEMM (≈ 2× dWdown's time), dWo's is the attention backward.
// - dgu: dWgu of block l reads it; SwiGluBackward of block l-1 rewrites it a whole block of
//   chain work later (kDgu). Single buffer: the wait is all but free (185 MB saved).
// - dqkv: dWqkv of block l reads it; the attention backward of block l-1 rewrites it (kDqkv),
//   likewise a block later.
// - activations (h1, att, h2, sw): per-layer sets are never rewritten in backward; the shared
//   recompute set is, by block l-1's recompute: Forward waits for kDqkv there (dWqkv is the
//   block's last dW GEMM, and the wgrad stream runs in order). Selective recompute's two sets
//   of h1/h2/sw: block l's refill follows block l+1's kDqkv wait, which covers block l+2's
//   dW GEMMs, the last readers of that set.
// The norm weight gradients are written by the chain (RmsNormBackward), disjoint from the dW
// tensors.
//
// FP8: each linear's output gradient is cast (E5M2, plus its transposed copy) right before its
// two GEMMs, which then read the casts; the weight gradient reads the input's transposed cast
// saved by the forward. The casts' buffers (one per linear kind) are read on the wgrad stream
// by block l's dW GEMMs and rewritten by block l-1's casts, each issued after a wait that
// already covers that dW GEMM: kDres (after dWo of block l, so also dWdown and dWgu before
// it) precedes block l-1's first cast, kDgu its gate/up cast, kDqkv its qkv cast. The saved
// input casts follow the activation sets' rules above.
Status CudaModel::BlockBackward(int layer, int set, const BlockActs& a, const bf16* x_in,
                                bf16* dres, bool accumulate_grads, cudaStream_t s) {
  Buffers& b = *buf_;
  const BlockOffsets& o = layout_.block;
  const bf16* w = UnitParams(layout_.block_unit(layer));
  float* g = UnitGrads(layout_.block_unit(layer));
  const int Bm = o_.micro_batch;
  const bool acc = accumulate_grads;
  Fp8Linears* f8 = b.fp8.get();
  // BF16: dW (+)= dy^T x on the wgrad stream.
  auto weight_grad = [&](const bf16* dy, const bf16* x, int64_t weight_offset, int64_t out,
                         int64_t in, WgradHazard reads) -> Status {
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdGemm, s));
    GemmArgs wg = LinearBackwardWeight(g + weight_offset, dy, x, N_, out, in, acc);
    if (grads16_direct_) {  // ddp's bf16 collectives read it straight from here
      wg.D = UnitGrads16(layout_.block_unit(layer)) + weight_offset;
      wg.d_type = DType::kBf16;
    }
    return WgradGemm(wg, reads, s);
  };
  // FP8: dy's casts (unless `cast_done`: its producer wrote them), then dW (+)= dy8t x8t^T on
  // the wgrad stream.
  auto fp8_weight_grad = [&](LinearKind k, const bf16* dy, int64_t weight_offset,
                             WgradHazard reads, bool cast_done) -> Status {
    if (!cast_done) {
      FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdElementwise, s));
      FORGE_RETURN_IF_ERROR(f8->CastGrad(layer, k, dy, s));
    }
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdGemm, s));
    return WgradGemm(f8->BackwardWeight(layer, k, set, g + weight_offset, acc), reads, s);
  };
  // dW (+)= dy^T x on the wgrad stream, then dx = dy W on this one.
  // `cast_done`: dy's FP8 casts were written by its producer (fused SwiGLU backward).
  auto linear_backward = [&](LinearKind k, bf16* dx, const bf16* dy, const bf16* x,
                             int64_t weight_offset, int64_t out, int64_t in, WgradHazard reads,
                             bool cast_done = false) -> Status {
    if (f8 == nullptr) {
      FORGE_RETURN_IF_ERROR(weight_grad(dy, x, weight_offset, out, in, reads));
      return b.gemm.Run(LinearBackwardData(dx, dy, w + weight_offset, N_, out, in), s);
    }
    FORGE_RETURN_IF_ERROR(fp8_weight_grad(k, dy, weight_offset, reads, cast_done));
    return b.gemm.Run(f8->BackwardData(layer, k, dx), s);
  };

  // FP8 on a delayed step: the norm backward that wrote dres (the final norm's, or block
  // l+1's attention norm's) also wrote its casts for this block's Down projection; this
  // block's MLP norm backward writes them for its Out projection (NormBackward).
  const bool fused_dres = f8 != nullptr && f8->fuse_norm_grad();
  // MLP: x_out = x_mid + SwiGLU(h2 Wgu^T) Wdown^T
  const bool fused = f8 != nullptr && f8->fuse_swiglu();  // writes dgu's FP8 casts directly
  if (b.swiglu_bwd_gemm) {
    // dh = dres W_down with SwiGLU's backward in the GEMM: dgu comes out, dh is never stored.
    FORGE_RETURN_IF_ERROR(weight_grad(dres, a.sw, o.w_down, d_, ffn_, WgradHazard::kDres));
    FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDgu, s));  // block l+1's dWgu reads dgu
    cuda::WgmmaGemmArgs gb = DownSwiGluBackwardGemm();
    gb.A = dres, gb.B = w + o.w_down, gb.D = b.dgu, gb.epi.gu = a.gu;
    FORGE_RETURN_IF_ERROR(cuda::WgmmaGemmBf16(gb, s));
  } else if (f8 != nullptr && f8->fuse_swiglu_bwd_gemm()) {
    // FP8: dh = dres8 W_down8 with SwiGLU's backward in one kernel straight into dgu's casts.
    FORGE_RETURN_IF_ERROR(
        fp8_weight_grad(LinearKind::kDown, dres, o.w_down, WgradHazard::kDres, fused_dres));
    FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDgu, s));  // block l+1's dWgu reads dgu
    FORGE_RETURN_IF_ERROR(f8->SwiGluBackwardGemm(layer, a.gu, s));
  } else {
    FORGE_RETURN_IF_ERROR(linear_backward(LinearKind::kDown, b.dsw, dres, a.sw, o.w_down, d_, ffn_,
                                          WgradHazard::kDres, fused_dres));
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdElementwise, s));
    FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDgu, s));  // block l+1's dWgu reads dgu
    if (fused) {
      FORGE_RETURN_IF_ERROR(f8->SwiGluBackwardToGrad(layer, b.dsw, a.gu, s));
    } else {
      FORGE_RETURN_IF_ERROR(cuda::SwiGluBackward(b.dgu, b.dsw, a.gu, N_, ffn_, s));
    }
  }
  FORGE_RETURN_IF_ERROR(linear_backward(LinearKind::kGateUp, b.dh, b.dgu, a.h2, o.w_gate_up,
                                        2 * ffn_, d_, WgradHazard::kDgu, fused));
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdElementwise, s));
  FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDres, s));  // dWdown reads dres
  FORGE_RETURN_IF_ERROR(NormBackward(layer, LinearKind::kOut, dres, g + o.mlp_norm, b.dh,
                                     a.x_mid, w + o.mlp_norm, a.rstd2, /*accumulate_dx=*/true,
                                     acc, s));

  // Attention: x_mid = x_in + SDPA(rope(h1 Wqkv^T)) Wo^T
  FORGE_RETURN_IF_ERROR(linear_backward(LinearKind::kOut, b.datt, dres, a.att, o.wo, d_, H_ * hd_,
                                        WgradHazard::kDres, fused_dres));
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdAttention, s));
  FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDqkv, s));  // block l+1's dWqkv reads dqkv
  if (hooks_ && hooks_->comm_window) {
    FORGE_RETURN_IF_ERROR(hooks_->comm_window(layout_.block_unit(layer), s));
  }
  // FP8 on a delayed step: the inverse RoPE writes the QKV gradient's FP8 casts itself, in
  // our attention backward's epilogue where it runs (fp8_attention_rope), else after it.
  const bool fused_rope = f8 != nullptr && f8->fuse_rope();
  const bool rope_in_attention = fused_rope && buf_->fp8_attention_rope;
  const cuda::FlashBackwardFp8Out qkv8 =
      rope_in_attention ? f8->QkvGradFromAttention(layer) : cuda::FlashBackwardFp8Out{};
  FORGE_RETURN_IF_ERROR(b.sdpa.Backward(b.sdpa_shape, a.qkv, a.att, b.datt, a.stats, b.dqkv,
                                        b.softmax_sum, b.dq_accum, s,
                                        rope_in_attention ? &qkv8 : nullptr));
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdElementwise, s));
  if (fused_rope) {
    if (!rope_in_attention) FORGE_RETURN_IF_ERROR(f8->RopeBackwardToGrad(layer, b.dqkv, s));
  } else {
    FORGE_RETURN_IF_ERROR(
        cuda::RopeApply(b.dqkv, Bm, T_, H_, KV_, hd_, b.rope_freq, /*inverse=*/true, s));
    if (m_.qk_norm) {  // RoPE's FP8 fusions are off with it (Fp8RopeShape::fuse)
      FORGE_RETURN_IF_ERROR(cuda::HeadRmsNormBackward(
          b.dqkv, g + o.q_norm, g + o.k_norm, a.qk_raw, w + o.q_norm, w + o.k_norm, a.rstd_qk,
          b.qk_norm, acc, b.qk_norm_ws, b.qk_norm_ws_bytes, s));
    }
  }
  FORGE_RETURN_IF_ERROR(linear_backward(LinearKind::kQkv, b.dh, b.dqkv, a.h1, o.wqkv, qkv_dim_,
                                        d_, WgradHazard::kDqkv, fused_rope));
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdElementwise, s));
  FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDres, s));  // dWo reads dres
  // dres is now block l-1's output gradient: the casts for its Down projection.
  return NormBackward(layer - 1, LinearKind::kDown, dres, g + o.attn_norm, b.dh, x_in,
                      w + o.attn_norm, a.rstd1, /*accumulate_dx=*/true, acc, s);
}

// Selective recompute: block `layer`'s h1, h2 and sw again, with the forward's kernels on the
// kept x_in, x_mid and gu (the epilogue GEMMs round before their math, so these are their
// bits too; the rstd rewritten are the same values). Their set (layer % 2) was last read by
// block layer+2's dW GEMMs, which the chain waited for (kDqkv) in block layer+1's backward.
Status CudaModel::RecomputeNormAndSwiGlu(int layer, const BlockActs& a, const bf16* x_in,
                                         cudaStream_t s) {
  const BlockOffsets& o = layout_.block;
  const bf16* w = UnitParams(layout_.block_unit(layer));
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdElementwise, s));
  FORGE_RETURN_IF_ERROR(
      cuda::RmsNormForward(a.h1, a.rstd1, x_in, w + o.attn_norm, N_, d_, m_.norm_eps, s));
  FORGE_RETURN_IF_ERROR(
      cuda::RmsNormForward(a.h2, a.rstd2, a.x_mid, w + o.mlp_norm, N_, d_, m_.norm_eps, s));
  return cuda::SwiGluForward(a.sw, a.gu, N_, ffn_, s);
}

// RMSNorm backward into the residual stream's gradient dres, which is the output gradient of
// linear `k` of block `cast_layer` (none below block 0): on a delayed FP8 step the same
// kernel writes that projection's E5M2 casts, and the projection's backward skips its cast.
// The casts' buffers are free here: the wait for kDres before each norm backward covers the
// dW GEMMs that read them last (see BlockBackward).
Status CudaModel::NormBackward(int cast_layer, LinearKind k, bf16* dres, float* dw,
                               const bf16* dout, const bf16* x, const bf16* w, const float* rstd,
                               bool accumulate_dx, bool accumulate_dw, cudaStream_t s) {
  Buffers& b = *buf_;
  const int ws = k == LinearKind::kOut ? 0 : 1;
  char* work = b.norm_ws[size_t(ws)];
  // With norm_dw_on_wgrad the dw reduction runs on the wgrad stream; the reduction that last
  // read this buffer there must be done with it first.
  const bool on_wgrad = dual_ && o_.norm_dw_on_wgrad;
  const WgradHazard h = ws == 0 ? WgradHazard::kNormWs0 : WgradHazard::kNormWs1;
  cuda::RmsNormDwReduce dw_reduce;
  if (on_wgrad) {
    FORGE_RETURN_IF_ERROR(WaitWgrad(h, s));
    dw_reduce = {b.wgrad, b.fork};
    wgrad_pending_ = true;
  }
  if (cast_layer >= 0 && b.fp8 && b.fp8->fuse_norm_grad()) {
    FORGE_RETURN_IF_ERROR(b.fp8->RmsNormBackwardToGrad(cast_layer, k, dres, dw, dout, x, w, rstd,
                                                       work, b.norm_ws_bytes, accumulate_dx,
                                                       accumulate_dw, s, dw_reduce));
  } else {
    FORGE_RETURN_IF_ERROR(cuda::RmsNormBackward(dres, dw, dout, x, w, rstd, N_, d_, work,
                                                b.norm_ws_bytes, s, accumulate_dx, accumulate_dw,
                                                dw_reduce));
  }
  return on_wgrad ? RecordWgrad(h) : Status::Ok();
}

// Tied LM head + loss over token chunks, so only [chunk, V] bf16 logits buffers exist:
// logits = hf Wte^T; cross-entropy turns them into dlogits in place; dhf = dlogits Wte;
// dWte (+)= dlogits^T hf (fp32, into the same gradient the embedding backward adds to later).
// Without accumulate_grads the first chunk overwrites dWte (every element: [V, d]) and the
// later chunks add to it.
//
// With the wgrad stream, dWte of chunk c runs there next to chunk c's dhf GEMM and chunk
// c+1's logits GEMM and cross-entropy. Chunk c's dlogits buffer is rewritten by the logits
// GEMM of chunk c + num_logits, which waits for that buffer's last dWte (kLogits0/1); with two
// buffers that is two chunks of chain work later. hf is only read here (rewritten by the next
// forward, after the join). dh rows are written by the chain only. The FP8 LM head's dWte
// (Fp8Linears::lm_head_wgrad) reads the same buffer (holding dlogits8's transposed copy then)
// and hf8t of the same slot, whose cast comes after that wait too.
Status CudaModel::LmHead(const int32_t* targets, float dloss, bool backward,
                         bool accumulate_grads, float* losses, cudaStream_t s) {
  Buffers& b = *buf_;
  // The head's weight: wte itself when tied, else the embedding unit's lm_head tensor.
  const bf16* wte = UnitParams(layout_.embedding_unit()) + layout_.lm_head;
  float* dwte = UnitGrads(layout_.embedding_unit()) + layout_.lm_head;
  const int64_t chunk = std::min<int64_t>(N_, o_.lm_head_chunk_rows);
  // FP8 logits and dhf GEMMs (precision.fp8.lm_head): Wte cast as the blocks' weights are,
  // once per step (its first micro-batch) and for every evaluation pass.
  Fp8Linears* f8 = b.fp8 && b.fp8->lm_head() ? b.fp8.get() : nullptr;
  if (f8 != nullptr && (!backward || !accumulate_grads)) {
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdElementwise, s));
    FORGE_RETURN_IF_ERROR(f8->CastLmHeadWeight(wte, s));
  }
  int c = 0;
  for (int64_t r0 = 0; r0 < N_; r0 += chunk, ++c) {
    const int64_t rows = std::min(chunk, N_ - r0);
    const bf16* hf = b.hf + r0 * d_;
    const int slot = c % b.num_logits;
    bf16* logits = b.logits[slot];
    const WgradHazard logits_read = slot == 0 ? WgradHazard::kLogits0 : WgradHazard::kLogits1;
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kLmHeadGemm, s));
    FORGE_RETURN_IF_ERROR(WaitWgrad(logits_read, s));  // dWte of chunk c - num_logits
    if (f8 != nullptr) {
      FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdElementwise, s));
      FORGE_RETURN_IF_ERROR(f8->CastLmHeadInput(hf, rows, backward ? slot : -1, s));
      FORGE_RETURN_IF_ERROR(Mark(StepPhase::kLmHeadGemm, s));
      FORGE_RETURN_IF_ERROR(b.gemm.Run(f8->LmHeadForward(logits, rows), s));
    } else {
      FORGE_RETURN_IF_ERROR(b.gemm.Run(Linear(logits, hf, wte, rows, V_, d_), s));
    }
    FORGE_RETURN_IF_ERROR(Mark(StepPhase::kCrossEntropy, s));
    // FP8: the dgrad's E5M2 dlogits come out of the cross-entropy kernel itself on a delayed
    // step, from a cast of its bf16 output otherwise.
    if (f8 != nullptr && backward && f8->fuse_lm_head_grad()) {
      FORGE_RETURN_IF_ERROR(
          f8->CrossEntropyToGrad(logits, losses + r0, targets + r0, rows, dloss, s));
    } else {
      FORGE_RETURN_IF_ERROR(cuda::CrossEntropyForwardBackward(logits, losses + r0, targets + r0,
                                                              rows, V_, dloss, backward, s));
      if (f8 != nullptr && backward) {
        FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdElementwise, s));
        FORGE_RETURN_IF_ERROR(f8->CastLmHeadGrad(logits, rows, s));
      }
    }
    if (!backward) continue;
    const bool acc = accumulate_grads || r0 > 0;
    if (f8 != nullptr && f8->lm_head_wgrad(rows)) {
      // FP8 dWte: dlogits8's transposed copy goes into this chunk's logits buffer (no bf16
      // dlogits were written, or the cast above has read them), guarded like the logits.
      FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdElementwise, s));
      FORGE_RETURN_IF_ERROR(f8->TransposeLmHeadGrad(logits, rows, s));
      FORGE_RETURN_IF_ERROR(Mark(StepPhase::kLmHeadGemm, s));
      FORGE_RETURN_IF_ERROR(
          WgradGemm(f8->LmHeadBackwardWeight(dwte, logits, slot, rows, acc), logits_read, s));
    } else {
      FORGE_RETURN_IF_ERROR(Mark(StepPhase::kLmHeadGemm, s));
      FORGE_RETURN_IF_ERROR(
          WgradGemm(LinearBackwardWeight(dwte, logits, hf, rows, V_, d_, acc), logits_read, s));
    }
    FORGE_RETURN_IF_ERROR(b.gemm.Run(
        f8 != nullptr ? f8->LmHeadBackwardData(b.dh + r0 * d_, rows)
                      : LinearBackwardData(b.dh + r0 * d_, logits, wte, rows, V_, d_),
        s));
  }
  // The embedding backward adds into dWte on the chain after the last dWte chunk.
  if (backward) FORGE_RETURN_IF_ERROR(RecordWgrad(WgradHazard::kDwte));
  return Status::Ok();
}

Status CudaModel::Forward(const int32_t* inputs, const int32_t* targets, float dloss,
                          bool backward, bool accumulate_grads, float* losses, cudaStream_t s) {
  dual_ = backward && buf_->wgrad != nullptr && timeline_ == nullptr;
  wgrad_pending_ = false;
  // ddp, bf16 collectives, a step of one micro-step, BF16 GEMMs: see CastUnitGradsToBf16.
  grads16_direct_ = backward && !accumulate_grads && buf_->grads16 != nullptr &&
                    buf_->fp8 == nullptr && hooks_ != nullptr && hooks_->grads_to_bf16;
  hazard_recorded_.fill(false);
  if (backward) unit_sumsq_ready_ = false;
  // The last step's deferred AdamW, before the weights are first read in this step (its first
  // micro-batch) or in an evaluation pass.
  const Status st = [&]() -> Status {
    if (buf_->update && (!backward || !accumulate_grads)) {
      FORGE_RETURN_IF_ERROR(Mark(StepPhase::kOptimizer, s));
      FORGE_RETURN_IF_ERROR(buf_->update->Begin(s, /*overlap=*/timeline_ == nullptr));
    }
    return ForwardImpl(inputs, targets, dloss, backward, accumulate_grads, losses, s);
  }();
  // Join even after an error, so no wgrad or update work is left unordered (or unjoined in
  // a capture).
  const Status update_joined = buf_->update ? buf_->update->End(s) : Status::Ok();
  Status joined = JoinWgrad(s);
  if (joined.ok()) joined = update_joined;
  dual_ = false;
  // Without hooks every unit's GradReady summed its gradient's squares (UnitSumSquares).
  if (backward && st.ok() && joined.ok()) unit_sumsq_ready_ = hooks_ == nullptr;
  return st.ok() ? joined : st;
}

Status CudaModel::ForwardImpl(const int32_t* inputs, const int32_t* targets, float dloss,
                              bool backward, bool accumulate_grads, float* losses,
                              cudaStream_t s) {
  Buffers& b = *buf_;
  const int L = m_.n_layer;
  const int fin = layout_.final_norm_unit();
  const bool recompute = o_.recompute == Recompute::kFull;
  // Selective: the two sets of h1/h2/sw still hold blocks L-1 and L-2 from the forward.
  const bool selective = o_.recompute == Recompute::kSelective && b.fp8 == nullptr;
  auto set = [&](int l) { return recompute ? 0 : l; };
  auto acts = [&](int l) -> const BlockActs& { return b.acts[set(l)]; };
  // FP8 weights are cast once per step (its first micro-batch) and for every evaluation pass
  // (the optimizer changed the weights since).
  const bool cast_weights = b.fp8 != nullptr && (!backward || !accumulate_grads);

  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdElementwise, s));
  FORGE_RETURN_IF_ERROR(BeforeForward(layout_.embedding_unit(), s));
  FORGE_RETURN_IF_ERROR(cuda::EmbeddingForward(b.xs[0], inputs,
                                               UnitParams(layout_.embedding_unit()), N_, d_, s));
  for (int l = 0; l < L; ++l) {
    FORGE_RETURN_IF_ERROR(BeforeForward(layout_.block_unit(l), s));
    if (cast_weights) FORGE_RETURN_IF_ERROR(CastLayerWeights(l, s));
    FORGE_RETURN_IF_ERROR(BlockForward(l, set(l), acts(l), b.xs[l], b.xs[l + 1], s));
  }
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdElementwise, s));
  FORGE_RETURN_IF_ERROR(BeforeForward(layout_.final_norm_unit(), s));
  FORGE_RETURN_IF_ERROR(cuda::RmsNormForward(b.hf, b.rstd_f, b.xs[L], UnitParams(fin), N_, d_,
                                             m_.norm_eps, s));
  FORGE_RETURN_IF_ERROR(LmHead(targets, dloss, backward, accumulate_grads, losses, s));
  // An evaluation pass must not shape the next step's FP8 scales.
  if (!backward) return b.fp8 ? b.fp8->ResetAmax(s) : Status::Ok();

  // dL/dhf is in dh. The final norm's backward starts the residual gradient (overwrites dres,
  // so it needs no zeroing); every later RmsNormBackward adds to it. No dW GEMM reads dh or
  // dres yet (dWte reads the logits buffers and hf).
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdElementwise, s));
  // FP8: dres is the last block's Down output gradient (NormBackward writes its casts).
  FORGE_RETURN_IF_ERROR(NormBackward(L - 1, LinearKind::kDown, b.dres, UnitGrads(fin), b.dh,
                                     b.xs[L], UnitParams(fin), b.rstd_f,
                                     /*accumulate_dx=*/false, accumulate_grads, s));
  FORGE_RETURN_IF_ERROR(GradReady(layout_.final_norm_unit(), s));
  // The blocks' backward overlaps the gradient collectives (data parallelism).
  b.gemm.set_default_sm_count(bwd_sm_count_);
  b.gemm_w.set_default_sm_count(wgrad_sm_count_);
  for (int l = L - 1; l >= 0; --l) {
    FORGE_RETURN_IF_ERROR(BeforeBackward(layout_.block_unit(l), s));
    // The shared set still holds the last layer from the forward pass. Recomputing layer l
    // rewrites it while block l+1's dW GEMMs may still read it: wait for the last of them.
    if (recompute && l != L - 1) {
      FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDqkv, s));
      FORGE_RETURN_IF_ERROR(BlockForward(l, set(l), acts(l), b.xs[l], nullptr, s));
    }
    if (selective && l < L - 2) {
      FORGE_RETURN_IF_ERROR(RecomputeNormAndSwiGlu(l, acts(l), b.xs[l], s));
    }
    FORGE_RETURN_IF_ERROR(
        BlockBackward(l, set(l), acts(l), b.xs[l], b.dres, accumulate_grads, s));
    FORGE_RETURN_IF_ERROR(GradReady(layout_.block_unit(l), s));
  }
  b.gemm.set_default_sm_count(0);
  b.gemm_w.set_default_sm_count(0);
  // Always adds: the LM head above already wrote this step's part of the tied gradient, and
  // its last dWte chunk (wgrad stream) must have landed first. Untied, the head's gradient is
  // its own tensor and wte's starts from zero on a pass that overwrites the gradients.
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kBwdElementwise, s));
  FORGE_RETURN_IF_ERROR(WaitWgrad(WgradHazard::kDwte, s));
  if (layout_.lm_head != 0 && !accumulate_grads) {
    FORGE_CUDA_CHECK(cudaMemsetAsync(UnitGrads(layout_.embedding_unit()), 0,
                                     size_t(layout_.lm_head) * sizeof(float), s));
  }
  FORGE_RETURN_IF_ERROR(cuda::EmbeddingBackward(UnitGrads(layout_.embedding_unit()),
                                                b.dres, inputs, N_, d_, V_, b.emb_ws,
                                                b.emb_ws_bytes, s));
  return GradReady(layout_.embedding_unit(), s);
}

Status CudaModel::BeforeForward(int unit, cudaStream_t s) {
  if (buf_->update) FORGE_RETURN_IF_ERROR(buf_->update->WaitUnit(unit, s));
  return hooks_ && hooks_->before_forward ? hooks_->before_forward(unit, s) : Status::Ok();
}

// The events are per unit, and a unit completes once per pass, so a hook may wait on them
// any time before the next pass's GradReady of the same unit.
Status CudaModel::GradReady(int unit, cudaStream_t s) {
  if (hooks_ == nullptr) return UnitSumSquares(unit, s);
  if (!hooks_->grad_ready) return Status::Ok();
  Buffers& b = *buf_;
  FORGE_CUDA_CHECK(cudaEventRecord(b.grad_ready_compute[unit], s));
  cudaEvent_t wgrad_done = nullptr;
  if (dual_ && wgrad_pending_) {
    wgrad_done = b.grad_ready_wgrad[unit];
    FORGE_CUDA_CHECK(cudaEventRecord(wgrad_done, b.wgrad));
  }
  return hooks_->grad_ready(unit, b.grad_ready_compute[unit], wgrad_done);
}

// World 1: the unit's share of the gradient norm as soon as its gradient is final, so the
// 1.4 GB read (gpt350m) overlaps the rest of the backward instead of opening the optimizer.
// On the wgrad stream when it is in use: queued after every dW GEMM forked so far (this
// unit's included) and, through the event, after the chain's writes to the unit; Forward's
// join orders it before the optimizer. Each micro-step recomputes it; the last one counts.
Status CudaModel::UnitSumSquares(int unit, cudaStream_t s) {
  Buffers& b = *buf_;
  cudaStream_t run = s;
  if (dual_) {
    FORGE_CUDA_CHECK(cudaEventRecord(b.grad_ready_compute[unit], s));
    FORGE_CUDA_CHECK(cudaStreamWaitEvent(b.wgrad, b.grad_ready_compute[unit], 0));
    wgrad_pending_ = true;
    run = b.wgrad;
  }
  return SumUnitSquares(unit, run);
}

Status CudaModel::SumUnitSquares(int unit, cudaStream_t s) {
  if (unit < 0 || unit >= static_cast<int>(layout_.units.size()) || UnitGrads(unit) == nullptr) {
    return Status::Invalid("cuda model: no full gradient for unit " + std::to_string(unit));
  }
  float* partial = buf_->unit_sumsq + int64_t{unit} * cuda::SumSquaresPartials();
  const int64_t n = layout_.units[size_t(unit)].numel;
  if (buf_->grads16) return cuda::SumSquaresPartialBf16(UnitGrads16(unit), n, partial, s);
  return cuda::SumSquaresPartial(UnitGrads(unit), n, partial, s);
}

bf16* CudaModel::UnitGrads16(int unit) const {
  return buf_->grads16 ? buf_->grads16 + pb_.unit_offset[size_t(unit)] : nullptr;
}

// The weight GEMMs wrote a block's four matrices (its matmul tensors) in bf16 when
// grads16_direct_; the rest of a block (its norm weights), and every other unit whole, are
// cast from the fp32 gradient.
Status CudaModel::CastUnitGradsToBf16(int unit, cudaStream_t s) {
  if (buf_->grads16 == nullptr) return Status::Precondition("cuda model: no grads16");
  const UnitLayout& u = layout_.units[size_t(unit)];
  if (!(grads16_direct_ && layout_.is_block_unit(unit))) {
    return cuda::CastFloatToBf16(UnitGrads16(unit), UnitGrads(unit), u.numel, s);
  }
  for (const TensorSlot& t : u.tensors) {
    if (t.is_matmul) continue;
    FORGE_RETURN_IF_ERROR(cuda::CastFloatToBf16(UnitGrads16(unit) + t.offset,
                                                UnitGrads(unit) + t.offset, t.numel, s));
  }
  return Status::Ok();
}

Status CudaModel::GradSumSquaresFromUnits(float* sumsq_out, cudaStream_t s) {
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kOptimizer, s));
  const int64_t count = int64_t(layout_.units.size()) * cuda::SumSquaresPartials();
  // The clip scale written here is provisional; ClipAndUpdate replaces it.
  return cuda::GradNormFromPartials(buf_->unit_sumsq, count, opt_.grad_clip, sumsq_out,
                                    buf_->clip_scale, s);
}

Status CudaModel::OptimizerStep(const cuda::AdamWHyper* hyper, float* sumsq_out,
                                cudaStream_t s) {
  Buffers& b = *buf_;
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kOptimizer, s));
  if (unit_sumsq_ready_) {
    FORGE_RETURN_IF_ERROR(GradSumSquaresFromUnits(sumsq_out, s));
  } else {
    FORGE_RETURN_IF_ERROR(cuda::GlobalGradNorm(b.adam_tensors, b.num_tensors, opt_.grad_clip,
                                               sumsq_out, b.clip_scale, b.gradnorm_ws,
                                               b.gradnorm_ws_bytes, s));
  }
  return UpdateOrDefer(hyper, s);
}

// AdamW by the clip scale just written, now or (defer_update) during the next forward; then
// the FP8 scale update, at the step's end either way.
Status CudaModel::UpdateOrDefer(const cuda::AdamWHyper* hyper, cudaStream_t s) {
  Buffers& b = *buf_;
  if (spike_limits_ != nullptr) {
    FORGE_RETURN_IF_ERROR(
        cuda::GateSpike(spike_stats_, spike_divisor_, spike_limits_, b.clip_scale, s));
  }
  if (b.update) {
    FORGE_RETURN_IF_ERROR(b.update->Defer(hyper, s));
  } else {
    FORGE_RETURN_IF_ERROR(cuda::AdamWMultiTensor(b.adam_tensors, b.num_tensors, hyper,
                                                 b.clip_scale, s, b.skipped_steps));
  }
  return EndStep(s);
}

Status CudaModel::FlushUpdate(cudaStream_t s) {
  return buf_->update ? buf_->update->Flush(s) : Status::Ok();
}

Status CudaModel::GradSumSquares(float* sumsq_out, cudaStream_t s) {
  Buffers& b = *buf_;
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kOptimizer, s));
  // The clip scale written here is this rank's; ClipAndUpdate replaces it.
  return cuda::GlobalGradNorm(b.adam_tensors, b.num_tensors, opt_.grad_clip, sumsq_out,
                              b.clip_scale, b.gradnorm_ws, b.gradnorm_ws_bytes, s);
}

Status CudaModel::ClipAndUpdate(const cuda::AdamWHyper* hyper, const float* sumsq,
                                cudaStream_t s) {
  Buffers& b = *buf_;
  FORGE_RETURN_IF_ERROR(cuda::ClipScaleFromSumSquares(sumsq, opt_.grad_clip, b.clip_scale, s));
  return UpdateOrDefer(hyper, s);
}

Status CudaModel::EndStep(cudaStream_t s) {
  return buf_->fp8 ? buf_->fp8->EndStep(s) : Status::Ok();
}

const int64_t* CudaModel::skipped_steps() const { return buf_->skipped_steps; }
const Fp8Linears* CudaModel::fp8() const { return buf_->fp8.get(); }
Fp8Linears* CudaModel::fp8() { return buf_->fp8.get(); }

Status CudaModel::CastLayerWeights(int layer, cudaStream_t s) {
  const BlockOffsets& o = layout_.block;
  const bf16* w = UnitParams(layout_.block_unit(layer));
  FORGE_RETURN_IF_ERROR(Mark(StepPhase::kFwdElementwise, s));
  // In LinearKind order: qkv, out, gate/up, down.
  return buf_->fp8->CastLayerWeights(layer, {w + o.wqkv, w + o.wo, w + o.w_gate_up, w + o.w_down},
                                     s);
}

}  // namespace forge
