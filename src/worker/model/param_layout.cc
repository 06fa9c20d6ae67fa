#include "worker/model/param_layout.h"

namespace forge {
namespace {

int64_t Add(UnitLayout* u, std::string name, std::vector<int64_t> shape, bool matrix) {
  TensorSlot t;
  t.name = std::move(name);
  t.numel = 1;
  for (int64_t s : shape) t.numel *= s;
  t.shape = std::move(shape);
  t.offset = u->numel;
  t.weight_decay = matrix;
  t.is_matmul = matrix;
  u->numel += t.numel;
  u->tensors.push_back(t);
  return t.offset;
}

}  // namespace

ParamLayout MakeParamLayout(const ModelConfig& m) {
  ParamLayout p;
  const int64_t d = m.d_model, hd = m.head_dim(), V = m.padded_vocab();
  const int64_t qkv_rows = (m.n_head + 2 * m.n_kv_head) * hd;

  UnitLayout emb;
  emb.name = "embedding";
  Add(&emb, "wte", {V, d}, true);
  p.units.push_back(emb);

  for (int l = 0; l < m.n_layer; ++l) {
    UnitLayout u;
    u.name = "block." + std::to_string(l);
    const std::string pre = "blocks." + std::to_string(l) + ".";
    BlockOffsets o;
    o.attn_norm = Add(&u, pre + "attn_norm", {d}, false);
    if (m.qk_norm) {
      o.q_norm = Add(&u, pre + "attn.q_norm", {hd}, false);
      o.k_norm = Add(&u, pre + "attn.k_norm", {hd}, false);
    }
    auto linear = [&](int k, const char* name, int64_t rows, int64_t cols) {
      p.linears[size_t(k)] = {name, Add(&u, pre + name, {rows, cols}, true), rows, cols};
      return p.linears[size_t(k)].offset;
    };
    o.wqkv = linear(0, "attn.wqkv", qkv_rows, d);
    o.wo = linear(1, "attn.wo", d, m.n_head * hd);
    o.mlp_norm = Add(&u, pre + "mlp_norm", {d}, false);
    o.w_gate_up = linear(2, "mlp.w_gate_up", 2 * int64_t{m.ffn}, d);
    o.w_down = linear(3, "mlp.w_down", d, m.ffn);
    p.block = o;
    p.units.push_back(u);
  }

  UnitLayout fn;
  fn.name = "final_norm";
  Add(&fn, "final_norm", {d}, false);
  if (!m.tie_embeddings) p.lm_head = Add(&fn, "lm_head", {V, d}, true);
  p.units.push_back(fn);
  p.head_unit = m.tie_embeddings ? 0 : static_cast<int>(p.units.size()) - 1;

  for (const auto& u : p.units) p.total += u.numel;
  return p;
}

int64_t MatmulParamCount(const ModelConfig& m) {
  int64_t n = 0;
  for (const auto& u : MakeParamLayout(m).units)
    for (const auto& t : u.tensors)
      if (t.is_matmul && !(t.name == "wte" && !m.tie_embeddings)) n += t.numel;
  return n;
}

double TrainFlopsPerToken(const ModelConfig& m) {
  // The attention term counts the attention width n_head * head_dim (d_model by default).
  return 6.0 * static_cast<double>(MatmulParamCount(m)) +
         12.0 * m.n_layer * (double(m.n_head) * m.head_dim()) * static_cast<double>(m.seq_len);
}

}  // namespace forge
