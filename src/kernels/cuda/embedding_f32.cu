#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embedding_f32.h"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void EmbeddingF32Kernel(float* __restrict__ out, const int32_t* __restrict__ tokens,
                                   const bf16* __restrict__ wte, int d) {
  const int64_t n = blockIdx.x;
  const bf16* src = wte + int64_t{tokens[n]} * d;
  float* dst = out + n * d;
  for (int j = threadIdx.x; j < d; j += kThreads) dst[j] = __bfloat162float(src[j]);
}

}  // namespace

Status EmbeddingForwardF32(float* out, const int32_t* tokens, const bf16* wte, int64_t N, int d,
                           cudaStream_t stream) {
  if (N < 0 || d <= 0)
    return Status::Invalid("EmbeddingForwardF32: bad shape d=" + std::to_string(d));
  if (N == 0) return Status::Ok();
  EmbeddingF32Kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(out, tokens, wte, d);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
