#include "worker/model/fp8_scaling.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace forge {

Fp8ScalingParams Fp8ParamsFromConfig(const Fp8Config& cfg, cpu::Fp8Format format) {
  Fp8ScalingParams p;
  p.recipe = cfg.recipe;
  p.amax_history = cfg.amax_history;
  p.margin = cfg.margin;
  p.fp8_max = cpu::Fp8Max(format);
  return p;
}

Status ValidateFp8ScalingParams(const Fp8ScalingParams& p) {
  if (p.amax_history < 1) {
    return Status::Invalid("fp8 scaling: amax_history must be >= 1, got " +
                           std::to_string(p.amax_history));
  }
  if (p.margin < 0 || p.margin > 32) {
    return Status::Invalid("fp8 scaling: margin must be in [0, 32], got " +
                           std::to_string(p.margin));
  }
  if (!(std::isfinite(p.fp8_max) && p.fp8_max > 0)) {
    return Status::Invalid("fp8 scaling: fp8_max must be finite and > 0, got " +
                           std::to_string(p.fp8_max));
  }
  return Status::Ok();
}

Fp8ScaleState MakeFp8ScaleState(const Fp8ScalingParams& p) {
  Fp8ScaleState s;
  s.history.assign(static_cast<size_t>(std::max(p.amax_history, 1)), 0.0f);
  return s;
}

float Fp8ScaleFromAmax(float amax, float fp8_max, int margin, float previous) {
  if (!(std::isfinite(amax) && amax > 0.0f)) return previous;
  // Float arithmetic (one correctly rounded division, an exact power-of-two step), so a
  // device-side update computes the same bits. An overflow to Inf (amax below ~1e-36) and an
  // underflow both end at the clamp.
  const float s = std::ldexp(fp8_max / amax, -margin);
  return std::clamp(s, kMinFp8Scale, kMaxFp8Scale);
}

float HistoryAmax(const Fp8ScaleState& s) {
  float m = 0.0f;
  for (float a : s.history) m = std::max(m, a);
  return m;
}

namespace {

void SetScale(float scale, Fp8ScaleState* s) {
  s->scale = scale;
  s->scale_inv = 1.0f / scale;
}

}  // namespace

bool RecordAmax(const Fp8ScalingParams& p, float step_amax, Fp8ScaleState* s) {
  if (!std::isfinite(step_amax)) {
    ++s->nonfinite_amax;
    return false;
  }
  if (s->history.empty()) {
    s->history.assign(static_cast<size_t>(std::max(p.amax_history, 1)), 0.0f);
  }
  const float amax = std::max(step_amax, 0.0f);  // -0.0 and the like count as 0
  s->history[static_cast<size_t>(s->recorded % static_cast<int64_t>(s->history.size()))] = amax;
  ++s->recorded;
  SetScale(Fp8ScaleFromAmax(HistoryAmax(*s), p.fp8_max, p.margin, s->scale), s);
  return true;
}

bool UpdateCurrentScale(const Fp8ScalingParams& p, float amax, Fp8ScaleState* s) {
  if (!std::isfinite(amax)) {
    ++s->nonfinite_amax;
    return false;
  }
  SetScale(Fp8ScaleFromAmax(amax, p.fp8_max, p.margin, s->scale), s);
  return true;
}

}  // namespace forge
