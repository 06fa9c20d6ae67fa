#include "kernels/cuda/cuda_check.h"

#include <map>
#include <mutex>
#include <utility>

namespace forge::cuda {

static std::string Where(const char* what, const char* file, int line) {
  return std::string(what) + " at " + file + ":" + std::to_string(line);
}

Status CudaError(cudaError_t e, const char* what, const char* file, int line) {
  return Status::Internal(Where(what, file, line) + ": " + cudaGetErrorName(e) + " (" +
                          cudaGetErrorString(e) + ")");
}

Status CublasError(cublasStatus_t e, const char* what, const char* file, int line) {
  return Status::Internal(Where(what, file, line) + ": cuBLAS status " +
                          std::to_string(static_cast<int>(e)));
}

Status CudnnError(cudnnStatus_t e, const char* what, const char* file, int line) {
  return Status::Internal(Where(what, file, line) + ": " + cudnnGetErrorString(e));
}

bool StreamCapturing(cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error the query left behind
    return true;
  }
  return st != cudaStreamCaptureStatusNone;
}

Status AllowDynamicSmem(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return Status::Ok();
  int device = 0;
  FORGE_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> granted;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = granted[{device, kernel}];
  if (bytes <= have) return Status::Ok();
  FORGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  have = bytes;
  return Status::Ok();
}

}  // namespace forge::cuda
