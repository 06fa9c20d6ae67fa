// Causal flash attention through cuDNN's graph (backend) API: forward and backward as composite
// operation graphs that cuDNN fuses into its flash kernels (see shared notes: the native SDPA
// ops cannot do causal on Hopper). Graphs are built once per shape and cached with their plans.
//
// Q, K and V are read in place from the fused bf16 qkv buffer [B, T, (H + 2*KV), hd] through
// strides; O / dO are [B, T, H, hd]; dQKV is written straight into a [B, T, (H + 2*KV), hd]
// gradient buffer. Stats (fp32 [B, H, T]) = rowmax + log(rowsum(exp)) saved for backward.
//
// Engine choice. The plan of a graph is made on its first call:
// - plan cache disabled (FORGE_PLAN_CACHE=off, see plan_cache.h): the first engine config of
//   cuDNN's heuristics (mode A) whose plan finalizes; no timing.
// - plan cache holds a choice for (GPU model, cuDNN version, fwd | bwd | bwd-det, shape): that
//   engine config, untimed. Every process reading the same cache runs the same kernels, so
//   two runs give the same bits.
// - otherwise (first run on this kind of machine) the call is tuned: up to kMaxCandidates
//   engine configs from heuristics modes A, then B, then fallback (A's first always among
//   them) are finalized and timed on the call's own operands (every run of a plan overwrites
//   all of its outputs: O and Stats; dQ/dK/dV and softmax_sum, with the fp32 dQ accumulator
//   initialised by the graph itself), 2 warm-ups and the median of 5 runs, with the device
//   synchronised first so other streams' work does not share the GPU. The fastest wins if it
//   beats the first config by kTuneMargin, else the first stays. For the forward graph and
//   the deterministic backward, engines noted NONDETERMINISTIC are left out (unless the first
//   config carries the note too, then the note says nothing here) and the winner must give
//   bitwise equal outputs on two runs. The choice is recorded in the cache (the first writer
//   wins among concurrent processes, and everyone adopts the recorded choice) and its plan
//   is rebuilt from the recorded value, exactly as later processes will.
// - a recorded choice this cuDNN cannot build (another cuDNN build, a hand edit) is tuned
//   again and replaced, with a warning; a cache file that is not a plan cache at all is an
//   error naming the file (fix or delete it, or set FORGE_PLAN_CACHE=off).
// - a first call under CUDA-graph capture is never timed (timing synchronises): it takes the
//   cached choice if any, else heuristics' first config, and records nothing.
// - under a profiler or checker (ProfilerAttached: kernels replayed or serialised) nothing is
//   timed either: the cached choice if any, else heuristics' first config, nothing recorded.
// Candidates needing more than max(2x, +256 MiB) of the first config's workspace are left
// out, and, where the runner works in a workspace it was lent (ShareWorkspace), those needing
// more than that workspace. Runners of one process share the cache file: the first tunes a
// shape, the others read its choice.
// Each tuning prints one line to stderr ("forge: sdpa bwd B=... | <GPU> | cudnn ...: tuned
// ..."); plan_log() has the same for every plan made.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/flash_backward.h"
#include "kernels/cuda/plan_cache.h"

namespace forge::cuda {

struct SdpaShape {
  int B = 0, T = 0, H = 0, KV = 0, hd = 0;
};

// How the plan of one graph was chosen (SdpaRunner::plan_log).
struct SdpaPlanInfo {
  std::string key;     // plan-cache key: "sdpa <fwd|bwd|bwd-det> B=.. | <GPU> | cudnn <ver>"
  std::string engine;  // the chosen engine config (CudnnEngineChoice text form)
  // "first" (cache off), "cache" (recorded choice), "tuned" (timed here), "capture" (first
  // call under capture: cached choice or heuristics' first, untimed), "profiler" (the same
  // under a profiler), "forced" (UseEngine).
  std::string source;
  int timed = 0;              // candidates timed ("tuned" only)
  float first_ms = 0.0f;      // heuristics' first config, median ("tuned" only)
  float chosen_ms = 0.0f;     // the chosen one, median ("tuned" only)
  std::string note;           // e.g. why a recorded choice was not used or not recorded
};

// One engine config the tuner would consider for a graph (SdpaRunner::EngineCandidates).
struct SdpaEngineCandidate {
  std::string engine;  // CudnnEngineChoice text form; index 0 is heuristics' first config
  int64_t workspace_bytes = 0;
  bool nondeterministic = false;  // cuDNN's NONDETERMINISTIC note
  bool runtime_compiled = false;
};

// Which kernels run the backward. kCudnn: cuDNN's graph. kFlash: our own (flash_backward.h;
// deterministic in both modes, needs no cuDNN plan) where it takes the shape, cuDNN's graph
// elsewhere; kCudnn always takes cuDNN's (engine.attention_backward). Flash is the default
// (0.37 ms a layer against cuDNN's 0.44 deterministic at gpt350m's shape on an H100, no dS in
// memory: docs/performance.md).
enum class SdpaBackwardKernel { kFlash, kCudnn };

class SdpaRunner {
 public:
  SdpaRunner();  // out of line: Graph is incomplete here
  ~SdpaRunner();
  SdpaRunner(const SdpaRunner&) = delete;
  SdpaRunner& operator=(const SdpaRunner&) = delete;

  // deterministic: backward writes dQ without an fp32 atomic accumulator, so two runs are
  // bitwise identical (slower, larger workspace). Takes the plan cache from the environment
  // (PlanCache::FromEnv).
  Status Init(bool deterministic, SdpaBackwardKernel backward = SdpaBackwardKernel::kFlash);

  // Replaces the plan cache (before the first call of a shape; e.g. benchmarks and tests).
  void set_plan_cache(PlanCache cache) { cache_ = std::move(cache); }
  const PlanCache& plan_cache() const { return cache_; }

  Status Forward(const SdpaShape& s, const bf16* qkv, bf16* out, float* stats,
                 cudaStream_t stream);
  // softmax_sum: fp32 [B, H, T] scratch; dq_accum: fp32 [B, H, T, hd] scratch (unused when
  // deterministic, may be null then). Workspace is owned by the runner. Our own backward
  // (flash_backward()) uses neither scratch: its own lives in the runner's workspace. fp8:
  // the gradient as FP8 with RoPE's inverse as well (FlashBackwardFp8Out, which says what of
  // dqkv is still written; our backward only: an error where flash_backward(s) is false).
  Status Backward(const SdpaShape& s, const bf16* qkv, const bf16* out, const bf16* dout,
                  const float* stats, bf16* dqkv, float* softmax_sum, float* dq_accum,
                  cudaStream_t stream, const FlashBackwardFp8Out* fp8 = nullptr);

  // Bytes of scratch the caller must provide for one Backward when carving both from one
  // buffer: softmax_sum at offset 0, dq_accum at the next 256-byte boundary.
  static size_t BackwardScratchBytes(const SdpaShape& s, bool deterministic);

  // The workspace Forward and Backward of shape s will ask for: each plan as its first call
  // will choose it where it can tell now (the plan cache's recorded choice, else heuristics'
  // first config; a tuning never picks more than a lent workspace holds), or our backward's
  // scratch. Builds the graphs (cached for the calls).
  StatusOr<size_t> WorkspaceBytes(const SdpaShape& s);
  // Makes the runner work in `bytes` of the caller's device memory at `p` (256-byte aligned,
  // before the first call) instead of a buffer of its own; a plan needing more still gets one
  // of its own, with a warning. The caller orders the memory's other uses against the
  // runner's calls.
  Status ShareWorkspace(void* p, size_t bytes);
  // Whether the runner works in a buffer of its own (none lent, or a plan needed more).
  bool owns_workspace() const { return owns_workspace_; }

  // At most this many engine configs are finalized and timed per graph.
  static constexpr int kMaxCandidates = 8;
  // A candidate replaces heuristics' first config only if faster by this fraction.
  static constexpr float kTuneMargin = 0.02f;

  // The engine configs a tuning of this graph would time, in order (finalizes each: slow).
  StatusOr<std::vector<SdpaEngineCandidate>> EngineCandidates(const SdpaShape& s,
                                                              bool backward);
  // Makes the graph run this engine config (text form, e.g. from EngineCandidates) from the
  // next call on, bypassing tuning and the plan cache.
  Status UseEngine(const SdpaShape& s, bool backward, const std::string& engine);

  // Whether Backward runs our own kernels for shape s (SdpaBackwardKernel::kFlash and a shape
  // and device FlashBackward takes).
  bool flash_backward(const SdpaShape& s) const;

  // How each graph's plan was chosen, in the order the plans were made.
  const std::vector<SdpaPlanInfo>& plan_log() const { return plan_log_; }

 private:
  struct Graph;  // one operation graph, its chosen plan and scalars
  struct Call;   // one call's variant pack contents and outputs
  StatusOr<Graph*> Get(const SdpaShape& s, bool backward);
  Status ChoosePlan(Graph* g, const SdpaShape& s, const Call& call, cudaStream_t stream);
  StatusOr<SdpaPlanInfo> Tune(Graph* g, const Call& call, cudaStream_t stream);
  Status Run(Graph* g, const Call& call, cudaStream_t stream);
  Status EnsureWorkspace(size_t bytes);

  cudnnHandle_t handle_ = nullptr;
  bool deterministic_ = false;
  SdpaBackwardKernel backward_ = SdpaBackwardKernel::kFlash;
  std::map<std::tuple<int, int, int, int, int, bool>, std::unique_ptr<Graph>> graphs_;
  StatusOr<size_t> PlanWorkspaceBytes(const SdpaShape& s, bool backward);

  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool owns_workspace_ = false;  // false while working in a lent one (ShareWorkspace)
  PlanCache cache_;
  std::string device_name_;  // GPU model, part of every plan-cache key
  std::vector<SdpaPlanInfo> plan_log_;
};

}  // namespace forge::cuda
