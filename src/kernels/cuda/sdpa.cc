// Causal attention forward/backward as composite cuDNN backend graphs (matmuls, pointwise ops,
// reductions, reshapes) that cuDNN recognises and fuses into its flash kernels. The native
// SDPA backend ops have no causal mask on Hopper, hence the composite form.
#include "kernels/cuda/sdpa.cuh"

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"

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

    Desc op;
    FORGE_RETURN_IF_ERROR(Create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    if (b) {
      FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    }
    if (t) {
      FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t));
    }
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    const float one = 1.0f;
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1,
                                               CUDNN_TYPE_FLOAT, 1, &one));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2,
                                               CUDNN_TYPE_FLOAT, 1, &one));
    FORGE_CUDNN_CHECK(cudnnBackendFinalize(op));
    ops_.push_back(op);
    return Status::Ok();
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

    Desc op;
    FORGE_RETURN_IF_ERROR(Create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, &op));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_DESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm));
    FORGE_CUDNN_CHECK(cudnnBackendFinalize(op));
    ops_.push_back(op);
    return Status::Ok();
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

    Desc op;
    FORGE_RETURN_IF_ERROR(Create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, &op));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd));
    FORGE_CUDNN_CHECK(cudnnBackendFinalize(op));
    ops_.push_back(op);
    return Status::Ok();
  }

  // y is x under another dims/strides view (a transpose here), possibly in another type.
  Status Reshape(Desc x, Desc y) {
    Desc op;
    FORGE_RETURN_IF_ERROR(Create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, &op));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    FORGE_CUDNN_CHECK(cudnnBackendFinalize(op));
    ops_.push_back(op);
    return Status::Ok();
  }

  const std::vector<Desc>& ops() const { return ops_; }

 private:
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

std::string LastCudnnError() {
  char buf[1024] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  return buf;
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

// Builds one graph's ops, then operation graph -> heuristics (mode A) -> the first engine
// config whose execution plan finalizes. Every descriptor goes into *owned (the plan last).
Status BuildPlan(cudnnHandle_t handle, const SdpaShape& s, bool backward, bool deterministic,
                 std::vector<Desc>* owned, Desc* plan_out, int64_t* workspace_bytes) {
  const Layout L(s);
  GraphBuilder gb(owned);
  FORGE_RETURN_IF_ERROR(backward ? BuildBackward(gb, L, deterministic) : BuildForward(gb, L));

  Desc op_graph;
  FORGE_RETURN_IF_ERROR(gb.Create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &op_graph));
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op_graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                             CUDNN_TYPE_HANDLE, 1, &handle));
  const std::vector<Desc>& ops = gb.ops();
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(op_graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             static_cast<int64_t>(ops.size()), ops.data()));
  FORGE_CUDNN_CHECK(cudnnBackendFinalize(op_graph));

  Desc heur;
  FORGE_RETURN_IF_ERROR(gb.Create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op_graph));
  FORGE_CUDNN_CHECK(
      cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
  FORGE_CUDNN_CHECK(cudnnBackendFinalize(heur));
  int64_t count = 0;
  FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  if (count <= 0) {
    return Status::Internal("cuDNN heuristics offer no engine for the " +
                            std::to_string(ops.size()) + "-op graph");
  }
  // The result array must hold engine-config descriptors created beforehand.
  std::vector<Desc> configs(static_cast<size_t>(count));
  for (Desc& c : configs) FORGE_RETURN_IF_ERROR(gb.Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c));
  int64_t returned = 0;
  FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                                             configs.data()));

  std::string last_error = "no engine config returned";
  for (int64_t i = 0; i < returned; ++i) {
    DescGuard plan;
    FORGE_CUDNN_CHECK(
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan.d));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                               CUDNN_TYPE_HANDLE, 1, &handle));
    FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[i]));
    // A config that cannot run this graph fails here; try the next one.
    const cudnnStatus_t plan_status = cudnnBackendFinalize(plan.d);
    if (plan_status != CUDNN_STATUS_SUCCESS) {
      last_error = std::string(cudnnGetErrorString(plan_status)) + " (" + LastCudnnError() + ")";
      continue;
    }
    int64_t n = 0;
    FORGE_CUDNN_CHECK(cudnnBackendGetAttribute(plan.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                               CUDNN_TYPE_INT64, 1, &n, workspace_bytes));
    *plan_out = plan.d;
    owned->push_back(plan.d);
    plan.d = nullptr;
    return Status::Ok();
  }
  return Status::Internal("none of " + std::to_string(returned) + " engine configs of the " +
                          std::to_string(ops.size()) + "-op graph finalized; last: " + last_error);
}

}  // namespace

struct SdpaRunner::Graph {
  std::vector<Desc> owned;  // every descriptor of this graph, in creation order
  Desc plan = nullptr;
  int64_t workspace_bytes = 0;
  // By-value scalars: the variant pack points at these host floats.
  float scale = 1.0f;
  float neg_inf = -std::numeric_limits<float>::infinity();
  float one = 1.0f;

  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
};

SdpaRunner::SdpaRunner() = default;

SdpaRunner::~SdpaRunner() {
  graphs_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cudnnDestroy(handle_);
}

Status SdpaRunner::Init(bool deterministic) {
  if (handle_) return Status::Precondition("SdpaRunner::Init called twice");
  FORGE_CUDNN_CHECK(cudnnCreate(&handle_));
  deterministic_ = deterministic;
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
  // cudaFree waits for work still using the old buffer. Growth happens on the first call of
  // each shape, before any CUDA-graph capture.
  if (workspace_) FORGE_CUDA_CHECK(cudaFree(workspace_));
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  FORGE_CUDA_CHECK(cudaMalloc(&workspace_, bytes));
  workspace_bytes_ = bytes;
  return Status::Ok();
}

StatusOr<SdpaRunner::Graph*> SdpaRunner::Get(const SdpaShape& s, bool backward) {
  const auto key = std::make_tuple(s.B, s.T, s.H, s.KV, s.hd, backward);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) return it->second.get();

  auto g = std::make_unique<Graph>();
  g->scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const Status st = BuildPlan(handle_, s, backward, deterministic_, &g->owned, &g->plan,
                              &g->workspace_bytes);
  if (!st.ok()) return WithContext(st, s, backward);
  Graph* raw = g.get();
  graphs_.emplace(key, std::move(g));
  return raw;
}

namespace {

Status Execute(cudnnHandle_t handle, Desc plan, const std::vector<int64_t>& uids,
               const std::vector<void*>& pointers, void* workspace) {
  DescGuard pack;
  FORGE_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack.d));
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(pack.d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                             CUDNN_TYPE_INT64,
                                             static_cast<int64_t>(uids.size()), uids.data()));
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(pack.d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                             CUDNN_TYPE_VOID_PTR,
                                             static_cast<int64_t>(pointers.size()),
                                             pointers.data()));
  FORGE_CUDNN_CHECK(cudnnBackendSetAttribute(pack.d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                             CUDNN_TYPE_VOID_PTR, 1, &workspace));
  FORGE_CUDNN_CHECK(cudnnBackendFinalize(pack.d));
  FORGE_CUDNN_CHECK(cudnnBackendExecute(handle, plan, pack.d));
  return Status::Ok();
}

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
  FORGE_RETURN_IF_ERROR(EnsureWorkspace(static_cast<size_t>(g->workspace_bytes)));
  FORGE_CUDNN_CHECK(cudnnSetStream(handle_, stream));

  const int64_t k_off = int64_t{s.H} * s.hd, v_off = int64_t{s.H + s.KV} * s.hd;
  const std::vector<int64_t> uids = {kQ, kKt, kV, kO, kStats, kScale, kNegInf};
  const std::vector<void*> ptrs = {Mut(qkv), Mut(qkv + k_off), Mut(qkv + v_off), out, stats,
                                   &g->scale, &g->neg_inf};
  return WithContext(Execute(handle_, g->plan, uids, ptrs, workspace_), s, false);
}

Status SdpaRunner::Backward(const SdpaShape& s, const bf16* qkv, const bf16* out,
                            const bf16* dout, const float* stats, bf16* dqkv, float* softmax_sum,
                            float* dq_accum, cudaStream_t stream) {
  if (!handle_) return Status::Precondition("SdpaRunner::Backward before Init");
  FORGE_RETURN_IF_ERROR(CheckShape(s, true));
  FORGE_RETURN_IF_ERROR(CheckAligned(qkv, "qkv"));
  FORGE_RETURN_IF_ERROR(CheckAligned(out, "out"));
  FORGE_RETURN_IF_ERROR(CheckAligned(dout, "dout"));
  FORGE_RETURN_IF_ERROR(CheckAligned(stats, "stats"));
  FORGE_RETURN_IF_ERROR(CheckAligned(dqkv, "dqkv"));
  FORGE_RETURN_IF_ERROR(CheckAligned(softmax_sum, "softmax_sum"));
  if (!deterministic_) FORGE_RETURN_IF_ERROR(CheckAligned(dq_accum, "dq_accum"));
  FORGE_ASSIGN_OR_RETURN(Graph * g, Get(s, true));
  FORGE_RETURN_IF_ERROR(EnsureWorkspace(static_cast<size_t>(g->workspace_bytes)));
  FORGE_CUDNN_CHECK(cudnnSetStream(handle_, stream));

  const int64_t k_off = int64_t{s.H} * s.hd, v_off = int64_t{s.H + s.KV} * s.hd;
  std::vector<int64_t> uids = {kQ,     kKt,     kVt,  kO,  kDO, kStats, kScale,
                               kNegInf, kOne,   kDQ,  kDK, kDV, kSoftmaxSum};
  std::vector<void*> ptrs = {Mut(qkv),       Mut(qkv + k_off), Mut(qkv + v_off), Mut(out),
                             Mut(dout),      Mut(stats),       &g->scale,        &g->neg_inf,
                             &g->one,        dqkv,             dqkv + k_off,     dqkv + v_off,
                             softmax_sum};
  if (!deterministic_) {
    uids.push_back(kDQAccum);
    ptrs.push_back(dq_accum);
  }
  return WithContext(Execute(handle_, g->plan, uids, ptrs, workspace_), s, true);
}

}  // namespace forge::cuda
