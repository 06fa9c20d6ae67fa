// The model's device buffers (CudaModel, Fp8Linears): one cudaMalloc per buffer, rounded up to
// 256 bytes and zero-filled (padding between units and unused tails read as 0), recorded in
// the owner's list (freed by the owner) and counted in its byte total.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/cuda_check.h"

namespace forge {

// x rounded up to a multiple of a.
inline int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// `who` names the owner in the error ("cuda model", "fp8 linears").
template <typename T>
Status DeviceAlloc(const char* who, std::vector<void*>* list, size_t* total, T** out,
                   size_t count) {
  *out = nullptr;
  if (count == 0) return Status::Ok();
  const size_t bytes = (count * sizeof(T) + 255) / 256 * 256;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    return Status::Unavailable(std::string(who) + ": cudaMalloc of " + std::to_string(bytes) +
                               " bytes failed (" + cudaGetErrorString(e) + "); total so far " +
                               std::to_string(*total) + " bytes");
  }
  list->push_back(p);
  *total += bytes;
  FORGE_CUDA_CHECK(cudaMemset(p, 0, bytes));
  *out = static_cast<T*>(p);
  return Status::Ok();
}

}  // namespace forge
