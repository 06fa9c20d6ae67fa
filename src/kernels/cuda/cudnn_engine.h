// Engine configs of a cuDNN backend operation graph: the configs the heuristics offer, a
// config as a plain value (engine global index + knob choices) with a text form that a plan
// cache can store, and execution plans finalized from either. A plan built from the value of
// a heuristics config runs the same kernels as one built from the config itself, so a choice
// recorded by one process can be replayed by another.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace forge::cuda {

struct CudnnEngineChoice {
  int64_t engine = -1;                             // CUDNN_ATTR_ENGINE_GLOBAL_INDEX
  std::vector<std::pair<int64_t, int64_t>> knobs;  // (cudnnBackendKnobType_t, value), by type

  // "engine=8 knobs=2:3,14:1" ("knobs=" followed by nothing when the engine has none).
  std::string ToString() const;
  friend bool operator==(const CudnnEngineChoice&, const CudnnEngineChoice&) = default;
};

// Inverse of ToString; anything else is kInvalidArgument naming the text.
StatusOr<CudnnEngineChoice> ParseCudnnEngineChoice(const std::string& text);

// A finalized execution plan and the descriptors made for it; destroys them (plan first).
class CudnnPlan {
 public:
  CudnnPlan() = default;
  ~CudnnPlan();
  CudnnPlan(CudnnPlan&& o) noexcept { *this = std::move(o); }
  CudnnPlan& operator=(CudnnPlan&& o) noexcept;
  CudnnPlan(const CudnnPlan&) = delete;
  CudnnPlan& operator=(const CudnnPlan&) = delete;

  cudnnBackendDescriptor_t plan() const { return plan_; }
  int64_t workspace_bytes() const { return workspace_bytes_; }
  const CudnnEngineChoice& choice() const { return choice_; }
  // The engine's notes: CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC, and whether its kernels are
  // compiled at run time (CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION).
  bool nondeterministic() const { return nondeterministic_; }
  bool runtime_compiled() const { return runtime_compiled_; }

 private:
  friend StatusOr<CudnnPlan> FinalizeCudnnPlan(cudnnHandle_t, cudnnBackendDescriptor_t);
  friend StatusOr<CudnnPlan> FinalizeCudnnPlan(cudnnHandle_t, cudnnBackendDescriptor_t,
                                               const CudnnEngineChoice&);
  void Reset();

  cudnnBackendDescriptor_t plan_ = nullptr;
  std::vector<cudnnBackendDescriptor_t> owned_;  // engine, knob choices, config
  int64_t workspace_bytes_ = 0;
  CudnnEngineChoice choice_;
  bool nondeterministic_ = false;
  bool runtime_compiled_ = false;
};

// The engine configs the heuristics modes offer for op_graph, mode by mode in the given
// order, each choice once (first occurrence kept). The first mode must answer; a later mode
// that fails (some do not support every graph) is skipped. The config descriptors are
// appended to *owned; the caller destroys them.
StatusOr<std::vector<cudnnBackendDescriptor_t>> HeuristicEngineConfigs(
    cudnnBackendDescriptor_t op_graph,
    const std::vector<cudnnBackendHeurMode_t>& modes,
    std::vector<cudnnBackendDescriptor_t>* owned);

// An execution plan for an engine config (e.g. from the heuristics). A config that cannot
// run its graph fails with kUnavailable and cuDNN's reason; other codes are hard errors.
StatusOr<CudnnPlan> FinalizeCudnnPlan(cudnnHandle_t handle, cudnnBackendDescriptor_t config);

// An execution plan for op_graph built from a choice: engine by global index, its knobs, the
// config, the plan. kUnavailable when cuDNN refuses any of them for this graph (a choice
// recorded with another cuDNN or GPU, or edited by hand).
StatusOr<CudnnPlan> FinalizeCudnnPlan(cudnnHandle_t handle, cudnnBackendDescriptor_t op_graph,
                                      const CudnnEngineChoice& choice);

// cuDNN's explanation of its last failure on this thread ("" if none).
std::string LastCudnnError();

}  // namespace forge::cuda
