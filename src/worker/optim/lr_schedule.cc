#include "worker/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace forge {

float LearningRate(const OptimizerConfig& opt, const ScheduleConfig& s, int64_t step) {
  const double peak = opt.lr;
  if (s.warmup_steps > 0 && step <= s.warmup_steps)
    return static_cast<float>(peak * double(step) / double(s.warmup_steps));
  if (s.decay == DecayKind::kConstant) return opt.lr;
  const double min_lr = peak * s.min_lr_ratio;
  const int64_t span = std::max<int64_t>(1, s.total_steps - s.warmup_steps);
  const double progress =
      std::clamp(double(step - s.warmup_steps) / double(span), 0.0, 1.0);
  const double shape = s.decay == DecayKind::kCosine
                           ? 0.5 * (1.0 + std::cos(M_PI * progress))
                           : 1.0 - progress;
  return static_cast<float>(min_lr + (peak - min_lr) * shape);
}

}  // namespace forge
