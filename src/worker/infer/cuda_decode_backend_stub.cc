// MakeCudaDecodeBackend in builds without CUDA (FORGE_CUDA=OFF or no nvcc); in CUDA builds
// cuda_decode_backend.cc defines it and this compiles to nothing.
#ifndef FORGE_HAVE_CUDA

#include "worker/infer/decode_backend.h"

namespace forge {

StatusOr<std::unique_ptr<DecodeBackend>> MakeCudaDecodeBackend(const ModelConfig& /*m*/,
                                                               const UnitBuffers& /*params*/) {
  return Status::Unavailable("generation on the GPU: this forge was built without CUDA");
}

}  // namespace forge

#endif  // FORGE_HAVE_CUDA
