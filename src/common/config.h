// The run configuration: one plain struct per YAML section. LoadRunConfig is strict: an unknown
// key, a wrong type or an out-of-range value is an error naming the key path and the line
// ("configs/x.yaml:12: optimizer.beta2: must be in [0, 1), got 1.5").
//
// YAML keys are the field names below; enums are lower-case strings. The `model` section is
// required and holds either `preset: tiny|gpt124m|gpt350m|llama3-1b|llama3-3b|llama3-8b` (then
// any field overrides the preset) or all of n_layer, d_model, n_head, ffn, vocab, seq_len. An
// n_kv_head that is not given follows n_head (plain multi-head attention); a head_dim that is
// not given is d_model / n_head. Every other section and key is optional.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace forge {

enum class InitScheme { kGpt2, kTorch };

enum class RopeScalingType { kNone, kLlama3 };

// `model.rope_scaling`: RoPE frequency scaling. llama3 is Llama 3.1's (transformers'
// rope_type "llama3"): with wavelength 2 pi / f of a pair's frequency f, pairs whose wavelength
// is above original_max_position_embeddings / low_freq_factor take f / factor, those below
// original_max_position_embeddings / high_freq_factor keep f, and those between are blended
// linearly in original_max_position_embeddings / wavelength. The numbers belong to type llama3
// (the defaults are Llama 3.1 8B's); given with type none they are an error.
struct RopeScalingConfig {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string preset;   // a preset's name (ApplyModelPreset) or "" (explicit dims)
  int n_layer = 4;
  int d_model = 128;
  int n_head = 4;
  int n_kv_head = 4;    // GQA: n_head % n_kv_head == 0
  // `model.head_dim`: the width of one attention head; 0 (or not given) means d_model /
  // n_head. Q/K/V project d_model to (n_head + 2 n_kv_head) * head_dim and the output
  // projection n_head * head_dim back to d_model, so the attention width may differ from
  // d_model. head_dim() is the value in effect.
  int explicit_head_dim = 0;
  int ffn = 384;        // SwiGLU hidden width
  int vocab = 50257;    // real vocabulary (GPT-2 BPE)
  int seq_len = 128;
  float rope_theta = 10000.0f;
  RopeScalingConfig rope_scaling;
  // true: the LM head is the embedding matrix; false: a separate lm_head [padded_vocab,
  // d_model] in the final unit, beside the final norm (worker/model/param_layout.h).
  bool tie_embeddings = true;
  float norm_eps = 1e-5f;
  bool qk_norm = false;
  float init_std = 0.02f;
  // How fresh weights are drawn (worker/model/init.h): gpt2 (matrices ~ N(0, init_std), the
  // residual output projections scaled by 1/sqrt(2 n_layer)) or torch (PyTorch's module
  // defaults, as ../shared/anchors/torch_baseline.py builds the model: embedding ~ N(0, 1),
  // linear weights ~ U(+-1/sqrt(fan_in)); init_std unused).
  InitScheme init = InitScheme::kGpt2;
  // A Hugging Face Llama directory (config.json + safetensors) whose weights a fresh run starts
  // from instead of drawing them (worker/hf/hf_import.h); "" draws them. Its config.json must
  // describe this model (the run checks every dimension at start and names what differs). A
  // resumed run ignores it.
  std::string init_from;

  int head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : d_model / n_head; }
  // The embedding/LM-head rows, padded to a multiple of 128 for GEMM-friendly shapes.
  int padded_vocab() const { return (vocab + 127) / 128 * 128; }
};

// Fills dims from a preset name; unknown name -> InvalidArgument.
// Sets preset, n_layer, d_model, n_head, n_kv_head, ffn, vocab and seq_len, and head_dim back
// to d_model / n_head; the llama3 presets also set rope_theta, rope_scaling and
// tie_embeddings (Llama 3.2 1B and 3B, Llama 3.1 8B). Leaves the rest.
Status ApplyModelPreset(const std::string& name, ModelConfig* m);

// One dataset of a mixture: each global batch draws from the sources in proportion to their
// weights (worker/data/mixture.h).
struct DataSourceConfig {
  std::string dir;      // a prepared dataset (manifest.json + shards)
  double weight = 1.0;  // > 0, relative to the other sources' weights
};

struct DataConfig {
  // One source (the shorthand): holds manifest.json + shards written by `forge data prepare`;
  // "" with no `sources` means $FORGE_DATA_DIR/dataset. Not given together with `sources`.
  std::string dataset_dir;
  std::vector<DataSourceConfig> sources;  // a mixture; empty: dataset_dir alone
  int epoch_shuffle = 1;     // 1: shuffle each source's sequence order per epoch from the seed
  // The tokenizer the model is trained for: a name (gpt2, cl100k_base, o200k_base, llama3)
  // or a path to a tokenizer file. When set, a dataset (every source) made with another
  // tokenizer (another name or other files) is an error at start-up; "" checks only the
  // vocabulary size.
  std::string tokenizer;
};

struct OptimizerConfig {
  float lr = 3e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;  // decoupled; not applied to norms
  float grad_clip = 1.0f;     // global-norm clip; 0 disables
};

enum class DecayKind { kCosine, kLinear, kConstant };

struct ScheduleConfig {
  int64_t total_steps = 1000;
  int64_t warmup_steps = 50;
  DecayKind decay = DecayKind::kCosine;
  float min_lr_ratio = 0.1f;  // min lr = lr * ratio
};

struct BatchConfig {
  int micro_batch = 8;        // sequences per micro-step per rank
  int64_t global_batch = 8;   // sequences per optimizer step over all ranks
  // accumulation = global_batch / (micro_batch * world_size), checked at run start.
};

enum class Precision { kFp32, kBf16, kFp8 };
enum class Backend { kAuto, kCpu, kCuda };

// `train.activation_recompute`: what the backward pass recomputes rather than keeps (cuda
// backend; the CPU reference keeps everything). none: every block's activations are kept.
// selective: the GEMM and attention outputs are kept, the RMSNorm and SwiGLU outputs (inputs of
// the weight-gradient GEMMs) are recomputed from them, saving (2 d_model + ffn) x 2 bytes a
// token and block. full: only each block's input is kept; the block runs forward again.
// true and false read as full and none.
enum class Recompute { kNone, kSelective, kFull };

// FP8 per-tensor scaling (`precision.fp8`, used when compute is fp8; worker/model/fp8_scaling.h
// implements the recipes): scale = fp8_max / amax / 2^margin, where amax is the max over the
// last `amax_history` steps' amaxes (delayed) or this step's amax of the tensor (current).
enum class Fp8Recipe { kDelayed, kCurrent };

// none: every FP8 GEMM promotes its partial sums to FP32; fprop (Transformer Engine's default):
// the forward GEMMs (and the FP8 LM head's logits GEMM) do not, which also lets the gate/up
// projection run our FP8 GEMM with SwiGLU fused (Fp8Linears::GateUpSwiGluGemm); fprop_dgrad
// (the default): the blocks' input-gradient GEMMs neither (K = a layer's output width), which
// also lets the down projection's input gradient run with SwiGLU's backward fused
// (Fp8Linears::SwiGluBackwardGemm: -1.0 ms a step against fprop at gpt350m B 16; the
// 2000-step gpt124m run ends 0.23% below BF16, worst 0.68%; docs/performance.md). The GEMMs
// whose K is the token count (weight gradients) or the vocabulary (the LM head's dhf) always
// promote.
enum class Fp8FastAccum { kNone, kFprop, kFpropDgrad };

struct Fp8Config {
  Fp8Recipe recipe = Fp8Recipe::kDelayed;
  int amax_history = 16;  // steps in the delayed recipe's window, [1, 1024]
  int margin = 0;         // extra headroom as a power of two, [0, 32]
  bool lm_head = false;   // the LM head GEMM in FP8 too
  // Which FP8 GEMMs use fast accumulation (cuda::GemmArgs::fast_accum; see Fp8FastAccum).
  Fp8FastAccum fast_accum = Fp8FastAccum::kFpropDgrad;
};

struct PrecisionConfig {
  Precision compute = Precision::kBf16;  // cpu backend always computes in fp32
  Fp8Config fp8;
};

// hsdp: fsdp inside each shard group of parallel.shard_group_size consecutive ranks (a node),
// replicated across the groups (worker/parallel/hybrid_groups.h).
enum class ParallelMode { kDdp, kZero1, kZero2, kFsdp, kHsdp };

// Element type of the gradient collectives (CUDA backend, ddp/zero1/zero2): bf16 halves their
// bytes; each rank's fp32 gradient is rounded to bf16 and summed in bf16 (ranks stay bitwise
// equal). fsdp rejects bf16; the CPU backend always sums fp32.
enum class GradReduce { kFp32, kBf16 };

// What moves ddp's gradient all-reduces on the GPU: NCCL's kernels, or the GPUs' copy engines
// (worker/parallel/copy_engine_allreduce.h: no SMs taken from the backward it overlaps; GPUs of
// one host whose ranks can map each other's memory with CUDA IPC, i.e. one container or pod,
// not one pod per GPU; fp32 gradients; the sum is in rank order, the same bits run after run).
// The CPU backend ignores it (MPI).
enum class DdpAllReduce { kNccl, kCopyEngine };

struct ParallelConfig {
  ParallelMode mode = ParallelMode::kDdp;
  GradReduce grad_reduce = GradReduce::kFp32;
  DdpAllReduce ddp_allreduce = DdpAllReduce::kNccl;
  double collective_timeout_s = 600.0;
  // hsdp only (required there, 0 otherwise): ranks per shard group, usually the GPUs of one
  // node. Must divide the world size (checked when the world is known); 1 keeps full state on
  // every rank (ddp-like), the world size is fsdp.
  int shard_group_size = 0;
};

struct CheckpointConfig {
  std::string dir;             // default: <run_dir>/checkpoints
  int64_t every_steps = 0;     // > 0: every N steps and after the last; 0: only on a stop request
  int keep_last = 3;
  int64_t keep_every = 0;      // also keep every Nth step; 0: none
  std::string resume;          // "", "latest", "step_N" or a path
};

struct EvalConfig {
  int64_t every_steps = 100;   // 0 disables periodic eval (final eval still runs)
  int batches = 8;             // micro-batches of validation data per eval
  // Prompts completed greedily at every eval (metrics.jsonl's "samples", the run's events),
  // each with up to sample_tokens new tokens.
  std::vector<std::string> samples;
  int sample_tokens = 32;
};

struct TrainConfig;
int MinWorkers(const TrainConfig& t);  // train.min_workers, 0 resolved to train.workers

struct TrainConfig {
  Backend backend = Backend::kAuto;
  Recompute activation_recompute = Recompute::kNone;
  int log_every = 10;
  std::string run_dir = "runs/default";
  // Under a coordinator (forge-coordinator, `forge train`): how many workers the run is placed
  // on, and how many restarts after a lost or hung worker before it FAILS (`forge train` and
  // the Slurm job script relaunch lost worker processes as often). A direct `mpirun ... forge
  // train` takes its world size from MPI and ignores these keys.
  int workers = 1;
  int max_restarts = 3;
  // Elastic continue (coordinator runs): after a lost worker, when the full `workers` cannot be
  // placed again within elastic_grace_s of the loss, the run resumes its last committed
  // checkpoint on as many workers as are available, down to min_workers (the same global batch
  // with more accumulation steps per rank, the same sample order), and grows back to `workers`
  // at a checkpoint once they are available again. A world w is used only when
  // batch.global_batch is a multiple of batch.micro_batch * w. 0 (the default): the same as
  // `workers`, not elastic (MinWorkers()).
  int min_workers = 0;
  double elastic_grace_s = 30.0;
  // Slurm jobs (deploy/slurm/forge-job.sh): a node whose workers ended node_failure_limit worker
  // steps is left out of the next steps when the rest of the allocation holds min_workers (0:
  // never). node_cooldown_s later (twice that after each further exclusion; 0: never in the job)
  // a step on every node is launched beside the running one; the run grows back onto it at its
  // next checkpoint. A resubmitted job starts on every node.
  int node_failure_limit = 2;
  double node_cooldown_s = 300.0;
  // A placed rank whose step has not advanced for this long (counted from its placement, so it
  // covers start-up, checkpoint loads and saves, evaluation and the slowest step) is hung: the
  // coordinator names it in an event, counts it (forge_hangs_total) and restarts the run from
  // its last committed checkpoint. Catches a stopped process (SIGSTOP) and a rank blocked in a
  // collective or a data read while its heartbeats go on. 0: off.
  double hang_timeout_s = 300.0;
  // Loss spikes (worker/train/spike_guard.h). A step whose global loss or gradient norm is
  // more than spike_sigma standard deviations above the mean of the last spike_window accepted
  // steps is skipped like a non-finite one (weights and moments unchanged) and counted; no
  // step is judged before the window is full. spike_max_in_row such skips in a row roll the
  // run back to its last committed checkpoint and skip the data those steps read. 0: off.
  double spike_sigma = 6.0;
  int spike_window = 100;
  int spike_max_in_row = 3;
  // Stragglers (coordinator/straggler_watch.h): a rank whose busy time per step (step time
  // less its wait in collectives) exceeds straggler_threshold times the median of the other
  // ranks' for straggler_reports step reports in a row is reported (an event, the
  // forge_straggler gauge) until as many reports in a row say it is not. 0: off.
  double straggler_threshold = 1.5;
  int straggler_reports = 5;
};

// `engine:` how the CUDA step runs (the CPU backend ignores it). Every default is the fastest
// setting measured (docs/performance.md); the keys exist to trade speed for memory or
// reproducibility and to isolate a fault. Scheduling choices that give bitwise the same result
// either way are not keys (worker/train/cuda_backend.h has them, for tests and benchmarks).
enum class AttentionBackward { kFlash, kCudnn };

struct EngineConfig {
  // Capture the step in a CUDA graph after one eager warm-up step and replay it.
  bool cuda_graph = true;
  // Bitwise-reproducible attention backward. Ours (flash) is deterministic at no cost; cuDNN's
  // default backward is not, and its deterministic form is ~13% slower.
  bool deterministic_attention = true;
  // flash: our Hopper attention backward where the shape allows (else cuDNN's); cudnn: always
  // cuDNN's.
  AttentionBackward attention_backward = AttentionBackward::kFlash;
  // Token rows per LM-head chunk: bounds the [rows, vocab] bf16 logits buffer.
  int lm_head_chunk = 4096;
  // The backward's weight-gradient GEMMs on a second stream beside the activation-gradient
  // chain (bitwise the same gradients; one more logits buffer and GEMM workspace).
  bool wgrad_stream = true;
  // SMs those GEMMs leave to the kernels beside them; -1: a quarter of the SMs (three eighths
  // in FP8), 0: none.
  int wgrad_sm_margin = -1;
  // Our Hopper GEMMs with RoPE / SwiGLU (and, in FP8, SwiGLU's backward) in their epilogue,
  // where the shapes fit and they are the faster path (worker/model/linear_strategy.cc: the
  // SwiGLU GEMMs up to d_model 2048); bitwise the same results as cuBLASLt plus a separate pass.
  bool fused_epilogues = true;
  // Time cuBLASLt's candidate algorithms once per GEMM shape instead of taking its heuristic's
  // first (no gain measured at gpt350m; the choice then depends on timing).
  bool gemm_autotune = false;
  // Data parallelism over NCCL: the buffers the collectives run on (the model's bf16 weights
  // and gradients, fsdp's gather and reduce-scatter buffers) from NCCL's allocator, registered
  // as symmetric windows: NCCL's symmetric kernels (fewer SMs) or registered buffers, so the
  // compute beside the collectives slows less. Plain memory where NCCL cannot (across nodes);
  // off with parallel.ddp_allreduce copy_engine (its CUDA IPC needs cudaMalloc memory).
  bool nccl_symmetric_memory = true;
};

// /metrics (src/metrics/): off unless a port is given. A worker serves on port + its local
// rank, so the ranks of one node do not collide.
struct MetricsConfig {
  // 0: no /metrics endpoint; `any` (held as -1): each rank binds a free port of its own and
  // logs it.
  int port = 0;
  std::string bind_address = "0.0.0.0";
  double peak_tflops = 0.0;              // MFU denominator; 0: the device's entry in
                                         // common/peak_flops.h (no MFU when unknown, e.g. CPU)
};

struct RunConfig {
  std::string source_path;     // file it came from (for messages)
  std::string name = "run";
  uint64_t seed = 1234;
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  BatchConfig batch;
  PrecisionConfig precision;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  TrainConfig train;
  EngineConfig engine;
  MetricsConfig metrics;
};

// Parses YAML text; `source` names it in errors (a path or "<spec>").
StatusOr<RunConfig> ParseRunConfig(const std::string& yaml_text, const std::string& source);
StatusOr<RunConfig> LoadRunConfig(const std::string& path);
// Cross-field checks (heads divide d_model, global batch divisible, ...).
Status ValidateRunConfig(const RunConfig& cfg);

const char* PrecisionName(Precision p);
const char* ParallelModeName(ParallelMode m);
const char* GradReduceName(GradReduce g);
const char* DdpAllReduceName(DdpAllReduce a);
const char* InitSchemeName(InitScheme i);
const char* Fp8FastAccumName(Fp8FastAccum f);
const char* DecayKindName(DecayKind d);
const char* BackendName(Backend b);
const char* RecomputeName(Recompute r);
const char* Fp8RecipeName(Fp8Recipe r);
const char* AttentionBackwardName(AttentionBackward a);
const char* RopeScalingTypeName(RopeScalingType t);
// The value a name spells (the config's spelling), for command-line flags: Invalid
// "<what>: must be one of a|b|..., got <name>" otherwise.
Status ParallelModeFromName(std::string_view name, const std::string& what, ParallelMode* out);
Status GradReduceFromName(std::string_view name, const std::string& what, GradReduce* out);
Status DdpAllReduceFromName(std::string_view name, const std::string& what, DdpAllReduce* out);
Status Fp8FastAccumFromName(std::string_view name, const std::string& what, Fp8FastAccum* out);

// The config as YAML that ParseRunConfig reads back to an equal RunConfig (floats are written
// in shortest round-trip form). For logs, run specs and checkpoint manifests.
std::string RunConfigToYaml(const RunConfig& cfg);

}  // namespace forge
