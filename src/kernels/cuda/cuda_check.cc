#include "kernels/cuda/cuda_check.h"

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

}  // namespace forge::cuda
