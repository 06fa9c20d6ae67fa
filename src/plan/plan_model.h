// `forge plan`'s cost model: step time, tokens/s, MFU and peak memory per GPU of a config's
// training step for each data-parallel mode at N GPUs, before any GPU is paid for.
//
// Compute (one GPU, one micro-step of micro_batch x seq_len tokens): the GEMMs' FLOPs
// (6 N_matmul a token, worker/model/param_layout.h) at the calibrated GEMM rate for the
// model's width, attention's (12 L (H hd) T a token) at the rate for its sequence length, the
// elementwise and cross-entropy bytes and AdamW's at the achieved HBM bandwidth
// (plan/plan_calibration.h). Recompute adds the blocks' forward again (full) or the norms'
// and SwiGLU's elementwise forward (selective).
//
// Collectives (NCCL rings): an all-reduce of S bytes over N ranks costs
// base + 2(N-1) hop + 2(N-1)/N S / busbw, a reduce-scatter or all-gather base + (N-1) hop +
// (N-1)/N S / busbw (S the whole buffer). Inside a node the link is NVLink; a ring that spans
// nodes runs at the smaller of NVLink's bandwidth and the node's network bandwidth (NCCL runs
// one ring per NIC, so a node with a NIC per GPU moves G NICs' worth), with the network's step
// latency; all-reduces across many ranks take NCCL's tree where it is faster (2 log2 N steps).
// Per mode, per unit (the embedding, each block, the final norm: the grain of the collectives):
//   ddp    all-reduce of each unit's gradient (bf16 with parallel.grad_reduce bf16), last
//          micro-step, beside the backward
//   zero1, zero2   reduce-scatter of each gradient beside the backward, all-gather of the bf16
//          weights beside the next forward (on the GPU zero2 runs as zero1)
//   fsdp   every micro-step: all-gather of each block's weights before its forward and
//          again before its backward, reduce-scatter of its fp32 gradient; the root units
//          (embedding, final norm) gathered once a step. The weights travel in bf16, but in
//          FP8 where the run gathers E4M3 (ChooseFp8Gather, worker/train/fp8_gather_rule.h):
//          then the four linear weights move a byte an element and the norm weights, each
//          rank's share, in a second, bf16 all-gather (the first step, which gathers bf16,
//          is left out)
//   hsdp   fsdp inside shard groups of S ranks (a node by default), and an all-reduce of each
//          gradient shard (fp32) across the N/S replicas, beside the backward
// Overlap: the collectives that cannot overlap (the last gradient's, the first gathers) count
// whole; of the rest, the calibrated exposed fraction counts, or all that does not fit in the
// compute it runs beside (backward: 2/3 of the step's compute, forward: 1/3), whichever is
// larger.
//
// Memory: EstimateTrainingMemory (worker/train/memory_estimate.h) for the mode and world (hsdp
// shards over its group: the parameter state, activations, the backward's buffers, logits
// chunks and attention/GEMM scratch, and fsdp's E4M3 gather buffers where the rule above says
// so), plus what that lower bound leaves out: ddp's bf16 gradient twin with
// parallel.grad_reduce bf16, fsdp's gathered block buffers and root units, and the calibrated
// overhead.
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "plan/plan_calibration.h"

namespace forge::plan {

enum class Mode { kDdp, kZero1, kZero2, kFsdp, kHsdp };
enum class Link { kNvlink, kIb400, kEth100 };

const char* ModeName(Mode m);
const char* LinkName(Link l);
StatusOr<Link> LinkFromName(const std::string& name);
// Every mode the plan predicts, in the order it prints them.
const std::vector<Mode>& AllModes();

struct Topology {
  int gpus = 1;            // N
  int gpus_per_node = 8;   // G (a run of N < G GPUs sits on one node)
  Link link = Link::kIb400;  // between nodes
  int shard_group = 0;     // hsdp's shard group size (0: min(G, N))
};

struct ModePrediction {
  Mode mode = Mode::kDdp;
  int gpus = 1;
  int accum_steps = 1;          // micro-steps per optimizer step on each GPU
  int64_t global_batch = 0;     // sequences per optimizer step (all GPUs)
  int shard_group = 0;          // hsdp: ranks per shard group (else 0)
  double compute_ms = 0;        // one GPU's step without collectives, of which:
  double gemm_ms = 0, attention_ms = 0, elementwise_ms = 0, recompute_ms = 0, optimizer_ms = 0;
  double comm_ms = 0;           // the step's collectives alone, back to back, of which
  double gather_ms = 0;         // the parameter all-gathers (zero, fsdp, hsdp)
  double exposed_ms = 0;        // what they add to the step
  double step_ms = 0;
  double tokens_per_s_per_gpu = 0;
  double tokens_per_s = 0;      // all GPUs
  double mfu = 0;               // model FLOPs over the dense BF16 peak
  double peak_gib = 0;          // per GPU: the parts below plus the calibration's overhead
  // Its parts, GiB per GPU (worker/train/memory_estimate.h): weights (fp32 master, bf16 copy or
  // fsdp's gathered units, FP8 copies), gradients, AdamW moments, saved activations, workspace
  // (the backward's activation gradients, logits chunks and attention scratch, GEMM workspaces).
  double weights_gib = 0, gradients_gib = 0, moments_gib = 0, activations_gib = 0;
  double workspace_gib = 0;
  double overhead_gib = 0;      // what the estimate leaves out (the calibration's figure)
  bool fits = false;            // peak_gib <= the calibration's capacity
  std::string note;             // why a mode does not apply, or what changed ("")
};

struct Plan {
  Topology topology;
  std::vector<ModePrediction> modes;  // AllModes(), at topology.gpus
  int recommended = -1;               // index in modes; -1 when none fits
  std::string reason;                 // why that one (or why none)
};

// One mode at topology.gpus. The config's micro_batch and global_batch are kept (the global
// batch grows to N x micro_batch where N GPUs exceed it; the note says so).
ModePrediction PredictMode(const RunConfig& cfg, Mode mode, const Topology& topo,
                           const PlanCalibration& cal);

// Every mode and the recommendation: the fastest of the modes that fit in memory.
Plan MakePlan(const RunConfig& cfg, const Topology& topo, const PlanCalibration& cal);

// N for the scaling table: powers of two from 1 to gpus, and gpus itself.
std::vector<int> ScalingPoints(int gpus);

// Sets cal's GEMM and attention rates (their half-widths kept) so that the model predicts
// `step_ms` for cfg's training step on one GPU in BF16 without recompute, one micro-step a step:
// the time left after the model's elementwise work and optimizer goes to the GEMMs and attention
// in the ratio a profile of that step measured (`gemm_share`: the GEMM phases' share of the
// GEMM and attention phases). Invalid when cfg is not such a step, the share is not in (0, 1),
// or the step leaves those two no time. forge-calibrate calls it with the step it timed.
Status FitComputeToStep(const RunConfig& cfg, double step_ms, double gemm_share,
                        PlanCalibration* cal);

// Sets cal's fp8_gemm_speedup so that the model predicts `step_ms` for cfg's training step on one
// GPU in FP8 without recompute, one micro-step a step (the BF16 rates already set, as by
// FitComputeToStep on the same model). Invalid when cfg is not such a step or no speedup from
// 0.5 to 4 reproduces it.
Status FitFp8SpeedupToStep(const RunConfig& cfg, double step_ms, PlanCalibration* cal);

}  // namespace forge::plan
