// Grid-stride loops of the elementwise kernels: the index arithmetic written once, the work of
// each element passed in as a lambda (inlined; the loops compile as if written in place).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace forge::cuda {

// Over the [rows, cols] elements of a row-major matrix, VEC columns at a time (cols % VEC ==
// 0): body(n, c) for row n and the first column c of each group.
template <int VEC, typename Body>
__device__ __forceinline__ void ForEachRowGroup(int64_t rows, int cols, Body body) {
  const int64_t per_row = cols / VEC;
  const int64_t total = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    body(i / per_row, (i % per_row) * VEC);
  }
}

// Over n elements: with `vec`, eight at a time first (by8(i) for elements [8i, 8i + 8)), then
// one at a time (by1(i)) for those left over.
template <typename By8, typename By1>
__device__ __forceinline__ void ForEachElementBy8(int64_t n, bool vec, By8 by8, By1 by1) {
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t scalar_begin = 0;
  if (vec) {
    const int64_t n8 = n / 8;
    for (int64_t i = tid; i < n8; i += stride) by8(i);
    scalar_begin = n8 * 8;
  }
  for (int64_t i = scalar_begin + tid; i < n; i += stride) by1(i);
}

}  // namespace forge::cuda
