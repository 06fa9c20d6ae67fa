// The FP8 scale update on the device, so a captured step graph updates its scales without the
// host reading amaxes. One thread per tensor applies worker/model/fp8_scaling.h's RecordAmax
// (the delayed recipe) bit for bit:
//   a non-finite amax is counted and changes nothing else; otherwise it enters the tensor's
//   history ring (slot recorded % window) and scale = clamp(ldexp(fp8_max / max(history),
//   -margin), 2^-63, 2^63), unchanged when that max is 0; scale_inv = 1 / scale.
// Then the amax slot is reset to 0 for the next step's max-accumulating casts.
// The current recipe is the same update with window 1, run between the amax pass and the cast.
//
// Layout: tensor i's amax, scale and scale_inv at [i * stride] of their arrays (stride 4 with
// 16-byte slots; the three may interleave in one array); history [n, window]; recorded and
// nonfinite [n]. Tensors of one call share fp8_max, window and margin (one call per format).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/status.h"

namespace forge::cuda {

// Must equal kMinFp8Scale / kMaxFp8Scale of worker/model/fp8_scaling.h (a GPU test checks).
inline constexpr float kFp8ScaleMin = 0x1p-63f;
inline constexpr float kFp8ScaleMax = 0x1p63f;

struct Fp8ScaleUpdateArgs {
  int64_t n = 0;            // tensors
  int64_t stride = 4;       // floats between consecutive tensors' amax/scale/scale_inv
  float* amax = nullptr;    // read, then reset to 0
  float* scale = nullptr;
  float* scale_inv = nullptr;
  float* history = nullptr;     // [n, window]
  int64_t* recorded = nullptr;  // [n]
  int64_t* nonfinite = nullptr; // [n]
  int window = 16;
  int margin = 0;
  float fp8_max = 448.0f;
};

Status Fp8ScaleUpdate(const Fp8ScaleUpdateArgs& args, cudaStream_t stream);

// Data parallelism: amax[i] = max over ranks r of gathered[r * stride + i] (an all-gather of
// every rank's amax slots), so every rank derives the same scales. Compared as bit patterns
// like the casts' amax (NaN above Inf above every finite value): an overflow on any rank
// reaches all.
Status Fp8AmaxMaxOverRanks(float* amax, const float* gathered, int64_t n, int world,
                           int64_t stride, cudaStream_t stream);

}  // namespace forge::cuda
