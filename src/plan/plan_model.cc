#include "plan/plan_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "common/named_values.h"
#include "worker/model/param_layout.h"
#include "worker/model/shard_layout.h"
#include "worker/parallel/mode_rules.h"
#include "worker/train/fp8_gather_rule.h"
#include "worker/train/lookup_apart_rule.h"
#include "worker/train/memory_estimate.h"

namespace forge::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

constexpr std::array<NamedValue<Mode>, 5> kModeNames{{{"ddp", Mode::kDdp},
                                                      {"zero1", Mode::kZero1},
                                                      {"zero2", Mode::kZero2},
                                                      {"fsdp", Mode::kFsdp},
                                                      {"hsdp", Mode::kHsdp}}};
constexpr std::array<NamedValue<Link>, 3> kLinkNames{
    {{"nvlink", Link::kNvlink}, {"ib400", Link::kIb400}, {"eth100", Link::kEth100}}};
// The backward's share of a micro-step's compute (twice the forward's FLOPs).
constexpr double kBackwardShare = 2.0 / 3.0;
// Attention's forward share of its time: llama3-1b's 22.3 of 95.2 ms (docs/performance.md).
constexpr double kAttentionForwardShare = 0.234;
// Selective recompute redoes the norms' and SwiGLU's elementwise forward: llama3-1b's +2.0 ms
// (292.41 against 290.39 ms, docs/performance.md) is 0.3 of its 6.9 ms of elementwise work.
constexpr double kSelectiveElementwiseShare = 0.3;

// One ring (or tree) of ranks: what its collectives cost.
struct Ring {
  int ranks = 1;
  double allreduce_gb_s = 1, reduce_scatter_gb_s = 1;
  double base_us = 0, hop_us = 0;

  double AllReduceMs(double bytes) const {
    if (ranks <= 1) return 0;
    const double n = ranks;
    const double hops = std::min(2.0 * (n - 1), 2.0 * std::ceil(std::log2(n)));  // ring | tree
    return (base_us + hops * hop_us) * 1e-3 + 2.0 * (n - 1) / n * bytes / allreduce_gb_s * 1e-6;
  }
  // Reduce-scatter or all-gather of a buffer of `bytes` (all ranks' parts).
  double GatherMs(double bytes) const {
    if (ranks <= 1) return 0;
    const double n = ranks;
    return (base_us + (n - 1) * hop_us) * 1e-3 + (n - 1) / n * bytes / reduce_scatter_gb_s * 1e-6;
  }
};

const LinkCalibration& NetLink(const PlanCalibration& c, Link l) {
  switch (l) {
    case Link::kNvlink: return c.nvlink;
    case Link::kIb400: return c.ib400;
    case Link::kEth100: return c.eth100;
  }
  return c.ib400;
}

// A ring of `ranks` GPUs, `per_node` of them on each node it spans, while `concurrent` rings of
// the same shape share each node's network (hsdp's replica rings: one per local rank).
Ring MakeRing(const PlanCalibration& c, const Topology& t, int ranks, int per_node,
              int concurrent) {
  Ring r;
  r.ranks = ranks;
  const LinkCalibration& nv = c.nvlink;
  const int nodes = (ranks + per_node - 1) / std::max(1, per_node);
  if (nodes <= 1 || t.link == Link::kNvlink) {
    r.allreduce_gb_s = nv.allreduce_gb_s;
    r.reduce_scatter_gb_s = nv.reduce_scatter_gb_s;
    r.base_us = nv.base_latency_us;
    r.hop_us = nv.hop_latency_us;
    return r;
  }
  const LinkCalibration& net = NetLink(c, t.link);
  // NCCL runs one ring per NIC: a node's rings together move all its NICs' bandwidth.
  const double nics = net.per_node ? 1.0 : double(std::min(t.gpus_per_node, t.gpus));
  const double share = 1.0 / std::max(1, concurrent);
  r.allreduce_gb_s = std::min(nv.allreduce_gb_s, net.allreduce_gb_s * nics * share);
  r.reduce_scatter_gb_s = std::min(nv.reduce_scatter_gb_s, net.reduce_scatter_gb_s * nics * share);
  r.base_us = std::max(nv.base_latency_us, net.base_latency_us);
  r.hop_us = net.hop_latency_us;
  return r;
}

// Collective time that runs beside `window_ms` of compute: of the part that fits, the exposed
// fraction; what does not fit, all of it.
double Exposed(double overlapped_ms, double weighted_ms, double window_ms) {
  return std::max(weighted_ms, overlapped_ms - window_ms);
}

struct Model {
  std::vector<int64_t> units;  // numel: [0] embedding, [1..L] blocks, [L+1] final norm
  int64_t params = 0, block = 0;
  double matmul_blocks = 0, matmul_head = 0;
  std::array<BlockLinear, kBlockLinears> linears{};  // where a block's linear weights lie
};

Model Describe(const ModelConfig& m) {
  Model d;
  const ParamLayout layout = MakeParamLayout(m);
  for (const UnitLayout& u : layout.units) d.units.push_back(u.numel);
  d.params = layout.total;
  d.block = m.n_layer > 0 ? layout.units[1].numel : 0;
  d.linears = layout.linears;
  d.matmul_head = double(m.padded_vocab()) * m.d_model;
  d.matmul_blocks = double(MatmulParamCount(m)) - d.matmul_head;
  return d;
}

struct Compute {
  double micro_ms = 0;  // one micro-step's forward and backward: the sum of
  double gemm_ms = 0, attention_ms = 0, elementwise_ms = 0, recompute_ms = 0;
  double optimizer_ms = 0;
};

Compute StepCompute(const RunConfig& cfg, const Model& md, double local_params,
                    const PlanCalibration& c) {
  const ModelConfig& m = cfg.model;
  const double tokens = double(cfg.batch.micro_batch) * m.seq_len;
  const double T = m.seq_len, d = m.d_model, L = m.n_layer;
  const bool fp8 = cfg.precision.compute == Precision::kFp8;
  const double gemm = c.gemm_tflops_max * d / (d + c.gemm_half_width) * 1e12;  // FLOP/s
  const double block_rate = gemm * (fp8 ? c.fp8_gemm_speedup : 1.0);
  const double head_rate = gemm * (fp8 && cfg.precision.fp8.lm_head ? c.fp8_gemm_speedup : 1.0);
  const double gemm_ms =
      (6 * md.matmul_blocks * tokens / block_rate + 6 * md.matmul_head * tokens / head_rate) * 1e3;
  const double attn_rate = c.attention_tflops_max * T / (T + c.attention_half_seq) * 1e12;
  const double attn_ms = 12 * L * double(m.n_head) * m.head_dim() * T * tokens / attn_rate * 1e3;
  const double hbm = c.hbm_gb_s * 1e9;
  const double elem_bytes = c.elementwise_bytes + (fp8 ? c.fp8_elementwise_bytes : 0.0);
  const double elem_ms =
      (elem_bytes * L * d * tokens + c.logits_bytes * double(m.padded_vocab()) * tokens) / hbm *
      1e3;
  double recompute_ms = 0;
  if (cfg.train.activation_recompute == Recompute::kFull)
    recompute_ms = 2 * md.matmul_blocks * tokens / block_rate * 1e3 +
                   kAttentionForwardShare * attn_ms + elem_ms / 3;
  else if (cfg.train.activation_recompute == Recompute::kSelective)
    recompute_ms = kSelectiveElementwiseShare * elem_ms;
  Compute out;
  out.micro_ms = gemm_ms + attn_ms + elem_ms + recompute_ms;
  out.gemm_ms = gemm_ms;
  out.attention_ms = attn_ms;
  out.elementwise_ms = elem_ms;
  out.recompute_ms = recompute_ms;
  out.optimizer_ms = c.optimizer_bytes_per_param * local_params / hbm * 1e3;
  return out;
}

double Bytes(int64_t numel, int world, double elem) {
  return double(PaddedSize(numel, std::max(1, world))) * elem;
}

}  // namespace

const char* ModeName(Mode m) { return NameOf(kModeNames, m); }
const char* LinkName(Link l) { return NameOf(kLinkNames, l); }
StatusOr<Link> LinkFromName(const std::string& name) { return ValueOf(kLinkNames, name, "--link"); }

const std::vector<Mode>& AllModes() {
  static const std::vector<Mode> modes = {Mode::kDdp, Mode::kZero1, Mode::kZero2, Mode::kFsdp,
                                          Mode::kHsdp};
  return modes;
}

std::vector<int> ScalingPoints(int gpus) {
  std::vector<int> n;
  for (int p = 1; p < gpus; p *= 2) n.push_back(p);
  n.push_back(gpus);
  return n;
}

ModePrediction PredictMode(const RunConfig& cfg_in, Mode mode, const Topology& topo,
                           const PlanCalibration& c) {
  ModePrediction p;
  p.mode = mode;
  p.gpus = topo.gpus;
  const int N = std::max(1, topo.gpus);
  const int G = std::max(1, std::min(topo.gpus_per_node, N));
  RunConfig cfg = cfg_in;
  const Model md = Describe(cfg.model);

  // The batch: micro_batch per GPU, as many micro-steps as the global batch needs.
  const int64_t micro = std::max(1, cfg.batch.micro_batch);
  const int64_t global = std::max<int64_t>(cfg.batch.global_batch, micro);
  int64_t accum = std::max<int64_t>(1, (global + N * micro - 1) / (N * micro));
  p.accum_steps = int(accum);
  p.global_batch = accum * N * micro;
  if (p.global_batch != global)
    p.note = "global batch " + std::to_string(p.global_batch) + " (not " +
             std::to_string(global) + "): " + std::to_string(accum) + " x " +
             std::to_string(micro) + " sequences per GPU";

  // Who shards over how many.
  int shard = 1;  // ranks that share one copy of the state
  if (mode == Mode::kZero1 || mode == Mode::kZero2 || mode == Mode::kFsdp) shard = N;
  if (mode == Mode::kHsdp) {
    shard = topo.shard_group > 0 ? std::min(topo.shard_group, N) : G;
    if (N % shard != 0) {
      p.note = "hsdp needs the GPUs (" + std::to_string(N) + ") to be a multiple of the shard "
               "group (" + std::to_string(shard) + ")";
      p.fits = false;
      return p;
    }
    p.shard_group = shard;
  }
  // hsdp with groups of one GPU is still hsdp: nothing to gather or reduce-scatter inside a
  // group, but every unit's fp32 gradient is all-reduced across the replicas (the whole world).
  const bool fsdp_like = (mode == Mode::kFsdp && shard > 1) || mode == Mode::kHsdp;
  cfg.parallel.mode = mode == Mode::kDdp     ? ParallelMode::kDdp
                      : mode == Mode::kZero1 ? ParallelMode::kZero1
                      : mode == Mode::kZero2 ? ParallelMode::kZero2
                      : mode == Mode::kFsdp  ? ParallelMode::kFsdp
                                             : ParallelMode::kHsdp;
  cfg.parallel.shard_group_size = mode == Mode::kHsdp ? shard : 0;
  const bool bf16_grads = cfg.parallel.grad_reduce == GradReduce::kBf16 && !fsdp_like;
  const double grad_elem = bf16_grads ? 2.0 : 4.0;

  // Compute.
  const double local_params = double(md.params) / shard;
  const Compute comp = StepCompute(cfg, md, local_params, c);
  p.compute_ms = comp.micro_ms * accum + comp.optimizer_ms;
  p.gemm_ms = comp.gemm_ms * accum;
  p.attention_ms = comp.attention_ms * accum;
  p.elementwise_ms = comp.elementwise_ms * accum;
  p.recompute_ms = comp.recompute_ms * accum;
  p.optimizer_ms = comp.optimizer_ms;

  // Collectives. Whole-world ring: every GPU; shard-group ring; hsdp's replica rings.
  const Ring world = MakeRing(c, topo, N, G, 1);
  const Ring group = MakeRing(c, topo, shard, G, 1);
  const int replicas = N / std::max(1, shard);
  // Replica r's ranks sit on different nodes when a group fills a node, so each node carries
  // min(shard, G) such rings at once.
  const Ring across = MakeRing(c, topo, replicas, std::max(1, G / shard), std::min(shard, G));
  const double fwd_window = (1 - kBackwardShare) * comp.micro_ms;
  const double bwd_window = kBackwardShare * comp.micro_ms;
  const double kg = c.gradient_exposed_fraction, ks = c.sharded_exposed_fraction;
  const size_t U = md.units.size();
  double comm = 0, exposed = 0, gather = 0;
  if (N > 1 && (mode == Mode::kDdp || mode == Mode::kZero1 || mode == Mode::kZero2)) {
    const bool zero = mode != Mode::kDdp;
    // Backward: unit U-1 first, the embedding (unit 0) last: its collective is the tail.
    double tail = 0, ov = 0;
    for (size_t u = 0; u < U; ++u) {
      const double b = Bytes(md.units[u], N, grad_elem);
      const double t = zero ? world.GatherMs(b) : world.AllReduceMs(b);
      (u == 0 ? tail : ov) += t;
    }
    comm += tail + ov;
    exposed += tail + Exposed(ov, kg * ov, bwd_window);
    if (zero) {  // bf16 weights gathered beside the next forward; the embedding's first
      double first = 0, rest = 0;
      for (size_t u = 0; u < U; ++u) (u == 0 ? first : rest) += world.GatherMs(Bytes(md.units[u], N, 2));
      comm += first + rest;
      gather += first + rest;
      exposed += first + Exposed(rest, ks * rest, fwd_window);
    }
  } else if (fsdp_like) {
    const int L = cfg.model.n_layer;
    // A block's weights in bf16; in FP8 where the run gathers E4M3 (fp8_gather_rule.h; its
    // first step, which gathers bf16, left out) the linear weights a byte an element and, in a
    // second all-gather, each rank's share of the norm weights in bf16.
    const double norms = double(MostNormElementsPerSlot(md.block, md.linears, shard));
    const double ag_block = ChooseFp8Gather(cfg, N).e4m3
                                ? group.GatherMs(Bytes(md.block, shard, 1)) +
                                      group.GatherMs(double(shard) * norms * 2)
                                : group.GatherMs(Bytes(md.block, shard, 2));
    const double rs_block = group.GatherMs(Bytes(md.block, shard, 4));
    // The embedding at either end of a pass: its table gathered once a step and its
    // gradient reduce-scattered every micro-step, or, looked up in the slots
    // (lookup_apart_rule.h), every rank's tokens and rows moved at both ends of every pass.
    const int64_t tokens = int64_t{micro} * cfg.model.seq_len;
    const bool slot_lookup =
        FsdpLooksUpInSlots(cfg.model, ModeRulesFor(cfg.parallel, N), shard, tokens);
    const double rows =
        group.GatherMs(double(shard) * double(tokens) * (2.0 * cfg.model.d_model + 4));
    const double ag_emb = slot_lookup ? 0 : group.GatherMs(Bytes(md.units[0], shard, 2));
    const double emb_fwd = slot_lookup ? rows : 0;
    const double rs_emb = slot_lookup ? rows : group.GatherMs(Bytes(md.units[0], shard, 4));
    const double ag_fin = group.GatherMs(Bytes(md.units[U - 1], shard, 2));
    const double rs_norm = group.GatherMs(Bytes(md.units[U - 1], shard, 4));
    // Per micro-step the first block's gather, the embedding's lookup and its gradient's sum
    // (the last of the backward) cannot overlap; the table is gathered once a step, and the
    // final unit, once a step too, beside the first micro-step's blocks.
    const double first = L > 0 ? ag_block : 0;
    const double fwd_ov = (L > 0 ? L - 1 : 0) * ag_block;
    const double bwd_ov = L * (ag_block + rs_block) + rs_norm;
    double tail = ag_emb + accum * (first + emb_fwd + rs_emb);
    comm += ag_emb + ag_fin + accum * (first + fwd_ov + bwd_ov + emb_fwd + rs_emb);
    gather += ag_emb + ag_fin + accum * 2 * L * ag_block;
    double bwd_last_ov = bwd_ov, bwd_last_w = ks * bwd_ov;
    if (mode == Mode::kHsdp && replicas > 1) {
      // The gradient shards' all-reduce across replicas, last micro-step, beside the backward;
      // the embedding's last.
      double x_tail = 0, x_ov = 0;
      for (size_t u = 0; u < U; ++u) {
        const double t = across.AllReduceMs(Bytes(md.units[u], shard, 4) / shard);
        (u == 0 ? x_tail : x_ov) += t;
      }
      comm += x_tail + x_ov;
      tail += x_tail;
      bwd_last_ov += x_ov;
      bwd_last_w += kg * x_ov;
    }
    exposed += tail + Exposed(fwd_ov + ag_fin, ks * (fwd_ov + ag_fin), fwd_window) +
               (accum - 1) * Exposed(fwd_ov, ks * fwd_ov, fwd_window) +
               (accum - 1) * Exposed(bwd_ov, ks * bwd_ov, bwd_window) +
               Exposed(bwd_last_ov, bwd_last_w, bwd_window);
  }
  p.comm_ms = comm;
  p.gather_ms = gather;
  p.exposed_ms = exposed;
  p.step_ms = p.compute_ms + exposed;
  const double tokens = double(accum) * micro * cfg.model.seq_len;
  p.tokens_per_s_per_gpu = tokens / (p.step_ms * 1e-3);
  p.tokens_per_s = p.tokens_per_s_per_gpu * N;
  p.mfu = p.tokens_per_s_per_gpu * TrainFlopsPerToken(cfg.model) / (c.peak_bf16_tflops * 1e12);

  // Memory: the estimate forge train checks at start-up (fsdp's E4M3 gather buffers where it
  // runs, as the rate above assumed; its gathered units; ddp's bf16 gradient twin).
  const MemoryEstimate mem = EstimateTrainingMemory(cfg, Backend::kCuda, N);
  p.weights_gib = mem.weights / kGiB;
  p.gradients_gib = mem.gradients / kGiB;
  p.moments_gib = mem.moments / kGiB;
  p.activations_gib = mem.activations / kGiB;
  p.workspace_gib = mem.workspace / kGiB;
  p.overhead_gib = c.overhead_gib;
  p.peak_gib = mem.total() / kGiB + p.overhead_gib;
  p.fits = p.peak_gib <= c.capacity_gib;
  return p;
}

Plan MakePlan(const RunConfig& cfg, const Topology& topo, const PlanCalibration& cal) {
  Plan plan;
  plan.topology = topo;
  for (Mode m : AllModes()) plan.modes.push_back(PredictMode(cfg, m, topo, cal));
  int best = -1, smallest = -1;
  for (int i = 0; i < int(plan.modes.size()); ++i) {
    const ModePrediction& p = plan.modes[i];
    if (p.step_ms <= 0) continue;  // not applicable
    if (smallest < 0 || p.peak_gib < plan.modes[smallest].peak_gib) smallest = i;
    if (!p.fits) continue;
    // The fastest; within 0.5% of it, the one that needs less memory.
    if (best < 0) { best = i; continue; }
    const ModePrediction& b = plan.modes[best];
    if (p.tokens_per_s > b.tokens_per_s * 1.005 ||
        (p.tokens_per_s > b.tokens_per_s * 0.995 && p.peak_gib < b.peak_gib))
      best = i;
  }
  char buf[512];
  if (best < 0) {
    const ModePrediction& s = plan.modes[smallest];
    std::snprintf(buf, sizeof buf,
                  "no mode fits in %.1f GiB per GPU: the smallest, %s, needs %.1f GiB; use more "
                  "GPUs, a smaller batch.micro_batch or train.activation_recompute",
                  cal.capacity_gib, ModeName(s.mode), s.peak_gib);
    plan.reason = buf;
    return plan;
  }
  plan.recommended = best;
  const ModePrediction& b = plan.modes[best];
  std::string others;
  for (const ModePrediction& p : plan.modes) {
    if (&p == &b || p.step_ms <= 0) continue;
    if (!p.fits)
      std::snprintf(buf, sizeof buf, "%s%s does not fit (%.1f GiB)", others.empty() ? "" : ", ",
                    ModeName(p.mode), p.peak_gib);
    else
      std::snprintf(buf, sizeof buf, "%s%s %.1f%% slower", others.empty() ? "" : ", ",
                    ModeName(p.mode), 100.0 * (1.0 - p.tokens_per_s / b.tokens_per_s));
    others += buf;
  }
  std::snprintf(buf, sizeof buf,
                "%s: fits (%.1f of %.1f GiB per GPU) and is the fastest that fits (%.0f tokens/s "
                "per GPU, %.1f ms exposed communication)",
                ModeName(b.mode), b.peak_gib, cal.capacity_gib, b.tokens_per_s_per_gpu,
                b.exposed_ms);
  plan.reason = std::string(buf) + (others.empty() ? "" : "; " + others);
  return plan;
}

namespace {

// The step the fits below reproduce: cfg's on one GPU, one micro-step a step.
ModePrediction PredictOneMicroStepOnOneGpu(const RunConfig& step_cfg,
                                           const PlanCalibration& cal) {
  RunConfig cfg = step_cfg;
  cfg.batch.global_batch = cfg.batch.micro_batch;
  Topology one;
  one.gpus = 1;
  one.gpus_per_node = 1;
  return PredictMode(cfg, Mode::kDdp, one, cal);
}

}  // namespace

Status FitComputeToStep(const RunConfig& cfg_in, double step_ms, double gemm_share,
                        PlanCalibration* cal) {
  if (cfg_in.precision.compute != Precision::kBf16 ||
      cfg_in.train.activation_recompute != Recompute::kNone)
    return Status::Invalid("fitting the compute rates to a step: it must be a BF16 step without "
                           "recompute (the rates are BF16's; recompute adds work the fit would "
                           "count as GEMMs)");
  if (!(step_ms > 0) || !std::isfinite(step_ms))
    return Status::Invalid("fitting the compute rates to a step: its time must be > 0 ms");
  if (!(gemm_share > 0 && gemm_share < 1))
    return Status::Invalid("fitting the compute rates to a step: the GEMMs' share of the GEMM "
                           "and attention time must be in (0, 1)");
  const ModePrediction p = PredictOneMicroStepOnOneGpu(cfg_in, *cal);
  const double rest = p.elementwise_ms + p.optimizer_ms;
  const double left = step_ms - rest;
  if (!(left > 0) || !(p.gemm_ms > 0) || !(p.attention_ms > 0)) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "fitting the compute rates to a step: %.2f ms leaves nothing for GEMMs and "
                  "attention beside the model's %.2f ms of elementwise work and optimizer",
                  step_ms, rest);
    return Status::Invalid(buf);
  }
  // The rates scale inversely with the time the fit gives each part.
  cal->gemm_tflops_max *= p.gemm_ms / (left * gemm_share);
  cal->attention_tflops_max *= p.attention_ms / (left * (1 - gemm_share));
  return Status::Ok();
}

Status FitFp8SpeedupToStep(const RunConfig& cfg_in, double step_ms, PlanCalibration* cal) {
  if (cfg_in.precision.compute != Precision::kFp8 ||
      cfg_in.train.activation_recompute != Recompute::kNone)
    return Status::Invalid("fitting FP8's GEMM speedup to a step: it must be an FP8 step without "
                           "recompute");
  if (!(step_ms > 0) || !std::isfinite(step_ms))
    return Status::Invalid("fitting FP8's GEMM speedup to a step: its time must be > 0 ms");
  PlanCalibration c = *cal;
  auto step_at = [&](double speedup) {
    c.fp8_gemm_speedup = speedup;
    return PredictOneMicroStepOnOneGpu(cfg_in, c).step_ms;
  };
  // The predicted step falls as the speedup grows: bisect on it.
  double lo = 0.5, hi = 4.0;
  if (step_ms > step_at(lo) || step_ms < step_at(hi)) {
    char buf[240];
    std::snprintf(buf, sizeof buf,
                  "fitting FP8's GEMM speedup to a step: %.2f ms is outside what speedups of 0.5 "
                  "to 4 over BF16's GEMMs give (%.2f to %.2f ms)",
                  step_ms, step_at(hi), step_at(lo));
    return Status::Invalid(buf);
  }
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (step_at(mid) > step_ms ? lo : hi) = mid;
  }
  cal->fp8_gemm_speedup = 0.5 * (lo + hi);
  return Status::Ok();
}

}  // namespace forge::plan
