// Error checking for CUDA runtime, cuBLASLt and cuDNN calls: every call is checked and a
// failure becomes a Status naming the call, file and line (never a silent abort in a library).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "common/status.h"

namespace forge::cuda {

Status CudaError(cudaError_t e, const char* what, const char* file, int line);
Status CublasError(cublasStatus_t e, const char* what, const char* file, int line);
Status CudnnError(cudnnStatus_t e, const char* what, const char* file, int line);

// Whether work queued on `stream` would be captured into a graph (so no synchronising, timing
// or allocation may happen). An error from the query counts as capturing: e.g. the legacy
// stream while another stream captures.
bool StreamCapturing(cudaStream_t stream);

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current device (above the
// default 48 KiB a kernel must opt in). The largest size granted is remembered per kernel and
// device, so only the first launch that needs more makes the runtime call. Not a stream
// operation: also fine while a graph is being captured.
Status AllowDynamicSmem(const void* kernel, size_t bytes);
template <typename... Params>
Status AllowDynamicSmem(void (*kernel)(Params...), size_t bytes) {
  return AllowDynamicSmem(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace forge::cuda

// Returns error(result, "call", file, line) from the enclosing function unless `call` gives
// `success`; the result keeps the type of `success` (a library's status enum).
#define FORGE_LIBRARY_CHECK_(call, text, success, error)                           \
  do {                                                                             \
    const decltype(success) _e = (call);                                           \
    if (_e != (success)) return ::forge::cuda::error(_e, text, __FILE__, __LINE__); \
  } while (0)

#define FORGE_CUDA_CHECK(call) FORGE_LIBRARY_CHECK_((call), #call, cudaSuccess, CudaError)
#define FORGE_CUBLAS_CHECK(call) \
  FORGE_LIBRARY_CHECK_((call), #call, CUBLAS_STATUS_SUCCESS, CublasError)
#define FORGE_CUDNN_CHECK(call) \
  FORGE_LIBRARY_CHECK_((call), #call, CUDNN_STATUS_SUCCESS, CudnnError)

// After a kernel launch: catches bad launch configurations without synchronising.
#define FORGE_CUDA_LAUNCH_CHECK() FORGE_CUDA_CHECK(cudaGetLastError())
