// MakeCudaBackend / CudaDeviceAvailable / CudaFreeDeviceMemoryBytes in builds without CUDA (FORGE_CUDA=OFF or no nvcc). The
// CMake glob always compiles this file; in CUDA builds FORGE_HAVE_CUDA is defined and
// cuda_backend.cc provides the real definitions, so this compiles to nothing.
#ifndef FORGE_HAVE_CUDA

#include "worker/train/backend.h"

namespace forge {

StatusOr<std::unique_ptr<TrainBackend>> MakeCudaBackend(const RunConfig& /*cfg*/,
                                                        Comm* /*comm*/) {
  return Status::Unavailable("built without CUDA");
}

bool CudaDeviceAvailable() { return false; }

double CudaFreeDeviceMemoryBytes() { return -1; }

}  // namespace forge

#endif  // FORGE_HAVE_CUDA
