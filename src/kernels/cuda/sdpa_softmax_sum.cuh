// softmax_sum = rowsum(dO * O) per (batch, head, query row): the first term of the attention
// backward (dS = P * (dO V^T - softmax_sum)), computed by our own kernel so that cuDNN's
// backward graph can take it as an input instead of running its own reduction kernel
// (SdpaRunner::Init's own_softmax_sum). Design in sdpa_softmax_sum.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"
#include "kernels/cuda/bf16.cuh"

namespace forge::cuda {

// sum[(b * H + h) * T + t] = sum_j dout[b, t, h, j] * out[b, t, h, j] in fp32 (products
// and sums in a fixed order: bitwise reproducible). dout and out are [B, T, H, hd] bf16,
// 16-byte aligned; hd a multiple of 8 with hd / 8 a power of two at most 32; H <= 256.
Status SoftmaxSum(float* sum, const bf16* dout, const bf16* out, int B, int T, int H, int hd,
                  cudaStream_t stream);

}  // namespace forge::cuda
