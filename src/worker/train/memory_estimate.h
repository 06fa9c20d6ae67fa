// What one training process needs in memory for a config, estimated before anything is
// allocated, so that a model too large for the machine (every dimension fits an int, not the
// memory: n_layer 100000, d_model 10^9, seq_len 2*10^9) is refused with the estimate and the
// keys that make it large, instead of dying in std::bad_alloc or the OOM killer.
//
// The estimate counts the buffers the backends allocate whatever happens, per rank, in double
// precision (the products of such dimensions overflow 64-bit integers): weights, gradients,
// AdamW moments and saved activations on both backends, the CPU backend's attention
// probabilities, and on the CUDA backend every buffer class CudaModel sizes from the config
// (the FP8 weight copies, the backward's activation gradients, the region the LM head's
// logits chunks share with the attention backward's scratch and cuDNN's deterministic
// workspace of 2 B H T^2 bytes, the cuBLASLt workspaces), fsdp's whole units (two gathered
// blocks and the root units, with their fp32 gradient buffers) and ddp's bf16 gradient twin. It is a lower bound of what the process holds, so a config it
// refuses can never fit. What it leaves out on the CUDA backend, all of it under 0.5 GiB at
// the Llama 3 shapes: the CUDA context, the cuDNN and cuBLASLt handles and the kernels they
// load, the CUDA graph, the FP8 SwiGLU output of the fused gate/up GEMM (micro_batch x seq_len
// x ffn bytes), the RoPE tables, the norm, embedding and gradient-norm workspaces, the token
// staging and the allocation rounding. On one H200 the CUDA backend's measured peaks of the
// llama3-1b/3b and gpt124m/350m presets lie 0.04 to 0.33 GiB above it
// (tests/unit/memory_estimate_test.cc).
#pragma once

#include <string>

#include "common/config.h"
#include "common/status.h"

namespace forge {

struct MemoryEstimate {
  double weights = 0;      // bytes per rank: master weights (and the device's bf16 copy)
  double gradients = 0;    // full and sharded gradient buffers
  double moments = 0;      // AdamW m and v
  double activations = 0;  // what the forward keeps for the backward
  double workspace = 0;    // CUDA: backward gradients, logits/attention region, GEMM scratch
  double total() const { return weights + gradients + moments + activations + workspace; }
};

// backend: kCpu or kCuda (resolved, not kAuto); world: data-parallel ranks (>= 1).
MemoryEstimate EstimateTrainingMemory(const RunConfig& cfg, Backend backend, int world);

// InvalidArgument when the estimate exceeds available_bytes, saying both, the parts, and the
// config keys that make the largest part large ("... reduce model.n_layer (100000) ..."); Ok
// otherwise. `where` names the memory ("this host's available memory", "GPU 0's free memory").
Status CheckTrainingMemory(const RunConfig& cfg, Backend backend, int world,
                           double available_bytes, const std::string& where);

// Host memory this process could still take: MemAvailable of /proc/meminfo, lowered to the
// room left under its cgroup's memory.max when there is one; < 0 when neither can be read.
double HostAvailableMemoryBytes();

}  // namespace forge
