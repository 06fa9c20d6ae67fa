// The AdamW update of step s, applied unit by unit while step s+1's forward runs.
//
// Why: the update is ~30 bytes per parameter (per slot element when sharded) of pure memory
// traffic (3.9 ms of an 84 ms gpt350m step on an H100; 120 GB a step for llama3-8b's slots on
// 2 GPUs) and, run at the end of the step, nothing overlaps it. It cannot start earlier
// (clipping needs the global norm, known only when the backward ends), but each unit's new
// weights are needed only when the next forward reaches that unit. So the step ends with the
// norm and Defer (hyper-parameters saved, a device flag set), and Begin forks an `update`
// stream from the compute stream, runs the units' AdamW there in `order` and records one event
// per unit; whatever reads unit u's weights next waits for its event (WaitUnit) first.
//   one GPU, ddp: the next forward calls Begin, and waits for unit u just before it reads it.
//   zero, fsdp:   the data-parallel layer calls Begin right after Defer, and the all-gather of
//                 unit u's slots (on the NCCL stream) waits for unit u; the forward waits for
//                 the gather. fsdp orders the root units (embedding, final norm) first, since
//                 the next step's first gather takes both.
// The update stream has the lowest priority, so the forward's kernels are scheduled first and
// the update fills the gaps (GEMM tails, the attention kernels' unused SMs). The arithmetic is
// the same kernel on the same values: weights and moments are bitwise those of the immediate
// update.
//
// The pending state lives in device memory (the flag), not on the host: a step captured in a
// CUDA graph always contains Begin's launches, which do nothing when no update is pending
// (after a Flush, or before the first step). Anything that reads or replaces the weights or
// moments between steps calls Flush first, on the stream the steps run on.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/adamw.h"

namespace forge {

class DeferredUpdate {
 public:
  DeferredUpdate() = default;
  ~DeferredUpdate();
  DeferredUpdate(const DeferredUpdate&) = delete;
  DeferredUpdate& operator=(const DeferredUpdate&) = delete;

  // tensors: the model's DEVICE descriptor array, units in order; unit u owns descriptors
  // [first_tensor[u], first_tensor[u + 1]) and unit_elements[u] elements. clip_scale and
  // skipped_steps: the model's device scalars. order: the units in the order Begin updates
  // them (a permutation; empty: 0, 1, ...). Creates the update stream with `priority`.
  Status Init(const cuda::AdamWTensor* tensors, std::vector<int> first_tensor,
              std::vector<int64_t> unit_elements, const float* clip_scale,
              int64_t* skipped_steps, int priority, std::vector<int> order = {});

  // End of a step, after the norm wrote clip_scale: saves *hyper (the caller rewrites it before
  // the next step) and marks the update pending, or counts the step skipped when the
  // gradients were not finite. Stream-ordered on s (capturable).
  Status Defer(const cuda::AdamWHyper* hyper, cudaStream_t s);

  // Fork the update stream from s and enqueue every unit's (gated) update there. With overlap
  // false (profiling: single stream) the update runs on s right here. No-op while a Begin is
  // open (the data-parallel layer's Begin, then the forward's).
  Status Begin(cudaStream_t s, bool overlap);
  // Before s reads unit u's weights (or, sharded, its slots). No-op unless a Begin with
  // overlap is open.
  Status WaitUnit(int unit, cudaStream_t s);
  // End of the forward: s waits for all of the update stream's work (also after an error, so
  // nothing is left unjoined in a capture).
  Status End(cudaStream_t s);

  // Applies a pending update now on s (one launch) and clears the flag; while a Begin is open,
  // s waits for it instead (End).
  Status Flush(cudaStream_t s);

 private:
  Status Launch(int first_unit, int last_unit, cudaStream_t s);

  const cuda::AdamWTensor* tensors_ = nullptr;
  std::vector<int> first_tensor_;     // size units + 1
  std::vector<int64_t> unit_elements_;
  std::vector<int> order_;            // the units in Begin's order
  const float* clip_scale_ = nullptr;
  int64_t* skipped_steps_ = nullptr;
  int* pending_ = nullptr;              // device flag: an update is pending
  cuda::AdamWHyper* hyper_ = nullptr;   // device copy of the deferred step's hyper-parameters
  cudaStream_t stream_ = nullptr;       // the units' updates during the next forward
  cudaEvent_t fork_ = nullptr;          // compute stream -> update stream
  cudaEvent_t done_ = nullptr;          // update stream -> compute stream (End)
  std::vector<cudaEvent_t> unit_done_;  // unit u's weights are updated
  bool used_ = false;  // Defer was called: until then Begin and Flush enqueue nothing
  bool open_ = false;  // a Begin with overlap whose End has not run
};

}  // namespace forge
