#include "worker/model/fp8_linears.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/cpu/fp8.h"
#include "kernels/cuda/byte_transpose.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/fp8_scale_update.h"
#include "kernels/cuda/rmsnorm_fp8.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/rope_fp8.h"
#include "kernels/cuda/swiglu_backward_gemm_fp8.h"
#include "kernels/cuda/swiglu_fp8.h"
#include "worker/model/device_alloc.h"
#include "worker/model/fp8_scaling.h"

namespace forge {

using cuda::bf16;
using cuda::DType;
using cuda::GemmArgs;

namespace {
constexpr int64_t kStride = 4;  // floats per scaling slot (16 bytes, cuBLASLt's alignment)
}

Fp8Linears::~Fp8Linears() {
  for (void* p : allocations_) cudaFree(p);
}

StatusOr<std::unique_ptr<Fp8Linears>> Fp8Linears::Create(
    const Fp8Config& cfg, int n_layer, const std::array<Fp8LinearShape, kLinearKinds>& shapes,
    int64_t tokens, int act_sets, const Fp8RopeShape& rope, const Fp8LmHeadShape& lm_head,
    const Fp8FusedBuffers& fused, bool one_weight_set) {
  std::unique_ptr<Fp8Linears> f(new Fp8Linears());
  FORGE_RETURN_IF_ERROR(
      f->Init(cfg, n_layer, shapes, tokens, act_sets, rope, lm_head, fused, one_weight_set));
  return StatusOr<std::unique_ptr<Fp8Linears>>(std::move(f));
}

template <typename T>
Status Fp8Linears::Alloc(T** p, size_t count) {
  return DeviceAlloc("fp8 linears", &allocations_, &allocated_, p, count);
}

Status Fp8Linears::AllocGroup(Group* g, int64_t n, float fp8_max) {
  g->n = n;
  g->fp8_max = fp8_max;
  const size_t slots = size_t(n * kStride);
  FORGE_RETURN_IF_ERROR(Alloc(&g->amax, slots));
  FORGE_RETURN_IF_ERROR(Alloc(&g->scale, slots));
  FORGE_RETURN_IF_ERROR(Alloc(&g->scale_inv, slots));
  FORGE_RETURN_IF_ERROR(Alloc(&g->history, size_t(n) * cfg_.amax_history));
  FORGE_RETURN_IF_ERROR(Alloc(&g->recorded, size_t(n)));
  FORGE_RETURN_IF_ERROR(Alloc(&g->nonfinite, size_t(n)));
  FORGE_RETURN_IF_ERROR(Alloc(&g->probe_amax, slots));
  FORGE_RETURN_IF_ERROR(Alloc(&g->probe_history, size_t(n)));
  FORGE_RETURN_IF_ERROR(Alloc(&g->probe_recorded, size_t(n)));
  // Scale 1 before anything is recorded (fp8_scaling.h); the first step measures anyway.
  std::vector<float> ones(slots, 1.0f);
  FORGE_CUDA_CHECK(cudaMemcpy(g->scale, ones.data(), slots * sizeof(float), cudaMemcpyHostToDevice));
  FORGE_CUDA_CHECK(
      cudaMemcpy(g->scale_inv, ones.data(), slots * sizeof(float), cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status Fp8Linears::Init(const Fp8Config& cfg, int n_layer,
                        const std::array<Fp8LinearShape, kLinearKinds>& shapes, int64_t tokens,
                        int act_sets, const Fp8RopeShape& rope, const Fp8LmHeadShape& lm_head,
                        const Fp8FusedBuffers& fused, bool one_weight_set) {
  rope_ = rope;
  one_weight_set_ = one_weight_set;
  cfg_ = cfg;
  L_ = n_layer;
  N_ = tokens;
  shape_ = shapes;
  if (cfg.lm_head != (lm_head.vocab > 0)) {
    return Status::Invalid("fp8 linears: precision.fp8.lm_head is " +
                           std::string(cfg.lm_head ? "on" : "off") + " but the LM head shape " +
                           (lm_head.vocab > 0 ? "was given" : "was not"));
  }
  lm_ = lm_head;
  FORGE_RETURN_IF_ERROR(
      ValidateFp8ScalingParams(Fp8ParamsFromConfig(cfg, cpu::Fp8Format::kE4M3)));
  // cuBLASLt's FP8 kernels need 16-byte aligned rows and leading dimensions of 16 elements.
  auto check16 = [](const char* what, int64_t v) {
    return v % 16 == 0 ? Status::Ok()
                       : Status::Invalid(std::string("precision.compute: fp8 needs ") + what +
                                         " to be a multiple of 16, got " + std::to_string(v));
  };
  FORGE_RETURN_IF_ERROR(check16("micro_batch * seq_len", tokens));
  int64_t max_in = 0;
  for (const Fp8LinearShape& sh : shapes) {
    FORGE_RETURN_IF_ERROR(
        check16("every linear layer's input width (d_model, heads * head_dim, ffn)", sh.in));
    FORGE_RETURN_IF_ERROR(check16("every linear layer's output width", sh.out));
    max_in = std::max(max_in, sh.in);
  }
  if (this->lm_head()) {
    FORGE_RETURN_IF_ERROR(check16("the padded vocabulary (precision.fp8.lm_head)", lm_.vocab));
    if (lm_.vocab > INT32_MAX) {
      return Status::Invalid("precision.fp8.lm_head: vocabulary of " + std::to_string(lm_.vocab) +
                             " rows is beyond the cross-entropy kernel's int range");
    }
    FORGE_RETURN_IF_ERROR(check16("d_model (precision.fp8.lm_head)", lm_.d));
    FORGE_RETURN_IF_ERROR(check16("the LM head's chunk rows (precision.fp8.lm_head)",
                                  lm_.chunk_rows));
  }

  FORGE_RETURN_IF_ERROR(
      AllocGroup(&e4m3_, this->lm_head() ? LmInputSlot() + 1 : LmWeightSlot(), cpu::kE4M3Max));
  FORGE_RETURN_IF_ERROR(
      AllocGroup(&e5m2_, LmGradSlot() + (this->lm_head() ? 1 : 0), cpu::kE5M2Max));
  const int weight_sets = one_weight_set ? 1 : L_;
  lin_.assign(size_t(kLinearKinds) * weight_sets, Linear{});
  for (int l = 0; l < weight_sets; ++l) {
    for (int k = 0; k < kLinearKinds; ++k) {
      Linear& li = lin_[size_t(kLinearKinds) * l + k];
      const size_t n = size_t(shapes[k].in * shapes[k].out);
      FORGE_RETURN_IF_ERROR(Alloc(&li.w8, n));
      FORGE_RETURN_IF_ERROR(Alloc(&li.w8t, n));
    }
  }
  FORGE_RETURN_IF_ERROR(Alloc(&x8_, size_t(N_ * max_in)));
  x8t_.assign(size_t(kLinearKinds) * act_sets, nullptr);
  for (int s = 0; s < act_sets; ++s) {
    for (int k = 0; k < kLinearKinds; ++k) {
      FORGE_RETURN_IF_ERROR(
          Alloc(&x8t_[size_t(kLinearKinds) * s + k], size_t(N_ * shapes[k].in)));
    }
  }
  for (int k = 0; k < kLinearKinds; ++k) {
    FORGE_RETURN_IF_ERROR(Alloc(&dy8_[k], size_t(N_ * shapes[k].out)));
    FORGE_RETURN_IF_ERROR(Alloc(&dy8t_[k], size_t(N_ * shapes[k].out)));
  }
  if (this->lm_head()) {
    FORGE_RETURN_IF_ERROR(Alloc(&lm_w8_, size_t(lm_.vocab * lm_.d)));
    FORGE_RETURN_IF_ERROR(Alloc(&lm_w8t_, size_t(lm_.vocab * lm_.d)));
    FORGE_RETURN_IF_ERROR(Alloc(&lm_x8_, size_t(lm_.chunk_rows * lm_.d)));
    FORGE_RETURN_IF_ERROR(Alloc(&lm_dy8_, size_t(lm_.chunk_rows * lm_.vocab)));
    lm_wgrad_ = lm_.wgrad && lm_.vocab % 64 == 0 && lm_.d % 64 == 0 && lm_.slots >= 1;
    if (lm_wgrad_) {
      lm_x8t_.assign(size_t(lm_.slots), nullptr);
      for (uint8_t*& x8t : lm_x8t_)
        FORGE_RETURN_IF_ERROR(Alloc(&x8t, size_t(lm_.chunk_rows * lm_.d)));
    }
  }
  if (fused.swiglu_gemm) {
    FORGE_RETURN_IF_ERROR(Alloc(&h8_, size_t(N_ * shapes[int(LinearKind::kDown)].in)));
  }
  if (fused.rope_table) {
    FORGE_RETURN_IF_ERROR(Alloc(&rope_sin_cos_, size_t(rope.T) * (rope.hd / 2)));
    FORGE_RETURN_IF_ERROR(
        cuda::RopeSinCosTable(rope_sin_cos_, rope.T, rope.hd, rope.inv_freq, nullptr));
  }
  // The memsets, uploads and the table above ran on the legacy stream.
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::Ok();
}

Status Fp8Linears::Update(Group& g, int64_t first, int64_t n, float* amax, float* history,
                          int64_t* recorded, int window, cudaStream_t s) {
  cuda::Fp8ScaleUpdateArgs u;
  u.n = n;
  u.stride = kStride;
  u.amax = amax;
  u.scale = g.scale + first * kStride;
  u.scale_inv = g.scale_inv + first * kStride;
  u.history = history;
  u.recorded = recorded;
  u.nonfinite = g.nonfinite + first;
  u.window = window;
  u.margin = cfg_.margin;
  u.fp8_max = g.fp8_max;
  return cuda::Fp8ScaleUpdate(u, s);
}

Fp8Linears::SlotPtrs Fp8Linears::SlotOf(const Group& g, int64_t i) {
  return {g.scale + i * kStride, g.amax + i * kStride, g.scale_inv + i * kStride};
}

Status Fp8Linears::Cast(Group& g, int64_t i, DType format, void* out, void* out_t, const bf16* x,
                        int64_t rows, int64_t cols, cudaStream_t s) {
  const SlotPtrs q = SlotOf(g, i);
  if (measuring()) {
    // The tensor's own amax into the probe slot, the window-1 update turns it into this
    // cast's scale (and zeroes the probe); the cast below still folds it into g.amax.
    float* probe = g.probe_amax + i * kStride;
    FORGE_RETURN_IF_ERROR(
        cuda::CastToFp8(nullptr, x, rows, cols, format, q.scale, probe, nullptr, s));
    FORGE_RETURN_IF_ERROR(
        Update(g, i, 1, probe, g.probe_history + i, g.probe_recorded + i, /*window=*/1, s));
  }
  return cuda::CastTransposeToFp8(out, out_t, x, rows, cols, format, q.scale, q.amax,
                                  q.scale_inv, s);
}

Status Fp8Linears::CastWeight(int layer, LinearKind k, const bf16* w, cudaStream_t s) {
  const int ki = int(k);
  given_w8_[size_t(ki)] = nullptr;
  const Linear& li = WeightBuffers(layer, ki);
  return Cast(e4m3_, WeightSlot(layer, ki), DType::kE4M3, li.w8, li.w8t, w, shape_[ki].out,
              shape_[ki].in, s);
}

Status Fp8Linears::CastLayerWeights(int layer, const std::array<const bf16*, kLinearKinds>& w,
                                    cudaStream_t s) {
  std::array<cuda::Fp8CastJob, kLinearKinds> jobs{};
  given_w8_.fill(nullptr);
  for (int ki = 0; ki < kLinearKinds; ++ki) {
    const Linear& li = WeightBuffers(layer, ki);
    const SlotPtrs q = SlotOf(e4m3_, WeightSlot(layer, ki));
    jobs[ki] = cuda::Fp8CastJob{w[ki], li.w8, li.w8t, shape_[ki].out, shape_[ki].in,
                                q.scale, q.amax, q.scale_inv};
  }
  // Casts that measure first (current recipe, first step) go one by one (Cast's probe).
  if (measuring() || !cuda::CastTransposeGroupSupported(jobs.data(), kLinearKinds)) {
    for (int ki = 0; ki < kLinearKinds; ++ki) {
      FORGE_RETURN_IF_ERROR(CastWeight(layer, LinearKind(ki), w[ki], s));
    }
    return Status::Ok();
  }
  return cuda::CastTransposeGroupToFp8(jobs.data(), kLinearKinds, DType::kE4M3, s);
}

bool Fp8Linears::TakesCastWeights() const {
  if (!one_weight_set_) return false;
  for (const Fp8LinearShape& sh : shape_) {
    if (sh.in % 64 != 0 || sh.out % 64 != 0) return false;
  }
  return true;
}

Status Fp8Linears::UseCastWeights(int layer, const std::array<const uint8_t*, kLinearKinds>& w8,
                                  bool transposes, cudaStream_t s) {
  if (!TakesCastWeights()) {
    return Status::Precondition("fp8 linears: cast weights need one weight set and shapes in "
                                "multiples of 64");
  }
  for (int ki = 0; ki < kLinearKinds; ++ki) {
    if (reinterpret_cast<uintptr_t>(w8[size_t(ki)]) % 16 != 0) {
      return Status::Precondition("fp8 linears: cast weights must be 16-byte aligned");
    }
  }
  for (int ki = 0; ki < kLinearKinds; ++ki) {
    const Linear& li = WeightBuffers(layer, ki);
    const uint8_t* w = w8[size_t(ki)];
    // Read in place where 256-byte aligned (as the own buffers are: the GEMMs' plans depend on
    // their operands' alignment, so they run the plans, and bits, of a cast), else copied.
    const bool in_place = reinterpret_cast<uintptr_t>(w) % 256 == 0;
    given_w8_[size_t(ki)] = in_place ? w : nullptr;
    if (!in_place) {
      FORGE_CUDA_CHECK(cudaMemcpyAsync(li.w8, w, size_t(shape_[ki].out * shape_[ki].in),
                                       cudaMemcpyDeviceToDevice, s));
    }
    if (transposes) {
      FORGE_RETURN_IF_ERROR(cuda::TransposeBytes(li.w8t, w, shape_[ki].out, shape_[ki].in, s));
    }
  }
  return Status::Ok();
}

Status Fp8Linears::CastInput(int layer, LinearKind k, int set, const bf16* x, cudaStream_t s) {
  const int ki = int(k);
  return Cast(e4m3_, InputSlot(layer, ki), DType::kE4M3, InputScratch(ki),
              x8t_[size_t(kLinearKinds) * set + ki], x, N_, shape_[ki].in, s);
}

Status Fp8Linears::CastGrad(int layer, LinearKind k, const bf16* dy, cudaStream_t s) {
  const int ki = int(k);
  return Cast(e5m2_, GradSlot(layer, ki), DType::kE5M2, dy8_[ki], dy8t_[ki], dy,
              N_, shape_[ki].out, s);
}

Status Fp8Linears::SwiGluForwardToInput(int layer, int set, const bf16* gate_up,
                                        cudaStream_t s) {
  const int k = int(LinearKind::kDown);
  const SlotPtrs q = SlotOf(e4m3_, InputSlot(layer, k));
  return cuda::SwiGluForwardFp8(InputScratch(k), x8t_[size_t(kLinearKinds) * set + k], gate_up, N_,
                                int(shape_[k].in), DType::kE4M3, q.scale, q.amax, q.scale_inv, s);
}

cuda::WgmmaGemmArgs Fp8Linears::WgmmaForward(int layer, LinearKind k, void* d) const {
  const int ki = int(k);
  cuda::WgmmaGemmArgs g;
  g.M = N_, g.N = shape_[ki].out, g.K = shape_[ki].in;
  g.A = x8_, g.B = W8(layer, ki), g.D = d;
  g.epi.a_scale = SlotOf(e4m3_, InputSlot(layer, ki)).scale_inv;
  g.epi.b_scale = SlotOf(e4m3_, WeightSlot(layer, ki)).scale_inv;
  return g;
}

cuda::WgmmaGemmArgs Fp8Linears::GateUpSwiGluGemm(int layer, int set, bf16* gu) const {
  const int kd = int(LinearKind::kDown);
  cuda::WgmmaGemmArgs g = WgmmaForward(layer, LinearKind::kGateUp, h8_);
  g.epilogue = cuda::WgmmaEpilogue::kSwiGlu;
  g.epi.gu = gu, g.epi.ffn = int(shape_[kd].in);
  const SlotPtrs h = SlotOf(e4m3_, InputSlot(layer, kd));
  g.epi.h_t = x8t_[size_t(kLinearKinds) * set + kd];
  g.epi.h_scale = h.scale, g.epi.h_amax = h.amax, g.epi.h_scale_inv = h.scale_inv;
  return g;
}

cuda::WgmmaGemmArgs Fp8Linears::QkvRopeGemm(int layer, bf16* qkv) const {
  cuda::WgmmaGemmArgs g = WgmmaForward(layer, LinearKind::kQkv, qkv);
  g.epilogue = cuda::WgmmaEpilogue::kRope;
  g.epi.rope_sin_cos = rope_sin_cos_, g.epi.T = rope_.T, g.epi.hd = rope_.hd;
  g.epi.rot_cols = (rope_.n_head + rope_.n_kv_head) * rope_.hd;
  return g;
}

Status Fp8Linears::SwiGluBackwardToGrad(int layer, const bf16* dout, const bf16* gate_up,
                                        cudaStream_t s) {
  const int k = int(LinearKind::kGateUp);
  const SlotPtrs q = SlotOf(e5m2_, GradSlot(layer, k));
  return cuda::SwiGluBackwardFp8(dy8_[k], dy8t_[k], dout, gate_up, N_, int(shape_[k].out / 2),
                                 DType::kE5M2, q.scale, q.amax, q.scale_inv, s);
}

cuda::SwiGluBackwardGemmFp8Args Fp8Linears::SwiGluBackwardGemmArgs(int layer,
                                                                   const bf16* gate_up) const {
  const int kd = int(LinearKind::kDown), kg = int(LinearKind::kGateUp);
  cuda::SwiGluBackwardGemmFp8Args a;
  a.M = N_, a.K = shape_[kd].out, a.ffn = int(shape_[kd].in);
  a.dy = dy8_[kd], a.w_t = WeightBuffers(layer, kd).w8t;
  a.dy_scale_inv = SlotOf(e5m2_, GradSlot(layer, kd)).scale_inv;
  a.w_scale_inv = SlotOf(e4m3_, WeightSlot(layer, kd)).scale_inv;
  a.gate_up = gate_up;
  a.dgate_up = dy8_[kg], a.dgate_up_t = dy8t_[kg];
  const SlotPtrs q = SlotOf(e5m2_, GradSlot(layer, kg));
  a.scale = q.scale, a.amax = q.amax, a.scale_inv = q.scale_inv;
  return a;
}

Status Fp8Linears::SwiGluBackwardGemm(int layer, const bf16* gate_up, cudaStream_t s) {
  return cuda::SwiGluBackwardGemmFp8(SwiGluBackwardGemmArgs(layer, gate_up), s);
}

Status Fp8Linears::RmsNormToInput(int layer, LinearKind k, int set, float* rstd, const bf16* x,
                                  const bf16* w, float eps, cudaStream_t s) {
  const int ki = int(k);
  const SlotPtrs q = SlotOf(e4m3_, InputSlot(layer, ki));
  return cuda::RmsNormForwardFp8(x8_, x8t_[size_t(kLinearKinds) * set + ki], rstd, x, w, N_,
                                 int(shape_[ki].in), eps, DType::kE4M3, q.scale, q.amax,
                                 q.scale_inv, s);
}

Status Fp8Linears::RmsNormBackwardToGrad(int layer, LinearKind k, bf16* dx, float* dw,
                                         const bf16* dout, const bf16* x, const bf16* w,
                                         const float* rstd, void* workspace, size_t workspace_bytes,
                                         bool accumulate_dx, bool accumulate_dw, cudaStream_t s,
                                         const cuda::RmsNormDwReduce& dw_reduce) {
  if (k != LinearKind::kOut && k != LinearKind::kDown) {
    return Status::Invalid("fp8 linears: the norm backward feeds the Out or Down projection");
  }
  const int ki = int(k);
  const SlotPtrs q = SlotOf(e5m2_, GradSlot(layer, ki));
  return cuda::RmsNormBackwardFp8(
      dx, dw, dout, x, w, rstd, N_, int(shape_[ki].out), workspace, workspace_bytes, accumulate_dx,
      accumulate_dw, dy8_[ki], dy8t_[ki], DType::kE5M2, q.scale, q.amax, q.scale_inv, s, dw_reduce);
}

Status Fp8Linears::RopeBackwardToGrad(int layer, const bf16* dqkv, cudaStream_t s) {
  const int k = int(LinearKind::kQkv);
  const SlotPtrs q = SlotOf(e5m2_, GradSlot(layer, k));
  return cuda::RopeBackwardFp8(dy8_[k], dy8t_[k], dqkv, rope_.B, rope_.T, rope_.n_head,
                               rope_.n_kv_head, rope_.hd, rope_sin_cos_, DType::kE5M2, q.scale,
                               q.amax, q.scale_inv, s);
}

cuda::FlashBackwardFp8Out Fp8Linears::QkvGradFromAttention(int layer) const {
  const int k = int(LinearKind::kQkv);
  const SlotPtrs q = SlotOf(e5m2_, GradSlot(layer, k));
  cuda::FlashBackwardFp8Out f;
  f.out = dy8_[k], f.out_t = dy8t_[k], f.rope_sin_cos = rope_sin_cos_;
  f.scale = q.scale, f.amax = q.amax, f.scale_inv = q.scale_inv;
  return f;
}

Status Fp8Linears::CastLmHeadWeight(const bf16* wte, cudaStream_t s) {
  if (!lm_head()) return Status::Precondition("fp8 linears: no FP8 LM head");
  return Cast(e4m3_, LmWeightSlot(), DType::kE4M3, lm_w8_, lm_w8t_, wte, lm_.vocab, lm_.d, s);
}

Status Fp8Linears::CastLmHeadInput(const bf16* hf, int64_t rows, int slot, cudaStream_t s) {
  if (!lm_head()) return Status::Precondition("fp8 linears: no FP8 LM head");
  if (rows < 0 || rows > lm_.chunk_rows || rows % 16 != 0) {
    return Status::Invalid("fp8 linears: LM head chunk of " + std::to_string(rows) +
                           " rows (at most " + std::to_string(lm_.chunk_rows) +
                           ", a multiple of 16)");
  }
  if (slot < 0 || !lm_head_wgrad(rows))
    return Cast(e4m3_, LmInputSlot(), DType::kE4M3, lm_x8_, nullptr, hf, rows, lm_.d, s);
  if (slot >= lm_.slots)
    return Status::Invalid("fp8 linears: LM head slot " + std::to_string(slot) + " of " +
                           std::to_string(lm_.slots));
  return Cast(e4m3_, LmInputSlot(), DType::kE4M3, lm_x8_, lm_x8t_[size_t(slot)], hf, rows, lm_.d,
              s);
}

Status Fp8Linears::CrossEntropyToGrad(bf16* logits, float* losses, const int32_t* targets,
                                      int64_t rows, float dloss, cudaStream_t s) {
  if (!lm_head() || measuring()) {
    return Status::Precondition("fp8 linears: no fused FP8 LM-head gradient on this step");
  }
  const SlotPtrs q = SlotOf(e5m2_, LmGradSlot());
  return cuda::CrossEntropyForwardBackwardFp8Grad(logits, losses, targets, rows,
                                                  static_cast<int>(lm_.vocab), dloss, lm_dy8_,
                                                  q.scale, q.amax, q.scale_inv,
                                                  /*write_bf16=*/!lm_head_wgrad(rows), s);
}

Status Fp8Linears::CastLmHeadGrad(const bf16* dlogits, int64_t rows, cudaStream_t s) {
  if (!lm_head()) return Status::Precondition("fp8 linears: no FP8 LM head");
  return Cast(e5m2_, LmGradSlot(), DType::kE5M2, lm_dy8_, nullptr, dlogits, rows, lm_.vocab, s);
}

GemmArgs Fp8Linears::LmHeadBackwardData(bf16* dhf, int64_t rows) const {
  GemmArgs g;
  g.M = rows, g.N = lm_.d, g.K = lm_.vocab;
  g.A = lm_dy8_, g.B = lm_w8t_, g.D = dhf;
  g.trans_a = false, g.trans_b = true;
  g.a_type = DType::kE5M2, g.b_type = DType::kE4M3, g.d_type = DType::kBf16;
  g.a_scale = SlotOf(e5m2_, LmGradSlot()).scale_inv;
  g.b_scale = SlotOf(e4m3_, LmWeightSlot()).scale_inv;
  return g;
}

Status Fp8Linears::TransposeLmHeadGrad(void* dlogits8t, int64_t rows, cudaStream_t s) const {
  if (!lm_head_wgrad(rows))
    return Status::Precondition("fp8 linears: no FP8 LM-head weight gradient for this chunk");
  return cuda::TransposeBytes(dlogits8t, lm_dy8_, rows, lm_.vocab, s);
}

GemmArgs Fp8Linears::LmHeadBackwardWeight(float* dwte, const void* dlogits8t, int slot,
                                          int64_t rows, bool accumulate) const {
  GemmArgs g;
  g.M = lm_.vocab, g.N = lm_.d, g.K = rows;
  g.A = dlogits8t, g.B = lm_x8t_[size_t(slot)], g.D = dwte;
  g.trans_a = false, g.trans_b = true;
  g.a_type = DType::kE5M2, g.b_type = DType::kE4M3, g.d_type = DType::kFp32;
  g.a_scale = SlotOf(e5m2_, LmGradSlot()).scale_inv;
  g.b_scale = SlotOf(e4m3_, LmInputSlot()).scale_inv;
  g.accumulate = accumulate;
  return g;
}

GemmArgs Fp8Linears::LmHeadForward(bf16* logits, int64_t rows) const {
  GemmArgs g;
  g.M = rows, g.N = lm_.vocab, g.K = lm_.d;
  g.A = lm_x8_, g.B = lm_w8_, g.D = logits;
  g.trans_a = false, g.trans_b = true;
  g.a_type = DType::kE4M3, g.b_type = DType::kE4M3, g.d_type = DType::kBf16;
  g.a_scale = SlotOf(e4m3_, LmInputSlot()).scale_inv;
  g.b_scale = SlotOf(e4m3_, LmWeightSlot()).scale_inv;
  g.fast_accum = cfg_.fast_accum != Fp8FastAccum::kNone;
  return g;
}

GemmArgs Fp8Linears::Forward(int layer, LinearKind k, bf16* y, const bf16* residual) const {
  const int ki = int(k);
  GemmArgs g;
  g.M = N_, g.N = shape_[ki].out, g.K = shape_[ki].in;
  g.A = InputScratch(ki), g.B = W8(layer, ki), g.D = y;
  g.trans_a = false, g.trans_b = true;
  g.a_type = DType::kE4M3, g.b_type = DType::kE4M3, g.d_type = DType::kBf16;
  g.a_scale = SlotOf(e4m3_, InputSlot(layer, ki)).scale_inv;
  g.b_scale = SlotOf(e4m3_, WeightSlot(layer, ki)).scale_inv;
  g.accumulate = residual != nullptr;
  g.C = residual;
  g.fast_accum = cfg_.fast_accum != Fp8FastAccum::kNone;
  return g;
}

GemmArgs Fp8Linears::BackwardData(int layer, LinearKind k, bf16* dx) const {
  const int ki = int(k);
  GemmArgs g;
  g.M = N_, g.N = shape_[ki].in, g.K = shape_[ki].out;
  g.A = dy8_[ki], g.B = WeightBuffers(layer, ki).w8t, g.D = dx;
  g.trans_a = false, g.trans_b = true;
  g.a_type = DType::kE5M2, g.b_type = DType::kE4M3, g.d_type = DType::kBf16;
  g.a_scale = SlotOf(e5m2_, GradSlot(layer, ki)).scale_inv;
  g.b_scale = SlotOf(e4m3_, WeightSlot(layer, ki)).scale_inv;
  g.fast_accum = cfg_.fast_accum == Fp8FastAccum::kFpropDgrad;
  return g;
}

GemmArgs Fp8Linears::BackwardWeight(int layer, LinearKind k, int set, float* dw,
                                    bool accumulate) const {
  const int ki = int(k);
  GemmArgs g;
  g.M = shape_[ki].out, g.N = shape_[ki].in, g.K = N_;
  g.A = dy8t_[ki], g.B = x8t_[size_t(kLinearKinds) * set + ki], g.D = dw;
  g.trans_a = false, g.trans_b = true;
  g.a_type = DType::kE5M2, g.b_type = DType::kE4M3, g.d_type = DType::kFp32;
  g.a_scale = SlotOf(e5m2_, GradSlot(layer, ki)).scale_inv;
  g.b_scale = SlotOf(e4m3_, InputSlot(layer, ki)).scale_inv;
  g.accumulate = accumulate;
  return g;
}

Status Fp8Linears::EndStep(cudaStream_t s) {
  for (Group* g : {&e4m3_, &e5m2_}) {
    FORGE_RETURN_IF_ERROR(
        Update(*g, 0, g->n, g->amax, g->history, g->recorded, cfg_.amax_history, s));
  }
  have_history_ = true;
  return Status::Ok();
}

Status Fp8Linears::ResetAmax(cudaStream_t s) {
  for (Group* g : {&e4m3_, &e5m2_}) {
    FORGE_CUDA_CHECK(cudaMemsetAsync(g->amax, 0, size_t(g->n * kStride) * sizeof(float), s));
  }
  return Status::Ok();
}

StatusOr<Fp8Linears::Snapshot> Fp8Linears::Read(cudaStream_t s) const {
  Snapshot out;
  auto read = [&](const Group& g, std::vector<float>* scale, std::vector<int64_t>* nonfinite) {
    std::vector<float> slots(size_t(g.n * kStride));
    scale->resize(size_t(g.n));
    nonfinite->resize(size_t(g.n));
    cudaError_t e = cudaMemcpyAsync(slots.data(), g.scale, slots.size() * sizeof(float),
                                    cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(nonfinite->data(), g.nonfinite, nonfinite->size() * sizeof(int64_t),
                          cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    for (int64_t i = 0; i < g.n; ++i) (*scale)[size_t(i)] = slots[size_t(i * kStride)];
    return e;
  };
  FORGE_CUDA_CHECK(read(e4m3_, &out.scale_e4m3, &out.nonfinite_e4m3));
  FORGE_CUDA_CHECK(read(e5m2_, &out.scale_e5m2, &out.nonfinite_e5m2));
  return out;
}

namespace {

constexpr char kStateMagic[4] = {'F', 'P', '8', 'S'};
constexpr uint32_t kStateVersion = 1;

struct StateHeader {
  char magic[4];
  uint32_t version;
  int64_t n_e4m3, n_e5m2, window;
  uint32_t have_history;
  uint32_t pad;
};

}  // namespace

// Blob: StateHeader, then per group (E4M3, E5M2): scale and scale_inv slots (n * 4 floats),
// history (n * window floats), recorded and nonfinite (n int64 each). Host byte order: a
// checkpoint moves between machines of the same architecture only (as the shard files).
std::array<std::pair<void*, size_t>, 5> Fp8Linears::StateParts(const Group& g, int window) {
  return {{{g.scale, size_t(g.n * kStride) * sizeof(float)},
           {g.scale_inv, size_t(g.n * kStride) * sizeof(float)},
           {g.history, size_t(g.n) * size_t(window) * sizeof(float)},
           {g.recorded, size_t(g.n) * sizeof(int64_t)},
           {g.nonfinite, size_t(g.n) * sizeof(int64_t)}}};
}
StatusOr<std::string> Fp8Linears::SaveState(cudaStream_t s) const {
  StateHeader h{};
  std::memcpy(h.magic, kStateMagic, 4);
  h.version = kStateVersion;
  h.n_e4m3 = e4m3_.n;
  h.n_e5m2 = e5m2_.n;
  h.window = cfg_.amax_history;
  h.have_history = have_history_ ? 1u : 0u;
  std::string blob(reinterpret_cast<const char*>(&h), sizeof(h));
  for (const Group* g : {&e4m3_, &e5m2_}) {
    for (const auto& [ptr, bytes] : StateParts(*g, int(h.window))) {
      const size_t at = blob.size();
      blob.resize(at + bytes);
      FORGE_CUDA_CHECK(cudaMemcpyAsync(blob.data() + at, ptr, bytes, cudaMemcpyDeviceToHost, s));
    }
  }
  FORGE_CUDA_CHECK(cudaStreamSynchronize(s));
  return blob;
}

Status Fp8Linears::LoadState(const std::string& blob, cudaStream_t s) {
  StateHeader h{};
  if (blob.size() < sizeof(h))
    return Status::Invalid("fp8 scaling state: " + std::to_string(blob.size()) + " bytes, too short");
  std::memcpy(&h, blob.data(), sizeof(h));
  if (std::memcmp(h.magic, kStateMagic, 4) != 0 || h.version != kStateVersion)
    return Status::Invalid("fp8 scaling state: unknown format (magic/version)");
  if (h.n_e4m3 != e4m3_.n || h.n_e5m2 != e5m2_.n || h.window != cfg_.amax_history) {
    return Status::Invalid("fp8 scaling state: saved for " + std::to_string(h.n_e4m3) + "+" +
                           std::to_string(h.n_e5m2) + " tensors with precision.fp8.amax_history " +
                           std::to_string(h.window) + ", this run has " +
                           std::to_string(e4m3_.n) + "+" + std::to_string(e5m2_.n) + " and " +
                           std::to_string(cfg_.amax_history) +
                           " (precision.fp8.lm_head adds 2 E4M3 tensors and 1 E5M2; it is " +
                           (lm_head() ? "on" : "off") + " here)");
  }
  size_t want = sizeof(h);
  for (const Group* g : {&e4m3_, &e5m2_}) {
    for (const auto& part : StateParts(*g, int(h.window))) want += part.second;
  }
  if (blob.size() != want) {
    return Status::Invalid("fp8 scaling state: " + std::to_string(blob.size()) +
                           " bytes, expected " + std::to_string(want));
  }
  size_t at = sizeof(h);
  for (const Group* g : {&e4m3_, &e5m2_}) {
    for (const auto& [ptr, bytes] : StateParts(*g, int(h.window))) {
      FORGE_CUDA_CHECK(cudaMemcpyAsync(ptr, blob.data() + at, bytes, cudaMemcpyHostToDevice, s));
      at += bytes;
    }
  }
  FORGE_CUDA_CHECK(cudaStreamSynchronize(s));  // the blob is the caller's
  have_history_ = h.have_history != 0;
  return Status::Ok();
}

}  // namespace forge
