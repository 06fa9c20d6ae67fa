// FP8 per-tensor scaling recipes (host side; no CUDA). A tensor is cast as
// q = sat(x * scale) and the GEMM undoes it with scale_inv = 1 / scale (cuBLASLt's A/B scale
// pointers take scale_inv).
//
//   scale = fp8_max / amax / 2^margin,  clamped to [kMinFp8Scale, kMaxFp8Scale]
//
// Delayed scaling: amax = max over the amax history, the last `amax_history` steps' amaxes of
// the tensor (each the max |x| over every cast of the tensor in that step, e.g. over
// micro-batches). Order per step:
//   1. the step's casts use `scale`, computed at the end of the previous step, and record
//      the step's amax (the cast kernels do that in the same pass);
//   2. after the step, RecordAmax(step amax): the amax enters the history (the oldest entry
//      leaves once the window is full);
//   3. `scale` = Fp8ScaleFromAmax(max over the history, ...) for the next step.
// Before the first recorded step the scale is 1 (no amax seen yet).
//
// Current (just-in-time) scaling: the tensor's amax is measured first and the cast of the
// same tensor uses scale = Fp8ScaleFromAmax(that amax, ...) (UpdateCurrentScale); the history
// is not used.
//
// Scales never become Inf, NaN or 0:
//   - an amax of 0 (all-zero window or tensor) keeps the previous scale;
//   - a non-finite amax (the step overflowed: Inf/NaN in the tensor) keeps the previous
//     scale and does not enter the history (the trainer skips such a step, so it must not
//     shape later scales either); it is counted in `nonfinite_amax`;
//   - a finite amax is clamped so that scale and scale_inv are both normal floats with room
//     for the GEMM to multiply two scale_invs: [2^-63, 2^63].
// Both recipes are plain arithmetic on floats; a device-side update (for CUDA graphs, where
// the host cannot read the step's amax) must implement exactly these rules.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "kernels/cpu/fp8.h"

namespace forge {

inline constexpr float kMinFp8Scale = 0x1p-63f;
inline constexpr float kMaxFp8Scale = 0x1p63f;

struct Fp8ScalingParams {
  Fp8Recipe recipe = Fp8Recipe::kDelayed;
  int amax_history = 16;   // window length (delayed)
  int margin = 0;          // power of two of headroom
  float fp8_max = cpu::kE4M3Max;
};

// From the run config, for a tensor cast to `format` (E4M3 activations/weights, E5M2
// gradients).
Fp8ScalingParams Fp8ParamsFromConfig(const Fp8Config& cfg, cpu::Fp8Format format);
Status ValidateFp8ScalingParams(const Fp8ScalingParams& p);

// One tensor's scaling state.
struct Fp8ScaleState {
  std::vector<float> history;  // ring of the last amax_history recorded amaxes (0 = unused)
  int64_t recorded = 0;        // amaxes recorded so far; the next goes to recorded % size
  int64_t nonfinite_amax = 0;  // amaxes refused as non-finite
  float scale = 1.0f;
  float scale_inv = 1.0f;
};

Fp8ScaleState MakeFp8ScaleState(const Fp8ScalingParams& p);

// fp8_max / amax / 2^margin clamped to [kMinFp8Scale, kMaxFp8Scale]; `previous` when amax is
// 0, negative or not finite.
float Fp8ScaleFromAmax(float amax, float fp8_max, int margin, float previous);

// Max over the history window (0 when nothing was recorded).
float HistoryAmax(const Fp8ScaleState& s);

// Delayed recipe, steps 2-3 above: records the step's amax and sets scale/scale_inv for the
// next step. Returns false if the amax was refused as non-finite (scale unchanged).
bool RecordAmax(const Fp8ScalingParams& p, float step_amax, Fp8ScaleState* s);

// Current recipe: sets scale/scale_inv from the tensor's own amax (measured just before its
// cast). Returns false if the amax was refused as non-finite (scale unchanged).
bool UpdateCurrentScale(const Fp8ScalingParams& p, float amax, Fp8ScaleState* s);

}  // namespace forge
