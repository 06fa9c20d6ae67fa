#include "worker/train/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

bool Sharded(ParallelMode m) { return m != ParallelMode::kDdp; }

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

// Activations the CUDA model allocates (cuda_model.cu), bf16: the layer inputs, the blocks'
// saved tensors (train.activation_recompute: all of every block's; selective: every block's
// GEMM and attention outputs, two sets of the recomputed norm and SwiGLU outputs; full: one
// block's), the final norm's output.
double CudaActivations(const RunConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const double N = double(cfg.batch.micro_batch) * m.seq_len, d = m.d_model, ffn = m.ffn;
  const double L = m.n_layer;
  const double qkv = (double(m.n_head) + 2.0 * m.n_kv_head) * m.head_dim();
  double kept = qkv + double(m.n_head) * m.head_dim() + d + 2 * ffn;  // qkv att x_mid gu
  if (m.qk_norm) kept += (double(m.n_head) + m.n_kv_head) * m.head_dim();  // Q, K before it
  const double recomputable = 2 * d + ffn;                                    // h1 h2 sw
  double blocks = L * (kept + recomputable);
  if (cfg.train.activation_recompute == Recompute::kSelective)
    blocks = L * kept + std::min(L, 2.0) * recomputable;
  if (cfg.train.activation_recompute == Recompute::kFull)
    blocks = std::min(L, 1.0) * (kept + recomputable);
  return 2 * N * ((L + 1) * d + blocks + d);
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
  if (e.activations > e.weights + e.gradients + e.moments) {
    if (probs > e.activations / 2)
      return Key("model.seq_len", m.seq_len) + " or " +
             Key("batch.micro_batch", cfg.batch.micro_batch) +
             " (the attention probabilities: micro_batch x n_head x seq_len^2)";
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
  if (!Sharded(cfg.parallel.mode) && cfg.train.workers > 1)
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
  // hsdp shards over its shard group only (parallel.shard_group_size ranks).
  const bool hsdp = cfg.parallel.mode == ParallelMode::kHsdp;
  const int shard_world =
      hsdp && cfg.parallel.shard_group_size > 0 ? std::min(world, cfg.parallel.shard_group_size)
                                                : world;
  const double W = std::max(1, shard_world);
  const double P = CountParams(cfg.model).total();
  const bool sharded = Sharded(cfg.parallel.mode) && shard_world > 1;
  MemoryEstimate e;
  if (backend == Backend::kCuda) {
    const bool fsdp = (cfg.parallel.mode == ParallelMode::kFsdp || hsdp) && shard_world > 1;
    // fp32 master and moments (sharded by zero1/zero2/fsdp/hsdp), the bf16 compute copy
    // (sharded by fsdp/hsdp), fp32 gradients (full unless fsdp) and the sharded modes' gradient slot.
    e.weights = (sharded ? 4 * P / W : 4 * P) + (fsdp ? 2 * P / W : 2 * P);
    e.gradients = (fsdp ? 0 : 4 * P) + (sharded ? 4 * P / W : 0);
    e.moments = sharded ? 8 * P / W : 8 * P;
    e.activations = CudaActivations(cfg);
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
  return Status::Invalid(
      "the model does not fit: training it on the " + std::string(BackendName(backend)) +
      " backend needs at least " + Bytes(e.total()) + " per rank (weights " + Bytes(e.weights) +
      ", gradients " + Bytes(e.gradients) + ", AdamW moments " + Bytes(e.moments) +
      ", activations " + Bytes(e.activations) + "), more than " + where + " (" +
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
