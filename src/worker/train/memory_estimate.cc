#include "worker/train/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "worker/model/linear_strategy.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/mode_rules.h"
#include "worker/train/fp8_gather_rule.h"
#include "worker/train/lookup_apart_rule.h"

namespace forge {
namespace {

// Parameter counts by part, as MakeParamLayout lays them out (in doubles: no overflow).
struct ParamCounts {
  double embedding = 0;  // padded vocab x d (and the LM head's as many when untied)
  double attention = 0;  // all layers: wqkv + wo (+ norms)
  double mlp = 0;        // all layers: w_gate_up + w_down
  double total() const { return embedding + attention + mlp; }
};

ParamCounts CountParams(const ModelConfig& m) {
  const double d = m.d_model, L = m.n_layer, hd = m.head_dim(), ffn = m.ffn;
  const double qkv = (double(m.n_head) + 2.0 * m.n_kv_head) * hd;
  ParamCounts p;
  p.embedding = double(m.padded_vocab()) * d * (m.tie_embeddings ? 1 : 2) + d;  // + final norm
  p.attention = L * (qkv * d + d * m.n_head * hd + 2 * d + (m.qk_norm ? 2 * hd : 0));
  p.mlp = L * 3 * d * ffn;
  return p;
}

// Activations the CPU model allocates for micro_batch sequences (cpu_model.cc), fp32, and the
// part of it that is the attention probabilities (B x H x T x T).
double CpuActivations(const ModelConfig& m, int micro_batch, double* probs) {
  const double B = micro_batch, T = m.seq_len, N = B * T, d = m.d_model, H = m.n_head;
  const double hd = m.head_dim(), ffn = m.ffn, V = m.padded_vocab();
  const double qkv = (H + 2.0 * m.n_kv_head) * hd;
  double per_layer = 4 * d + 2 + qkv + H * hd + 3 * ffn;  // per token
  if (m.qk_norm) per_layer += qkv + H + m.n_kv_head;
  double global = 1 + 5 * d + 2 + V + 2 * H * hd + qkv + 3 * ffn;  // per token
  if (m.qk_norm) global += qkv;
  *probs = B * H * T * T * 4;
  return (N * (m.n_layer * per_layer + global)) * 4 + *probs;
}

// The CUDA model's buffers (worker/model/cuda_model.cc, fp8_linears.cc, kernels/cuda/sdpa.cc)
// beyond the parameter state, in bytes, by the config alone: what a GPU's kernels choose at
// run time (the fused epilogue GEMMs, which engine cuDNN picks) is taken as on an H100/H200.
struct CudaBuffers {
  double fp8_weights = 0;  // the linears' FP8 weights and their transposes (every rank whole)
                           // of every layer, or of one layer under fsdp (cast per pass), and
                           // fsdp's E4M3 gather buffers
  double activations = 0;  // layer inputs, saved block tensors, the final norm's output
  double workspace = 0;    // backward gradients, logits chunks, attention and GEMM scratch
  double quadratic = 0;    // the part of workspace that grows with seq_len^2 (cuDNN's)
};

CudaBuffers CountCudaBuffers(const RunConfig& cfg, int world) {
  const ModelConfig& m = cfg.model;
  const EngineConfig& eng = cfg.engine;
  const bool fp8 = cfg.precision.compute == Precision::kFp8;
  const double B = cfg.batch.micro_batch, T = m.seq_len, N = B * T, d = m.d_model;
  const double ffn = m.ffn, L = m.n_layer, H = m.n_head, KV = m.n_kv_head, hd = m.head_dim();
  const double V = m.padded_vocab(), qkv = (H + 2 * KV) * hd, att = H * hd;
  CudaBuffers c;

  // Saved per block set (bf16 unless said): rstd1 and rstd2 (fp32 per token), qkv, the
  // attention output and its fp32 log-sum-exp per head and token, x_mid, gate/up; with
  // QK-norm the raw Q, K and their fp32 rstd. h1, h2 and sw (recomputable) are kept by every
  // set without recompute, two alternating sets with selective, one shared set in FP8 (whose
  // backward reads their FP8 transposes instead). Full recompute keeps one block set.
  double kept = 2 * (qkv + att + d + 2 * ffn) + 4 * (2 + H);
  if (m.qk_norm) kept += 2 * (H + KV) * hd + 4 * (H + KV);
  const double recomputable = 2 * (2 * d + ffn);
  const double sets = cfg.train.activation_recompute == Recompute::kFull ? std::min(L, 1.0) : L;
  const double h_sets = fp8 ? std::min(sets, 1.0)
                        : cfg.train.activation_recompute == Recompute::kSelective
                            ? std::min(sets, 2.0)
                            : sets;
  c.activations = N * (2 * (L + 1) * d + sets * kept + h_sets * recomputable + 2 * d + 4);

  // The backward's activation gradients (bf16): dres, dh, gate/up's, the attention output's,
  // qkv's, and SwiGLU's input gradient unless the fused SwiGLU-backward GEMM consumes it in
  // its epilogue (BF16 with engine.fused_epilogues at a width where it is the faster path, not
  // ddp on several ranks).
  double grads = 2 * d + 2 * ffn + att + qkv;
  const bool ddp_ranks = world > 1 && !ModeRulesFor(cfg.parallel, world).sharded();
  if (fp8 || !eng.fused_epilogues || !SwiGluGemmsAreFaster(m.d_model) || ddp_ranks) grads += ffn;
  c.workspace = 2 * N * grads;
  // The LM head's bf16 logits chunks: one per stream (two with engine.wgrad_stream).
  const double rows = std::min(N, double(eng.lm_head_chunk));
  const double logits_buffers = eng.wgrad_stream ? 2 : 1;
  const double logits = logits_buffers * rows * V * 2;
  // Attention backward: softmax_sum (fp32 per head and token), dq_accum (fp32 [B,H,T,hd])
  // where not deterministic, and the runner's workspace: our flash backward's (heads of 64, T
  // a multiple of 128: fp32x2 row stats and an fp32 dq accumulator per head and token, and
  // under GQA each query head's fp32 dK and dV) or
  // cuDNN's, whose deterministic backward needs 2 B H T^2 bytes (its non-deterministic one a
  // few MiB, not counted).
  const double rows_bht = B * H * T;
  double attention = 4 * rows_bht + (eng.deterministic_attention ? 0 : 4 * rows_bht * hd);
  const bool flash = eng.attention_backward == AttentionBackward::kFlash && m.head_dim() == 64 &&
                     m.seq_len % 128 == 0 && m.n_head % m.n_kv_head == 0;
  if (flash) {
    attention += rows_bht * (8 + 4 * 64) + rows_bht / 64 * 4;
    if (H > KV) attention += rows_bht * 2 * 64 * 4 + B * KV * T / 128 * 4;  // GQA: dK, dV
  } else if (eng.deterministic_attention) {
    c.quadratic = 2 * B * H * T * T;
  }
  attention += c.quadratic;
  // The logits and attention's backward share one region (step_buffers.cc).
  c.workspace += std::max(logits, attention);
  c.workspace += 2.0 * (64 << 20);  // two cuBLASLt workspaces (compute and wgrad streams)

  if (fp8) {
    // Fp8Linears: per layer (one shared set under fsdp) an E4M3 weight and its transpose for
    // each linear; the input's cast (widest input) and, per saved block set, every linear's
    // transposed input; each linear's output gradient cast and its transpose.
    const double ins = d + att + d + ffn, outs = qkv + d + 2 * ffn + d;
    const bool one_weight_set = world > 1 && ModeRulesFor(cfg.parallel, world).shard_params;
    c.fp8_weights =
        2 * (one_weight_set ? 1 : L) * (qkv * d + att * d + 2 * ffn * d + ffn * d);
    // fsdp's E4M3 gather where it runs (fp8_gather_rule.h; cuda_data_parallel.h): two rotating
    // gathered block units and this rank's slot of every block, a byte an element.
    if (ChooseFp8Gather(cfg, world).e4m3) {
      const double block = qkv * d + att * d + 3 * ffn * d + 2 * d + (m.qk_norm ? 2 * hd : 0);
      const double W = ModeRulesFor(cfg.parallel, world).shard_world;
      c.fp8_weights += 2 * block + L * block / W;
    }
    c.activations += N * sets * ins;
    c.workspace += N * std::max({d, att, ffn}) + 2 * N * outs;
    if (cfg.precision.fp8.lm_head) {
      c.fp8_weights += 2 * V * d;
      c.workspace += rows * d + rows * V + logits_buffers * rows * d;
    }
  }
  return c;
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  char buf[64];
  if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.3g %s", b, units[u]);  // beyond EiB
  else std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string Key(const char* name, long long v) {
  return std::string(name) + " (" + std::to_string(v) + ")";
}

// The keys that make the largest part of the estimate large.
std::string Culprits(const RunConfig& cfg, Backend backend, const MemoryEstimate& e,
                     double probs) {
  const ModelConfig& m = cfg.model;
  if (e.activations + e.workspace > e.weights + e.gradients + e.moments) {
    if (probs > (e.activations + e.workspace) / 2)
      return Key("model.seq_len", m.seq_len) + " or " +
             Key("batch.micro_batch", cfg.batch.micro_batch) +
             (backend == Backend::kCuda
                  ? " (cuDNN's deterministic attention backward: 2 x micro_batch x n_head x "
                    "seq_len^2 bytes)"
                  : " (the attention probabilities: micro_batch x n_head x seq_len^2)");
    std::string keys = Key("batch.micro_batch", cfg.batch.micro_batch) + ", " +
                       Key("model.seq_len", m.seq_len) + " or " + Key("model.n_layer", m.n_layer);
    if (backend == Backend::kCuda && cfg.train.activation_recompute != Recompute::kFull)
      keys += ", or set train.activation_recompute: selective or full";
    return keys;
  }
  const ParamCounts p = CountParams(m);
  if (p.embedding >= p.attention + p.mlp)
    return Key("model.vocab", m.vocab) + " or " + Key("model.d_model", m.d_model);
  std::string keys = Key("model.n_layer", m.n_layer) + (p.mlp > p.attention ? ", " : " or ") +
                     Key("model.d_model", m.d_model);
  if (p.mlp > p.attention) keys += " or " + Key("model.ffn", m.ffn);
  if (cfg.train.workers > 1 && !ModeRulesFor(cfg.parallel, cfg.train.workers).sharded())
    keys += ", or shard the state over the ranks (parallel.mode zero1|zero2|fsdp)";
  return keys;
}

// A "<key> <value>" line of a /proc or cgroup file, in bytes (kB lines scaled); < 0 if absent.
double ReadMeminfoField(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    double v = -1;
    char unit[8] = {};
    if (std::sscanf(line.c_str() + key.size() + 1, "%lf %7s", &v, unit) < 1) return -1;
    return std::string(unit) == "kB" ? v * 1024 : v;
  }
  return -1;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A number file ("max" and unreadable: < 0).
double ReadNumber(const std::string& path) {
  const std::string t = ReadText(path);
  if (t.empty() || t.rfind("max", 0) == 0) return -1;
  try {
    return std::stod(t);
  } catch (...) {
    return -1;
  }
}

// Room left under this process's cgroup limit (v2, else v1); < 0 when unlimited or unknown.
double CgroupRoom() {
  std::istringstream in(ReadText("/proc/self/cgroup"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) {  // cgroup v2
      const std::string dir = "/sys/fs/cgroup" + line.substr(3);
      const double max = ReadNumber(dir + "/memory.max");
      const double cur = ReadNumber(dir + "/memory.current");
      if (max > 0 && cur >= 0) return std::max(0.0, max - cur);
    }
  }
  const double max = ReadNumber("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  const double cur = ReadNumber("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  if (max > 0 && max < 1e18 && cur >= 0) return std::max(0.0, max - cur);  // v1: huge = none
  return -1;
}

}  // namespace

MemoryEstimate EstimateTrainingMemory(const RunConfig& cfg, Backend backend, int world) {
  // What the mode shards, over how many ranks (hsdp: its shard group).
  const ModeRules rules = ModeRulesFor(cfg.parallel, world);
  const double W = rules.shard_world;
  const double P = CountParams(cfg.model).total();
  const bool sharded = rules.sharded() && W > 1;
  MemoryEstimate e;
  if (backend == Backend::kCuda) {
    const bool fsdp = rules.shard_params && W > 1;
    // fp32 master and moments (sharded by zero1/zero2/fsdp/hsdp), the bf16 compute copy
    // (none under fsdp/hsdp, whose gathers cast the fp32 slots), fp32 gradients (full unless
    // fsdp), ddp's bf16 gradient twin and the sharded modes' gradient slot.
    const CudaBuffers c = CountCudaBuffers(cfg, world);
    e.weights = (sharded ? 4 * P / W : 4 * P) + (fsdp ? 0 : 2 * P) + c.fp8_weights;
    e.gradients = (fsdp ? 0 : 4 * P) + (sharded ? 4 * P / W : 0);
    // ddp reducing in bf16 (parallel.grad_reduce): a bf16 twin of the gradients it all-reduces.
    if (world > 1 && !rules.sharded() && cfg.parallel.grad_reduce == GradReduce::kBf16)
      e.gradients += 2 * P;
    const int64_t tokens = int64_t{cfg.batch.micro_batch} * cfg.model.seq_len;
    // An untied table looked up in the slots is never gathered (lookup_apart_rule.h).
    const bool slot_lookup = fsdp && FsdpLooksUpInSlots(cfg.model, rules, int(W), tokens);
    if (fsdp) {
      // fsdp's whole units on every rank: two gathered blocks (bf16) with their fp32 gradient
      // buffers, and the root units (the embedding; the final norm with an untied head)
      // gathered with theirs for the whole step (later micro-steps reduce-scatter in place,
      // into them); with an untied head the two root units' gradients share one buffer.
      const ParamLayout layout = MakeParamLayout(cfg.model);
      const double block = cfg.model.n_layer > 0 ? double(layout.units[1].numel) : 0.0;
      const double emb = double(layout.units.front().numel);
      const double fin = double(layout.units.back().numel);
      const bool shared = layout.head_unit != layout.embedding_unit();
      e.weights += 2 * (2 * block + (slot_lookup ? 0 : emb) + fin);
      e.gradients += 4 * (2 * block + (shared ? std::max(emb, fin) : emb + fin));
    }
    e.moments = sharded ? 8 * P / W : 8 * P;
    e.activations = c.activations;
    e.workspace = c.workspace;
    // A tied embedding's gradient summed in two parts (lookup_apart_rule.h): every rank's
    // lookup rows (bf16) and tokens, and the embedding backward's sort scratch for them (keys
    // and positions twice, cub's temp about as much); fsdp's lookup in the slots likewise.
    const double lookup_ranks =
        TakeLookupApart(cfg.model, rules, cfg.parallel.grad_reduce, world, tokens) ? world
        : slot_lookup                                                               ? W
                                                                                    : 0;
    e.workspace += lookup_ranks * double(tokens) * (2.0 * cfg.model.d_model + 4 + 16 + 8);
  } else {
    // fp32 throughout: every mode holds the full weights and one full gradient during a step.
    double probs = 0;
    e.weights = 4 * P;
    e.gradients = 4 * P + (sharded ? 4 * P / W : 0);
    e.moments = sharded ? 8 * P / W : 8 * P;
    e.activations = CpuActivations(cfg.model, cfg.batch.micro_batch, &probs);
  }
  return e;
}

Status CheckTrainingMemory(const RunConfig& cfg, Backend backend, int world,
                           double available_bytes, const std::string& where) {
  const MemoryEstimate e = EstimateTrainingMemory(cfg, backend, world);
  if (available_bytes < 0 || e.total() <= available_bytes) return Status::Ok();
  double probs = 0;
  if (backend != Backend::kCuda) CpuActivations(cfg.model, cfg.batch.micro_batch, &probs);
  else probs = CountCudaBuffers(cfg, world).quadratic;
  return Status::Invalid(
      "the model does not fit: training it on the " + std::string(BackendName(backend)) +
      " backend needs at least " + Bytes(e.total()) + " per rank (weights " + Bytes(e.weights) +
      ", gradients " + Bytes(e.gradients) + ", AdamW moments " + Bytes(e.moments) +
      ", activations " + Bytes(e.activations) +
      (e.workspace > 0 ? ", workspace " + Bytes(e.workspace) : std::string()) + "), more than " + where + " (" +
      Bytes(available_bytes) + "); reduce " + Culprits(cfg, backend, e, probs));
}

double HostAvailableMemoryBytes() {
  const double avail = ReadMeminfoField(ReadText("/proc/meminfo"), "MemAvailable");
  const double room = CgroupRoom();
  if (avail < 0) return room;
  if (room < 0) return avail;
  return std::min(avail, room);
}

}  // namespace forge
