// Causal flash attention through cuDNN's graph (backend) API: forward and backward as composite
// operation graphs that cuDNN fuses into its flash kernels (see shared notes: the native SDPA
// ops cannot do causal on Hopper). Graphs are built once per shape and cached with their plans.
//
// Q, K and V are read in place from the fused bf16 qkv buffer [B, T, (H + 2*KV), hd] through
// strides; O / dO are [B, T, H, hd]; dQKV is written straight into a [B, T, (H + 2*KV), hd]
// gradient buffer. Stats (fp32 [B, H, T]) = rowmax + log(rowsum(exp)) saved for backward.
#pragma once

#include <cudnn.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "common/status.h"
#include "kernels/cuda/bf16.cuh"

namespace forge::cuda {

struct SdpaShape {
  int B = 0, T = 0, H = 0, KV = 0, hd = 0;
};

class SdpaRunner {
 public:
  SdpaRunner();  // out of line: Graph is incomplete here
  ~SdpaRunner();
  SdpaRunner(const SdpaRunner&) = delete;
  SdpaRunner& operator=(const SdpaRunner&) = delete;

  // deterministic: backward writes dQ without an fp32 atomic accumulator, so two runs are
  // bitwise identical (slower, larger workspace).
  Status Init(bool deterministic);

  Status Forward(const SdpaShape& s, const bf16* qkv, bf16* out, float* stats,
                 cudaStream_t stream);
  // softmax_sum: fp32 [B, H, T] scratch; dq_accum: fp32 [B, H, T, hd] scratch (unused when
  // deterministic, may be null then). Workspace is owned by the runner.
  Status Backward(const SdpaShape& s, const bf16* qkv, const bf16* out, const bf16* dout,
                  const float* stats, bf16* dqkv, float* softmax_sum, float* dq_accum,
                  cudaStream_t stream);

  // Bytes of scratch the caller must provide for one Backward when carving both from one
  // buffer: softmax_sum at offset 0, dq_accum at the next 256-byte boundary.
  static size_t BackwardScratchBytes(const SdpaShape& s, bool deterministic);

 private:
  struct Graph;  // one finalized plan + its uids
  StatusOr<Graph*> Get(const SdpaShape& s, bool backward);
  Status EnsureWorkspace(size_t bytes);

  cudnnHandle_t handle_ = nullptr;
  bool deterministic_ = false;
  std::map<std::tuple<int, int, int, int, int, bool>, std::unique_ptr<Graph>> graphs_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace forge::cuda
