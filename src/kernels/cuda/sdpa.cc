// Causal attention forward/backward as composite cuDNN backend graphs (matmuls, pointwise ops,
// reductions, reshapes) that cuDNN recognises and fuses into its flash kernels. The native
// SDPA backend ops have no causal mask on Hopper, hence the composite form.
#include "kernels/cuda/sdpa.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/checksum.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cudnn_engine.h"
#include "kernels/cuda/owned_handles.h"

namespace forge::cuda {

namespace {

using Desc = cudnnBackendDescriptor_t;
using Dims = std::array<int64_t, 4>;

// Unique ids of the tensors bound in the variant pack; virtual tensors get ids from
// kFirstVirtual up (cuDNN wants every tensor id unique within a graph).
enum Uid : int64_t {
  kQ = 1,
  kKt,  // K read transposed: [B, KV, hd, T]
  kV,   // forward: [B, KV, T, hd]
  kVt,  // backward: [B, KV, hd, T]
  kO,
  kStats,
  kScale,
  kNegInf,
  kOne,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,
  kDQAccum,
  kFirstVirtual = 100,
};

// Element strides of the fused qkv / dqkv buffer [B, T, H + 2*KV, hd] and of the other
// operands, as 4-D [batch, head, row, col] views.
struct Layout {
  int64_t B, T, H, KV, D;
  int64_t tok;  // elements per token in qkv: (H + 2*KV) * hd

  explicit Layout(const SdpaShape& s)
      : B(s.B), T(s.T), H(s.H), KV(s.KV), D(s.hd), tok(int64_t{s.H + 2 * s.KV} * s.hd) {}

  // Q (or dQ, dK, dV with heads = KV) in place in qkv: [B, heads, T, D].
  Dims rows_dims(int64_t heads) const { return {B, heads, T, D}; }
  Dims rows_strides() const { return {T * tok, D, tok, 1}; }
  // K or V read transposed in place: [B, KV, D, T].
  Dims cols_dims() const { return {B, KV, D, T}; }
  Dims cols_strides() const { return {T * tok, D, 1, tok}; }
  // O and dO: [B, T, H, D] in memory.
  Dims o_dims() const { return {B, H, T, D}; }
  Dims o_strides() const { return {T * H * D, D, H * D, 1}; }
  // Packed [B, H, T, D] (fp32 dQ accumulator, virtual per-head gradients).
  Dims packed_strides() const { return {H * T * D, T * D, D, 1}; }
  // Scores [B, H, T, T], and their transposed view.
  Dims scores_dims() const { return {B, H, T, T}; }
  Dims scores_strides() const { return {H * T * T, T * T, T, 1}; }
  Dims scores_t_strides() const { return {H * T * T, T * T, 1, T}; }
  // Per-row statistics [B, H, T, 1].
  Dims row_dims() const { return {B, H, T, 1}; }
  Dims row_strides() const { return {H * T, T, 1, 1}; }
};

constexpr Dims kScalarDims = {1, 1, 1, 1};

// Frees a descriptor on scope exit (variant packs, failed plans).
struct DescGuard {
  Desc d = nullptr;
  DescGuard() = default;
  DescGuard(const DescGuard&) = delete;
  DescGuard& operator=(const DescGuard&) = delete;
  ~DescGuard() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
};

// Builds the tensors and operations of one graph. Every descriptor it creates goes into
// *owned (the Graph), which destroys them after the plan.
class GraphBuilder {
 public:
  explicit GraphBuilder(std::vector<Desc>* owned) : owned_(owned) {}

  Status Create(cudnnBackendDescriptorType_t type, Desc* out) {
    FORGE_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, out));
    owned_->push_back(*out);
    return Status::Ok();
  }

  Status Tensor(Desc* out, int64_t uid, cudnnDataType_t type, const Dims& dims,
                const Dims& strides, bool is_virtual, bool by_value = false) {
    FORGE_RETURN_IF_ERROR(Create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, out));
    const int64_t alignment = 16;
    FORGE_CUDNN_CHECK(
        cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_DIMENSIONS,
                                               CUDNN_TYPE_INT64, 4, dims.data()));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64,
                                               4, strides.data()));
    FORGE_CUDNN_CHECK(
        cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
                                               CUDNN_TYPE_INT64, 1, &alignment));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_IS_VIRTUAL,
                                               CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
    if (by_value) {
      FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(*out, CUDNN_ATTR_TENSOR_IS_BY_VALUE,
                                                 CUDNN_TYPE_BOOLEAN, 1, &by_value));
    }
    FORGE_CUDNN_CHECK(cudnnBackendFinalize(*out));
    return Status::Ok();
  }
  Status Virtual(Desc* out, cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return Tensor(out, next_virtual_uid_++, type, dims, strides, /*is_virtual=*/true);
  }
  // An fp32 scalar passed by value (a host pointer in the variant pack).
  Status Scalar(Desc* out, int64_t uid) {
    return Tensor(out, uid, CUDNN_DATA_FLOAT, kScalarDims, kScalarDims, /*is_virtual=*/false,
                  /*by_value=*/true);
  }

  // y = mode(x[, b][, t]); b and t may be null. axis is for GEN_INDEX only.
  Status Pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t precision, Desc x, Desc b, Desc t,
                   Desc y, int64_t axis = -1) {
    Desc pw;
    FORGE_RETURN_IF_ERROR(Create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw));
    FORGE_CUDNN_CHECK(
        cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC,
                                               CUDNN_TYPE_DATA_TYPE, 1, &precision));
    if (mode == CUDNN_POINTWISE_GEN_INDEX) {
      FORGE_CUDNN_CHECK(
          cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
    }
    FORGE_CUDNN_CHECK(cudnnBackendFinalize(pw));
    return Operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
                     {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw},
                      {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x},
                      {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b},
                      {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t},
                      {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y}},
                     [](Desc op) -> Status {
                       const float one = 1.0f;
                       FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(
                           op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one));
                       FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(
                           op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one));
                       return Status::Ok();
                     });
  }

  // c = a * b over the last two axes, batched over the first two (b may have fewer heads:
  // cuDNN broadcasts each of its heads to H / KV query heads).
  Status Matmul(Desc a, Desc b, Desc c) {
    Desc mm;
    FORGE_RETURN_IF_ERROR(Create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, &mm));
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    FORGE_CUDNN_CHECK(
        cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    FORGE_CUDNN_CHECK(cudnnBackendFinalize(mm));
    return Operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
                     {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a},
                      {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
                      {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c},
                      {CUDNN_ATTR_OPERATION_MATMUL_DESC, mm}});
  }

  // y = reduce(x) over the axes where y has extent 1 (or groups of heads, for GQA).
  Status Reduction(cudnnReduceTensorOp_t reduce, Desc x, Desc y) {
    Desc rd;
    FORGE_RETURN_IF_ERROR(Create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, &rd));
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_OPERATOR,
                                               CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce));
    FORGE_CUDNN_CHECK(
        cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp));
    FORGE_CUDNN_CHECK(cudnnBackendFinalize(rd));
    return Operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                     {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x},
                      {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y},
                      {CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd}});
  }

  // y is x under another dims/strides view (a transpose here), possibly in another type.
  Status Reshape(Desc x, Desc y) {
    return Operation(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
                     {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x},
                      {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y}});
  }

  const std::vector<Desc>& ops() const { return ops_; }

 private:
  // An operation of `type` added to the graph: its descriptor-valued attributes (null ones
  // left unset), then whatever `more` sets, then finalized.
  Status Operation(cudnnBackendDescriptorType_t type,
                   std::initializer_list<std::pair<cudnnBackendAttributeName_t, Desc>> attrs,
                   const std::function<Status(Desc)>& more = nullptr) {
    Desc op;
    FORGE_RETURN_IF_ERROR(Create(type, &op));
    for (const auto& [name, value] : attrs) {
      if (value == nullptr) continue;
      FORGE_CUDNN_CHECK(
          cudnnBackendSetAttribute(op, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value));
    }
    if (more) FORGE_RETURN_IF_ERROR(more(op));
    FORGE_CUDNN_CHECK(cudnnBackendFinalize(op));
    ops_.push_back(op);
    return Status::Ok();
  }

  std::vector<Desc>* owned_;
  std::vector<Desc> ops_;
  int64_t next_virtual_uid_ = kFirstVirtual;
};

// scores = causal_mask(scale * Q K^T) as a virtual fp32 [B, H, T, T] (5 + 1 ops).
Status BuildMaskedScores(GraphBuilder& gb, const Layout& L, Desc q, Desc kt, Desc scale,
                         Desc neg_inf, Desc* masked) {
  const Dims sd = L.scores_dims(), ss = L.scores_strides();
  Desc s, scaled, row, col, keep;
  FORGE_RETURN_IF_ERROR(gb.Virtual(&s, CUDNN_DATA_FLOAT, sd, ss));
  FORGE_RETURN_IF_ERROR(gb.Matmul(q, kt, s));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&scaled, CUDNN_DATA_FLOAT, sd, ss));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, nullptr, scaled));
  // Causal: keep column j of row i where i >= j, else -inf.
  FORGE_RETURN_IF_ERROR(gb.Virtual(&row, CUDNN_DATA_INT32, sd, ss));
  FORGE_RETURN_IF_ERROR(gb.Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scaled, nullptr,
                                     nullptr, row, /*axis=*/2));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&col, CUDNN_DATA_INT32, sd, ss));
  FORGE_RETURN_IF_ERROR(gb.Pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scaled, nullptr,
                                     nullptr, col, /*axis=*/3));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&keep, CUDNN_DATA_BOOLEAN, sd, ss));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep));
  FORGE_RETURN_IF_ERROR(gb.Virtual(masked, CUDNN_DATA_FLOAT, sd, ss));
  return gb.Pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scaled, neg_inf, keep,
                      *masked);
}

// Forward, 14 ops: masked scores -> softmax with Stats = max + log(sum exp) -> P (bf16) V.
Status BuildForward(GraphBuilder& gb, const Layout& L) {
  Desc q, kt, v, o, stats, scale, neg_inf;
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&q, kQ, CUDNN_DATA_BFLOAT16, L.rows_dims(L.H), L.rows_strides(), false));
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&kt, kKt, CUDNN_DATA_BFLOAT16, L.cols_dims(), L.cols_strides(), false));
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&v, kV, CUDNN_DATA_BFLOAT16, L.rows_dims(L.KV), L.rows_strides(), false));
  FORGE_RETURN_IF_ERROR(gb.Tensor(&o, kO, CUDNN_DATA_BFLOAT16, L.o_dims(), L.o_strides(), false));
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&stats, kStats, CUDNN_DATA_FLOAT, L.row_dims(), L.row_strides(), false));
  FORGE_RETURN_IF_ERROR(gb.Scalar(&scale, kScale));
  FORGE_RETURN_IF_ERROR(gb.Scalar(&neg_inf, kNegInf));

  Desc masked;
  FORGE_RETURN_IF_ERROR(BuildMaskedScores(gb, L, q, kt, scale, neg_inf, &masked));

  const Dims sd = L.scores_dims(), ss = L.scores_strides();
  const Dims rd = L.row_dims(), rs = L.row_strides();
  Desc mx, shifted, e, sum, log_sum, p;
  FORGE_RETURN_IF_ERROR(gb.Virtual(&mx, CUDNN_DATA_FLOAT, rd, rs));
  FORGE_RETURN_IF_ERROR(gb.Reduction(CUDNN_REDUCE_TENSOR_MAX, masked, mx));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&shifted, CUDNN_DATA_FLOAT, sd, ss));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, masked, mx, nullptr, shifted));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&e, CUDNN_DATA_FLOAT, sd, ss));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, shifted, nullptr, nullptr, e));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&sum, CUDNN_DATA_FLOAT, rd, rs));
  FORGE_RETURN_IF_ERROR(gb.Reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&log_sum, CUDNN_DATA_FLOAT, rd, rs));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, nullptr, nullptr, log_sum));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, log_sum, nullptr, stats));
  // P feeds the second matmul as bf16 (the fused kernel's operand type).
  FORGE_RETURN_IF_ERROR(gb.Virtual(&p, CUDNN_DATA_BFLOAT16, sd, ss));
  FORGE_RETURN_IF_ERROR(gb.Pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, sum, nullptr, p));
  return gb.Matmul(p, v, o);
}

// One of dK / dV: straight into dqkv when KV == H; for GQA a virtual per-query-head gradient
// summed over each group of H / KV heads.
Status BuildKvGradient(GraphBuilder& gb, const Layout& L, Desc a, Desc b, Desc out) {
  if (L.KV == L.H) return gb.Matmul(a, b, out);
  Desc full;
  FORGE_RETURN_IF_ERROR(
      gb.Virtual(&full, CUDNN_DATA_BFLOAT16, L.rows_dims(L.H), L.packed_strides()));
  FORGE_RETURN_IF_ERROR(gb.Matmul(a, b, full));
  return gb.Reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

// Backward, 22 ops (21 deterministic; +2 for GQA):
//   softmax_sum = rowsum(dO * O) * 1;  P = exp(masked scores - Stats);
//   dV = P^T dO;  dS = scale * P * (dO V^T - softmax_sum);  dK = dS^T Q;  dQ = dS K.
Status BuildBackward(GraphBuilder& gb, const Layout& L, bool deterministic) {
  Desc q, kt, vt, o, d_o, stats, scale, neg_inf, one, dq, dk, dv, softmax_sum;
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&q, kQ, CUDNN_DATA_BFLOAT16, L.rows_dims(L.H), L.rows_strides(), false));
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&kt, kKt, CUDNN_DATA_BFLOAT16, L.cols_dims(), L.cols_strides(), false));
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&vt, kVt, CUDNN_DATA_BFLOAT16, L.cols_dims(), L.cols_strides(), false));
  FORGE_RETURN_IF_ERROR(gb.Tensor(&o, kO, CUDNN_DATA_BFLOAT16, L.o_dims(), L.o_strides(), false));
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&d_o, kDO, CUDNN_DATA_BFLOAT16, L.o_dims(), L.o_strides(), false));
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&stats, kStats, CUDNN_DATA_FLOAT, L.row_dims(), L.row_strides(), false));
  FORGE_RETURN_IF_ERROR(gb.Scalar(&scale, kScale));
  FORGE_RETURN_IF_ERROR(gb.Scalar(&neg_inf, kNegInf));
  FORGE_RETURN_IF_ERROR(gb.Scalar(&one, kOne));
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&dq, kDQ, CUDNN_DATA_BFLOAT16, L.rows_dims(L.H), L.rows_strides(), false));
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&dk, kDK, CUDNN_DATA_BFLOAT16, L.rows_dims(L.KV), L.rows_strides(), false));
  FORGE_RETURN_IF_ERROR(
      gb.Tensor(&dv, kDV, CUDNN_DATA_BFLOAT16, L.rows_dims(L.KV), L.rows_strides(), false));
  FORGE_RETURN_IF_ERROR(gb.Tensor(&softmax_sum, kSoftmaxSum, CUDNN_DATA_FLOAT, L.row_dims(),
                                  L.row_strides(), false));

  const Dims sd = L.scores_dims(), ss = L.scores_strides(), st = L.scores_t_strides();
  const Dims rd = L.row_dims(), rs = L.row_strides();

  // softmax_sum (3 ops).
  Desc do_o, do_o_sum;
  FORGE_RETURN_IF_ERROR(gb.Virtual(&do_o, CUDNN_DATA_FLOAT, L.o_dims(), L.packed_strides()));
  FORGE_RETURN_IF_ERROR(gb.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d_o, o, nullptr, do_o));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&do_o_sum, CUDNN_DATA_FLOAT, rd, rs));
  FORGE_RETURN_IF_ERROR(gb.Reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, do_o_sum));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, do_o_sum, one, nullptr, softmax_sum));

  // P recomputed from Stats (6 + 2 ops).
  Desc masked, shifted, p;
  FORGE_RETURN_IF_ERROR(BuildMaskedScores(gb, L, q, kt, scale, neg_inf, &masked));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&shifted, CUDNN_DATA_FLOAT, sd, ss));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, masked, stats, nullptr, shifted));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&p, CUDNN_DATA_FLOAT, sd, ss));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, shifted, nullptr, nullptr, p));

  // dV = P^T dO (2 ops).
  Desc p_t;
  FORGE_RETURN_IF_ERROR(gb.Virtual(&p_t, CUDNN_DATA_BFLOAT16, sd, st));
  FORGE_RETURN_IF_ERROR(gb.Reshape(p, p_t));
  FORGE_RETURN_IF_ERROR(BuildKvGradient(gb, L, p_t, d_o, dv));

  // dS = scale * P * (dO V^T - softmax_sum) (4 ops).
  Desc dp, dp_centered, dp_p, ds;
  FORGE_RETURN_IF_ERROR(gb.Virtual(&dp, CUDNN_DATA_FLOAT, sd, ss));
  FORGE_RETURN_IF_ERROR(gb.Matmul(d_o, vt, dp));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&dp_centered, CUDNN_DATA_FLOAT, sd, ss));
  FORGE_RETURN_IF_ERROR(gb.Pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, softmax_sum,
                                     nullptr, dp_centered));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&dp_p, CUDNN_DATA_FLOAT, sd, ss));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp_centered, p, nullptr, dp_p));
  FORGE_RETURN_IF_ERROR(gb.Virtual(&ds, CUDNN_DATA_FLOAT, sd, ss));
  FORGE_RETURN_IF_ERROR(
      gb.Pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp_p, scale, nullptr, ds));

  // dK = dS^T Q (2 ops).
  Desc ds_t;
  FORGE_RETURN_IF_ERROR(gb.Virtual(&ds_t, CUDNN_DATA_BFLOAT16, sd, st));
  FORGE_RETURN_IF_ERROR(gb.Reshape(ds, ds_t));
  FORGE_RETURN_IF_ERROR(BuildKvGradient(gb, L, ds_t, q, dk));

  // dQ = dS K (2 ops, +1 through the fp32 accumulator).
  Desc k;
  FORGE_RETURN_IF_ERROR(gb.Virtual(&k, CUDNN_DATA_BFLOAT16, L.rows_dims(L.KV), L.rows_strides()));
  FORGE_RETURN_IF_ERROR(gb.Reshape(kt, k));
  if (deterministic) return gb.Matmul(ds, k, dq);
  Desc dq_accum;
  FORGE_RETURN_IF_ERROR(gb.Tensor(&dq_accum, kDQAccum, CUDNN_DATA_FLOAT, L.rows_dims(L.H),
                                  L.packed_strides(), false));
  FORGE_RETURN_IF_ERROR(gb.Matmul(ds, k, dq_accum));
  return gb.Pointwise(CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_accum, nullptr, nullptr, dq);
}

std::string Describe(const SdpaShape& s, bool backward) {
  return std::string(backward ? "sdpa backward" : "sdpa forward") + " B=" + std::to_string(s.B) +
         " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
         " KV=" + std::to_string(s.KV) + " hd=" + std::to_string(s.hd);
}

// Names the call and appends cuDNN's own explanation of its last failure.
Status WithContext(const Status& st, const SdpaShape& s, bool backward) {
  if (st.ok()) return st;
  return Status(st.code(), Describe(s, backward) + ": " + st.message() + " [cuDNN: " +
                               LastCudnnError() + "]");
}

Status CheckShape(const SdpaShape& s, bool backward) {
  if (s.B <= 0 || s.T <= 0 || s.H <= 0 || s.KV <= 0 || s.hd <= 0) {
    return Status::Invalid(Describe(s, backward) + ": non-positive dimension");
  }
  if (s.H % s.KV != 0) {
    return Status::Invalid(Describe(s, backward) + ": H must be a multiple of KV");
  }
  // 16-byte aligned rows for every head slice, and cuDNN's flash head-size limit on Hopper
  // (d = 256 backward is Blackwell-only).
  if (s.hd % 8 != 0 || s.hd > 128) {
    return Status::Invalid(Describe(s, backward) + ": hd must be a multiple of 8, at most 128");
  }
  return Status::Ok();
}

Status CheckAligned(const void* p, const char* name) {
  if (p == nullptr) return Status::Invalid(std::string("sdpa: null ") + name);
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    return Status::Invalid(std::string("sdpa: ") + name + " not 16-byte aligned");
  }
  return Status::Ok();
}

size_t Align256(size_t n) { return (n + 255) / 256 * 256; }

// Builds one graph's ops and finalizes them into an operation graph. Every descriptor goes
// into *owned.
Status BuildOperationGraph(cudnnHandle_t handle, const SdpaShape& s, bool backward,
                           bool deterministic, std::vector<Desc>* owned, Desc* op_graph) {
  const Layout L(s);
  GraphBuilder gb(owned);
  FORGE_RETURN_IF_ERROR(backward ? BuildBackward(gb, L, deterministic) : BuildForward(gb, L));
  FORGE_RETURN_IF_ERROR(gb.Create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, op_graph));
  // Deprecated, but the operation graph still wants the handle.
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(*op_graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                             CUDNN_TYPE_HANDLE, 1, &handle));
  const std::vector<Desc>& ops = gb.ops();
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(*op_graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             static_cast<int64_t>(ops.size()), ops.data()));
  FORGE_CUDNN_CHECK(cudnnBackendFinalize(*op_graph));
  return Status::Ok();
}

// Events of one timing, destroyed on every path.
using Events = OwnedHandles<cudaEvent_t, cudaEventDestroy>;

// A device buffer freed on scope exit (a tuning candidate's larger workspace).
struct DeviceScratch {
  void* p = nullptr;
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch() {
    if (p) cudaFree(p);
  }
};

constexpr int kTuneWarmup = 2;
constexpr int kTuneRuns = 5;

}  // namespace

struct SdpaRunner::Graph {
  std::vector<Desc> owned;  // tensors, ops, operation graph, heuristics' configs
  Desc op_graph = nullptr;
  std::string kind;                // "fwd", "bwd" or "bwd-det": part of the plan-cache key
  bool needs_determinism = false;  // forward, or the deterministic backward
  std::optional<CudnnPlan> plan;   // chosen on the first call
  // By-value scalars: the variant pack points at these host floats.
  float scale = 1.0f;
  float neg_inf = -std::numeric_limits<float>::infinity();
  float one = 1.0f;

  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    plan.reset();  // before the descriptors it was built from
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
};

struct SdpaRunner::Call {
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  // Device regions every run writes in full (compared when checking reproducibility).
  std::vector<std::pair<const void*, size_t>> outputs;
};

namespace {

// Variant pack: the call's uids and pointers plus a workspace.
Status MakePack(const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                void* workspace, DescGuard* pack) {
  FORGE_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack->d));
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(pack->d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                             CUDNN_TYPE_INT64,
                                             static_cast<int64_t>(uids.size()), uids.data()));
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(pack->d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                             CUDNN_TYPE_VOID_PTR,
                                             static_cast<int64_t>(ptrs.size()), ptrs.data()));
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(pack->d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                             CUDNN_TYPE_VOID_PTR, 1, &workspace));
  FORGE_CUDNN_CHECK(cudnnBackendFinalize(pack->d));
  return Status::Ok();
}

// Median time in ms of one plan on the call's operands (on the handle's stream, which is
// `stream`): kTuneWarmup runs, then kTuneRuns back to back between consecutive events.
StatusOr<float> TimePlan(cudnnHandle_t handle, const CudnnPlan& plan,
                         const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                         void* workspace, cudaStream_t stream) {
  DescGuard pack;
  FORGE_RETURN_IF_ERROR(MakePack(uids, ptrs, workspace, &pack));
  for (int i = 0; i < kTuneWarmup; ++i) {
    FORGE_CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan(), pack.d));
  }
  Events ev;
  for (int i = 0; i <= kTuneRuns; ++i) {
    cudaEvent_t e = nullptr;
    FORGE_CUDA_CHECK(cudaEventCreate(&e));
    ev.Own(e);
  }
  FORGE_CUDA_CHECK(cudaEventRecord(ev[0], stream));
  for (int i = 0; i < kTuneRuns; ++i) {
    FORGE_CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan(), pack.d));
    FORGE_CUDA_CHECK(cudaEventRecord(ev[size_t(i) + 1], stream));
  }
  FORGE_CUDA_CHECK(cudaEventSynchronize(ev.back()));
  std::vector<float> ms(kTuneRuns);
  for (int i = 0; i < kTuneRuns; ++i) {
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(i)], ev[size_t(i) + 1]));
  }
  std::sort(ms.begin(), ms.end());
  return ms[kTuneRuns / 2];
}

// CRC32C of the call's outputs after the work queued on stream.
StatusOr<uint32_t> OutputsChecksum(const std::vector<std::pair<const void*, size_t>>& outputs,
                                   cudaStream_t stream) {
  FORGE_CUDA_CHECK(cudaStreamSynchronize(stream));
  constexpr size_t kChunk = size_t(16) << 20;
  std::vector<char> host;
  uint32_t crc = 0;
  for (const auto& [ptr, bytes] : outputs) {
    for (size_t off = 0; off < bytes; off += kChunk) {
      const size_t n = std::min(kChunk, bytes - off);
      host.resize(n);
      FORGE_CUDA_CHECK(cudaMemcpy(host.data(), static_cast<const char*>(ptr) + off, n,
                                  cudaMemcpyDeviceToHost));
      crc = Crc32cExtend(crc, host.data(), n);
    }
  }
  return crc;
}

// Two runs of the plan give bitwise equal outputs.
StatusOr<bool> Reproducible(cudnnHandle_t handle, const CudnnPlan& plan,
                            const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                            const std::vector<std::pair<const void*, size_t>>& outputs,
                            void* workspace, cudaStream_t stream) {
  DescGuard pack;
  FORGE_RETURN_IF_ERROR(MakePack(uids, ptrs, workspace, &pack));
  uint32_t crc[2] = {0, 0};
  for (uint32_t& c : crc) {
    FORGE_CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan(), pack.d));
    FORGE_ASSIGN_OR_RETURN(c, OutputsChecksum(outputs, stream));
  }
  return crc[0] == crc[1];
}

// Heuristics' engine configs for the graph, finalized, in order: mode A (only its first
// finalizable config when `first_only`), then B, then fallback, at most kMaxCandidates. The
// first is always heuristics' first finalizable config; later ones are left out when they
// need a much larger workspace (bounded memory) or more than `max_workspace` (where > 0: a
// lent workspace), or, for graphs that must be deterministic,
// carry cuDNN's NONDETERMINISTIC note while the first does not.
StatusOr<std::vector<CudnnPlan>> FinalizeCandidates(cudnnHandle_t handle, Desc op_graph,
                                                    bool needs_determinism, bool first_only,
                                                    int max_candidates,
                                                    std::vector<Desc>* owned,
                                                    int64_t max_workspace = 0) {
  std::vector<cudnnBackendHeurMode_t> modes = {CUDNN_HEUR_MODE_A};
  if (!first_only) {
    modes.push_back(CUDNN_HEUR_MODE_B);
    modes.push_back(CUDNN_HEUR_MODE_FALLBACK);
  }
  FORGE_ASSIGN_OR_RETURN(const std::vector<Desc> configs,
                         HeuristicEngineConfigs(op_graph, modes, owned));
  if (configs.empty()) return Status::Internal("cuDNN heuristics offer no engine config");
  std::vector<CudnnPlan> plans;
  std::string last_error = "none tried";
  int64_t workspace_limit = 0;
  for (Desc config : configs) {
    if (int(plans.size()) >= max_candidates || (first_only && !plans.empty())) break;
    StatusOr<CudnnPlan> p = FinalizeCudnnPlan(handle, config);
    if (!p.ok()) {
      // A config that cannot run this graph fails here; try the next one.
      if (p.status().code() != Code::kUnavailable) return p.status();
      last_error = p.status().message();
      continue;
    }
    if (plans.empty()) {
      const int64_t first = p->workspace_bytes();
      workspace_limit = std::max(2 * first, first + (int64_t{256} << 20));
      if (max_workspace > 0) workspace_limit = std::min(workspace_limit, max_workspace);
    } else {
      if (p->workspace_bytes() > workspace_limit) continue;
      if (needs_determinism && p->nondeterministic() && !plans[0].nondeterministic()) continue;
    }
    plans.push_back(std::move(p).value());
  }
  if (plans.empty()) {
    return Status::Internal("none of " + std::to_string(configs.size()) +
                            " engine configs finalized; last: " + last_error);
  }
  return plans;
}

// The plan of an engine config given as text (a plan cache's value): kInvalidArgument where the
// text is not one, kUnavailable where this cuDNN cannot build it for the graph.
StatusOr<CudnnPlan> PlanFromText(cudnnHandle_t handle, Desc op_graph, const std::string& text) {
  FORGE_ASSIGN_OR_RETURN(const CudnnEngineChoice choice, ParseCudnnEngineChoice(text));
  return FinalizeCudnnPlan(handle, op_graph, choice);
}

std::string PlanKey(const SdpaShape& s, const std::string& kind, const std::string& device) {
  return "sdpa " + kind + " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
         " H=" + std::to_string(s.H) + " KV=" + std::to_string(s.KV) +
         " hd=" + std::to_string(s.hd) + " | " + device + " | cudnn " +
         std::to_string(cudnnGetVersion());
}

void Warn(const std::string& what) { std::fprintf(stderr, "forge: %s\n", what.c_str()); }

std::string Ms(float ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f ms", double(ms));
  return buf;
}

}  // namespace

SdpaRunner::SdpaRunner() = default;

SdpaRunner::~SdpaRunner() {
  graphs_.clear();
  if (owns_workspace_) cudaFree(workspace_);
  if (handle_) cudnnDestroy(handle_);
}

bool SdpaRunner::flash_backward(const SdpaShape& s) const {
  return backward_ == SdpaBackwardKernel::kFlash &&
         FlashBackwardSupports({s.B, s.T, s.H, s.KV, s.hd}).ok();
}

Status SdpaRunner::Init(bool deterministic, SdpaBackwardKernel backward) {
  if (handle_) return Status::Precondition("SdpaRunner::Init called twice");
  backward_ = backward;
  int device = 0;
  FORGE_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  FORGE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  device_name_ = prop.name;
  FORGE_CUDNN_CHECK(cudnnCreate(&handle_));
  deterministic_ = deterministic;
  cache_ = PlanCache::FromEnv();
  return Status::Ok();
}

size_t SdpaRunner::BackwardScratchBytes(const SdpaShape& s, bool deterministic) {
  const size_t rows = size_t(s.B) * s.H * s.T;
  size_t bytes = Align256(rows * sizeof(float));
  if (!deterministic) bytes += Align256(rows * s.hd * sizeof(float));
  return bytes;
}

Status SdpaRunner::EnsureWorkspace(size_t bytes) {
  if (bytes <= workspace_bytes_) return Status::Ok();
  if (workspace_ && !owns_workspace_) {
    Warn("sdpa: a plan needs a " + std::to_string(bytes) + "-byte workspace, more than the " +
         std::to_string(workspace_bytes_) + " bytes lent to it: it gets one of its own");
  }
  // cudaFree waits for work still using the old buffer. Growth happens on the first call of
  // each shape, before any CUDA-graph capture.
  if (owns_workspace_) FORGE_CUDA_CHECK(cudaFree(workspace_));
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  owns_workspace_ = false;
  FORGE_CUDA_CHECK(cudaMalloc(&workspace_, bytes));
  workspace_bytes_ = bytes;
  owns_workspace_ = true;
  return Status::Ok();
}

Status SdpaRunner::ShareWorkspace(void* p, size_t bytes) {
  if (workspace_) return Status::Precondition("SdpaRunner::ShareWorkspace after the first call");
  if (p == nullptr || reinterpret_cast<uintptr_t>(p) % 256 != 0)
    return Status::Invalid("SdpaRunner::ShareWorkspace: a 256-byte aligned buffer is needed");
  workspace_ = p;
  workspace_bytes_ = bytes;
  owns_workspace_ = false;
  return Status::Ok();
}

StatusOr<size_t> SdpaRunner::PlanWorkspaceBytes(const SdpaShape& s, bool backward) {
  if (backward && flash_backward(s)) {
    return FlashBackwardScratchBytes({s.B, s.T, s.H, s.KV, s.hd});
  }
  FORGE_ASSIGN_OR_RETURN(Graph * g, Get(s, backward));
  if (g->plan) return static_cast<size_t>(g->plan->workspace_bytes());
  if (cache_.enabled()) {  // the recorded choice, as ChoosePlan will take it
    FORGE_ASSIGN_OR_RETURN(const std::optional<std::string> recorded,
                           cache_.Get(PlanKey(s, g->kind, device_name_)));
    if (recorded) {
      StatusOr<CudnnPlan> p = PlanFromText(handle_, g->op_graph, *recorded);
      if (p.ok()) return static_cast<size_t>(p->workspace_bytes());
    }
  }
  FORGE_ASSIGN_OR_RETURN(std::vector<CudnnPlan> first,
                         FinalizeCandidates(handle_, g->op_graph, g->needs_determinism,
                                            /*first_only=*/true, 1, &g->owned));
  return static_cast<size_t>(first[0].workspace_bytes());
}

StatusOr<size_t> SdpaRunner::WorkspaceBytes(const SdpaShape& s) {
  if (!handle_) return Status::Precondition("SdpaRunner::WorkspaceBytes before Init");
  FORGE_RETURN_IF_ERROR(CheckShape(s, true));
  FORGE_ASSIGN_OR_RETURN(const size_t fwd, PlanWorkspaceBytes(s, false));
  FORGE_ASSIGN_OR_RETURN(const size_t bwd, PlanWorkspaceBytes(s, true));
  return std::max(fwd, bwd);
}

StatusOr<SdpaRunner::Graph*> SdpaRunner::Get(const SdpaShape& s, bool backward) {
  const auto key = std::make_tuple(s.B, s.T, s.H, s.KV, s.hd, backward);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return it->second.get();

  auto g = std::make_unique<Graph>();
  g->scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  g->kind = !backward ? "fwd" : deterministic_ ? "bwd-det" : "bwd";
  // The forward graph is the same in both modes and shares its cache entry: it is held to
  // the deterministic standard in both.
  g->needs_determinism = !backward || deterministic_;
  const Status st =
      BuildOperationGraph(handle_, s, backward, deterministic_, &g->owned, &g->op_graph);
  if (!st.ok()) return WithContext(st, s, backward);
  Graph* raw = g.get();
  graphs_.emplace(key, std::move(g));
  return raw;
}

StatusOr<SdpaPlanInfo> SdpaRunner::Tune(Graph* g, const Call& call, cudaStream_t stream) {
  FORGE_ASSIGN_OR_RETURN(
      std::vector<CudnnPlan> cands,
      FinalizeCandidates(handle_, g->op_graph, g->needs_determinism, /*first_only=*/false,
                         kMaxCandidates, &g->owned,
                         owns_workspace_ ? 0 : static_cast<int64_t>(workspace_bytes_)));
  // Other streams' work (e.g. weight gradients) must not share the GPU with the timed runs.
  FORGE_CUDA_CHECK(cudaDeviceSynchronize());

  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> times(cands.size(), inf);
  std::string notes;
  // The workspace of candidate i: the runner's if large enough, else a scratch buffer.
  auto with_workspace = [&](size_t i, auto&& fn) -> Status {
    const size_t need = static_cast<size_t>(cands[i].workspace_bytes());
    DeviceScratch scratch;
    void* ws = workspace_;
    if (need > workspace_bytes_) {
      if (cudaMalloc(&scratch.p, need) != cudaSuccess) {
        (void)cudaGetLastError();
        scratch.p = nullptr;
        return Status::Unavailable("no memory for a " + std::to_string(need) +
                                   "-byte workspace");
      }
      ws = scratch.p;
    }
    return fn(ws);
  };
  for (size_t i = 0; i < cands.size(); ++i) {
    const Status st = with_workspace(i, [&](void* ws) -> Status {
      FORGE_ASSIGN_OR_RETURN(times[i], TimePlan(handle_, cands[i], call.uids, call.ptrs, ws,
                                                stream));
      return Status::Ok();
    });
    if (!st.ok()) {
      // A cuDNN refusal at run time skips the candidate; a CUDA error is the caller's too.
      if (st.code() != Code::kUnavailable && cudaPeekAtLastError() != cudaSuccess) return st;
      notes += cands[i].choice().ToString() + " did not run (" + st.message() + "); ";
    }
  }

  // Fastest first; heuristics' first config stays unless beaten by the margin; for graphs
  // that must be deterministic the winner must reproduce its outputs bitwise.
  std::vector<size_t> order(cands.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return times[a] < times[b]; });
  int chosen = -1;
  for (size_t i : order) {
    if (!std::isfinite(times[i])) break;
    const bool beats_first =
        i == 0 || !std::isfinite(times[0]) || times[i] < times[0] * (1.0f - kTuneMargin);
    if (!beats_first) continue;
    if (g->needs_determinism) {
      bool same = false;
      const Status st = with_workspace(i, [&](void* ws) -> Status {
        FORGE_ASSIGN_OR_RETURN(same, Reproducible(handle_, cands[i], call.uids, call.ptrs,
                                                  call.outputs, ws, stream));
        return Status::Ok();
      });
      if (!st.ok() && st.code() != Code::kUnavailable) return st;
      if (!same) {
        notes += cands[i].choice().ToString() + " is not bitwise reproducible; ";
        continue;
      }
    }
    chosen = static_cast<int>(i);
    break;
  }
  if (chosen < 0) {
    if (!std::isfinite(times[0])) {
      return Status::Internal("none of " + std::to_string(cands.size()) +
                              " engine configs ran: " + notes);
    }
    notes += "no faster candidate reproduced its outputs: keeping heuristics' first; ";
    chosen = 0;
  }

  SdpaPlanInfo info;
  info.source = "tuned";
  info.engine = cands[size_t(chosen)].choice().ToString();
  for (float t : times) info.timed += std::isfinite(t) ? 1 : 0;
  info.first_ms = std::isfinite(times[0]) ? times[0] : 0.0f;
  info.chosen_ms = times[size_t(chosen)];
  info.note = notes;
  // Keep the winner's plan as a fallback; the plan actually used is rebuilt from the
  // recorded value by the caller, exactly as a later process will build it.
  g->plan = std::move(cands[size_t(chosen)]);
  return info;
}

Status SdpaRunner::ChoosePlan(Graph* g, const SdpaShape& s, const Call& call,
                              cudaStream_t stream) {
  if (g->plan) return Status::Ok();
  SdpaPlanInfo info;
  info.key = PlanKey(s, g->kind, device_name_);

  // Heuristics' first finalizable config, untimed (the behaviour without a plan cache).
  auto take_first = [&]() -> Status {
    FORGE_ASSIGN_OR_RETURN(std::vector<CudnnPlan> first,
                           FinalizeCandidates(handle_, g->op_graph, g->needs_determinism,
                                              /*first_only=*/true, 1, &g->owned));
    g->plan = std::move(first[0]);
    return Status::Ok();
  };

  if (!cache_.enabled()) {
    FORGE_RETURN_IF_ERROR(take_first());
    info.source = "first";
    info.engine = g->plan->choice().ToString();
  } else {
    FORGE_ASSIGN_OR_RETURN(const std::optional<std::string> recorded, cache_.Get(info.key));
    bool stale = false;
    if (recorded) {
      StatusOr<CudnnPlan> p = PlanFromText(handle_, g->op_graph, *recorded);
      if (p.ok()) {
        g->plan = std::move(p).value();
        info.source = "cache";
        info.engine = g->plan->choice().ToString();
      } else if (p.status().code() == Code::kUnavailable ||
                 p.status().code() == Code::kInvalidArgument) {
        // Recorded by another cuDNN build or edited by hand: choose again and replace it.
        stale = true;
        info.note = "recorded choice \"" + *recorded + "\" in " + cache_.path() +
                    " is not usable here (" + p.status().message() + "); ";
      } else {
        return p.status();
      }
    }
    if (!g->plan && ProfilerAttached()) {
      FORGE_RETURN_IF_ERROR(take_first());
      info.source = "profiler";
      info.engine = g->plan->choice().ToString();
      info.note += "a profiler or checker is attached: heuristics' first config, "
                   "untimed, not recorded";
    } else if (!g->plan && StreamCapturing(stream)) {
      // Timing would synchronise a capturing stream; the model warms every shape up
      // eagerly before capturing, so this is a first call the caller did not plan for.
      FORGE_RETURN_IF_ERROR(take_first());
      info.source = "capture";
      info.engine = g->plan->choice().ToString();
      info.note += "first call under stream capture: untimed, not recorded";
    } else if (!g->plan) {
      const auto t0 = std::chrono::steady_clock::now();
      FORGE_ASSIGN_OR_RETURN(SdpaPlanInfo tuned, Tune(g, call, stream));
      tuned.key = info.key;
      tuned.note = info.note + tuned.note;
      info = std::move(tuned);
      // Record; when another process recorded first, adopt its choice (same bits).
      StatusOr<std::string> winner = info.engine;
      if (stale) {
        const Status put = cache_.Put(info.key, info.engine);
        if (!put.ok()) winner = put;
      } else {
        winner = cache_.PutIfAbsent(info.key, info.engine);
      }
      std::string use = info.engine;
      if (!winner.ok()) {
        info.note += "not recorded: " + winner.status().message() + "; ";
      } else if (*winner != info.engine) {
        info.note += "adopted the choice another process recorded first; ";
        use = *winner;
      }
      StatusOr<CudnnPlan> rebuilt = PlanFromText(handle_, g->op_graph, use);
      if (rebuilt.ok()) {
        g->plan = std::move(rebuilt).value();
        info.engine = g->plan->choice().ToString();
      } else {
        // Keep the tuned plan itself (built from heuristics' config).
        info.note += "rebuilding \"" + use + "\" failed (" + rebuilt.status().message() +
                     "): running the tuned config; ";
      }
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      char took[32];
      std::snprintf(took, sizeof(took), "%.2f s", secs);
      Warn(info.key + ": tuned " + std::to_string(info.timed) + " engine configs in " + took +
           ": " + info.engine + " " + Ms(info.chosen_ms) + " (heuristics' first " +
           Ms(info.first_ms) + ")" + (info.note.empty() ? "" : "; " + info.note) +
           (cache_.enabled() ? " [plan cache " + cache_.path() + "]" : ""));
    }
  }
  if (info.source != "tuned" && !info.note.empty()) Warn(info.key + ": " + info.note);
  plan_log_.push_back(std::move(info));
  return Status::Ok();
}

Status SdpaRunner::Run(Graph* g, const Call& call, cudaStream_t stream) {
  (void)stream;  // already set on the handle
  FORGE_RETURN_IF_ERROR(EnsureWorkspace(static_cast<size_t>(g->plan->workspace_bytes())));
  DescGuard pack;
  FORGE_RETURN_IF_ERROR(MakePack(call.uids, call.ptrs, workspace_, &pack));
  FORGE_CUDNN_CHECK(cudnnBackendExecute(handle_, g->plan->plan(), pack.d));
  return Status::Ok();
}

StatusOr<std::vector<SdpaEngineCandidate>> SdpaRunner::EngineCandidates(const SdpaShape& s,
                                                                        bool backward) {
  if (!handle_) return Status::Precondition("SdpaRunner::EngineCandidates before Init");
  FORGE_RETURN_IF_ERROR(CheckShape(s, backward));
  FORGE_ASSIGN_OR_RETURN(Graph * g, Get(s, backward));
  StatusOr<std::vector<CudnnPlan>> plans =
      FinalizeCandidates(handle_, g->op_graph, g->needs_determinism, /*first_only=*/false,
                         kMaxCandidates, &g->owned);
  if (!plans.ok()) return WithContext(plans.status(), s, backward);
  std::vector<SdpaEngineCandidate> out;
  for (const CudnnPlan& p : *plans) {
    out.push_back({p.choice().ToString(), p.workspace_bytes(), p.nondeterministic(),
                   p.runtime_compiled()});
  }
  return out;
}

Status SdpaRunner::UseEngine(const SdpaShape& s, bool backward, const std::string& engine) {
  if (!handle_) return Status::Precondition("SdpaRunner::UseEngine before Init");
  FORGE_RETURN_IF_ERROR(CheckShape(s, backward));
  FORGE_ASSIGN_OR_RETURN(Graph * g, Get(s, backward));
  FORGE_ASSIGN_OR_RETURN(const CudnnEngineChoice choice, ParseCudnnEngineChoice(engine));
  StatusOr<CudnnPlan> p = FinalizeCudnnPlan(handle_, g->op_graph, choice);
  if (!p.ok()) return WithContext(p.status(), s, backward);
  // The plan it replaces may still have runs queued (benchmarks and tests only come here).
  if (g->plan) FORGE_CUDA_CHECK(cudaDeviceSynchronize());
  g->plan = std::move(p).value();
  SdpaPlanInfo info;
  info.key = PlanKey(s, g->kind, device_name_);
  info.engine = g->plan->choice().ToString();
  info.source = "forced";
  plan_log_.push_back(std::move(info));
  return Status::Ok();
}

namespace {
void* Mut(const void* p) { return const_cast<void*>(p); }
}  // namespace

Status SdpaRunner::Forward(const SdpaShape& s, const bf16* qkv, bf16* out, float* stats,
                           cudaStream_t stream) {
  if (!handle_) return Status::Precondition("SdpaRunner::Forward before Init");
  FORGE_RETURN_IF_ERROR(CheckShape(s, false));
  FORGE_RETURN_IF_ERROR(CheckAligned(qkv, "qkv"));
  FORGE_RETURN_IF_ERROR(CheckAligned(out, "out"));
  FORGE_RETURN_IF_ERROR(CheckAligned(stats, "stats"));
  FORGE_ASSIGN_OR_RETURN(Graph * g, Get(s, false));
  FORGE_CUDNN_CHECK(cudnnSetStream(handle_, stream));

  const int64_t k_off = int64_t{s.H} * s.hd, v_off = int64_t{s.H + s.KV} * s.hd;
  Call call;
  call.uids = {kQ, kKt, kV, kO, kStats, kScale, kNegInf};
  call.ptrs = {Mut(qkv), Mut(qkv + k_off), Mut(qkv + v_off), out, stats, &g->scale,
               &g->neg_inf};
  const size_t rows = size_t(s.B) * s.H * s.T;
  call.outputs = {{out, rows * s.hd * sizeof(bf16)}, {stats, rows * sizeof(float)}};
  FORGE_RETURN_IF_ERROR(WithContext(ChoosePlan(g, s, call, stream), s, false));
  return WithContext(Run(g, call, stream), s, false);
}

Status SdpaRunner::Backward(const SdpaShape& s, const bf16* qkv, const bf16* out, const bf16* dout,
                            const float* stats, bf16* dqkv, float* softmax_sum, float* dq_accum,
                            cudaStream_t stream, const FlashBackwardFp8Out* fp8) {
  if (!handle_) return Status::Precondition("SdpaRunner::Backward before Init");
  FORGE_RETURN_IF_ERROR(CheckShape(s, true));
  FORGE_RETURN_IF_ERROR(CheckAligned(qkv, "qkv"));
  FORGE_RETURN_IF_ERROR(CheckAligned(out, "out"));
  FORGE_RETURN_IF_ERROR(CheckAligned(dout, "dout"));
  FORGE_RETURN_IF_ERROR(CheckAligned(stats, "stats"));
  FORGE_RETURN_IF_ERROR(CheckAligned(dqkv, "dqkv"));
  if (flash_backward(s)) {
    const FlashBackwardShape fs{s.B, s.T, s.H, s.KV, s.hd};
    FORGE_RETURN_IF_ERROR(EnsureWorkspace(FlashBackwardScratchBytes(fs)));
    return FlashBackward(fs, qkv, out, dout, stats, dqkv, workspace_, stream, fp8);
  }
  if (fp8 != nullptr) {
    return Status::Precondition(
        "SdpaRunner::Backward: FP8 outputs need our attention backward (engine.attention_backward "
        "flash, an sm_90 GPU, head width 64, T a multiple of 128)");
  }
  FORGE_RETURN_IF_ERROR(CheckAligned(softmax_sum, "softmax_sum"));
  if (!deterministic_) FORGE_RETURN_IF_ERROR(CheckAligned(dq_accum, "dq_accum"));
  FORGE_ASSIGN_OR_RETURN(Graph * g, Get(s, true));
  FORGE_CUDNN_CHECK(cudnnSetStream(handle_, stream));

  const int64_t k_off = int64_t{s.H} * s.hd, v_off = int64_t{s.H + s.KV} * s.hd;
  Call call;
  call.uids = {kQ,     kKt,     kVt,  kO,  kDO, kStats, kScale,
               kNegInf, kOne,   kDQ,  kDK, kDV, kSoftmaxSum};
  call.ptrs = {Mut(qkv),       Mut(qkv + k_off), Mut(qkv + v_off), Mut(out),
               Mut(dout),      Mut(stats),       &g->scale,        &g->neg_inf,
               &g->one,        dqkv,             dqkv + k_off,     dqkv + v_off,
               softmax_sum};
  if (!deterministic_) {
    call.uids.push_back(kDQAccum);
    call.ptrs.push_back(dq_accum);
  }
  const size_t rows = size_t(s.B) * s.H * s.T;
  call.outputs = {{dqkv, size_t(s.B) * s.T * (s.H + 2 * s.KV) * s.hd * sizeof(bf16)},
                  {softmax_sum, rows * sizeof(float)}};
  FORGE_RETURN_IF_ERROR(WithContext(ChoosePlan(g, s, call, stream), s, true));
  return WithContext(Run(g, call, stream), s, true);
}

}  // namespace forge::cuda
